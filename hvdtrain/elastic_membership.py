"""What the Trainer does when Horovod's elastic driver changes the set of workers: reshard
the data, rescale the learning rate, and rerun the start-up collectives with a joining
worker (see :mod:`hvdtrain.backends.horovod.elastic`)."""
from __future__ import annotations

import logging

from hvdtrain import learning_rate

logger = logging.getLogger("hvdtrain")


class ElasticMembership:
    """Mixed into :class:`hvdtrain.Trainer`: its elastic members, which only the Horovod
    backend supports (others raise ``NotImplementedError`` naming the backend)."""

    def reshard(self) -> None:
        """Re-reads rank and world size after an elastic membership change and rebuilds
        what depends on them: the data shard and step counts, the learning-rate scale,
        the compiled step, and the position in the data (from ``global_step``)."""
        old_size = self.size
        self._backend.refresh_membership()
        self.rank, self.size = self._backend.rank, self._backend.size
        self._reporter.samples_per_step = self.batch_size * self.size
        new_scale = learning_rate.lr_scale_factor(self.size, self._lr_rule)
        if new_scale != self.lr_scale:
            learning_rate.scale_learning_rate(learning_rate.inner_optimizer(self.optimizer),
                                              new_scale / self.lr_scale)
            logger.info("world size %d -> %d: learning rate scaled by %g", old_size, self.size,
                        new_scale / self.lr_scale)
            self.lr_scale = new_scale
        self._setup_data()
        self._checkpointer.rebind()
        self._train_step = self._backend.make_train_step(self._step_program, self.optimizer,
                                                         self._step)
        self._pending, self._stop_checked_at = None, -1
        self._feed.seek(self.steps_per_epoch, self.global_step)

    def rejoin(self) -> None:
        """After an elastic restart, on a worker that kept training: runs the collectives a
        joining worker's constructor runs, in the same order, so both meet and the new
        worker gets rank 0's state. Keep in step with ``__init__``: a collective added
        there must be added here, or a joining worker hangs the job.

        1. the agreement on settings (:mod:`hvdtrain.agreement`);
        2. ``reshard()``: the shard-length agreement of ``setup_data`` (and everything
           else that depends on the world size);
        3. the checkpoint hand-shakes (nothing is restored: the state is in memory);
        4. the start-state broadcast (program, optimizer and step variables).
        """
        self._agree_on_start()
        self.reshard()
        self._checkpointer.replay_start_handshake()
        self._backend.share_start_state(self.state_variables, self._program)
        step = int(self._step.numpy())
        if step != self._global_step:  # rank 0 was at another step: follow it
            self._global_step = step
            self._feed.seek(self.steps_per_epoch, step)

    def resume_step_from_state(self) -> None:
        """Sets ``global_step`` from the step variable (after its value was put back)."""
        self._global_step = int(self._step.numpy()) // self._backend.step_units
