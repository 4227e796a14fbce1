"""Checkpoints taken between the passes of local accumulation (``backward_passes_per_step``).

Each rank's accumulated gradients are its own, and a checkpoint holds one copy (rank 0's
writes), so a resume from a save between two exchanges used to give every rank rank 0's
pending sum (unsharded) or none at all (sharded). An update uses only the ranks' average
of the accumulated sums, so a save first averages them in place on every rank: the next
update is the same up to summation order, and the one copy saved is every rank's. On
restore it reaches every rank through the start broadcast (Keras's accumulators are
optimizer variables) or, sharded, through the sharded state's scatter
(``sharded_state``), so the resumed run continues the pending passes.
"""
from __future__ import annotations

import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.internals import keras_private


class AveragedAccumulators:
    """The checkpoint ``state`` of an exchange strategy under local accumulation: its own
    state (``strategy``'s save and restore), and ``accumulators`` averaged over the ranks
    before every save (so every rank takes part in it: ``saves_state``)."""

    saves_state = True

    def __init__(self, strategy, accumulators) -> None:
        self._strategy = strategy
        self._accumulators = list(accumulators)
        self.optional_state = strategy.optional_state

    def save_objects(self) -> dict:
        for acc in self._accumulators:
            acc.assign(dist.allreduce_mean(tf.convert_to_tensor(acc)))
        return self._strategy.save_objects() if self._strategy.saves_state else {}

    def restore_objects(self) -> dict:
        return self._strategy.restore_objects() if self._strategy.saves_state else {}

    def after_restore(self, restored: bool) -> None:
        if self._strategy.saves_state:
            self._strategy.after_restore(restored)


def checkpoint_state(strategy, optimizer):
    """What a Checkpointer's ``state`` is for ``strategy`` and ``optimizer``: ``strategy``
    itself, or under local accumulation an :class:`AveragedAccumulators` around it (the
    sharded strategy's full-size accumulators, else Keras's own)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not inner.gradient_accumulation_steps:
        return strategy
    sharded = getattr(strategy, "accumulators", None)
    return AveragedAccumulators(strategy, sharded if sharded else
                                keras_private.gradient_accumulators(inner))
