"""Setting up the tf.distribute backends: one strategy per process, created before
TensorFlow starts, and this worker's index."""
from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from hvdtrain import checks

NAMES = ("mirrored", "multi_worker_mirrored")
_strategies: dict = {}


def get_strategy(name: str = "mirrored", *, devices: int | None = None) -> tf.distribute.Strategy:
    """This process's strategy ``name``, created once and reused by the Trainer.

    Call it before TensorFlow starts (before any dataset or tensor exists): that is when
    MultiWorkerMirroredStrategy can configure its collective ops and when logical CPU
    devices can be made.

    Args:
        name: ``"mirrored"`` or ``"multi_worker_mirrored"`` (which reads ``TF_CONFIG``).
        devices: for ``"mirrored"`` without GPUs, split the CPU into this many logical
            devices (one replica each).

    Raises:
        ValueError: an unknown name or bad ``devices``.
        RuntimeError: TensorFlow had already started, with what to do instead.
    """
    if name not in NAMES:
        raise ValueError(f"strategy name must be one of {NAMES}, got {name!r}")
    checks.integer(devices, "devices", minimum=1, optional=True)
    if name in _strategies:
        return _strategies[name]
    if devices and devices > 1 and not tf.config.list_physical_devices("GPU"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
        except RuntimeError as err:
            raise RuntimeError(
                f"cannot split the CPU into {devices} devices: TensorFlow has already started "
                "(call hvdtrain.get_strategy('mirrored', devices=N) before creating any "
                "dataset or tensor)") from err
    if name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    else:
        if not os.environ.get("TF_CONFIG"):
            raise ValueError("strategy='multi_worker_mirrored' needs TF_CONFIG describing the "
                             "workers, e.g. {\"cluster\": {\"worker\": [\"host1:port\", "
                             "\"host2:port\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}")
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        except RuntimeError as err:
            if "program startup" not in str(err):
                raise
            raise RuntimeError(
                "MultiWorkerMirroredStrategy must be created before TensorFlow starts: call "
                "hvdtrain.get_strategy('multi_worker_mirrored') at the top of the "
                "program, before creating any dataset or tensor; the Trainer then uses it") from err
    _strategies[name] = strategy
    return strategy


def resolve(strategy: Any) -> tf.distribute.Strategy:
    """``strategy`` itself if it is a Strategy, else this process's strategy of that name."""
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    return get_strategy(strategy)


def worker_index(strategy) -> tuple[int, int]:
    """(this worker's index, number of workers)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0, 1
    workers = len(resolver.cluster_spec().as_dict().get("worker", [])) \
        + len(resolver.cluster_spec().as_dict().get("chief", []))
    index = resolver.task_id or 0
    if resolver.task_type == "worker" and "chief" in resolver.cluster_spec().as_dict():
        index += 1
    return int(index), max(1, workers)


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The name ``strategy`` was created under by :func:`get_strategy`, else its class name."""
    return next((n for n, s in _strategies.items() if s is strategy), type(strategy).__name__)
