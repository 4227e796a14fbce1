"""What the sharded update (``sharded.ReduceScatter``) adds between the reduce-scatter and
the update of this rank's slice, where a slice alone does not know enough:

* Which optimizers can be sharded at all (:func:`check_shardable`): only element-wise
  updates; one whose update of an entry reads the whole tensor (a layer-wise trust
  ratio, a factored second moment, an orthogonalisation) is refused.
* Norm clipping. This rank's slice (one flat part per bucket) is made of runs, each a
  part of one variable or of a bucket's padding (:func:`slice_runs`). The sums of
  squares of each variable's runs, one number a variable, summed over the ranks in one
  small all-reduce, are each variable's squared norm of the whole averaged gradient:
  ``clipnorm`` scales each run by its variable's factor, ``global_clipnorm`` every run by
  the factor of their total, with Keras's own formulas. The norm is of the reduced
  gradient, so it cannot ride in the reduce-scatter itself (nor in the all-gather, which
  needs the clipped update).
* A loss scaler's finiteness check: each rank checks its slice; the count of ranks whose
  slice is not finite is all-reduced, so every rank applies or skips (and lowers the
  scale) together.
* Local accumulation (``backward_passes_per_step``): the passes' gradients are summed
  into full-size local accumulators and exchanged once every ``k`` passes (saved, averaged
  over the ranks, by ``accumulated_state``).
* Weight decay (:func:`decay_slices`), each run as its variable's, and ``use_ema``'s
  finalisation (:func:`finalize_slices`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import keras
import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod.runtime import alone
from hvdtrain.internals import keras_private


#: Optimizers (by class name, anywhere in the class's ancestry) whose update needs a whole
#: tensor, and why.
WHOLE_TENSOR = {
    "Lamb": "its trust ratio is the norm of each whole weight over the norm of its update",
    "LAMB": "its trust ratio is the norm of each whole weight over the norm of its update",
    "Lars": "its trust ratio is the norm of each whole weight over the norm of its gradient",
    "LARS": "its trust ratio is the norm of each whole weight over the norm of its gradient",
    "Adafactor": "its second moment is factored over each whole matrix's rows and columns",
    "Muon": "its update orthogonalises each whole matrix",
}


def check_shardable(optimizer) -> None:
    """Raises ``ValueError`` when ``optimizer``'s update cannot be computed slice by slice.

    Args:
        optimizer: the Keras 3 optimizer to shard (or a ``LossScaleOptimizer`` around
            it), not built yet.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a loss scaler
    for cls in type(inner).__mro__:
        if cls.__name__ in WHOLE_TENSOR:
            raise ValueError(f"shard_optimizer=True cannot shard {type(inner).__name__}: "
                             f"{WHOLE_TENSOR[cls.__name__]}, and each rank holds only a slice")
    if inner.use_ema and inner.gradient_accumulation_steps:
        raise ValueError("shard_optimizer=True with backward_passes_per_step > 1 does not work "
                         "with use_ema: Keras moves the average on every pass, the sharded "
                         "update once an exchange")
    if optimizer.built or inner.built:
        raise ValueError("shard_optimizer=True needs an optimizer that has not been built yet "
                         "(it is built on this rank's slice of the weights)")


def bucket_runs(layout, b: int, flat: tf.Tensor) -> list[tuple[int, tf.Tensor]]:
    """This rank's share ``flat`` of bucket ``b`` cut at its runs, in order:
    ``(position, part)``, a part of one variable (its position in the layout) or of the
    bucket's padding (-1)."""
    runs = [(i, hi - lo) for i, lo, hi in layout.own_runs(b)]
    parts = tf.split(flat, [n for _, n in runs]) if len(runs) > 1 else [flat]
    return [(i, part) for (i, _), part in zip(runs, parts)]


def slice_runs(layout, grad_slices: Sequence) -> list[tuple[int, tf.Tensor]]:
    """:func:`bucket_runs` of each bucket's share in ``grad_slices``, in order."""
    return [run for b, flat in enumerate(grad_slices) for run in bucket_runs(layout, b, flat)]


def agreed_sum(values: tf.Tensor, name: str) -> tf.Tensor:
    """``values`` summed over the ranks, under a name that is the same on every rank
    (Horovod matches the ranks' ops by name, and each rank made a different number of ops
    before: its own slice's runs)."""
    if alone():
        return values
    return dist.allreduce_total(tf.identity(values, name=name))


def clips_by_norm(optimizer) -> bool:
    """True when ``optimizer`` clips by a norm (``clipnorm`` or ``global_clipnorm``)."""
    return bool((optimizer.clipnorm and optimizer.clipnorm > 0)
                or (optimizer.global_clipnorm and optimizer.global_clipnorm > 0))


def run_squares(layout, grad_slices: Sequence) -> tf.Tensor:
    """This rank's part of each variable's squared gradient norm: the sums of squares of
    its runs in ``grad_slices``, one number a variable (summed over the ranks: the whole)."""
    mine = [tf.zeros([], tf.float32)] * len(layout.sizes)
    for i, part in slice_runs(layout, grad_slices):
        if i >= 0:  # a variable cut over buckets has a run in each
            mine[i] = mine[i] + tf.reduce_sum(part * part)
    return tf.stack(mine)


def clip_with(optimizer, layout, grad_slices: Sequence, squares: tf.Tensor) -> list:
    """``grad_slices`` clipped as Keras clips the whole gradient, given each variable's
    squared norm of it (``squares``): by each variable's norm (``clipnorm``, first as in
    Keras) or by the global norm (``global_clipnorm``)."""
    if optimizer.clipnorm and optimizer.clipnorm > 0:
        clip = tf.cast(optimizer.clipnorm, tf.float32)
        # tf.clip_by_norm's formula, with the norm of the whole variable
        norms = tf.where(squares > 0, tf.sqrt(tf.where(squares > 0, squares, 1.0)), squares)
        out = []
        for b, flat in enumerate(grad_slices):
            parts = [part if i < 0 else part * clip / tf.maximum(norms[i], clip)
                     for i, part in bucket_runs(layout, b, flat)]
            out.append(tf.concat(parts, 0) if len(parts) > 1 else parts[0])
        return out
    clip = tf.cast(optimizer.global_clipnorm, tf.float32)
    norm = tf.sqrt(tf.reduce_sum(squares))  # keras's clip_by_global_norm from here on
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
    return [flat * scale for flat in grad_slices]


def clip_slices(optimizer, grad_slices: Sequence) -> list:
    """This rank's slices of the averaged gradient clipped by the norms of the whole
    gradient (:func:`clip_with`); one all-reduce of one number per variable."""
    layout = strategy_of(optimizer).layout
    squares = agreed_sum(run_squares(layout, grad_slices), "hvd_shard_norms")
    return clip_with(optimizer, layout, grad_slices, squares)


def decay_slices(optimizer) -> None:
    """Keras's decoupled weight decay (``variable -= variable * wd * lr``) on this rank's
    slices: each run as its variable would be decayed, so ``exclude_from_weight_decay``
    (by variable or by name) holds as unsharded; a bucket's padding is zeros either way."""
    strategy = strategy_of(optimizer)
    decayed = [keras_private.uses_weight_decay(optimizer, v) for v in strategy.variables]
    lr = tf.cast(optimizer.learning_rate, tf.float32)
    wd = tf.cast(optimizer.weight_decay, tf.float32)
    for b, part in enumerate(strategy.slices):
        flags = [i < 0 or decayed[i] for i, _, _ in strategy.layout.own_runs(b)]
        if all(flags):
            part.assign_sub(part * wd * lr)
        elif any(flags):  # the excluded variables' runs subtract zeros
            runs = bucket_runs(strategy.layout, b, tf.convert_to_tensor(part))
            part.assign_sub(tf.concat([run * wd * lr if keep else tf.zeros_like(run)
                                       for keep, (_, run) in zip(flags, runs)], 0))


def finalize_slices(optimizer) -> None:
    """``finalize_variable_values`` of a sharded optimizer with ``use_ema``: each slice set
    to its moving average (Keras's own), then all-gathered into the model's variables
    (every rank, as ``fit`` does at its end)."""
    strategy = strategy_of(optimizer)
    keras.optimizers.Optimizer.finalize_variable_values(optimizer, strategy.slices)
    strategy.after_update(strategy.variables)


def agreed_finite(local_finite: tf.Tensor) -> tf.Tensor:
    """True when every rank's ``local_finite`` is (one all-reduce of a count)."""
    bad = tf.cast(tf.logical_not(local_finite), tf.float32)
    return agreed_sum(bad, "hvd_shard_nonfinite") < 0.5


def make_accumulators(variables: Sequence) -> list:
    """One float32 accumulator per variable, full size, this rank's own (not broadcast
    nor checkpointed)."""
    return [keras.Variable(tf.zeros(v.shape, tf.float32), trainable=False,
                           name="hvd_accumulator") for v in variables]


def accumulate(optimizer, accumulators: Sequence, grads: Sequence,
               update: Callable[[list], None]) -> None:
    """Adds ``grads`` to ``accumulators``; every ``gradient_accumulation_steps``-th call
    ``update(accumulators)`` runs instead (it exchanges their sum and applies it, counting
    the pass; Keras divides the sum by the number of passes), and they are zeroed.
    The other calls count their pass here."""
    steps = optimizer.gradient_accumulation_steps
    passes = keras_private.passes_counter(optimizer)

    def add_grads():
        for g, a in zip(grads, accumulators):
            if g is not None:
                a.assign_add(tf.cast(tf.convert_to_tensor(g), a.dtype))

    def add():
        add_grads()
        passes.assign_add(1)

    def exchange():
        add_grads()
        update(list(accumulators))  # read after the adds, before the zeroing
        for a in accumulators:
            a.assign(tf.zeros(a.shape, a.dtype))

    tf.cond(tf.equal((passes + 1) % steps, 0), exchange, add)


def strategy_of(optimizer):
    """The ``sharded.ReduceScatter`` of a sharded optimizer (or of its loss scaler)."""
    return getattr(optimizer, "_hvd_distributed").exchanger.strategy


def start_apply(optimizer, grads, trainable_variables, reduced: bool):
    """The start of a sharded ``apply``: inside an XLA-compiled step, the hand-out of the
    gradients (its result returned); else the checks and the build (``None`` returned)."""
    hvd = getattr(optimizer, "_hvd_distributed")
    if hvd.capture is not None:
        return hvd.capture.take(grads, trainable_variables, optimizer)
    if not optimizer.built:
        optimizer.build(list(trainable_variables))
    strategy = strategy_of(optimizer)
    if reduced and len(list(grads)) != len(strategy.slices):
        raise ValueError("a sharded optimizer applies reduced gradients as its exchanger's "
                         f"reduce returns them, this rank's share of each of its "
                         f"{len(strategy.slices)} buckets; got {len(list(grads))} tensors "
                         "(or apply the model's gradients with reduced=False)")
    variables = strategy.variables
    if trainable_variables is not None and len(list(trainable_variables)) != len(variables):
        raise ValueError("a sharded optimizer updates the variables it was built with, "
                         f"{len(variables)} of them; got {len(list(trainable_variables))}")
    return None


class ShardedLossScaleMixin:
    """A ``LossScaleOptimizer`` around a sharded optimizer: the scaled gradients are
    reduce-scattered, the slice's finiteness is agreed over the ranks, and the inner
    (sharded) optimizer updates the slice, or every rank skips and lowers the scale."""

    def build(self, variables):
        super().build(variables)  # the inner optimizer builds on the slice
        strategy_of(self).optimizer = self  # checkpoints hold the scaler, as unsharded

    def apply(self, grads, trainable_variables=None, *, reduced: bool = False):
        taken = start_apply(self, grads, trainable_variables, reduced)
        if taken is not None:
            return taken
        strategy = strategy_of(self)
        super().apply(strategy.scatter(list(grads)), strategy.slices)
        return self.iterations

    def check_finite(self, grads):
        return agreed_finite(super().check_finite(grads))
