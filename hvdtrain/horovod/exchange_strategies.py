"""How a bucket plan's gradients travel between the ranks: the Exchanger's strategies.

The :class:`~hvdtrain.horovod.exchange.Exchanger` owns the plan (which gradients go
together, the riders in the first bucket, the scaling of the riders back to sums); a
strategy moves one plan's tensors and keeps whatever state that needs. Which one runs is
read from the settings (``exchange.choose_strategy``), so every front door gets it
through the same ``Exchanger.reduce`` call:

* :class:`AllReduce`: each bucket one fused all-reduce (Horovod's ``grouped_allreduce``,
  fp16 casts, sparse gradients by all-reduce); the default.
* :class:`Sparsified`: ``topk`` / ``randomk`` keep a share of each gradient, sent by
  allgather, with the rest kept in a local residual (error feedback).

Low-rank compression (PowerSGD) is a strategy of its own module, ``powersgd.py``. One more
fits the same seam: sharded optimizer state (reduce-scatter of each bucket into this
rank's slice, the update of that slice, then :meth:`Strategy.after_update` all-gathers the
slices into the variables).
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod.exchange_settings import ExchangeSettings, variable_key


class Strategy:
    """One way of moving a bucket plan's gradients (the interface).

    Attributes:
        name: what the logs and errors call it.
        carries_riders: entries with no variable (the riders, per-rank scalars in the first
            bucket) come back summed or averaged as by an all-reduce, so they can ride.
        keeps_gradients: part of a step's gradients is kept and sent in later steps
            (error feedback), so a loss scaler's scale must be taken out first.
    """

    name = "strategy"
    carries_riders = False
    keeps_gradients = False

    def __init__(self, settings: ExchangeSettings) -> None:
        self.settings = settings

    def build(self, variables: Sequence) -> None:
        """Makes the state kept between steps, once the variables are known (the
        optimizer's ``build``). Nothing by default."""

    def reduce(self, grads: list, variables: list | None, buckets: list[list[int]] | None,
               seed) -> list:
        """The gradients reduced over the ranks (``None`` entries stay ``None``), then the
        riders; a sharded strategy returns this rank's share of each bucket instead of
        the gradients.

        Args:
            grads: the gradients, riders included (their variable is ``None``).
            variables: their variables, or ``None``.
            buckets: lists of positions in ``grads``, each reduced together (``None``:
                all of them at once).
            seed: a number that changes every step (the optimizer's iteration counter).
        """
        raise NotImplementedError

    def after_update(self, variables: Sequence) -> None:
        """Runs after the optimizer updated ``variables`` (where a sharded update would
        all-gather its slices). Nothing by default."""

    # --- the state a checkpoint holds (see hvdtrain.checkpoint.Checkpointer's ``state``)
    #: the strategy keeps state a checkpoint must hold for an exact resume: the save
    #: decision is then agreed, and :meth:`save_objects` runs on every rank before a save
    saves_state = False
    #: names of :meth:`restore_objects` a checkpoint may lack (one written without them)
    optional_state: frozenset = frozenset()

    def save_objects(self) -> dict:
        """Trackables to write beside (or, same name, in place of) the checkpoint's own,
        by name; run on every rank before rank 0 writes (it may run collectives)."""
        return {}

    def restore_objects(self) -> dict:
        """Trackables to read the checkpoint into (rank 0), by name."""
        return {}

    def after_restore(self, restored: bool) -> None:
        """Runs on every rank once the checkpoint was read on rank 0 (``restored``: one
        was found), before the start state is broadcast."""

    def start_variables(self) -> list:
        """The strategy's own variables that start from rank 0's values (the start-up
        broadcast carries them beside the model's and the optimizer's)."""
        return []

    def local_variables(self) -> list:
        """Variables that differ between the ranks by design (not broadcast at start)."""
        return []


class AllReduce(Strategy):
    """Each bucket one fused all-reduce (today's exchange)."""

    name = "allreduce"
    carries_riders = True

    def reduce(self, grads, variables, buckets, seed):
        s = self.settings
        return dist.reduce_gradients(grads, op=s.op, compression=s.compression,
                                     sparse_as_dense=s.sparse_as_dense, prescale=s.prescale,
                                     postscale=s.postscale, groups=buckets,
                                     process_set=s.process_set)


class Sparsified(Strategy):
    """``topk`` / ``randomk``: each gradient's chosen entries sent by allgather, the rest
    kept in this rank's residual and added to the next step's gradient."""

    name = "sparsified"
    carries_riders = False  # each gradient goes on its own, by allgather
    keeps_gradients = True  # the residuals

    def __init__(self, settings: ExchangeSettings) -> None:
        super().__init__(settings)
        self.residuals: list[tf.Variable] = []  # one per variable, in the built order
        self._residual_of: dict[int, tf.Variable] = {}

    def build(self, variables):
        # This rank's own: kept out of the optimizer's variables, so they are neither
        # broadcast nor checkpointed.
        self.residuals = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                      name="hvd_residual") for v in variables]
        self._residual_of = {variable_key(v): r for v, r in zip(variables, self.residuals)}

    def reduce(self, grads, variables, buckets, seed):
        s, sparsifier = self.settings, self.settings.compression
        if not self._residual_of:  # a tape's: no optimizer built it
            self.build([v for v in variables if v is not None])
        out = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                out.append(None)
                continue
            g = tf.convert_to_tensor(g) * s.prescale
            out.append(sparsifier.exchange(g, self._residual_of[variable_key(v)],
                                           seed * 1009 + i, average=s.op is dist.Average))
        return out

