"""hvdtrain: data-parallel training of TensorFlow 2 / Keras 3 models with Horovod.

The front door is :class:`Trainer`, which mirrors TensorLayer's distributed Trainer.
Importing the package is cheap; TensorFlow and Horovod load on first use of a name
that needs them.
"""
from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"


def _usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which launchers and container
    limits narrow), not every core the machine has."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: The TensorFlow thread variables hvdtrain set itself (the user's own are left alone).
_THREAD_ENV_SET: list = []


def _share_cores_before_tensorflow_starts() -> None:
    """Gives each local rank an equal share of the cores through TensorFlow's environment
    variables, which TensorFlow reads when its runtime starts. Setting them at import time
    still works when the user creates datasets or tensors before ``hvdtrain.init()``."""
    for key in ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(key, "").isdigit():
            local_size = max(1, int(os.environ[key]))
            break
    else:
        return
    threads = os.environ.get("HVDTRAIN_THREADS") or str(max(1, _usable_cores() // local_size))
    for key, value in (("TF_NUM_INTRAOP_THREADS", threads),
                       ("TF_NUM_INTEROP_THREADS", str(max(2, int(threads))))):
        if key not in os.environ:
            os.environ[key] = value
            _THREAD_ENV_SET.append(key)


def _restore_thread_environment() -> None:
    """Undoes :func:`_share_cores_before_tensorflow_starts` (for stock baselines)."""
    while _THREAD_ENV_SET:
        os.environ.pop(_THREAD_ENV_SET.pop(), None)


_share_cores_before_tensorflow_starts()

_LAZY = {
    "Trainer": "hvdtrain.trainer",
    "Callback": "hvdtrain.callbacks",
    "DistributedOptimizer": "hvdtrain.backends.horovod.optimizer",
    "Average": "hvdtrain.backends.horovod.collectives",
    "Sum": "hvdtrain.backends.horovod.collectives",
    "Adasum": "hvdtrain.backends.horovod.collectives",
    "Compression": "hvdtrain.backends.horovod.collectives",
    "init": "hvdtrain.backends.horovod.runtime",
    "rank": "hvdtrain.backends.horovod.runtime",
    "size": "hvdtrain.backends.horovod.runtime",
    "local_rank": "hvdtrain.backends.horovod.runtime",
    "is_root": "hvdtrain.backends.horovod.runtime",
    "ModelParallel": "hvdtrain.backends.horovod.hybrid",
    "get_strategy": "hvdtrain.backends.tfdist.strategies",
    "TaskSpecDef": "hvdtrain.backends.ps.cluster",
    "TaskSpec": "hvdtrain.backends.ps.cluster",
    "DistributedSession": "hvdtrain.backends.ps.session",
    "StopAtTimeHook": "hvdtrain.backends.ps.session",
    "ParameterServerTrainer": "hvdtrain.trainer",
}
#: Submodules reachable as attributes (``hvdtrain.keras``, ``hvdtrain.tfdist.get_strategy``);
#: the short names of modules that live inside a backend are kept for users' scripts.
_SUBMODULES = {
    "datasets": "hvdtrain.datasets", "keras": "hvdtrain.keras", "trainer": "hvdtrain.trainer",
    "data": "hvdtrain.data", "program": "hvdtrain.program", "checkpoint": "hvdtrain.checkpoint",
    "callbacks": "hvdtrain.callbacks", "options": "hvdtrain.options",
    "learning_rate": "hvdtrain.learning_rate", "precision": "hvdtrain.precision",
    "backends": "hvdtrain.backends", "cli": "hvdtrain.cli",
    "dist": "hvdtrain.backends.horovod.collectives",
    "elastic": "hvdtrain.backends.horovod.elastic",
    "hybrid": "hvdtrain.backends.horovod.hybrid",
    "compression": "hvdtrain.backends.horovod.compression",
    "tfdist": "hvdtrain.backends.tfdist",
    "cluster": "hvdtrain.backends.ps.cluster",
    "ps": "hvdtrain.backends.ps",
}

__all__ = sorted(_LAZY) + ["datasets", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")
