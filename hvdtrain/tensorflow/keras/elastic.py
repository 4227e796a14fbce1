"""``horovod.tensorflow.keras.elastic`` for Keras 3: ``KerasState`` (a model and its
optimizer), the three state callbacks, and ``run``."""
from hvdtrain.horovod.keras_state import (  # noqa: F401
    CommitStateCallback, TensorFlowKerasState, UpdateBatchStateCallback,
    UpdateEpochStateCallback, run)

KerasState = TensorFlowKerasState

__all__ = ["CommitStateCallback", "KerasState", "TensorFlowKerasState",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
