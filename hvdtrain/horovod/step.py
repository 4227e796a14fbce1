"""The one Horovod training step, for every front door: how gradients go from the backward
pass through the exchange to the update.

The Trainer's step (``backend.py``), Keras ``fit``'s step (``keras_steps.py``), the
distributed optimizer's hook (``optimizer.py``) and the tapes all go through here:

* **the exchange**: :func:`reduce_gradients` (buckets and overlap, Horovod's fusion
  groups, compression and sparsification with error feedback, pre/post scaling) and
  :func:`exchange`, which lets scalars (the loss, the stop flag) ride in the first bucket;
* **the update**: :func:`apply` (skipping the optimizer's own reduction when the caller
  reduced; local accumulation and loss scaling are the optimizer's, inside ``apply``);
* **the XLA split**: :func:`compile_pass` compiles the forward and backward pass, the
  exchange and the update stay outside (Horovod's ops have no XLA kernels); a user's
  ``train_step`` hands its gradients out through :class:`Capture`;
* **the start**: :func:`broadcast_start` sets every rank's variables to the root's before
  the first update (at the first step for a model built from its first batch).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Sequence

import keras
import tensorflow as tf

from hvdtrain.horovod import buckets as bucket_plan
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression as compression_lib
from hvdtrain.horovod import exchange as settings
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")


# ---------------------------------------------------------------------- the exchange

def reduce_gradients(how: settings.Exchange, grads: Sequence, variables: Sequence,
                     buckets: list | None = None, *, residual_of: Callable | None = None,
                     seed=0) -> list:
    """All-reduces ``grads`` as ``how`` says (sparsified or not).

    Args:
        how: the op, compression, scaling, fusion groups and bucket size.
        grads: the gradients (``None`` entries stay ``None``).
        variables: their variables, or ``None`` entries for tensors riding along.
        buckets: lists of positions in ``grads``, each one fused all-reduce; overrides
            ``how``'s fusion groups and bucket size.
        residual_of: for a sparsifier, the error-feedback residual of a variable.
        seed: for a sparsifier, a number that changes every step (``randomk``'s draw).
    """
    dist.check_not_in_xla("the gradient exchange")
    comp = how.compression
    if not isinstance(comp, compression_lib.Sparsifier):
        if buckets is None:
            buckets = _bucket_positions(how, variables, len(grads))
        return dist.reduce_gradients(list(grads), op=how.op, compression=comp,
                                     sparse_as_dense=how.sparse_as_dense,
                                     prescale=how.prescale, postscale=how.postscale,
                                     groups=buckets, process_set=how.process_set)
    out = []
    for i, (g, v) in enumerate(zip(grads, variables)):
        if g is None:
            out.append(None)
            continue
        g = tf.convert_to_tensor(g) * how.prescale
        out.append(comp.exchange(g, residual_of(v), seed * 1009 + i,
                                 average=how.op is dist.Average))
    return out


def reduce_for(optimizer, grads: Sequence, variables: Sequence,
               buckets: list | None = None) -> list:
    """:func:`reduce_gradients` with a distributed optimizer's exchange and residuals; the
    optimizer's :class:`Riders` (set while ``fit``'s step traces) ride in the first bucket
    where the exchange allows it."""
    def residual_of(variable):
        return optimizer._hvd_residuals[keras_private.variable_index(optimizer, variable)]

    how, riders = optimizer._hvd_exchange, optimizer._hvd_riders
    if riders is None or riders.done or not riders.can_ride(optimizer):
        return reduce_gradients(how, grads, variables, buckets, residual_of=residual_of,
                                seed=optimizer.iterations)
    n, scalars = len(grads), riders.values
    plan = buckets or _bucket_positions(how, variables, n) or [list(range(n))]
    groups = [plan[0] + list(range(n, n + len(scalars)))] + plan[1:]
    reduced = reduce_gradients(how, list(grads) + scalars, list(variables) + [None] * len(scalars),
                               groups, residual_of=residual_of, seed=optimizer.iterations)
    riders.arrive(reduced[n:], how)
    return reduced[:n]


def _bucket_positions(how: settings.Exchange, variables: Sequence, count: int):
    """The buckets :func:`reduce_gradients` makes by itself (None: one fused call)."""
    buckets = settings.group_positions(how.groups, variables, count)
    if buckets is None and how.bucket_mb and variables and all(v is not None for v in variables):
        buckets = bucket_plan.plan(variables, how.bucket_mb)
    return buckets


class Riders:
    """Scalars that ride in the first gradient bucket of the step being traced (``fit``'s
    per-step flags), so agreeing on them costs no collective of its own.

    Set on the optimizer with :func:`riding` while the step traces; the optimizer's
    exchange takes them if it can (:meth:`can_ride`), else :meth:`finish` sends them on
    their own. Either way ``on_sum`` receives their sums over the ranks.
    """

    def __init__(self, values: Sequence, on_sum: Callable) -> None:
        self.values = [tf.cast(v, tf.float32) for v in values]
        self._on_sum = on_sum
        self.done = False

    @staticmethod
    def can_ride(optimizer) -> bool:
        """True when the optimizer's exchange runs every step and carries 0/1 values
        exactly: no Adasum, sparsifier, process set or local gradient accumulation."""
        how = optimizer._hvd_exchange
        return (how.op is not dist.Adasum and how.process_set is None
                and not isinstance(how.compression, compression_lib.Sparsifier)
                and not optimizer.gradient_accumulation_steps)

    def arrive(self, reduced: Sequence, how: settings.Exchange) -> None:
        """Hands over the reduced values, turned back into sums (the world size read when
        the step runs: an elastic job keeps its traced step across a resize)."""
        factor = tf.constant(how.prescale * how.postscale, tf.float32)
        if how.op is dist.Average:
            factor /= tf.cast(dist.size_now(), tf.float32)
        self._on_sum([tf.cast(r, tf.float32) / factor for r in reduced])
        self.done = True

    def finish(self) -> None:
        """Sends the values on their own if no exchange took them."""
        if not self.done:
            total = dist.allreduce_total(tf.stack(self.values))
            self._on_sum([total[i] for i in range(len(self.values))])
            self.done = True


@contextlib.contextmanager
def riding(optimizer, riders: Riders):
    """While tracing inside this block, ``optimizer``'s exchange carries ``riders``; at
    its end they go on their own if nothing took them."""
    keras_private.set_untracked(optimizer, "_hvd_riders", riders)
    try:
        yield riders
        riders.finish()
    finally:
        keras_private.set_untracked(optimizer, "_hvd_riders", None)


def reduces_before_apply(optimizer) -> bool:
    """True when a caller may reduce the gradients itself (one fused call, scalars riding
    along) and then :func:`apply` them: no local accumulation, loss scaling or
    compression has to happen first."""
    how = getattr(optimizer, "_hvd_exchange", None)
    return (settings.is_distributed(optimizer)
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and not optimizer.gradient_accumulation_steps
            # fp16 would turn a large (finite) loss riding along into Inf
            and how.compression is dist.Compression.none
            and how.prescale == 1.0 and how.postscale == 1.0
            and how.groups is None and how.process_set is None)


def exchange(optimizer, grads: Sequence, variables: Sequence, scalars: Sequence,
             plan: list[list[int]]) -> tuple[list, list, bool]:
    """Reduces the gradients and averages ``scalars`` over the ranks in as few collectives
    as the optimizer allows.

    Where :func:`reduces_before_apply` holds, the scalars ride in the first bucket of
    ``plan`` (no collective of their own; with Adasum, whose result for scalars may change
    sign, they go in one small all-reduce). Otherwise the optimizer reduces the
    gradients inside ``apply`` and the scalars go on their own.

    Returns:
        ``(grads, mean scalars, reduced)``: ``reduced`` says whether ``grads`` are already
        reduced (pass it to :func:`apply`).
    """
    def on_their_own():
        mean = dist.allreduce_mean(tf.stack([tf.cast(s, tf.float32) for s in scalars]))
        return [mean[i] for i in range(len(scalars))]

    if not reduces_before_apply(optimizer):
        return list(grads), on_their_own(), False
    n = len(grads)
    if optimizer._hvd_exchange.op is dist.Adasum:
        return reduce_for(optimizer, grads, variables, buckets=plan), on_their_own(), True
    groups = [plan[0] + list(range(n, n + len(scalars)))] + plan[1:]
    reduced = reduce_for(optimizer, list(grads) + list(scalars),
                         list(variables) + [None] * len(scalars), buckets=groups)
    return reduced[:n], reduced[n:], True


# ---------------------------------------------------------------------- the update

@contextlib.contextmanager
def _reduced_by_caller(optimizer):
    keras_private.set_untracked(optimizer, "_hvd_already_reduced", True)
    try:
        yield
    finally:
        keras_private.set_untracked(optimizer, "_hvd_already_reduced", False)


def apply(optimizer, grads, variables, reduced: bool):
    """``optimizer.apply(grads, variables)``; with ``reduced`` the optimizer's own
    reduction is skipped (the caller reduced with :func:`exchange`)."""
    with _reduced_by_caller(optimizer) if reduced else contextlib.nullcontext():
        return optimizer.apply(grads, variables)


# ---------------------------------------------------------------------- XLA

def compile_pass(forward_backward: Callable, what: str) -> Callable:
    """The forward and backward pass compiled by XLA (``jit_compile=True``); whoever calls
    it runs the exchange and the update outside the compiled cluster. Logs that once on
    rank 0, naming ``what`` is compiled."""
    if dist.rank() == 0:
        logger.info("XLA compiles %s's forward and backward pass; hvdtrain's gradient "
                    "exchange and the update run outside the compiled cluster", what)
    return tf.function(forward_backward, jit_compile=True, reduce_retracing=True)


class Capture:
    """Holds the gradients a distributed optimizer was given inside an XLA-compiled step
    (``fit``'s XLA step), to apply them outside it."""

    def __init__(self) -> None:
        self.grads: list | None = None
        self.variables: list | None = None

    def take(self, grads, variables, optimizer):
        self.grads = list(grads)
        self.variables = None if variables is None else list(variables)
        return optimizer.iterations


@contextlib.contextmanager
def capturing(optimizer, capture: Capture):
    """While tracing inside this block, ``optimizer.apply`` only records its arguments."""
    keras_private.set_untracked(optimizer, "_hvd_capture", capture)
    try:
        yield capture
    finally:
        keras_private.set_untracked(optimizer, "_hvd_capture", None)


# ---------------------------------------------------------------------- the start

def broadcast_start(variables: Sequence, root_rank: int = 0, exclude: Sequence = ()) -> None:
    """Sets ``variables`` to ``root_rank``'s values on every rank, but those in ``exclude``
    (variables each rank keeps as its own)."""
    own = {settings.variable_key(v) for v in exclude}
    dist.broadcast_variables([v for v in variables if settings.variable_key(v) not in own],
                             root_rank=root_rank)
