"""Checkpoints of sharded optimizer state, in the format of an unsharded run.

A sharded optimizer (``sharded.ReduceScatter``) holds, on each rank, its moments for that
rank's slice of a flat buffer only. A checkpoint holds what the same optimizer unsharded
would hold: one slot per variable and kind (``momentum``, ``velocity``...), full size, so
a sharded run resumes from an unsharded checkpoint and the other way round, and on any
number of ranks.

* Saving (every rank): each kind's slices are all-gathered bucket by bucket, and rank 0
  writes them into a *full view*, an optimizer of the user's class built on the model's
  variables, made for the save and dropped after it (so only rank 0 holds the full state,
  and only while it writes).
* Restoring: rank 0 reads the checkpoint into a full view; then every rank takes its own
  part of each slot, one variable at a time (a sum over the ranks of rank 0's value and
  zeros: exact), so no rank but 0 ever holds more than one full variable.
* Local accumulation's pending sums are full-size on every rank: saved and restored
  whole (:data:`ACCUMULATED`).

The slice's slots are found by name: Keras names a slot ``<reference>_<kind>``, and the
slice variable's name is the reference of the sharded optimizer's slots.
"""
from __future__ import annotations

import logging
import math

import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import scatter_ops

logger = logging.getLogger("hvdtrain")


#: The slot kind of Keras's local accumulation (``gradient_accumulation_steps``): the
#: sharded update keeps its sums in full-size accumulators of its own
#: (``ReduceScatter.accumulators``, averaged over the ranks before a save by
#: ``accumulated_state``), which are what the checkpoint's slots of this kind hold.
ACCUMULATED = "gradient_accumulator"


def user_class(optimizer) -> type:
    """The user's optimizer class under hvdtrain's mixin (``extend_class_in_place``)."""
    return type(optimizer).__bases__[-1]


def slice_slots(optimizer, slice_variable) -> list[tuple[str, object]]:
    """``(kind, slot)`` for each of ``optimizer``'s slots of ``slice_variable``."""
    prefix = slice_variable.name + "_"
    size = tuple(slice_variable.shape)
    return [(v.name[len(prefix):], v) for v in optimizer.variables
            if v.name.startswith(prefix) and tuple(v.shape) == size]


def _scalars(optimizer) -> dict:
    return {v.name: v for v in optimizer.variables if not v.shape.rank}


def _view_slots(view, kind: str) -> list:
    """``view``'s slots of ``kind``, in its variables' order."""
    return [v for v in view.variables if v.shape.rank and v.name.endswith("_" + kind)]


def full_view(optimizer, variables, kinds: list[str]) -> tuple[object, dict[str, list]]:
    """An optimizer of ``optimizer``'s class and config built on ``variables``, and its
    slots by kind, in the variables' order.

    Raises:
        ValueError: the class does not make one slot of each kind per variable.
    """
    view = user_class(optimizer).from_config(optimizer.get_config())
    view.build(list(variables))
    slots = {}
    for kind in kinds:
        found = _view_slots(view, kind)
        if [tuple(v.shape) for v in found] != [tuple(v.shape) for v in variables]:
            raise ValueError(f"{type(view).__name__} does not make one {kind!r} slot per "
                             "variable: its sharded state cannot be saved in the unsharded "
                             "format")
        slots[kind] = found
    return view, slots


def readable_bytes(n: int) -> str:
    """``n`` bytes as ``"1.5 GB"``, ``"381.4 MB"`` or ``"0.9 KB"`` (binary units)."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KB"


def state_bytes(optimizer) -> int:
    """The bytes of ``optimizer``'s variables held on this rank (its moments, slots and
    counters; for a sharded optimizer, those of this rank's slice)."""
    return sum(int(math.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in optimizer.variables)


def describe_state(optimizer) -> str:
    """One line for the start log: ``optimizer``'s state bytes on this rank and, when its
    state is sharded, the ranks and the whole (unsharded) size it is a part of."""
    mine = readable_bytes(state_bytes(optimizer))
    distributed = getattr(optimizer, "_hvd_distributed", None)
    strategy = distributed.exchanger.strategy if distributed is not None else None
    if getattr(strategy, "name", None) != "reducescatter" or strategy.optimizer is None:
        return f"optimizer state: {mine} per rank (not sharded)"
    n = strategy.layout.size
    whole = readable_bytes(state_size(strategy.variables, strategy._kinds()))
    return f"optimizer state: {mine} per rank (sharded over {n}: 1/{n} of {whole})"


def state_size(variables, kinds) -> int:
    """The bytes of the full (unsharded) slots: what rank 0 holds while it saves."""
    return 4 * len(kinds) * sum(int(math.prod(v.shape)) for v in variables)


def _slots_by_bucket(strategy) -> dict[str, list]:
    """Each kind's slots of ``strategy``'s slice variables, one per bucket, in order."""
    out: dict[str, list] = {}
    for part in strategy.slices:
        for kind, slot in slice_slots(strategy.optimizer, part):
            out.setdefault(kind, []).append(slot)
    return out


def gather_to_root(strategy):
    """The full view of ``strategy``'s optimizer state on rank 0 (``None`` elsewhere);
    run on every rank (all-gathers, one per slot kind and bucket)."""
    optimizer, layout = strategy.optimizer, strategy.layout
    slots = _slots_by_bucket(strategy)
    root = dist.rank() == 0
    view, targets = full_view(optimizer, strategy.variables, list(slots)) \
        if root else (None, None)
    for kind, parts in slots.items():
        if kind == ACCUMULATED and strategy.accumulators:  # whole on every rank already
            for i, acc in enumerate(strategy.accumulators):
                if root:
                    targets[kind][i].assign(tf.cast(acc, targets[kind][i].dtype))
            continue
        for b, slot in enumerate(parts):
            full = scatter_ops.allgather_slices([tf.convert_to_tensor(slot)])[0]
            if root:
                layout.assign_bucket(b, full, targets[kind])
            del full
    if root:
        for name, v in _scalars(optimizer).items():
            mine = _scalars(view).get(name)
            if mine is not None:
                mine.assign(tf.cast(v, mine.dtype))
    return view


def scatter_from_root(strategy, view) -> None:
    """Sets every rank's slice slots from rank 0's full ``view`` (``None`` elsewhere), and
    rank 0's counters from the view's; run on every rank."""
    layout = strategy.layout
    slots = _slots_by_bucket(strategy)
    targets = None if view is None else {k: _view_slots(view, k) for k in slots}
    for kind, bucket_slots in slots.items():
        if kind == ACCUMULATED and strategy.accumulators:  # every rank's, whole
            for i, acc in enumerate(strategy.accumulators):
                source = (tf.cast(targets[kind][i], tf.float32) if targets is not None
                          else tf.zeros(acc.shape, tf.float32))
                acc.assign(dist.allreduce_total(source))  # rank 0's value (zeros elsewhere)
            continue
        for b, slot in enumerate(bucket_slots):
            chunk, parts, last = layout.chunks[b], [], 0
            start, end = layout.rank * chunk, (layout.rank + 1) * chunk
            for i, lo, hi, at in layout.pieces(b):  # entries lo:hi of variable i, at `at`
                source = (tf.reshape(tf.cast(targets[kind][i], tf.float32), [-1])[lo:hi]
                          if targets is not None else tf.zeros([hi - lo], tf.float32))
                full = dist.allreduce_total(source)  # rank 0's value (zeros elsewhere)
                if max(start, at) < min(end, at + hi - lo):
                    parts.append(full[max(start, at) - at:min(end, at + hi - lo) - at])
                last = at + hi - lo
            if end > last:  # this rank's share runs into the padding
                parts.append(tf.zeros([end - max(start, last)], tf.float32))
            slot.assign(tf.concat(parts, 0) if len(parts) > 1 else parts[0])
    if view is not None:
        for name, v in _scalars(view).items():
            mine = _scalars(strategy.optimizer).get(name)
            if mine is not None:
                mine.assign(tf.cast(v, mine.dtype))
