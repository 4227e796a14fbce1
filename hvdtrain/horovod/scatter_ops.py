"""The reduce-scatter and all-gather collectives of the sharded optimizer state.

Kept beside :mod:`hvdtrain.horovod.collectives` (the module every other Horovod call goes
through), which is at its size limit. Both work inside a ``tf.function``.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

import horovod.tensorflow as hvd

from hvdtrain.horovod.collectives import _watched_in_graph
from hvdtrain.horovod.runtime import alone


def reducescatter_average(flats: Sequence[tf.Tensor], op=hvd.Average,
                          tag: str = "") -> list[tf.Tensor]:
    """Each 1-D tensor of ``flats`` (its length a multiple of the world size) reduced over
    the ranks with ``op``, this rank's equal share of it returned (one fused call;
    ``tag`` tells apart the calls of one step, e.g. the bucket's number)."""
    if alone():
        return list(flats)
    flats = _named(flats, f"hvd_shard_grad{tag}")
    return list(_watched_in_graph(
        "the sharded gradient exchange", lambda: hvd.grouped_reducescatter(flats, op=op)))


def allgather_slices(slices: Sequence[tf.Tensor], tag: str = "") -> list[tf.Tensor]:
    """Each rank's 1-D tensors of ``slices`` concatenated in rank order (one fused call;
    ``tag`` as for :func:`reducescatter_average`)."""
    if alone():
        return list(slices)
    slices = _named(slices, f"hvd_shard_weights{tag}")
    return list(_watched_in_graph(
        "the sharded weight gather", lambda: hvd.grouped_allgather(slices)))


def _named(tensors: Sequence[tf.Tensor], prefix: str) -> list[tf.Tensor]:
    """``tensors`` under names that are the same on every rank: Horovod matches a grouped
    op's tensors over the ranks by the name of its first input, and the ops each rank
    made before (its own slice's pieces) differ in number, so TensorFlow's own names for
    them differ."""
    if tf.executing_eagerly():
        return list(tensors)
    return [tf.identity(t, name=f"{prefix}_{i}") for i, t in enumerate(tensors)]
