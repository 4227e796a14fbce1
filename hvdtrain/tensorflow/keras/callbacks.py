"""``horovod.tensorflow.keras.callbacks`` for Keras 3 (the implementation is
:mod:`hvdtrain.keras.callbacks`)."""
from hvdtrain.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback)

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "MetricAverageCallback"]
