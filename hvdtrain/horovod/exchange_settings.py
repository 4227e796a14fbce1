"""The exchange's settings (what :class:`hvdtrain.horovod.exchange.Exchanger` is made
from), checked: Horovod's fusion groups and ``gradient_predivide_factor``.

The distributed optimizer (``optimizer.py``) and the tapes (``tape.py``) make them from
their arguments; the Exchanger reads them.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import keras

from hvdtrain import checks
from hvdtrain.horovod import collectives as dist


@dataclasses.dataclass(frozen=True)
class ExchangeSettings:
    """How gradients are exchanged over the ranks: one object for a distributed optimizer
    and a distributed tape alike (read by :class:`hvdtrain.horovod.exchange.Exchanger`,
    which chooses its strategy from them).

    Attributes:
        op: Horovod's reduction (``Average``, ``Sum``, ``Adasum``...).
        compression: Horovod's compressor or one of hvdtrain's sparsifiers.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients first.
        prescale, postscale: factors applied before and after the reduction.
        groups: Horovod's fusion groups (a number, or lists of variables).
        bucket_mb: without ``groups``, buckets of about this many MiB, the last layers'
            first (``None``: one fused all-reduce).
        process_set: the ranks to reduce over (``None``: every rank).
        shard_optimizer: reduce-scatter the gradients and update this rank's slice only
            (``sharded.ReduceScatter``: optimizer state sharded over the ranks).
    """

    op: Any = dist.Average
    compression: Any = dist.Compression.none
    sparse_as_dense: bool = False
    prescale: float = 1.0
    postscale: float = 1.0
    groups: Any = None
    bucket_mb: float | None = None
    process_set: Any = None
    shard_optimizer: bool = False


def variable_key(variable) -> int:
    """One key for a Keras 3 variable and the ``tf.Variable`` behind it (a plain
    ``tf.Variable`` is its own key)."""
    return id(variable.value) if isinstance(variable, keras.Variable) else id(variable)


def group_positions(groups, variables, count: int) -> list[list[int]] | None:
    """Horovod's ``num_groups`` (an int: that many contiguous groups) or ``groups`` (lists
    of variables, each reduced in one fused call) as lists of positions in the gradients."""
    if not groups:
        return None
    if isinstance(groups, int):
        return [g for g in (list(range(count * i // groups, count * (i + 1) // groups))
                            for i in range(groups)) if g]
    where = {variable_key(v): i for i, v in enumerate(variables or []) if v is not None}
    return [[where[variable_key(v)] for v in group if variable_key(v) in where]
            for group in groups]


def predivide(factor, op, process_set=None) -> tuple:
    """Horovod's ``gradient_predivide_factor``: ``(op, prescale, postscale)`` that average
    as ``Average`` does, summing ``g / factor`` and multiplying by ``factor / size``.

    Raises:
        ValueError: ``factor`` is not a positive number, or is not 1 with an op other
            than Average.
    """
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be a positive number, got {factor!r}")
    if factor == 1.0:
        return op, 1.0, 1.0
    if op is not dist.Average:
        raise ValueError(f"gradient_predivide_factor works with op Average only, got op={op!r}")
    members = dist.size() if process_set is None else process_set.size()
    return dist.Sum, 1.0 / factor, factor / members


def check_groups(groups, num_groups) -> int | list | None:
    """Horovod's rules for ``groups`` / ``num_groups``; returns the one in effect.

    Raises:
        ValueError: both given, a negative ``num_groups``, or ``groups`` not a list of
            lists of variables.
    """
    checks.integer(num_groups, "num_groups", minimum=0)
    if groups is not None and num_groups:
        raise ValueError("pass either groups or num_groups, not both")
    if groups is None:
        return num_groups or None
    if checks.is_integer(groups) and groups >= 0:
        return groups or None  # Horovod also takes an int here (deprecated num_groups)
    if not isinstance(groups, (list, tuple)) or not all(
            isinstance(g, (list, tuple)) and all(hasattr(v, "shape") for v in g) for g in groups):
        raise ValueError("groups must be a list of lists of variables (each list is reduced in "
                         f"one fused call), got {groups!r}")
    return [list(g) for g in groups]
