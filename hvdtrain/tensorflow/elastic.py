"""``horovod.tensorflow.elastic`` for Keras 3: ``run``, ``TensorFlowKerasState``,
``TensorFlowState`` (see :mod:`hvdtrain.horovod.keras_state`), and the names it
re-exports."""
from hvdtrain.horovod.horovod_api import (  # noqa: F401
    broadcast_object, broadcast_object_fn, broadcast_variables, init, rank, shutdown)
from hvdtrain.horovod.horovod_private import (  # noqa: F401
    HorovodInternalError, ObjectState)
from hvdtrain.horovod.horovod_private import elastic_run_fn as run_fn  # noqa: F401
from hvdtrain.horovod.keras_state import (  # noqa: F401
    TensorFlowKerasState, TensorFlowState, run)

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]
