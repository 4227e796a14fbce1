"""Hybrid parallelism: the network split into stages on this rank's local devices,
Horovod data parallelism across ranks.

``Trainer(..., model=..., loss=..., model_parallel=...)`` splits the model into
contiguous stages, one per local device (this rank's GPUs, or logical CPU devices), and
places every stage's floating-point variables on its device. The forward pass runs each
stage under ``tf.device(its device)`` and the loss on the last stage's device; the
backward pass goes stage by stage in reverse, each under its own device, handing the
gradient of a stage's input to the stage before it. Optimizer slots are created next to
their variables and updates run there. Gradient reduction across ranks is the Trainer's
usual distributed-optimizer path, unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import keras
import tensorflow as tf

from hvdtrain import program as building

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
                    isinstance(i, int) and not isinstance(i, bool) for i in s):
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
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
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
                v._initialize(v.value.read_value())  # noqa: SLF001 - Keras 3.15 Variable init
            if not same_device(v.value.device, stage.device):
                raise RuntimeError(f"could not place {v.path} on {stage.device}: it is on "
                                   f"{v.value.device}")


class _Plan:
    """Holds the stages outside Keras's tracking, so checkpoints look as without stages."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        self.recording: _Recording | None = None


class _Recording:
    """What one forward pass inside a :class:`StagedTape` leaves for the staged backward:
    each stage's output and the cut (gradient-stopped, watched) copy the next stage reads."""

    def __init__(self, tape: tf.GradientTape) -> None:
        self.tape = tape
        self.calls = 0
        self.cuts: list[list[tuple]] = []

    def cut(self, h):
        pairs, flat = [], []
        for t in tf.nest.flatten(h):
            if tf.is_tensor(t) and t.dtype.is_floating:
                c = tf.stop_gradient(t)
                self.tape.watch(c)
                pairs.append((t, c))
                t = c
            flat.append(t)
        self.cuts.append(pairs)
        return tf.nest.pack_sequence_as(h, flat)


class StagedProgram(building._ModelWithLoss):  # noqa: SLF001 - same program form
    """``[x, y] -> {"loss": ...}`` running each stage on its device, the loss on the last."""

    def __init__(self, network: keras.Model, loss_fn, stages: Sequence[Stage]) -> None:
        super().__init__(network, loss_fn)
        self._plan = _Plan(stages)

    @property
    def stages(self) -> list[Stage]:
        """The stages, in call order."""
        return list(self._plan.stages)

    def call(self, inputs, training=False):
        x, y = inputs
        rec = self._plan.recording
        if rec is not None and not keras.backend.is_keras_tensor(x):
            rec.calls += 1
            rec.cuts = []
        else:
            rec = None
        h = x
        for i, stage in enumerate(self._plan.stages):
            with tf.device(stage.device):
                if i and rec is not None:
                    h = rec.cut(h)
                for layer in stage.layers:
                    h = layer(h, training=training)
        with tf.device(self._plan.stages[-1].device):
            return {building.LOSS_KEY: keras.ops.mean(self.loss_fn(y, h))}


class StagedTape:
    """A ``tf.GradientTape`` for a :class:`StagedProgram`: ``gradient`` runs the backward
    stage by stage in reverse, each under its stage's device."""

    def __init__(self, program: StagedProgram) -> None:
        self._program = program
        self._tape = tf.GradientTape(persistent=True)
        self._rec = None

    def __enter__(self) -> "StagedTape":
        self._tape.__enter__()
        self._rec = self._program._plan.recording = _Recording(self._tape)
        return self

    def __exit__(self, *exc) -> None:
        self._program._plan.recording = None
        self._tape.__exit__(*exc)

    def gradient(self, target, sources) -> list:
        """Gradients of the scalar ``target`` for ``sources`` (the program's variables)."""
        rec = self._rec
        if rec is None or rec.calls != 1:
            raise RuntimeError("the staged program must be called exactly once inside its tape, "
                               f"was called {0 if rec is None else rec.calls} times")
        stages = self._program.stages
        owner = {id(v): i for i, s in enumerate(stages) for v in s.variables}
        last = len(stages) - 1
        # Besides through the next stage's input, the target reaches a stage's variables
        # directly only through added losses (regularizers); then it is a target there too.
        direct = bool(self._program.losses)
        grads: dict[int, Any] = {}
        upstream: list[tuple] = []  # (stage output, gradient of the target for it)
        for i in range(last, -1, -1):
            own = [v for v in sources if owner.get(id(v), last) == i]
            cut_in = [c for _, c in rec.cuts[i - 1]] if i else []
            if i == last:
                targets, out_grads = [target], None
            else:
                pairs = [(t, g) for t, g in upstream if g is not None]
                targets, out_grads = [t for t, _ in pairs], [g for _, g in pairs]
                if direct:
                    targets.append(target)
                    out_grads.append(tf.ones_like(target))
            if not targets or not (own or cut_in):
                upstream = []
                continue
            with tf.device(stages[i].device):
                result = self._tape.gradient(targets, cut_in + own, output_gradients=out_grads)
            for v, g in zip(own, result[len(cut_in):]):
                grads[id(v)] = g
            upstream = [(t, g) for (t, _), g in zip(rec.cuts[i - 1], result)] if i else []
        del self._tape
        return [grads.get(id(v)) for v in sources]


def tape_for(program: keras.Model):
    """The tape the Trainer's step records under: staged for a staged program."""
    return StagedTape(program) if isinstance(program, StagedProgram) else tf.GradientTape()


def model_program(model: Any, loss: Any, element_spec, model_parallel: ModelParallel,
                  build_training_func: Any = None) -> tuple:
    """The Trainer's network and program with the network split over local devices.

    Returns:
        ``(network, program)``: the ``keras.Sequential`` and a :class:`StagedProgram`.

    Raises:
        ValueError: a build function was given (model parallelism needs ``model=``), or
            the devices, stages or split are wrong (see :func:`plan`).
    """
    if build_training_func is not None or model is None:
        raise ValueError("model_parallel needs model=... (a keras.Sequential, or a list of "
                         "stages) and loss=...; the build-function path builds one graph that "
                         "cannot be split into stages")
    devices = local_devices(model_parallel)
    network, stages = plan(model, model_parallel, devices, element_spec)
    loss_fn = building.model_program(network, loss, element_spec).loss_fn  # checks the loss
    place(stages)
    return network, StagedProgram(network, loss_fn, stages)
