"""The interface between the one Trainer loop and a way of running data-parallel steps.

A backend answers who this process is (``rank``, ``size``), agrees on flags and sums
numbers across workers, creates variables where they must live (``scope``), feeds each
worker its batches, builds and runs the training step, and saves and restores state. The
:class:`hvdtrain.Trainer` owns everything else: arguments, program building, learning-rate
scaling, the loop, epochs, validation means, logging, callbacks and checkpoint cadence.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf

from hvdtrain import data
from hvdtrain import program as programs


class Backend:
    """Base class: the single-process behaviour, which subclasses override.

    Attributes:
        name: the strategy name (``"horovod"``, ``"mirrored"``, ...).
        rank: this process's index among the workers; 0 is the chief (it logs and keeps
            the checkpoints).
        size: replicas training in parallel: the learning rate is scaled by it and each
            replica runs ``max_iteration // size`` steps.
        num_workers: processes taking part (``size`` counts replicas, which may be more).
        step_units: increments of the step counter per global step.
        unit: what ``size`` counts, for messages ("ranks", "replicas", "workers").
        strategy: the ``tf.distribute.Strategy``, where there is one.
    """

    name = "base"
    rank = 0
    size = 1
    num_workers = 1
    step_units = 1
    unit = "ranks"
    strategy = None
    #: Whether only one process decides stops (no agreement is needed to read a flag).
    single_decider = False
    #: Whether the training steps run in this process (their logs are tensors here, and
    #: they can feed the Trainer's metrics).
    local_steps = True
    #: This worker's preemption request (set by the Trainer): ``.requested`` is True once a
    #: signal arrived (see :class:`hvdtrain.preemption.SignalWatch`).
    stop_request = None

    def describe(self) -> str:
        """One line for the Trainer's first log line: the backend and its workers."""
        return f"strategy={self.name!r}: {self.size} {self.unit}"

    # ------------------------------------------------------------------ collectives
    def agree_any(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is True on any (a collective: every worker
        must call it at the same point)."""
        return bool(flag)

    def sum_over_workers(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` summed key by key over every worker (a collective)."""
        return dict(values)

    def allgather_object(self, obj: Any) -> list:
        """Every worker's picklable ``obj``, in worker order (a collective)."""
        return [obj]

    # ------------------------------------------------------------------ building
    def scope(self):
        """Where the program's, optimizer's and step's variables are created."""
        return contextlib.nullcontext()

    def build_program(self, build_training_func: Callable | None, model: Any, loss: Any,
                      element_spec) -> tuple:
        """``(network, program)`` from a build function or a model and loss (in ``scope``)."""
        if model is not None:
            return model, programs.model_program(model, loss, element_spec)
        return programs.build_training_program(build_training_func, element_spec)

    def adopt_optimizer(self, optimizer: keras.optimizers.Optimizer,
                        given_instance: bool) -> keras.optimizers.Optimizer:
        """The optimizer to train with, called in ``scope``; ``given_instance`` says the
        user passed an instance made outside it."""
        return optimizer

    def distribute_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """Wraps the (learning-rate scaled) optimizer for this backend's reduction."""
        return optimizer

    def after_build(self, program: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
        """Checks or adjusts what was built, once, before any state is restored."""

    # ------------------------------------------------------------------ data
    def setup_data(self, dataset: tf.data.Dataset, options) -> int | None:
        """Prepares this worker's pipeline; returns the steps per epoch every worker can
        take (-1: infinite; ``None``: unknown, agreed step by step with
        :meth:`next_agreed`)."""
        raise NotImplementedError

    def open_iterator(self, epoch: int, skip: int, num_epochs: int) -> Iterator:
        """Batches from ``skip`` steps into ``epoch`` to the end of the last epoch (one
        epoch when the length is unknown)."""
        raise NotImplementedError

    def next_agreed(self, iterator) -> Any:
        """The next batch, or ``None`` once any worker's data ended (a collective)."""
        return next(iterator, None)

    # ------------------------------------------------------------------ steps
    def make_train_step(self, program: keras.Model, optimizer: keras.optimizers.Optimizer,
                        step: tf.Variable) -> Callable:
        """``f(batch, global_step) -> logs`` (a dict of tensors) that trains one step on
        every worker and adds ``step_units`` to ``step``."""
        raise NotImplementedError

    def settle(self, global_step: int) -> None:
        """Reads back what the steps since the last call decided on the device (a stop
        agreed, updates skipped for a non-finite loss): called by the Trainer on every
        worker at the same steps (every ``min(log_step_size, 10)``) and when training ends."""

    def preemption_agreed(self) -> bool:
        """After a step: True on every worker once any worker's ``stop_request`` was set (a
        collective; a backend whose step carries the request reads its result instead)."""
        return self.agree_any(bool(self.stop_request is not None and self.stop_request.requested))

    def join(self) -> None:
        """Waits for the steps scheduled so far (steps are synchronous unless overridden)."""

    def evaluation_shard(self) -> tuple[int, int]:
        """``(shards, index)``: the part of a dataset this worker evaluates or predicts."""
        return self.num_workers, self.rank

    def evaluate(self, program: keras.Model, dataset: tf.data.Dataset,
                 batch_size: int) -> tuple[dict, float]:
        """``(sums, count)``: each output of ``program`` summed over every example of
        ``dataset`` on every worker, and the number of examples (a collective). The one
        evaluate loop; a backend gives its batches (:meth:`evaluation_batches`), its step
        (:meth:`evaluation_step`) and how the sums meet (:meth:`evaluation_totals`)."""
        key = (batch_size, self.evaluation_shard())
        cached = self._evaluation
        if not (made_for(cached, program, dataset) and cached[2] == key):
            cached = self._evaluation = (program, dataset, key,
                                         self.evaluation_batches(dataset, batch_size),
                                         tf.function(self.evaluation_step(program)))
        _, _, _, batches, step = cached
        sums, count = {k: 0.0 for k in program.output_keys}, 0.0
        for batch in batches:
            weighted, n = step(batch)
            for k in sums:
                sums[k] += float(weighted[k])
            count += float(n)
        totals = self.evaluation_totals({**sums, _COUNT: count})
        return {k: totals[k] for k in sums}, totals[_COUNT]

    _evaluation = None  # (program, dataset, (batch size, shard), batches, step)

    def evaluation_batches(self, dataset: tf.data.Dataset, batch_size: int):
        """This worker's batches of ``dataset`` for :meth:`evaluate` (its
        :meth:`evaluation_shard`)."""
        shards, index = self.evaluation_shard()
        return data.shard_and_batch(dataset, num_shards=shards, index=index,
                                    batch_size=batch_size, prefetch_size=2)

    def evaluation_step(self, program: keras.Model) -> Callable:
        """``f(batch) -> ({output: sum over the batch's examples}, examples)``."""
        return lambda batch: weighted_outputs(program, *batch)

    def evaluation_totals(self, sums: dict[str, float]) -> dict[str, float]:
        """The evaluation's sums over every worker (a collective)."""
        return self.sum_over_workers(sums)

    # ------------------------------------------------------------------ state
    def checkpointer(self, options, **objects):
        """An object with ``restore_latest()``, ``maybe_save(step, meta)``,
        ``save(step, **meta)``, ``close()`` and ``restored_manifest``, keeping
        ``objects`` (see :class:`hvdtrain.checkpoint.Checkpointer`); for elastic
        training also ``check_directory()``, ``restore_latest(replay=True)`` and
        ``rebind()`` (see :mod:`hvdtrain.trainer.startup`)."""
        raise NotImplementedError

    def share_start_state(self, variables: list, program: keras.Model) -> None:
        """Makes every worker start from the chief's state (a collective)."""

    # ------------------------------------------------------------------ run
    def session_for(self, trainer):
        """What ``trainer.session`` is: an object whose ``should_stop()`` is the Trainer's."""
        return _Session(trainer)

    def on_train_begin(self) -> None:
        """Called once before the first step."""

    def on_train_end(self, global_step: int) -> None:
        """Called once after the last step and the final checkpoint."""

    def refresh_membership(self) -> None:
        """Re-reads rank and size after an elastic restart (Horovod only)."""
        raise NotImplementedError(f"elastic training needs strategy='horovod', not {self.name!r}")


_COUNT = "\0count"  # the examples, summed beside the outputs (no output's name)


def weighted_outputs(program: keras.Model, x, y) -> tuple[dict, tf.Tensor]:
    """``program``'s outputs in inference mode, each times the batch's examples (an empty
    batch gives zeros), and the examples: what :meth:`Backend.evaluate` sums."""
    out = program([x, y], training=False)
    n = tf.cast(tf.shape(y)[0], tf.float32)
    return {k: tf.where(n > 0, tf.cast(v, tf.float32) * n, 0.0) for k, v in out.items()}, n


def made_for(cached: tuple | None, *keys) -> bool:
    """Whether a cache entry ``(*keys, ...)`` was made for these objects (by identity)."""
    return cached is not None and all(c is k for c, k in zip(cached, keys))


def recreated_in_scope(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """A fresh optimizer of the same class and configuration, so that its variables are
    created in the current strategy scope, not where the user made the instance."""
    return type(optimizer).from_config(optimizer.get_config())


class _Session:
    """The TensorLayer-style ``trainer.session``: only ``should_stop()`` is meaningful."""

    def __init__(self, trainer) -> None:
        self._trainer = trainer

    def should_stop(self) -> bool:
        """True once training has ended on every worker (a collective, see
        :meth:`hvdtrain.Trainer.should_stop`)."""
        return self._trainer.should_stop()
