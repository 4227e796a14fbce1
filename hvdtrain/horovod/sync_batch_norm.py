"""``SyncBatchNormalization`` for Keras 3: batch statistics over every rank's batch.

Horovod 0.28.1's class overrides a Keras 2 method that Keras 3's ``BatchNormalization``
never calls, so on Keras 3 it would silently normalize by each rank's own batch. Here the
per-rank count, sum and sum of squares go through one all-reduce when training (its
gradient is Horovod's, so the backward pass is synchronized too).
"""
from __future__ import annotations

import keras
import tensorflow as tf

import horovod.tensorflow as hvd

from hvdtrain.horovod import runtime
from hvdtrain.internals import keras_private


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics (mean, variance)
    are those of the global batch, the union of every rank's batch.

    Args:
        fused: accepted for Horovod's signature; must be False or None.
        kwargs: ``BatchNormalization``'s arguments.
    """

    def __init__(self, fused=False, **kwargs) -> None:
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True")
        keras_private.check_batch_norm_moments_hook(type(self))
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if mask is not None or runtime.alone():
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
        total = tf.reduce_sum(inputs, axis=axes, keepdims=True)
        squares = tf.reduce_sum(tf.square(inputs), axis=axes, keepdims=True)
        count, total, squares = hvd.grouped_allreduce(
            [tf.reshape(count, [1]), total, squares], op=hvd.Sum)
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return tf.squeeze(mean, axes), tf.squeeze(variance, axes)

