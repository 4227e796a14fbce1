"""Non-finite gradients: one bad record on one rank must not ruin every rank's weights.

A NaN or Inf feature on one rank can leave that rank's loss finite (a ReLU turns NaN into
0) while its gradients are not; the exchange then sums them into every rank's update.
Before the exchange each rank computes one flag, "some gradient of mine is not finite"
(:func:`local_flag`), which rides in the first bucket as an exact
:class:`~hvdtrain.horovod.exchange.Rider` (no collective of its own): its sum is the
number of ranks whose gradients were not finite, the same number on every rank, so every
rank takes the same branch. Only on that path are the flags all-gathered, to name the
ranks. ``nan_policy`` says what happens then:

* ``"stop"`` (the default): no update is applied, and the step raises naming the step and
  the ranks (:data:`MARK` starts the message; ``fit`` re-raises it as a
  ``FloatingPointError`` with the batch's position in the epoch);
* ``"skip"``: every rank skips the update, rank 0 warns;
* ``"ignore"``: no flag, no check (Horovod's behaviour).

``HVDTRAIN_NAN_POLICY`` sets the default for the distributed optimizer and the tapes, so
a Horovod script gets the check without a change and can turn it off without one. Under
dynamic loss scaling (a ``LossScaleOptimizer``) non-finite gradients are the scaler's own
signal to lower its scale: they are not counted here.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable, Sequence

import tensorflow as tf

from hvdtrain import options
from hvdtrain.horovod import collectives as dist

#: The environment variable that sets the default ``nan_policy`` of the distributed
#: optimizer and the tapes.
POLICY_ENV = "HVDTRAIN_NAN_POLICY"
#: How every message about non-finite gradients starts.
MARK = "hvdtrain: non-finite gradients"


def resolve_policy(nan_policy: str | None) -> str:
    """``nan_policy``, else ``$HVDTRAIN_NAN_POLICY``, else ``"stop"``.

    Raises:
        ValueError: the policy is not ``"stop"``, ``"skip"`` or ``"ignore"``.
    """
    where = "nan_policy"
    if nan_policy is None:
        nan_policy, where = os.environ.get(POLICY_ENV, "stop") or "stop", POLICY_ENV
    if nan_policy not in options.NAN_POLICIES:
        raise ValueError(f"{where} must be 'stop', 'skip' or 'ignore', got {nan_policy!r}")
    return nan_policy


def local_flag(grads: Sequence) -> tf.Tensor:
    """1.0 (float32) when one of this rank's ``grads`` holds a NaN or an Inf, else 0.0."""
    checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
              for g in grads if g is not None]
    if not checks:
        return tf.constant(0.0)
    return 1.0 - tf.cast(tf.reduce_all(tf.stack(checks)), tf.float32)


def bad_ranks(flag: tf.Tensor) -> tf.Tensor:
    """The ranks whose ``flag`` is set (an all-gather: run it on every rank, on the
    failure path only)."""
    flags = dist.allgather(tf.reshape(tf.cast(flag, tf.float32), [1]))
    return tf.where(flags > 0.5)[:, 0]


def apply_if_finite(nan_policy: str, count, flag, step, update: Callable, *,
                    what: str = "the update was not applied") -> tf.Tensor:
    """Runs ``update()`` when ``count`` (ranks with non-finite gradients, summed over the
    ranks) is 0; else what ``nan_policy`` says. Returns whether it ran.

    Args:
        nan_policy: ``"stop"`` raises ``tf.errors.InvalidArgumentError`` (from the graph)
            whose message starts with :data:`MARK`; ``"skip"`` warns on rank 0.
        count: the summed flags (a float32 scalar).
        flag: this rank's flag (:func:`local_flag`).
        step: the step's number: a scalar tensor, or a callable returning one, called
            inside the check. Read there, an optimizer's counter (``lambda:
            opt.iterations + 1``) makes the check one of the counter's uses, so Keras's
            increment after the update waits for it: a stopped step is not counted.
            ``None``: no number.
        update: the update to run (its return value is dropped).
        what: what did not happen, for the message.
    """
    def run():
        update()
        return tf.constant(True)

    def refuse():
        number = step() if callable(step) else step
        at = "" if number is None else " at step {}"
        args = ([] if number is None else [tf.cast(number, tf.int64)]) + [bad_ranks(flag)]
        text = tf.strings.format(MARK + at + " on rank(s) {}; " + what,
                                 args, summarize=-1)
        if nan_policy == "stop":
            text += (" (nan_policy='stop'; a NaN or Inf in those ranks' batch, or a diverging "
                     f"model; {POLICY_ENV}=skip goes on without those steps, =ignore turns "
                     "the check off)")
            check = tf.debugging.Assert(count < 0.5, [text], summarize=1)
            with tf.control_dependencies([check]):
                return tf.constant(False)
        if dist.rank() == 0:
            tf.print("WARNING:", text, "(nan_policy='skip')", output_stream=sys.stderr)
        return tf.constant(False)

    return tf.cond(count < 0.5, run, refuse)


def message_of(error: BaseException) -> str | None:
    """The hvdtrain message inside a TensorFlow error raised by :func:`apply_if_finite`,
    else ``None``."""
    text = str(error)
    at = text.find(MARK)
    if at < 0:
        return None
    line = re.sub(r"\\+'", "'", text[at:].splitlines()[0])
    return re.sub(r"['\"\]\s]+$", "", line) if line.endswith(("]", "'", '"')) else line
