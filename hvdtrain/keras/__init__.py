"""Horovod for Keras 3 ``model.fit``: a distributed optimizer and Horovod's callbacks.

Two or three changed lines turn a single-process Keras script into a data-parallel one::

    import hvdtrain.keras as hvk
    hvk.init()
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvk.size())),
                  loss=...)
    model.fit(x_shard, y_shard, callbacks=[hvk.BroadcastGlobalVariablesCallback(0),
                                           hvk.MetricAverageCallback()],
              verbose=1 if hvk.rank() == 0 else 0)

Horovod's own ``horovod.tensorflow.keras`` cannot do this on Keras 3 (see the README);
``hvdtrain.tensorflow.keras`` has its names and defaults over this same implementation.
"""
from hvdtrain.horovod.collectives import init, is_root, local_rank, local_size, rank, size  # noqa: F401
from hvdtrain.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    ModelCheckpoint,
)
from hvdtrain.horovod.optimizer import DistributedOptimizer  # noqa: F401
