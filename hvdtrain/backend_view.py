"""What the Trainer shows of its backend: the strategy, the workers, the dtype policy,
the steps applied and skipped, where the variables live."""
from __future__ import annotations

import keras
import tensorflow as tf


class BackendView:
    """Read-only facts of a Trainer's backend (a mixin of :class:`hvdtrain.Trainer`, which
    sets ``_backend``, ``_step``, ``_program``, ``optimizer`` and ``size``)."""

    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        """The ``tf.distribute.Strategy`` of the backend (``None`` for Horovod)."""
        return self._backend.strategy

    @property
    def num_workers(self) -> int:
        """Processes taking part (``size`` counts replicas, which may be more)."""
        return self._backend.num_workers

    @property
    def skipped_steps(self) -> int:
        """Steps whose update was skipped for a non-finite loss (``nan_policy``)."""
        return getattr(self._backend, "skipped_steps", 0)

    @property
    def mixed_precision(self) -> str:
        """The dtype policy the network was built under."""
        return getattr(self._backend, "mixed_precision", keras.mixed_precision.global_policy().name)

    @property
    def worker_steps(self) -> int:
        """Steps applied by all workers together, read from the step counter (on parameter
        servers the workers count them as they apply their updates)."""
        return int(self._step.numpy()) * self.size // self._backend.step_units

    @property
    def variable_devices(self) -> dict:
        """``{variable path: device}`` of the model's and optimizer's variables."""
        return {v.path: v.value.device for v in
                list(self._program.variables) + list(self.optimizer.variables)}
