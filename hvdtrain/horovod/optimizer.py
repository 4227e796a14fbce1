"""Distributed Keras 3 optimizers: gradients all-reduced by Horovod before the update.

Horovod's own ``DistributedOptimizer`` cannot wrap a Keras 3 optimizer (it reaches for
``Variable.ref()`` and ``keras.backend`` names that Keras 3 removed). hvdtrain's version
keeps the user's optimizer a real Keras optimizer, so it works in a custom loop and in
``model.compile``, and inserts one fused all-reduce of the gradients just before the
update: after the local gradient accumulation (``backward_passes_per_step``) and before
gradient clipping, so clipping sees the global gradient as in single-process training.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Sequence

import keras
import tensorflow as tf

from hvdtrain import options
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression as compression_lib
from hvdtrain.horovod import exchange, exchange_settings, finite, sharded, sharded_update
from hvdtrain.horovod.runtime import alone
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")

#: The one attribute hvdtrain sets on a Keras object: a distributed optimizer's
#: :class:`_Distributed` (set past Keras's attribute tracking).
ATTRIBUTE = "_hvd_distributed"


class _Update:
    """One ``apply`` call in flight: whether its caller reduced the gradients (an argument
    of :func:`apply`), and the variables Keras updates (read by the clipping hook)."""

    def __init__(self, reduced: bool) -> None:
        self.reduced = reduced
        self.variables: list | None = None
        self.bad_ranks = None  # how many ranks' gradients were not finite (when checked)


class _Ride:
    """``fit``'s riders waiting for the optimizer's exchange, and who gets their sums."""

    def __init__(self, riders: Sequence, on_sums: Callable) -> None:
        self.riders, self.on_sums, self.done = list(riders), on_sums, False

    def arrive(self, sums) -> None:
        self.on_sums(sums)
        self.done = True


class _Distributed:
    """What a distributed optimizer holds: its :class:`~hvdtrain.horovod.exchange.Exchanger`,
    and for the call being traced the update in flight, ``fit``'s riders and, inside
    ``fit``'s XLA step, where ``apply`` hands its gradients (:class:`step.Capture`)."""

    def __init__(self, exchanger: exchange.Exchanger, nan_policy: str = "ignore") -> None:
        self.exchanger = exchanger
        self.nan_policy = nan_policy
        self.update: _Update | None = None
        self.ride: _Ride | None = None
        self.capture = None

    def reduce(self, optimizer, grads, variables, flag=None) -> list:
        """The exchanger's reduction inside ``apply``; ``fit``'s riders go along when
        the exchange runs every step (no local accumulation) and can carry them, and so
        does ``flag`` (this rank's non-finite gradients flag), whose sum goes to
        ``self.update.bad_ranks``."""
        ride, riders = self.ride, []
        if (ride is not None and not ride.done and not optimizer.gradient_accumulation_steps
                and self.exchanger.carries(ride.riders)):
            riders = list(ride.riders)
        mine = [] if flag is None else [exchange.Rider(flag, exact=True)]
        grads, sums = self.exchanger.reduce(grads, variables, riders + mine,
                                            seed=optimizer.iterations)
        if riders:
            ride.arrive(sums[:len(riders)])
        if mine:
            self.update.bad_ranks = sums[-1]
        return grads

    @contextlib.contextmanager
    def applying(self, reduced: bool):
        self.update = _Update(reduced)
        try:
            yield self.update
        finally:
            self.update = None


def _of(optimizer) -> _Distributed:
    return getattr(optimizer, ATTRIBUTE)


class _DistributedMixin:
    """Reduces gradients across ranks at the point Keras is about to clip and apply them.

    Overrides Keras's private update-path hooks, ``keras_private.OPTIMIZER_HOOKS``.
    """

    def apply(self, grads, trainable_variables=None, *, reduced: bool = False):
        hvd = _of(self)
        if hvd.capture is not None:  # inside an XLA-compiled step: hand them out
            return hvd.capture.take(grads, trainable_variables, self)
        with hvd.applying(reduced):
            return super().apply(grads, trainable_variables)

    def build(self, variables):
        super().build(variables)
        _of(self).exchanger.build(variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        hvd = _of(self)
        if hvd.update is None:  # reached without apply (Keras's own paths): reduce here
            with hvd.applying(False):
                return self._backend_apply_gradients(grads, trainable_variables)
        hvd.update.variables = list(trainable_variables)  # read by _clip_gradients
        parent = super()._backend_apply_gradients
        if hvd.nan_policy != "ignore" and not hvd.update.reduced and (
                not self.gradient_accumulation_steps):
            # reduced here (clipping comes next, as it would), the flag riding along, and
            # applied only when every rank's gradients were finite (hvdtrain.horovod.finite)
            flag = finite.local_flag(grads)
            grads = hvd.reduce(self, grads, hvd.update.variables, flag)
            hvd.update.reduced = True
            result = finite.apply_if_finite(
                hvd.nan_policy, hvd.update.bad_ranks, flag, lambda: self.iterations + 1,
                lambda: parent(grads, trainable_variables))
        else:
            result = parent(grads, trainable_variables)
        hvd.exchanger.after_update(trainable_variables)
        return result

    def _clip_gradients(self, grads):
        hvd = _of(self)
        if not hvd.update.reduced:
            grads = hvd.reduce(self, grads, hvd.update.variables)
        return super()._clip_gradients(grads)


class _DistributedLossScaleMixin:
    """For ``LossScaleOptimizer``: reduce the scaled gradients before the finiteness check,
    so every rank takes the same branch (apply, or skip and lower the scale)."""

    def apply(self, grads, trainable_variables=None, *, reduced: bool = False):
        hvd = _of(self)
        if hvd.capture is not None:
            return hvd.capture.take(grads, trainable_variables, self)
        if not reduced and hvd.exchanger.strategy.keeps_gradients:
            # its errors carry over to later steps, whose loss scale may differ: the
            # exchange sees unscaled gradients (a power of two: exact), the check scaled ones
            if not self.built:  # the scale is made by build (fit builds in apply)
                self.build(trainable_variables)
            scale = self.dynamic_scale
            grads = [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]
            grads = [None if g is None else g * tf.cast(scale, g.dtype)
                     for g in hvd.reduce(self, grads, trainable_variables)]
        elif not reduced:
            grads = hvd.reduce(self, list(grads), trainable_variables)
        return super().apply(grads, trainable_variables)

    def build(self, variables):
        super().build(variables)
        _of(self).exchanger.build(variables)


def is_distributed(optimizer) -> bool:
    """True when ``optimizer`` was already wrapped by a ``DistributedOptimizer``."""
    return isinstance(getattr(optimizer, ATTRIBUTE, None), _Distributed)


def exchanger_of(optimizer) -> exchange.Exchanger:
    """The :class:`~hvdtrain.horovod.exchange.Exchanger` of a distributed optimizer."""
    return _of(optimizer).exchanger


def apply(optimizer, grads, variables, *, reduced: bool):
    """``optimizer.apply(grads, variables)``; with ``reduced`` (the caller reduced them
    with the optimizer's exchanger) the optimizer's own reduction is skipped."""
    return optimizer.apply(grads, variables, reduced=reduced)


def reduces_before_apply(optimizer) -> bool:
    """True when a caller may reduce the gradients itself with the optimizer's exchanger
    (one fused call, scalars riding along) and then :func:`apply` them: no local
    accumulation, loss scaling or compression has to happen first. (A sharded optimizer's
    exchanger returns this rank's share of each bucket, which its ``apply`` takes.)"""
    if not is_distributed(optimizer):
        return False
    how = exchanger_of(optimizer).settings
    return (not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and not optimizer.gradient_accumulation_steps
            # fp16 would turn a large (finite) loss riding along into Inf
            and how.compression is dist.Compression.none
            and how.prescale == 1.0 and how.postscale == 1.0
            and how.groups is None and how.process_set is None)


@contextlib.contextmanager
def riding(optimizer, riders: Sequence, on_sums: Callable):
    """While ``fit``'s step traces inside this block, ``optimizer``'s exchange carries
    ``riders`` (:class:`~hvdtrain.horovod.exchange.Rider`) where it can; at the block's
    end they go on their own if nothing took them. Either way ``on_sums`` receives their
    sums over the ranks."""
    hvd = _of(optimizer)
    hvd.ride = ride = _Ride(riders, on_sums)
    try:
        yield ride
        if not ride.done:
            ride.arrive(hvd.exchanger.reduce([], None, ride.riders)[1])
    finally:
        hvd.ride = None


@contextlib.contextmanager
def capturing(optimizer, capture):
    """While tracing inside this block, ``optimizer.apply`` only records its arguments
    in ``capture`` (a :class:`hvdtrain.horovod.step.Capture`)."""
    hvd = _of(optimizer)
    hvd.capture = capture
    try:
        yield capture
    finally:
        hvd.capture = None


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, *, compression=None,
                         op="average", backward_passes_per_step: int = 1,
                         sparse_as_dense: bool = False,
                         compression_ratio: float | None = None,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = True,
                         groups=None, num_groups: int = 0,
                         process_set=None,
                         bucket_mb: float | None = None,
                         compression_rank: int | None = None,
                         shard_optimizer: bool = False,
                         nan_policy: str | None = None) -> keras.optimizers.Optimizer:
    """Makes a Keras 3 optimizer all-reduce its gradients over every rank before updating.

    The optimizer is wrapped in place (its class becomes a subclass that reduces first)
    and returned, so its state, learning rate and schedule are kept, and it can be passed
    to ``model.compile`` or used in a custom loop.

    Args:
        optimizer: a Keras 3 optimizer instance.
        compression: ``None``/``"none"``, ``"fp16"`` (Horovod's compressors also work),
            ``"topk"`` or ``"randomk"`` (sparsification with error feedback, exchanged by
            allgather), or ``"powersgd"`` (each matrix sent as two rank-r factors, with
            error feedback; ``hvdtrain.compression.PowerSGD(rank, start_step)`` for its
            other settings); see :mod:`hvdtrain.compression`.
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
        compression_rank: the rank of ``"powersgd"``'s approximation (default
            ``hvdtrain.compression.DEFAULT_RANK``); an hvdtrain extension.
        shard_optimizer: shard the optimizer's state over the ranks (ZeRO-1): the
            gradients are reduce-scattered, each rank updates its slice of the weights
            with moments for that slice alone, and the slices are all-gathered
            (``hvdtrain.horovod.sharded``); element-wise optimizers only, with op
            ``"average"``, compression ``"none"`` or ``"fp16"`` and no process set;
            clipping, loss scaling and local accumulation work. On one rank (not
            elastic) there is nothing to shard and the optimizer is left unsharded. An
            hvdtrain extension.
        nan_policy: when some rank's gradients hold a NaN or an Inf before the exchange:
            ``"stop"`` (raise, naming the step and the ranks; no update), ``"skip"`` (no
            update on any rank) or ``"ignore"``; default ``$HVDTRAIN_NAN_POLICY``, else
            ``"stop"`` (:mod:`hvdtrain.horovod.finite`). Not checked under a loss scaler
            (its own signal), local accumulation or ``shard_optimizer``. An hvdtrain
            extension.

    Returns:
        The same optimizer object, now distributed. Under Keras's ``mixed_float16``
        policy it is first wrapped in a ``LossScaleOptimizer`` (which is returned), so
        the overflow check sees the reduced gradients and every rank skips together.

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer.
        ValueError: a bad ``op``, ``compression`` or ``backward_passes_per_step``.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("optimizer must be a Keras 3 optimizer instance (e.g. keras.optimizers."
                        f"SGD(0.01)), got {type(optimizer).__name__}")
    settings = options.ReductionOptions(  # every setting checked, before Horovod starts
        compression=compression, compression_ratio=compression_ratio, op=op,
        backward_passes_per_step=backward_passes_per_step, sparse_as_dense=sparse_as_dense,
        bucket_mb=options.DEFAULT_BUCKET_MB if bucket_mb is None else bucket_mb,
        compression_rank=compression_rank)
    dist.init()
    hvd_op = dist.resolve_op(op)
    compressor = compression_lib.resolve(compression, compression_ratio, compression_rank)
    fusion_groups = exchange_settings.check_groups(groups, num_groups)
    reduce_op, prescale, postscale = exchange_settings.predivide(gradient_predivide_factor, hvd_op,
                                                        process_set)
    if hvd_op is dist.Adasum and dist.size() & (dist.size() - 1):
        raise ValueError(f"op='adasum' needs a world size that is a power of two, got "
                         f"{dist.size()}")
    if hvd_op is dist.Adasum and dist.size() > 1 and not dist.mpi_enabled():
        raise ValueError("op='adasum' needs Horovod's MPI controller: launch with mpirun or "
                         "horovodrun --mpi (Gloo has no Adasum)")
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
    if isinstance(compressor, compression_lib.PowerSGD) and (
            hvd_op is dist.Adasum or process_set is not None):
        raise ValueError("compression='powersgd' works with op 'average' or 'sum' over every "
                         "rank: it takes no op='adasum' or process_set")
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
    if shard_optimizer:
        if (hvd_op is not dist.Average or process_set is not None or fusion_groups
                or compressor not in (dist.Compression.none, dist.Compression.fp16)):
            raise ValueError("shard_optimizer=True works with op='average', compression "
                             "'none' or 'fp16', no groups and no process_set")
        sharded_update.check_shardable(optimizer)  # refused on one rank as on many
        if alone():  # nothing to shard: a slice would be a second copy of the weights
            logger.info("shard_optimizer=True on one rank: nothing to shard over, so the "
                        "optimizer keeps its whole state (as unsharded)")
            shard_optimizer = False
    if not shard_optimizer:
        keras_private.extend_class_in_place(
            optimizer, _DistributedLossScaleMixin if loss_scaled else _DistributedMixin)
    if backward_passes_per_step > 1 and not average_aggregated_gradients:
        prescale *= backward_passes_per_step  # Keras averages the passes
    how = exchange_settings.ExchangeSettings(
        op=reduce_op, compression=compressor, sparse_as_dense=bool(sparse_as_dense),
        prescale=prescale, postscale=postscale, groups=fusion_groups,
        bucket_mb=float(settings.bucket_mb),
        process_set=process_set, shard_optimizer=bool(shard_optimizer))
    state = _Distributed(exchange.Exchanger(how), finite.resolve_policy(nan_policy))
    if shard_optimizer:  # (and the optimizer inside a loss scaler)
        sharded.extend_in_place(optimizer, ATTRIBUTE, state)
    else:
        keras_private.set_untracked(optimizer, ATTRIBUTE, state)
    return optimizer
