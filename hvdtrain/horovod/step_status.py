"""What the compiled training step decided, kept on the device and read only when the
Trainer settles (every ``min(log_step_size, 10)`` steps and at the end of training), so
the Python loop can run ahead of the device instead of waiting for a flag after every
step.

The step records there: how many updates it skipped for a non-finite loss (every rank
sees the same mean loss, so they agree), the first such step and whether this rank's
own loss was the non-finite one, and whether a preemption stop was agreed. Under
``nan_policy="stop"`` the first non-finite step also halts the updates, so the weights
stay those from before it until the host reads the flag and raises.
"""
from __future__ import annotations

import logging

import tensorflow as tf

logger = logging.getLogger("hvdtrain")

_SKIPPED, _FIRST_BAD, _BAD_HERE, _STOP = range(4)
_CLEAR = [0, -1, 0, 0]


class StepStatus:
    """Device-held flags of the training steps (one small int64 vector).

    Args:
        rank: this rank (for messages).
        nan_policy: ``"stop"``, ``"skip"`` or ``"ignore"``.
        allgather_object: gathers a Python object from every rank (names the bad ranks).
    """

    def __init__(self, rank: int, nan_policy: str, allgather_object) -> None:
        self.rank, self.nan_policy = rank, nan_policy
        self._allgather = allgather_object
        with tf.device("/CPU:0"):  # read by the host; a few bytes copied per step
            self._flags = tf.Variable(_CLEAR, dtype=tf.int64, trainable=False,
                                      name="hvdtrain_step_status")
        self.skipped_steps = 0
        self.stop_agreed = False

    # ------------------------------------------------------------------ in the step
    def halted(self) -> tf.Tensor:
        """True once a non-finite step was recorded under ``nan_policy="stop"``."""
        if self.nan_policy != "stop":
            return tf.constant(False)
        return self._flags[_FIRST_BAD] >= 0

    def record(self, step: tf.Tensor, mean_finite: tf.Tensor, local_finite: tf.Tensor,
               stopping: tf.Tensor):
        """Traced in the step: counts a skipped update and remembers the first one."""
        flags = self._flags.read_value()
        bad = tf.logical_not(mean_finite)
        first = tf.logical_and(bad, flags[_FIRST_BAD] < 0)
        new = tf.stack([
            flags[_SKIPPED] + tf.cast(bad, tf.int64),
            tf.where(first, tf.cast(step, tf.int64), flags[_FIRST_BAD]),
            tf.where(first, tf.cast(tf.logical_not(local_finite), tf.int64), flags[_BAD_HERE]),
            tf.maximum(flags[_STOP], tf.cast(stopping, tf.int64)),
        ])
        return self._flags.assign(new)

    # ------------------------------------------------------------------ on the host
    def settle(self) -> None:
        """Reads the flags (one device read; every rank at the same step): a stop
        agreed, skipped updates logged (``"skip"``) or raised (``"stop"``).

        Raises:
            FloatingPointError: under ``nan_policy="stop"``, naming the first
                non-finite step and the ranks whose loss was not finite.
        """
        skipped, first_bad, bad_here, stop = (int(v) for v in self._flags.numpy())
        self.stop_agreed = self.stop_agreed or bool(stop)
        if not skipped:
            return
        bad = [r for r, b in enumerate(self._allgather(bool(bad_here))) if b]
        message = (f"non-finite loss at step {first_bad} on rank(s) {bad or 'unknown'}; the "
                   "update was not applied")
        if self.nan_policy == "stop":
            raise FloatingPointError(message + " (nan_policy='stop': no update after it was "
                                     "applied; use 'skip' to go on)")
        self.skipped_steps += skipped
        self._flags.assign(tf.constant(_CLEAR[:_STOP] + [stop], dtype=tf.int64))  # stop stays
        if self.rank == 0:
            more = f"; {skipped - 1} more step(s) skipped since" if skipped > 1 else ""
            logger.warning("%s (nan_policy='skip')%s", message, more)
