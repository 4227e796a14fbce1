"""Optimizer state sharded over the ranks (ZeRO-1): the ``ReduceScatter`` strategy.

Each bucket's gradients are laid end to end in one flat float32 buffer, padded to a
multiple of the world size, and reduce-scattered (op Average), so each rank receives its
own equal share of every bucket. The wrapped Keras optimizer is built on flat variables
holding this rank's shares of the weights, one per bucket, so its moments are 1/N of
their unsharded size; it updates them, and the updated shares are all-gathered back into
the model's variables. A reduce-scatter plus an all-gather move the bytes of one ring
all-reduce.

Only element-wise updates can be sharded this way (``sharded_update.check_shardable``
refuses the others). What a slice alone does not know (a variable's or the global
gradient norm for clipping, a loss scaler's finiteness, the passes of local accumulation,
which variables weight decay excludes) is in ``sharded_update``.
"""
from __future__ import annotations

import math
from typing import Sequence

import logging

import keras
import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import scatter_ops, sharded_state, sharded_update
from hvdtrain.horovod.exchange_strategies import Strategy
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")

#: The gradient (and weight) buckets in flight at once, in MiB: buckets within it are
#: exchanged together (in one Horovod cycle where they are ready together); a bucket
#: beyond it waits for an earlier one to end, so the exchange's temporaries stay this
#: small however large the model. With the default 25 MiB buckets, a small model's
#: buckets all go at once and a large model's one after another (2 in flight raised the
#: peak RSS of a 100 M-parameter Adam run at np=4 from 0.73-0.78 to 0.78-0.80 of
#: unsharded, for no measurable speed).
IN_FLIGHT_MB = 32.0

#: Variables below this many MiB are never cut into buckets of their own, however small
#: ``bucket_mb`` (above it, a variable larger than ``bucket_mb`` is cut by rows).
CUT_MIN_MB = 1.0


class Layout:
    """Where each variable's entries sit in the flat, padded buffer of each bucket, and
    which range of each bucket is this rank's (static: read at trace time).

    A bucket is a list of *pieces* ``(position, lo, hi)``: entries ``lo:hi`` of a
    variable's flat view, whole rows of it. With ``max_entries``, a variable larger than
    that is cut by rows into buckets of its own, so no bucket's buffer (nor Horovod's and
    Gloo's working copies of it) is larger than ``max_entries`` entries, give or take a
    row: the exchange's temporaries stay small whatever the size of the largest layer.

    Args:
        shapes: the variables' shapes, in the gradients' order.
        buckets: lists of positions, each exchanged together (``None``: one bucket).
        rank, size: this rank and the number of ranks.
        max_entries: the most entries a bucket holds (``None``: no limit).
    """

    def __init__(self, shapes: Sequence, buckets: list[list[int]] | None, rank: int,
                 size: int, max_entries: int | None = None) -> None:
        self.sizes = [int(math.prod(s)) for s in shapes]
        self.shapes = [tuple(s) for s in shapes]
        self.buckets = _cut(buckets or [list(range(len(shapes)))], self.shapes, self.sizes,
                            max_entries)
        self.rank, self.size = rank, size
        totals = [sum(hi - lo for _, lo, hi in b) for b in self.buckets]
        self.chunks = [-(-t // size) for t in totals]  # each rank's share of a bucket
        self.pads = [c * size - t for c, t in zip(self.chunks, totals)]
        self.slice_size = sum(self.chunks)

    def waits(self, in_flight_mb: float) -> list[int | None]:
        """For each bucket, the earlier bucket whose exchange must end before its own
        starts (``None``: none), so the buckets in flight hold about ``in_flight_mb`` MiB
        at most (always at least one bucket)."""
        sizes = [4 * c * self.size for c in self.chunks]
        out, first, held = [], 0, 0
        for b, n in enumerate(sizes):
            held += n
            while first < b and held > in_flight_mb * 2**20:
                held, first = held - sizes[first], first + 1
            out.append(first - 1 if first else None)
        return out

    def pieces(self, b: int):
        """``(position, lo, hi, offset)`` of each piece of bucket ``b``: entries ``lo:hi``
        of that variable sit at ``offset`` in the bucket's flat buffer."""
        offset = 0
        for i, lo, hi in self.buckets[b]:
            yield i, lo, hi, offset
            offset += hi - lo

    def flat_buckets(self, values: Sequence) -> list[tf.Tensor]:
        """Each bucket's ``values`` (``None``: zeros) flat, float32, padded."""
        return [self.flat_bucket(b, values) for b in range(len(self.buckets))]

    def flat_bucket(self, b: int, values: Sequence, dtype=tf.float32) -> tf.Tensor:
        """Bucket ``b``'s ``values`` (``None``: zeros) flat, in ``dtype``, padded (a
        bucket of one whole variable and no padding is a reshape, not a copy)."""
        parts = [tf.zeros([hi - lo], dtype) if values[i] is None
                 else self._flat(values[i], i, lo, hi, dtype)
                 for i, lo, hi in self.buckets[b]]
        if self.pads[b]:
            parts.append(tf.zeros([self.pads[b]], dtype))
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    def _flat(self, value, i: int, lo: int, hi: int, dtype=tf.float32) -> tf.Tensor:
        flat = tf.reshape(tf.cast(tf.convert_to_tensor(value), dtype), [-1])
        return flat if (lo, hi) == (0, self.sizes[i]) else flat[lo:hi]

    def own_runs(self, b: int):
        """``(position, lo, hi)`` of each run of this rank's share of bucket ``b``, in
        order: entries ``lo:hi`` of one variable's flat view, or ``(-1, 0, n)``: n
        entries of the bucket's padding."""
        chunk = self.chunks[b]
        start, end, last = self.rank * chunk, (self.rank + 1) * chunk, 0
        for i, lo, hi, offset in self.pieces(b):
            a, z = max(start, offset), min(end, offset + hi - lo)
            if a < z:
                yield i, lo + a - offset, lo + z - offset
            last = offset + hi - lo
        if end > last:  # this rank's share runs into the padding
            yield -1, 0, end - max(start, last)

    def _own_parts(self, b: int, values: Sequence):
        """This rank's share of bucket ``b`` of ``values``, part by part, each made when
        it is asked for (a part of one variable, or the bucket's padding)."""
        for i, lo, hi in self.own_runs(b):
            yield tf.zeros([hi], tf.float32) if i < 0 else self._flat(values[i], i, lo, hi)

    def own_slices(self, values: Sequence) -> list[tf.Tensor]:
        """This rank's slice of ``values`` (the weights), one flat part per bucket, read
        without a full flat copy."""
        out = []
        for b in range(len(self.buckets)):
            parts = list(self._own_parts(b, values))
            out.append(tf.concat(parts, 0) if len(parts) > 1 else parts[0])
        return out

    def load_own_slices(self, values: Sequence, targets: Sequence) -> None:
        """Sets each bucket's flat variable in ``targets`` to this rank's share of it in
        ``values``, in place, part after part: no temporary larger than one part."""
        done = []
        for b, target in enumerate(targets):
            position, parts = 0, self._own_parts(b, values)
            while True:
                with tf.control_dependencies(done):  # the next part read once this one is in
                    part = next(parts, None)
                    if part is None:
                        break
                    n = int(part.shape[0])
                    op = tf.raw_ops.ResourceStridedSliceAssign(
                        ref=target.handle, begin=[position], end=[position + n],
                        strides=[1], value=part)
                done, position = [op] if op is not None else [], position + n

    def assign_bucket(self, b: int, full, variables: Sequence) -> list:
        """Assigns bucket ``b``'s gathered flat buffer into its variables, in place (a
        piece into its rows); returns the assignments (to order later work after them).
        Nothing reads the variables in between, so no assignment copies a variable."""
        ops = []
        for i, lo, hi, offset in self.pieces(b):
            v, shape = variables[i], self.shapes[i]
            piece = tf.cast(full[offset:offset + hi - lo], v.dtype)
            if (lo, hi) == (0, self.sizes[i]):
                ops.append(tf.raw_ops.AssignVariableOp(resource=v.handle,
                                                       value=tf.reshape(piece, shape)))
            else:  # whole rows of a variable cut by _cut
                row = self.sizes[i] // shape[0]
                ops.append(tf.raw_ops.ResourceStridedSliceAssign(
                    ref=v.handle, begin=[lo // row], end=[hi // row], strides=[1],
                    value=tf.reshape(piece, ((hi - lo) // row,) + shape[1:])))
        return [op for op in ops if op is not None]


def _cut(buckets, shapes, sizes, max_entries) -> list[list[tuple[int, int, int]]]:
    """``buckets`` (lists of positions) as lists of pieces ``(position, lo, hi)``, each
    bucket of at most ``max_entries`` entries (a variable larger than that cut by whole
    rows, at least one row a piece)."""
    out = []
    for bucket in buckets:
        current, filled = [], 0
        for i in bucket:
            row = sizes[i] // shapes[i][0] if shapes[i] and shapes[i][0] else 1
            step = sizes[i] if max_entries is None or sizes[i] <= max_entries else \
                max(1, max_entries // max(1, row)) * row
            for lo in range(0, sizes[i], step) if sizes[i] else [0]:
                hi = min(sizes[i], lo + step)
                if current and max_entries is not None and filled + hi - lo > max_entries:
                    out.append(current)
                    current, filled = [], 0
                current.append((i, lo, hi))
                filled += hi - lo
        if current:
            out.append(current)
    return out


class ReduceScatter(Strategy):
    """Sharded optimizer state: each bucket reduce-scattered into this rank's slice, the
    slice updated by the wrapped optimizer, the slices all-gathered into the variables."""

    name = "reducescatter"
    carries_riders = True  # in the first bucket's reduce-scatter

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.layout: Layout | None = None
        self.slices: list | None = None  # this rank's share of each bucket, flat
        self.variables: list | None = None
        self.optimizer = None  # the sharded optimizer, once built
        self.accumulators: list = []  # full-size, local: backward_passes_per_step > 1
        self._restoring = None  # rank 0's full view being restored into
        self._logged_size = False

    def make(self, variables: Sequence, buckets: list[list[int]] | None) -> list:
        """Lays out ``variables`` and makes one flat variable per bucket for this rank's
        share of it (kept out of the optimizer's variables, so neither broadcast nor
        checkpointed: they are read from the weights before every update)."""
        self.variables = list(variables)
        mb = self.settings.bucket_mb  # a variable larger is cut (never below CUT_MIN_MB)
        cap = int(max(mb, CUT_MIN_MB) * 2**20) // 4 if mb and math.isfinite(mb) else None
        self.layout = Layout([v.shape for v in variables], buckets, dist.rank(), dist.size(),
                             max_entries=cap)
        self.slices = [keras.Variable(part, dtype="float32", trainable=True,
                                      name=f"hvd_shard_{b}")
                       for b, part in enumerate(self.layout.own_slices(variables))]
        return self.slices

    def is_slices(self, variables) -> bool:
        """True when ``variables`` are this rank's slice variables (a loss scaler's call)."""
        return (self.slices is not None and variables is not None
                and len(variables) == len(self.slices)
                and all(v is s for v, s in zip(variables, self.slices)))

    # --- checkpoints in the unsharded format (hvdtrain.horovod.sharded_state)
    saves_state = True

    def save_objects(self) -> dict:
        view = sharded_state.gather_to_root(self)
        if view is None:
            return {}
        if not self._logged_size:
            self._logged_size = True
            logger.info("saving the sharded optimizer state: rank 0 gathers it whole (%.1f MB)",
                        sharded_state.state_size(self.variables, self._kinds()) / 2**20)
        return {"optimizer": view}

    def restore_objects(self) -> dict:
        self._restoring, _ = sharded_state.full_view(self.optimizer, self.variables,
                                                     self._kinds())
        return {"optimizer": self._restoring}

    def after_restore(self, restored: bool) -> None:
        view, self._restoring = self._restoring, None
        if restored:
            sharded_state.scatter_from_root(self, view)

    def local_variables(self) -> list:
        if self.optimizer is None:
            return []
        return [slot for s in self.slices
                for _, slot in sharded_state.slice_slots(self.optimizer, s)]

    def _kinds(self) -> list[str]:
        return [kind for kind, _ in sharded_state.slice_slots(self.optimizer, self.slices[0])]

    def reduce(self, grads, variables, buckets, seed):
        """This rank's share of each bucket of the averaged gradients (as :meth:`scatter`),
        then the riders (the entries past the model's gradients) averaged: they ride in
        the first bucket's reduce-scatter, a copy in every rank's share of it."""
        if self.layout is None:
            raise ValueError("the sharded exchange needs the optimizer built on the model's "
                             "variables first (optimizer.build)")
        n = len(self.variables)
        return self.scatter(list(grads)[:n], riders=list(grads)[n:])

    def scatter(self, grads: Sequence, riders: Sequence = ()) -> list[tf.Tensor]:
        """This rank's share of each bucket of the gradients averaged over the ranks (one
        flat float32 tensor per bucket), then each of ``riders`` (scalars) averaged."""
        s, grads, pieces = self.settings, list(grads), []
        # fp16 compression: sent and summed in float16, the slice updated in float32
        wire = (tf.float16 if s.compression is dist.Compression.fp16 and self.layout.size > 1
                else tf.float32)
        extra = tf.cast(tf.stack(riders), wire) if riders else None
        waits = self.layout.waits(IN_FLIGHT_MB)
        for b, wait in enumerate(waits):
            # a bucket's flat buffer (and Horovod's working copy of it) is made only once
            # the exchange of the bucket it waits for has ended: at most IN_FLIGHT_MB of
            # such temporaries are alive, not a full-size copy of every gradient
            with tf.control_dependencies([] if wait is None else [pieces[wait]]):
                flat = self.layout.flat_bucket(b, grads, dtype=wire)
                if b == 0 and extra is not None:  # the riders at the end of every share
                    shares = tf.reshape(flat, [self.layout.size, self.layout.chunks[0]])
                    flat = tf.reshape(tf.concat(
                        [shares, tf.tile(extra[None], [self.layout.size, 1])], 1), [-1])
                if s.prescale != 1.0:
                    flat = flat * s.prescale
                pieces.append(tf.cast(scatter_ops.reducescatter_average(
                    [flat], op=s.op, tag=f"_b{b}")[0], tf.float32))
        if extra is not None:
            first, chunk = pieces[0], self.layout.chunks[0]
            pieces[0] = first[:chunk]
            pieces += [first[chunk + i] for i in range(len(riders))]
        if s.postscale != 1.0:
            pieces = [p * s.postscale for p in pieces]
        return pieces

    def load_slices(self, variables: Sequence) -> None:
        """Sets the slice variables from the weights (they may have been broadcast or
        restored since the last update)."""
        self.layout.load_own_slices(variables, self.slices)

    def after_update(self, variables):
        variables, done = list(variables), []
        for b, wait in enumerate(self.layout.waits(IN_FLIGHT_MB)):
            # each bucket's share read once updated (a read, not a copy), gathered and
            # assigned into the variables in place, once the bucket it waits for is in:
            # at most IN_FLIGHT_MB of gathered buffers alive beside the weights
            with tf.control_dependencies([] if wait is None else done[wait]):
                full = scatter_ops.allgather_slices([tf.convert_to_tensor(self.slices[b])],
                                                    tag=f"_b{b}")[0]
            done.append(self.layout.assign_bucket(b, full, variables))


class ShardedMixin:
    """A Keras 3 optimizer built on this rank's flat slices of the weights (one per
    bucket), whose ``apply`` reduce-scatters the gradients (every
    ``gradient_accumulation_steps``-th pass, their local sum), updates the slices and
    all-gathers the weights; norm clipping sees the norms of the whole gradient
    (``sharded_update``). Keras updates each slice from its bucket's gradient alone, so
    a bucket is updated and gathered while later buckets are still being reduced, and the
    update's temporaries are bucket-sized."""

    def build(self, variables):
        strategy = sharded_update.strategy_of(self)
        if strategy.slices is None:
            buckets = getattr(self, "_hvd_distributed").exchanger.plan(list(variables))
            strategy.make(variables, buckets)
            if self.gradient_accumulation_steps:
                strategy.accumulators = sharded_update.make_accumulators(variables)
        super().build(strategy.slices)
        strategy.optimizer = self

    def apply(self, grads, trainable_variables=None, *, reduced: bool = False):
        strategy = sharded_update.strategy_of(self)
        tv = None if trainable_variables is None else list(trainable_variables)
        if strategy.is_slices(tv):
            # a loss scaler's call (ShardedLossScaleMixin): the slices' gradients, reduced
            return self._update_slices(list(grads))
        taken = sharded_update.start_apply(self, grads, tv, reduced)
        if taken is not None:
            return taken
        if reduced:  # the caller reduced them with the exchanger: the slices' gradients
            return self._update_slices(list(grads))
        hvd = getattr(self, "_hvd_distributed")  # its reduce: fit's riders ride along
        if self.gradient_accumulation_steps:
            sharded_update.accumulate(
                self, strategy.accumulators, list(grads),
                lambda total: self._update_slices(hvd.reduce(self, total, strategy.variables)))
        else:
            self._update_slices(hvd.reduce(self, list(grads), strategy.variables))
        return self.iterations

    def _update_slices(self, grad_slices):
        strategy = sharded_update.strategy_of(self)
        strategy.load_slices(strategy.variables)
        super().apply(grad_slices, strategy.slices)
        strategy.after_update(strategy.variables)
        return self.iterations

    def _clip_gradients(self, grads):
        if sharded_update.clips_by_norm(self):
            return sharded_update.clip_slices(self, grads)
        return super()._clip_gradients(grads)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is not None:
            sharded_update.decay_slices(self)

    def finalize_variable_values(self, var_list):
        if self.use_ema:
            sharded_update.finalize_slices(self)


def extend_in_place(optimizer, attribute: str, distributed) -> None:
    """Makes ``optimizer`` sharded in place (its class extended, ``distributed`` set as
    its ``attribute``); under a loss scaler, the scaler and the optimizer inside it."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        keras_private.extend_class_in_place(optimizer, sharded_update.ShardedLossScaleMixin)
        keras_private.set_untracked(optimizer, attribute, distributed)
        optimizer = optimizer.inner_optimizer  # the one that updates the slice
    keras_private.extend_class_in_place(optimizer, ShardedMixin)
    keras_private.set_untracked(optimizer, attribute, distributed)
