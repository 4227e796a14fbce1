"""``horovod.tensorflow.elastic`` for Keras 3: ``run``, ``TensorFlowKerasState``,
``TensorFlowState`` (see :mod:`hvdtrain.backends.horovod.keras_state`)."""
from hvdtrain.backends.horovod.keras_state import (  # noqa: F401
    TensorFlowKerasState, TensorFlowState, run)

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]
