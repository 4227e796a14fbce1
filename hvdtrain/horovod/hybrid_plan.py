"""Model parallelism inside a rank, planning: which local devices the stages use, how
the network is split into contiguous stages, and placing each stage's variables.

:mod:`hvdtrain.horovod.hybrid` runs the planned stages (forward and backward).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import keras
import tensorflow as tf

from hvdtrain import checks, program as building
from hvdtrain.internals import keras_private

HOST = "/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class ModelParallel:
    """How to split the network over this rank's devices.

    Args:
        devices: a number ``k`` of local devices (this rank's first ``k`` GPUs, or logical
            CPU devices when there is no GPU), or device names such as
            ``["/GPU:0", "/GPU:1"]``. GPU numbers count this rank's GPUs: with ``k`` GPUs
            per rank, local rank ``r`` is given the node's GPUs ``[r*k, r*k + k)``.
        split: for a ``keras.Sequential``, the index of the first layer of every stage
            after the first (``len(devices) - 1`` increasing numbers); ``None`` balances
            the stages by parameter count.
    """

    devices: int | Sequence[str]
    split: Sequence[int] | None = None

    def __post_init__(self) -> None:
        d = self.devices
        if isinstance(d, bool) or not isinstance(d, (int, list, tuple)):
            raise TypeError("model_parallel devices must be a number of local devices or a list "
                            f"of device names like ['/GPU:0', '/GPU:1'], got {d!r}")
        if isinstance(d, int) and d < 1:
            raise ValueError(f"model_parallel devices must be at least 1, got {d}")
        if isinstance(d, (list, tuple)):
            if not d or not all(isinstance(n, str) and n for n in d):
                raise ValueError("model_parallel devices must be a non-empty list of device names "
                                 f"like ['/GPU:0', '/GPU:1'], got {list(d)!r}")
            object.__setattr__(self, "devices", tuple(d))
        if self.split is not None:
            s = self.split
            if not isinstance(s, (list, tuple)) or not all(
                    checks.is_integer(i) for i in s):
                raise TypeError(f"model_parallel split must be a list of layer indices, got {s!r}")
            object.__setattr__(self, "split", tuple(s))

    @property
    def num_stages(self) -> int:
        """Stages (one per device)."""
        return self.devices if isinstance(self.devices, int) else len(self.devices)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: its device (canonical name) and its layers, in call order."""

    device: str
    layers: tuple

    @property
    def variables(self) -> list:
        """The stage's variables (each once)."""
        seen, out = set(), []
        for layer in self.layers:
            for v in layer.variables:
                if id(v) not in seen:
                    seen.add(id(v))
                    out.append(v)
        return out


def resolve(model_parallel: Any) -> ModelParallel | None:
    """Turns the Trainer's ``model_parallel`` argument into a :class:`ModelParallel`.

    Raises:
        TypeError: anything but ``None``, an int, a list of device names or a ModelParallel.
    """
    if model_parallel is None or isinstance(model_parallel, ModelParallel):
        return model_parallel
    if isinstance(model_parallel, (int, list, tuple)) and not isinstance(model_parallel, bool):
        return ModelParallel(devices=model_parallel)
    raise TypeError("model_parallel must be None, a number of local devices, a list of device "
                    "names (e.g. ['/GPU:0', '/GPU:1']) or hvdtrain.ModelParallel(...), got "
                    f"{type(model_parallel).__name__}")


def gpus_per_rank(mp: ModelParallel | None) -> int:
    """How many of the node's GPUs each rank is pinned to (see ``dist.init``)."""
    if mp is None:
        return 1
    if isinstance(mp.devices, int):
        return mp.devices
    gpus = [_spec(n) for n in mp.devices]
    return max([s.device_index + 1 for s in gpus if s.device_type == "GPU"] or [1])


def use_cpu_devices(n: int) -> list[str]:
    """Splits the host CPU into ``n`` logical devices (call before TensorFlow starts).

    Returns:
        The device names, ``["/device:CPU:0", ...]``.

    Raises:
        RuntimeError: TensorFlow already started with another number of CPU devices.
    """
    checks.positive_int(n, "n")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError as err:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != n:
            raise RuntimeError(f"cannot make {n} logical CPU devices: TensorFlow already started "
                               f"with {have}; call hvdtrain.hybrid.use_cpu_devices({n}) before "
                               "creating any tensor or dataset") from err
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def _spec(name: str) -> tf.DeviceSpec:
    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model_parallel device {name!r} is not a device name like '/GPU:0' or "
                         f"'/CPU:1': {err}") from None
    if spec.device_type is None or spec.device_index is None:
        raise ValueError(f"model_parallel device {name!r} must name a device type and number, "
                         "like '/GPU:0' or '/CPU:1'")
    if spec.job not in (None, "localhost") or spec.task not in (None, 0):
        raise ValueError(f"model_parallel device {name!r} must be a local device of this rank")
    return spec


def local_devices(mp: ModelParallel) -> list[str]:
    """The canonical names of the stage devices, checked against this process's devices.

    Raises:
        ValueError: a device does not exist, is listed twice, or there are too few.
    """
    present = {(s.device_type, s.device_index): d.name for d in tf.config.list_logical_devices()
               for s in [tf.DeviceSpec.from_string(d.name)] if s.device_index is not None}
    if isinstance(mp.devices, int):
        k = mp.devices
        gpus = tf.config.list_logical_devices("GPU")
        cpus = tf.config.list_logical_devices("CPU")
        pool, kind = (gpus, "GPU") if gpus else (cpus, "CPU")
        if len(pool) < k:
            hint = (f"pin {k} GPUs per rank (the Trainer does so when it initializes Horovod; "
                    f"hvdtrain.init(gpus_per_rank={k}) when you initialize first)" if gpus else
                    f"make logical CPU devices with hvdtrain.hybrid.use_cpu_devices({k}) before "
                    "TensorFlow starts")
            raise ValueError(f"model_parallel={k} needs {k} local devices, but this rank has "
                             f"{len(pool)} {kind} device(s): {hint}")
        return [_canonical(d.name) for d in pool[:k]]
    out = []
    for name in mp.devices:
        spec = _spec(name)
        key = (spec.device_type, spec.device_index)
        if key not in present:
            raise ValueError(f"model_parallel device {name!r} does not exist on this rank; it has "
                             f"{sorted(present.values())}")
        canonical = _canonical(present[key])
        if canonical in out:
            raise ValueError(f"model_parallel lists device {name!r} more than once")
        out.append(canonical)
    return out


def _canonical(name: str) -> str:
    s = tf.DeviceSpec.from_string(name)
    return f"/device:{s.device_type}:{s.device_index}"


def same_device(a: str, b: str) -> bool:
    """True when two device strings name the same device type and number."""
    sa, sb = tf.DeviceSpec.from_string(a or HOST), tf.DeviceSpec.from_string(b or HOST)
    return (sa.device_type, sa.device_index) == (sb.device_type, sb.device_index)


def balanced_split(counts: Sequence[int], k: int) -> list[int]:
    """Contiguous split of layers with ``counts`` parameters into ``k`` non-empty stages
    whose largest stage is as small as possible.

    Among equally good splits, each boundary is as late as possible, so a layer without
    parameters (dropout, activation) stays with the layer before it.

    Returns:
        The index of the first layer of stages ``1 .. k-1``.
    """
    n = len(counts)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} layers into {k} non-empty stages")
    prefix = [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest largest-stage for the first i layers in j stages
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            best[j][i] = min(max(best[j - 1][s], prefix[i] - prefix[s]) for s in range(j - 1, i))
    starts, end = [], n
    for j in range(k, 1, -1):
        s = max(s for s in range(j - 1, end)
                if max(best[j - 1][s], prefix[end] - prefix[s]) <= best[k][n])
        starts.append(s)
        end = s
    return starts[::-1]


def plan(model: Any, mp: ModelParallel, devices: Sequence[str], element_spec) -> tuple:
    """The network and its stages, one per device, built (on the host when not yet).

    Returns:
        ``(network, stages)``: a ``keras.Sequential`` (the one given, or one holding the
        given stages) and a list of :class:`Stage`.

    Raises:
        ValueError / TypeError: naming ``model`` or ``model_parallel`` and what is wrong.
    """
    k = len(devices)
    if isinstance(model, (list, tuple)):
        if mp.split is not None:
            raise ValueError("model_parallel split applies to a keras.Sequential model; model is "
                             "already a list of stages")
        if len(model) != k:
            raise ValueError(f"model has {len(model)} stages but model_parallel gives {k} "
                             f"device(s) {list(devices)}: give one device per stage")
        for i, stage in enumerate(model):
            if not isinstance(stage, keras.layers.Layer):
                raise TypeError(f"model[{i}] must be a Keras layer or model (a stage), got "
                                f"{type(stage).__name__}")
            if isinstance(stage, keras.Sequential) and not stage.layers:
                raise ValueError(f"model[{i}] is an empty stage (a Sequential without layers)")
        network = keras.Sequential(list(model), name="hvdtrain_stages")
        groups = [[s] for s in model]
    elif isinstance(model, keras.Sequential):
        network, layers = model, list(model.layers)
        if not layers:
            raise ValueError("model is an empty keras.Sequential: nothing to split into stages")
        if len(layers) < k:
            raise ValueError(f"model has {len(layers)} layer(s), too few for {k} stages (one "
                             f"per model_parallel device {list(devices)}): each stage needs a layer")
        groups = None
    else:
        raise TypeError("model_parallel needs model= as a keras.Sequential (split into stages) or "
                        "a list of Keras layers, one per stage; got "
                        f"{type(model).__name__}: pass its parts as a list of stages")
    if not network.built:
        x, _ = building.symbolic_inputs(element_spec)
        with tf.device(HOST):  # on the host; each stage is then moved to its device
            network(x)
    if groups is None:
        if mp.split is None:
            starts = balanced_split([layer.count_params() for layer in layers], k)
        else:
            starts = list(mp.split)
            if len(starts) != k - 1 or starts != sorted(set(starts)) or not all(
                    0 < s < len(layers) for s in starts):
                raise ValueError(f"model_parallel split must be {k - 1} increasing layer indices "
                                 f"in 1..{len(layers) - 1} (first layer of stages 1..{k - 1}), "
                                 f"got {list(starts)}: every stage needs a layer")
        bounds = [0, *starts, len(layers)]
        groups = [layers[a:b] for a, b in zip(bounds, bounds[1:])]
    stages = [Stage(d, tuple(g)) for d, g in zip(devices, groups)]
    _check_not_shared(stages)
    return network, stages


def _check_not_shared(stages: Sequence[Stage]) -> None:
    owner = {}
    for i, stage in enumerate(stages):
        for v in stage.variables:
            if id(v) in owner and owner[id(v)] != i:
                raise ValueError(f"variable {v.path} is shared by stages {owner[id(v)]} and {i}: "
                                 "put the layers that share it in one stage")
            owner[id(v)] = i


def place(stages: Sequence[Stage]) -> None:
    """Moves every stage's floating-point variables onto its device.

    A variable not yet there gets a new ``tf.Variable`` on the device holding its value
    (Keras 3's own initialization path). Integer state (dropout seeds) stays on the host:
    stateless random ops read their seeds from host memory on every device.
    """
    for stage in stages:
        for v in stage.variables:
            if not keras.backend.is_float_dtype(v.dtype) or same_device(v.value.device, stage.device):
                continue
            with tf.device(stage.device):
                keras_private.reinitialize_variable(v, v.value.read_value())
            if not same_device(v.value.device, stage.device):
                raise RuntimeError(f"could not place {v.path} on {stage.device}: it is on "
                                   f"{v.value.device}")
