"""The exchange: one object, the :class:`Exchanger`, owns the whole gradient path.

Every front door holds one and calls it where its step reduces: the Trainer's step
(``backends/horovod.py``), the distributed optimizer's hook (``optimizer.py``, which also
carries ``fit``'s step) and the tapes (``tape.py``). It owns:

* **the bucket plan**: Horovod's fusion groups, else buckets of ``bucket_mb`` MiB, the last
  layers' first (``buckets.plan``), so each bucket leaves as soon as its gradients exist;
* **the strategy** that moves the plan (``exchange_strategies.py``, ``powersgd.py``, chosen
  by the settings: :func:`choose_strategy`): all-reduce (dense, sparse, fp16),
  sparsification with error feedback, or PowerSGD's low-rank approximation;
* **the riders**: per-rank scalars (the Trainer's loss and stop flag, ``fit``'s last-batch
  flag, any later flag) that ride in the first bucket and come back summed over the ranks,
  at no collective of their own where the strategy can carry them;
* **the scaling**: the pre/post factors of the settings, undone for the riders.

Its settings are :class:`hvdtrain.horovod.exchange_settings.ExchangeSettings`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import tensorflow as tf

from hvdtrain.horovod import buckets as bucket_plan
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression as compression_lib
from hvdtrain.horovod import exchange_strategies as strategies
from hvdtrain.horovod import powersgd, sharded
from hvdtrain.horovod.exchange_settings import ExchangeSettings, group_positions


@dataclasses.dataclass(frozen=True)
class Rider:
    """A per-rank scalar that rides in the first gradient bucket and comes back as its sum
    over the ranks.

    Attributes:
        value: this rank's value (cast to float32).
        exact: a flag or small count (0, 1, ...), which fp16 and the settings' scaling
            carry exactly; a value that is not (a loss) does not ride under fp16.
    """

    value: Any
    exact: bool = False


def choose_strategy(settings: ExchangeSettings) -> strategies.Strategy:
    """The strategy ``settings`` ask for, read from their compression."""
    if settings.shard_optimizer:
        return sharded.ReduceScatter(settings)
    if isinstance(settings.compression, compression_lib.Sparsifier):
        return strategies.Sparsified(settings)
    if isinstance(settings.compression, compression_lib.PowerSGD):
        return powersgd.LowRank(settings)
    return strategies.AllReduce(settings)


class Exchanger:
    """Reduces gradients over the ranks as ``settings`` say, with riders in the first bucket.

    Args:
        settings: the op, compression, scaling, fusion groups, bucket size and ranks.
    """

    def __init__(self, settings: ExchangeSettings) -> None:
        self.settings = settings
        self.strategy = choose_strategy(settings)

    def __repr__(self) -> str:
        return f"Exchanger({self.strategy.name}, {self.settings})"

    def build(self, variables: Sequence) -> None:
        """Makes the strategy's state for ``variables`` (the optimizer's ``build``)."""
        self.strategy.build(variables)

    def after_update(self, variables: Sequence) -> None:
        """Tells the strategy the optimizer updated ``variables``."""
        self.strategy.after_update(variables)

    def plan(self, variables: Sequence | None, count: int | None = None) -> list[list[int]] | None:
        """The buckets: lists of positions in the gradients of ``variables``, each reduced
        together (the settings' fusion groups, else buckets of ``bucket_mb``); ``None``:
        one fused call."""
        count = len(variables) if count is None else count
        s = self.settings
        buckets = group_positions(s.groups, variables, count)
        if buckets is None and s.bucket_mb and variables and all(v is not None for v in variables):
            buckets = bucket_plan.plan(variables, s.bucket_mb)
        return buckets

    def carries(self, riders: Sequence[Rider]) -> bool:
        """True when ``riders`` can ride in the first bucket: a strategy that carries
        them, every rank in the reduction, an op that sums (not Adasum, whose result for
        scalars may change sign), and no fp16 for a rider that fp16 would not keep (PowerSGD
        sends them as they are)."""
        s = self.settings
        return (self.strategy.carries_riders and s.op is not dist.Adasum
                and s.process_set is None
                and (s.compression is dist.Compression.none or all(r.exact for r in riders)
                     or isinstance(s.compression, compression_lib.PowerSGD)))  # fp32

    def reduce(self, grads: Sequence, variables: Sequence | None, riders: Sequence = (), *,
               buckets: list[list[int]] | None = None, seed=0) -> tuple[list, list]:
        """Reduces ``grads`` over the ranks and sums ``riders``.

        Args:
            grads: the gradients (``None`` entries stay ``None``; none at all: only the
                riders, in one small all-reduce).
            variables: their variables, in forward order (``None``: one fused call).
            riders: :class:`Rider` objects (or plain scalars, not exact).
            buckets: overrides :meth:`plan`.
            seed: a number that changes every step (``randomk``'s draw).

        Returns:
            ``(grads, rider_sums)``: the reduced gradients and each rider's sum over the
            ranks (float32 scalars).
        """
        dist.check_not_in_xla("the gradient exchange")
        grads = list(grads)
        n = len(grads)
        riders = [r if isinstance(r, Rider) else Rider(r) for r in riders]
        variables = None if variables is None else list(variables)
        if buckets is None and n:
            buckets = self.plan(variables, n)
        if not riders:
            return (self.strategy.reduce(grads, variables, buckets, seed) if n else []), []
        if not n or not self.carries(riders):
            reduced = self.strategy.reduce(grads, variables, buckets, seed) if n else []
            return reduced, self._on_their_own(riders)
        values = [tf.cast(r.value, tf.float32) for r in riders]
        plan = buckets or [list(range(n))]
        groups = [plan[0] + list(range(n, n + len(values)))] + plan[1:]
        out = self.strategy.reduce(grads + values,
                                   (variables or [None] * n) + [None] * len(values),
                                   groups, seed)
        k = len(out) - len(values)  # the sharded strategy returns a share per bucket
        return out[:k], self._as_sums(out[k:])

    def _as_sums(self, reduced: Sequence) -> list:
        """The riders' reduced values turned back into sums (the world size read when the
        step runs: an elastic job keeps its traced step across a resize)."""
        s = self.settings
        factor = tf.constant(s.prescale * s.postscale, tf.float32)
        if s.op is dist.Average:
            factor /= tf.cast(dist.size_now(), tf.float32)
        return [tf.cast(r, tf.float32) / factor for r in reduced]

    @staticmethod
    def _on_their_own(riders: Sequence[Rider]) -> list:
        """The riders' sums over every rank, in one small all-reduce."""
        total = dist.allreduce_total(tf.stack([tf.cast(r.value, tf.float32) for r in riders]))
        return [total[i] for i in range(len(riders))]
