"""What the compiled training step decided, kept on the device and read only when the
Trainer settles (every ``min(log_step_size, 10)`` steps and at the end of training), so
the Python loop can run ahead of the device instead of waiting for a flag after every
step.

The step records there: how many updates it skipped for a non-finite loss or non-finite
gradients (every rank sees the same summed loss and the same count of ranks whose
gradients were not finite, so they agree), the first such step and whether this rank's
own loss or gradients were the non-finite ones, and whether a preemption stop was agreed. Under
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
        where: a step's number -> where its batch is in each rank's epoch, for messages
            (``" (epoch 2, batch 37 of each rank's shard)"``), or ``None``.
    """

    def __init__(self, rank: int, nan_policy: str, allgather_object, where=None) -> None:
        self.rank, self.nan_policy = rank, nan_policy
        self._allgather = allgather_object
        self._where = where
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
               stopping: tf.Tensor, local_grads_finite: tf.Tensor | None = None):
        """Traced in the step: counts a skipped update and remembers the first one, and
        what was not finite on this rank (bit 1: its loss, bit 2: its gradients)."""
        here = tf.cast(tf.logical_not(local_finite), tf.int64)
        if local_grads_finite is not None:
            here += 2 * tf.cast(tf.logical_not(local_grads_finite), tf.int64)
        flags = self._flags.read_value()
        bad = tf.logical_not(mean_finite)
        first = tf.logical_and(bad, flags[_FIRST_BAD] < 0)
        new = tf.stack([
            flags[_SKIPPED] + tf.cast(bad, tf.int64),
            tf.where(first, tf.cast(step, tf.int64), flags[_FIRST_BAD]),
            tf.where(first, here, flags[_BAD_HERE]),
            tf.maximum(flags[_STOP], tf.cast(stopping, tf.int64)),
        ])
        return self._flags.assign(new)

    # ------------------------------------------------------------------ on the host
    def settle(self) -> None:
        """Reads the flags (one device read; every rank at the same step): a stop
        agreed, skipped updates logged (``"skip"``) or raised (``"stop"``).

        Raises:
            FloatingPointError: under ``nan_policy="stop"``, naming the first
                non-finite step, the ranks whose loss or gradients were not finite,
                and where the pipeline knows it the batch's position in the epoch.
        """
        skipped, first_bad, bad_here, stop = (int(v) for v in self._flags.numpy())
        self.stop_agreed = self.stop_agreed or bool(stop)
        if not skipped:
            return
        kinds = self._allgather(bad_here)
        loss = [r for r, b in enumerate(kinds) if b & 1]
        grads = [r for r, b in enumerate(kinds) if b & 2 and not b & 1]
        where = self._where(first_bad) if self._where is not None else ""
        if grads and not loss:
            message = (f"non-finite gradients at step {first_bad} on rank(s) {grads} (its "
                       f"loss finite: a NaN or Inf in its batch?){where}")
        else:
            message = (f"non-finite loss at step {first_bad} on rank(s) {loss or 'unknown'}"
                       + (f", non-finite gradients on rank(s) {grads}" if grads else "")
                       + where)
        message += "; the update was not applied"
        if self.nan_policy == "stop":
            raise FloatingPointError(message + " (nan_policy='stop': no update after it was "
                                     "applied; use 'skip' to go on)")
        self.skipped_steps += skipped
        self._flags.assign(tf.constant(_CLEAR[:_STOP] + [stop], dtype=tf.int64))  # stop stays
        if self.rank == 0:
            more = f"; {skipped - 1} more step(s) skipped since" if skipped > 1 else ""
            logger.warning("%s (nan_policy='skip')%s", message, more)
