"""Elastic training: the Trainer keeps going when workers leave or join.

Launch with Horovod's elastic driver (Gloo), e.g.::

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover_hosts.sh \\
        python train.py

and, in ``train.py``, build the Trainer as usual and hand it to :func:`run` instead of
looping yourself::

    from hvdtrain.horovod import elastic

    trainer = hvdtrain.Trainer(dataset, build, keras.optimizers.Adam, {"learning_rate": 1e-3})
    elastic.run(trainer, commit_steps=50)

Every ``commit_steps`` steps the model and optimizer variables and the global step are
copied to host memory (a *commit*), and the driver's news about added or removed hosts
is checked. When a worker dies, the survivors roll back to the last commit; when hosts
are added or removed, the workers stop at the commit. Either way Horovod is restarted
with the new membership, the Trainer is resharded for the new world size (data shard,
step counts, learning-rate scale, compiled step, data position from the global step)
and training continues.

How a joining worker catches up: it simply runs the training script, so its Trainer
constructor performs the Trainer's start-up collectives (the agreement on shard lengths,
the checkpoint hand-shake, the broadcast of every variable and the global step from rank
0). The workers already running replay exactly those collectives right after the restart
(:meth:`hvdtrain.Trainer.rejoin`), so everyone meets in the same collectives and the
newcomer ends up with rank 0's state. Rank 0 is always a worker that was already running
(Horovod keeps the host order and drops failed hosts), so the state comes from a commit.

Rules for the training script: no collective of its own (``broadcast_object``,
``allreduce`` ...) before :func:`run`, neither before nor after ``Trainer(...)``, since a
joining worker would run it while the others do not. ``max_iteration`` keeps TensorLayer's meaning (``max_iteration // size``
steps per rank), so a run that changes size ends at the step count of its final size.

Horovod blacklists a *host* when one of its workers fails, so each worker that may be
killed needs a host entry of its own in the discovery output (on one machine, names such
as ``localhost`` and ``127.0.0.1`` count as different hosts); see
``scripts/discover_hosts.sh``. With a single host, pass ``--network-interface lo`` (the
elastic driver otherwise wants two hosts to find their common network interfaces).
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from hvdtrain import checks
from hvdtrain.horovod import elastic_runtime
from hvdtrain.horovod import optimizer as distributed

logger = logging.getLogger("hvdtrain")


class TrainerState(elastic_runtime.ElasticState):
    """A Trainer's elastic state: program and optimizer variables and the global step.

    ``save()`` (called by ``commit()``) keeps numpy copies in host memory, ``restore()``
    assigns them back after a failed collective, and ``sync()`` brings every worker to rank
    0's state after a restart (see :meth:`hvdtrain.Trainer.rejoin`).

    Attributes:
        resets: restarts this worker went through.
        sizes: the world sizes this worker trained at, in order.
        committed_step: the global step of the last commit.
    """

    def __init__(self, trainer) -> None:
        if distributed.is_distributed(trainer.optimizer) and \
                distributed.exchanger_of(trainer.optimizer).settings.shard_optimizer:
            raise ValueError("shard_optimizer=True does not work with elastic training yet: "
                             "each rank's slice of the optimizer state is laid out for a "
                             "fixed world size")
        super().__init__()
        self.trainer = trainer
        self._variables = trainer.state_variables
        self._values: list[np.ndarray] = []
        self.committed_step = -1
        self.resets = 0
        self.sizes = [trainer.size]
        self._restarted = False
        self.save()

    def save(self) -> None:
        """Copies the variables and the step to host memory (a commit)."""
        self._values = [np.array(v.numpy(), copy=True) for v in self._variables]
        self.committed_step = self.trainer.global_step

    def restore(self) -> None:
        """Puts back the last commit, undoing the steps taken since."""
        for var, value in zip(self._variables, self._values):
            var.assign(value)
        self.trainer.resume_step_from_state()

    def reset(self) -> None:
        """Horovod was restarted with a new membership (called before reset callbacks)."""
        self.resets += 1
        self._restarted = True

    def sync(self) -> None:
        """Brings this worker to rank 0's state: a no-op for a worker whose Trainer was
        just built (its constructor did it), the start-up collectives for one that was
        restarted."""
        with elastic_runtime.collective_failures_as_internal_errors():
            self.catch_up()
        self.save()

    def catch_up(self) -> None:
        """After a restart: reshard the Trainer and re-run its start-up collectives."""
        if not self._restarted:
            return
        old_size = self.sizes[-1]
        self.trainer.rejoin()
        self._restarted = False
        if self.trainer.size != old_size:
            self.sizes.append(self.trainer.size)
        if self.trainer.rank == 0:
            logger.info("elastic restart %d: world size %d -> %d, continuing at step %d",
                        self.resets, old_size, self.trainer.size, self.trainer.global_step)


def run(trainer, *, commit_steps: int = 100,
        on_commit: Callable[[TrainerState], None] | None = None,
        on_reset: Callable[[TrainerState], None] | None = None) -> TrainerState:
    """Trains ``trainer`` to the end under Horovod's elastic driver.

    Works unchanged without it (``python train.py`` or a fixed ``horovodrun``): commits
    then only cost a copy and one small broadcast.

    Args:
        trainer: a :class:`hvdtrain.Trainer` that has not started training.
        commit_steps: commit (copy the state to host memory and check for added or removed
            hosts) every this many global steps. A failure loses at most this many steps;
            a new host waits at most this many steps to join.
        on_commit: called after each commit with the state (on every rank).
        on_reset: called after each restart, once the worker is in step with rank 0.

    Returns:
        The final :class:`TrainerState` (``resets``, ``sizes``, ``committed_step``).
    """
    checks.positive_int(commit_steps, "commit_steps")
    if trainer.started:
        raise ValueError("hvdtrain.elastic.run needs a Trainer that has not started training")
    state = TrainerState(trainer)
    reported = [0]

    def train(state: TrainerState) -> int:
        if state._restarted:  # hosts were only removed: Horovod skips sync(), catch up here
            state.catch_up()
            state.save()
        if state.resets > reported[0]:
            reported[0] = state.resets
            if on_reset is not None:
                on_reset(state)
        while not trainer.should_stop():
            trainer.train_on_batch()
            if trainer.global_step % commit_steps == 0:
                state.commit()
                if on_commit is not None:
                    on_commit(state)
        return trainer.global_step

    elastic_runtime.elastic_run(train)(state)
    return state
