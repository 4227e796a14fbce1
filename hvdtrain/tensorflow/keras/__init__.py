"""``horovod.tensorflow.keras`` for Keras 3: change one import line.

::

    import hvdtrain.tensorflow.keras as hvd   # was: import horovod.tensorflow.keras as hvd

``DistributedOptimizer`` takes Horovod's arguments and defaults (``backward_passes_per_step``
sums the passes unless ``average_aggregated_gradients``); the callbacks are
``hvdtrain.keras``'s, under Horovod's names. ``hvdtrain.keras`` is the same implementation
with hvdtrain's own defaults.
"""
from hvdtrain.horovod.horovod_api import (  # noqa: F401
    Average, Compression, ProcessSet, Sum, add_process_set, broadcast_global_variables,
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
    gloo_enabled, init, is_initialized, load_model, local_rank, local_size, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built,
    shutdown, size, start_timeline, stop_timeline)
from hvdtrain.horovod.horovod_api import (  # noqa: F401
    keras_distributed_optimizer as DistributedOptimizer)
from hvdtrain.horovod.keras_values import (  # noqa: F401
    allgather, allreduce, broadcast, reducescatter)
from hvdtrain.tensorflow.keras import callbacks, elastic  # noqa: F401
