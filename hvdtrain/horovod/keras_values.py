"""``horovod.tensorflow.keras``'s collectives on values (numbers, numpy arrays, tensors):
each returns a tensor with the result, as Horovod's do under TensorFlow 2."""
from __future__ import annotations

import tensorflow as tf

import horovod.tensorflow as hvd


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=hvd.Compression.none) -> tf.Tensor:
    """The reduction of ``value`` over every rank (``op`` default: Average)."""
    return hvd.allreduce(tf.convert_to_tensor(value), average=average,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         op=op, compression=compression, name=name)


def allgather(value, name=None) -> tf.Tensor:
    """Every rank's ``value`` concatenated along the first axis, in rank order."""
    return hvd.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank: int, name=None) -> tf.Tensor:
    """``root_rank``'s ``value``."""
    return hvd.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=hvd.Average) -> tf.Tensor:
    """This rank's part of the reduction of ``value`` (split along the first axis)."""
    return hvd.reducescatter(tf.convert_to_tensor(value), op=op, name=name)
