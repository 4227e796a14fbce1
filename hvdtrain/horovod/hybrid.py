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

The devices and the split are planned in :mod:`hvdtrain.horovod.hybrid_plan`
(its public names are importable from here too); this module runs the stages.
"""
from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from hvdtrain import program as building
from hvdtrain.horovod.hybrid_plan import (  # noqa: F401 - the public names
    HOST,
    ModelParallel,
    Stage,
    balanced_split,
    gpus_per_rank,
    local_devices,
    place,
    plan,
    resolve,
    same_device,
    use_cpu_devices,
)


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


class StagedProgram(building.ModelWithLoss):
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
