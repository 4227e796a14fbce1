"""The Trainer's start-up protocol: one ordered list of steps, written once.

A worker that starts runs every step of :data:`STEPS` (``Trainer.__init__``). After an
elastic restart, a worker that kept training runs the same list with nothing given
(``Trainer.rejoin``), so it meets a joining worker in the same collectives, in the same
order; a missed or reordered collective would hang the job. Each step runs its
collectives in both cases, and differs only in what it does around them: a worker
already training has its program, checkpointer and state in memory and reads no
checkpoint. A collective added to the start-up goes into one step here, and so reaches
the constructor, the rejoin and the checkpoint hand-shake at once.

The steps, in order:

1. ``agreement``: every rank's settings compared (the first collective of a start);
2. ``data``: this worker's pipeline and the shard-length agreement (on a rejoin,
   everything that depends on the world size: ``Trainer.reshard``);
3. ``build``: program, optimizer, step counter (no collective; nothing on a rejoin);
4. ``checkpointer``: rank 0 checks that it can write the checkpoint directory, every
   rank learns the verdict (the checkpointer's constructor, or its ``check_directory``);
5. ``restore``: rank 0 reads its newest good checkpoint, every rank learns which
   (on a rejoin nothing is read: ``restore_latest(replay=True)``);
6. ``start_state``: rank 0's variables broadcast to every worker;
7. ``position``: the global step read from the (broadcast) step variable.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import keras
import tensorflow as tf

from hvdtrain import learning_rate, options
from hvdtrain.trainer.evaluation import Evaluation


@dataclasses.dataclass
class Given:
    """What a starting worker builds from: the constructor's arguments for the program,
    the optimizer and validation (a rejoining worker has built them already)."""

    build_training_func: Callable | None
    model: Any
    loss: Any
    optimizer: Any
    optimizer_args: dict | None
    build_validation_func: Callable | None
    metrics: list
    #: the learning rate as configured, read before a checkpoint overwrites it
    configured_lr: float | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the start-up: ``run(trainer, given)``, with ``given=None`` on a rejoin."""

    name: str
    run: Callable[[Any, Given | None], None]


def _agreement(trainer, given: Given | None) -> None:
    agreed = trainer._agree_on_start()
    if given is not None:
        # rank 0's checkpoint settings are the job's (Horovod's rank-0-only idiom); the
        # options as given stay as they are
        trainer._agreed = agreed
        trainer._checkpointing = options.CheckpointOptions(**agreed.checkpoint)


def _data(trainer, given: Given | None) -> None:
    if given is None:
        trainer.reshard()
    else:
        trainer._setup_data()


def _build(trainer, given: Given | None) -> None:
    """Program, optimizer and step counter, created where the backend wants them."""
    if given is None:
        return
    backend, opts = trainer._backend, trainer.options
    element_spec = trainer._training_dataset.element_spec
    given_instance = isinstance(given.optimizer, keras.optimizers.Optimizer)
    with backend.scope():
        trainer._network, trainer._program = backend.build_program(
            given.build_training_func, given.model, given.loss, element_spec)
        optimizer = backend.adopt_optimizer(
            learning_rate.make_optimizer(given.optimizer, given.optimizer_args), given_instance)
        trainer._lr_rule = opts.learning_rate.rule
        trainer.lr_scale = learning_rate.lr_scale_factor(trainer.size, trainer._lr_rule)
        learning_rate.scale_learning_rate(
            optimizer, trainer.lr_scale,
            warmup_steps=opts.learning_rate.warmup_in_steps(trainer.steps_per_epoch))
        trainer.optimizer = backend.distribute_optimizer(optimizer)
        trainer._trainable = trainer._program.trainable_variables
        if not trainer._trainable:
            raise ValueError("the network has no trainable variables")
        trainer.optimizer.build(trainer._trainable)
        trainer._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    backend.after_build(trainer._program, trainer.optimizer)
    trainer._evaluation = Evaluation(backend, trainer._network, trainer._program, element_spec,
                                     given.build_validation_func, given.metrics,
                                     opts.data.batch_size)
    trainer._step_program = trainer._evaluation.training_program()


def _checkpointer(trainer, given: Given | None) -> None:
    if given is None:
        trainer._checkpointer.check_directory()
        return
    trainer._checkpointer = trainer._backend.checkpointer(  # checks the directory
        trainer._checkpointing, model=trainer._program, optimizer=trainer.optimizer,
        step=trainer._step)


def _restore(trainer, given: Given | None) -> None:
    if given is None:  # the state is in memory: nothing is read, the collectives run
        trainer._checkpointer.restore_latest(replay=True)
        return
    given.configured_lr = learning_rate.configured_rate(trainer.optimizer)
    trainer.restored_from = trainer._checkpointer.restore_latest()


def _start_state(trainer, given: Given | None) -> None:
    trainer._backend.share_start_state(trainer.state_variables, trainer._program)


def _position(trainer, given: Given | None) -> None:
    """The global step from the step variable: rank 0's, on a rejoin too (then the data
    position follows it when rank 0 was at another step)."""
    before = None if given is not None else trainer.global_step
    trainer.resume_step_from_state()
    if given is None:
        if trainer.global_step != before:
            trainer._feed.seek(trainer.steps_per_epoch, trainer.global_step)
    elif trainer.restored_from:
        trainer._after_restore(given.configured_lr)


#: The start-up protocol, in order (see the module docstring).
STEPS: tuple[Step, ...] = (
    Step("agreement", _agreement),
    Step("data", _data),
    Step("build", _build),
    Step("checkpointer", _checkpointer),
    Step("restore", _restore),
    Step("start_state", _start_state),
    Step("position", _position),
)


def run(trainer, given: Given | None) -> None:
    """Runs every step of :data:`STEPS` on ``trainer``: a start (``given``: the
    constructor's arguments) or a rejoin after an elastic restart (``None``). A sequence
    of collectives: every worker runs it at the same time."""
    for step in STEPS:
        step.run(trainer, given)
