"""Distributed Keras 3 optimizers: gradients all-reduced by Horovod before the update.

Horovod's own ``DistributedOptimizer`` cannot wrap a Keras 3 optimizer (it reaches for
``Variable.ref()`` and ``keras.backend`` names that Keras 3 removed). hvdtrain's version
keeps the user's optimizer a real Keras optimizer, so it works in a custom loop and in
``model.compile``, and inserts one fused all-reduce of the gradients just before the
update: after the local gradient accumulation (``backward_passes_per_step``) and before
gradient clipping, so clipping sees the global gradient as in single-process training.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from hvdtrain import options
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression as compression_lib
from hvdtrain.horovod import exchange, step
from hvdtrain.internals import keras_private


class _DistributedMixin(exchange.ExchangeSettings):
    """Reduces gradients across ranks at the point Keras is about to clip and apply them.

    Overrides Keras's private update-path hooks, ``keras_private.OPTIMIZER_HOOKS``.
    """

    def apply(self, grads, trainable_variables=None):
        if self._hvd_capture is not None:  # inside an XLA-compiled step: hand them out
            return self._hvd_capture.take(grads, trainable_variables, self)
        return super().apply(grads, trainable_variables)

    def build(self, variables):
        super().build(variables)
        if isinstance(self._hvd_exchange.compression, compression_lib.Sparsifier):
            # Error-feedback residuals are this rank's own: kept out of the optimizer's
            # variables, so they are neither broadcast nor checkpointed.
            self._hvd_residuals = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                               name="hvd_residual") for v in variables]

    def _backend_apply_gradients(self, grads, trainable_variables):
        # Read at trace time by _clip_gradients. Set past Keras's attribute tracking, which
        # would otherwise add the model's variables to ``optimizer.variables``.
        keras_private.set_untracked(self, "_hvd_current_vars", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if not self._hvd_already_reduced:
            grads = step.reduce_for(self, grads, self._hvd_current_vars)
        return super()._clip_gradients(grads)


class _DistributedLossScaleMixin(exchange.ExchangeSettings):
    """For ``LossScaleOptimizer``: reduce the scaled gradients before the finiteness check,
    so every rank takes the same branch (apply, or skip and lower the scale)."""

    def apply(self, grads, trainable_variables=None):
        if self._hvd_capture is not None:
            return self._hvd_capture.take(grads, trainable_variables, self)
        grads = step.reduce_for(self, list(grads), trainable_variables)
        return super().apply(grads, trainable_variables)


is_distributed = exchange.is_distributed


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, *, compression=None,
                         op="average", backward_passes_per_step: int = 1,
                         sparse_as_dense: bool = False,
                         compression_ratio: float | None = None,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = True,
                         groups=None, num_groups: int = 0,
                         process_set=None,
                         bucket_mb: float | None = None) -> keras.optimizers.Optimizer:
    """Makes a Keras 3 optimizer all-reduce its gradients over every rank before updating.

    The optimizer is wrapped in place (its class becomes a subclass that reduces first)
    and returned, so its state, learning rate and schedule are kept, and it can be passed
    to ``model.compile`` or used in a custom loop.

    Args:
        optimizer: a Keras 3 optimizer instance.
        compression: ``None``/``"none"``, ``"fp16"`` (Horovod's compressors also work),
            ``"topk"`` or ``"randomk"`` (sparsification with error feedback, exchanged by
            allgather; see :mod:`hvdtrain.compression`).
        op: ``"average"`` (default), ``"sum"`` or ``"adasum"``; Horovod's ops also work.
        backward_passes_per_step: gradients are accumulated locally (averaged) over this
            many calls and exchanged once, then applied.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before the all-reduce.
        compression_ratio: fraction of entries sent by ``"topk"`` / ``"randomk"``.
        gradient_predivide_factor: with ``op="average"``, divide by this before the sum
            and by ``size / factor`` after it (Horovod's meaning; guards fp16 against
            overflow).
        average_aggregated_gradients: with ``backward_passes_per_step > 1``, apply the
            mean of the accumulated gradients (hvdtrain's default) or, when False, their
            sum (``horovod.tensorflow.keras``'s default).
        groups, num_groups: Horovod's fusion groups: lists of variables each reduced in
            one fused call, or a number of contiguous groups (default: one group).
        process_set: a Horovod ``ProcessSet`` to reduce over (default: every rank).
        bucket_mb: without ``groups``, the gradients are reduced in buckets of about this
            many MiB, the last layers' first, so the exchange can start while the earlier
            layers' gradients are computed (default ``hvdtrain.options.DEFAULT_BUCKET_MB``;
            ``math.inf``: one fused all-reduce).

    Returns:
        The same optimizer object, now distributed. Under Keras's ``mixed_float16``
        policy it is first wrapped in a ``LossScaleOptimizer`` (which is returned), so
        the overflow check sees the reduced gradients and every rank skips together.

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer.
        ValueError: a bad ``op``, ``compression`` or ``backward_passes_per_step``.
    """
    dist.init()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("optimizer must be a Keras 3 optimizer instance (e.g. keras.optimizers."
                        f"SGD(0.01)), got {type(optimizer).__name__}")
    hvd_op = dist.resolve_op(op)
    compressor = compression_lib.resolve(compression, compression_ratio)
    fusion_groups = exchange.check_groups(groups, num_groups)
    reduce_op, prescale, postscale = exchange.predivide(gradient_predivide_factor, hvd_op,
                                                        process_set)
    if hvd_op is dist.Adasum and dist.size() & (dist.size() - 1):
        raise ValueError(f"op='adasum' needs a world size that is a power of two, got "
                         f"{dist.size()}")
    if hvd_op is dist.Adasum and dist.size() > 1 and not dist.mpi_enabled():
        raise ValueError("op='adasum' needs Horovod's MPI controller: launch with mpirun or "
                         "horovodrun --mpi (Gloo has no Adasum)")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError("backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    missing = keras_private.missing_optimizer_hooks(optimizer)
    if missing:
        raise TypeError(f"{type(optimizer).__name__} lacks the Keras 3 optimizer update path "
                        f"hvdtrain hooks into ({', '.join(missing)})")
    if is_distributed(optimizer):
        raise ValueError("optimizer is already a hvdtrain DistributedOptimizer")
    if (keras.mixed_precision.global_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        # Keras would wrap it in a LossScaleOptimizer at compile time, around the
        # reduction, and each rank would then skip steps on its own local overflow. Wrap
        # it here instead, so the scaled gradients are reduced before the check.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    sparsified = isinstance(compressor, compression_lib.Sparsifier)
    if sparsified and hvd_op is dist.Adasum:
        raise ValueError(f"compression={compressor.name!r} works with op 'average' or 'sum', not "
                         "'adasum'")
    if sparsified and (gradient_predivide_factor != 1.0 or fusion_groups or process_set):
        raise ValueError(f"compression={compressor.name!r} exchanges by allgather: it takes no "
                         "gradient_predivide_factor, groups, num_groups or process_set")
    if sparsified and optimizer.built:
        raise ValueError(f"compression={compressor.name!r} needs an optimizer that has not been "
                         "built yet (its residuals are created when it is built)")
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if loss_scaled and (sparsified or backward_passes_per_step != 1):
        raise ValueError("a LossScaleOptimizer (mixed_float16) works with compression 'none' or "
                         "'fp16' and backward_passes_per_step=1")
    if backward_passes_per_step > 1:
        if optimizer.built:
            raise ValueError("backward_passes_per_step > 1 needs an optimizer that has not been "
                             "built yet (its accumulators are created when it is built)")
        if optimizer.gradient_accumulation_steps not in (None, backward_passes_per_step):
            raise ValueError("optimizer already has gradient_accumulation_steps="
                             f"{optimizer.gradient_accumulation_steps}; pass "
                             "backward_passes_per_step instead")
        optimizer.gradient_accumulation_steps = backward_passes_per_step
    mixin = _DistributedLossScaleMixin if loss_scaled else _DistributedMixin
    keras_private.extend_class_in_place(optimizer, mixin)
    if backward_passes_per_step > 1 and not average_aggregated_gradients:
        prescale *= backward_passes_per_step  # Keras averages the passes
    how = exchange.Exchange(
        op=reduce_op, compression=compressor, sparse_as_dense=bool(sparse_as_dense),
        prescale=prescale, postscale=postscale, groups=fusion_groups,
        bucket_mb=options.check_bucket_mb(options.DEFAULT_BUCKET_MB if bucket_mb is None
                                          else bucket_mb),
        process_set=process_set)
    keras_private.set_untracked(optimizer, "_hvd_exchange", how)
    return optimizer
