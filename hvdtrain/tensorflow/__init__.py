"""``horovod.tensorflow`` for TensorFlow 2.16+ and Keras 3: change one import line.

::

    import hvdtrain.tensorflow as hvd   # was: import horovod.tensorflow as hvd

Every public name of ``horovod.tensorflow`` 0.28.1 is here with its signature and meaning
(the README's table says, name by name, what differs and why). Horovod's collectives on
tensors, process sets and build queries are Horovod's own; what has to touch Keras 3
variables and optimizers -- ``broadcast_variables``, ``DistributedGradientTape``,
``PartialDistributedGradientTape``, ``DistributedOptimizer``, ``SyncBatchNormalization``
and ``elastic`` -- is hvdtrain's, shared with ``hvdtrain.keras`` and the Trainer.
"""
from hvdtrain.horovod.horovod_api import (  # noqa: F401
    Adasum, Average, Compression, DistributedOptimizer, Max, Min, ProcessSet, Product, Sum,
    add_process_set, allgather, allgather_object, allreduce, alltoall, barrier, broadcast,
    broadcast_, broadcast_global_variables, broadcast_object, broadcast_object_fn,
    broadcast_variables, ccl_built, check_extension, cross_rank, cross_size, cuda_built,
    ddl_built, global_process_set, gloo_built, gloo_enabled, gpu_available, grouped_allgather,
    grouped_allreduce, grouped_reducescatter, init, is_homogeneous, is_initialized, join,
    local_rank, local_rank_op, local_size, local_size_op, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, process_set_included_op, rank, rank_op, reducescatter,
    remove_process_set, rocm_built, shutdown, size, size_op, start_timeline, stop_timeline)
from hvdtrain.horovod.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from hvdtrain.horovod.tape import (  # noqa: F401
    DistributedGradientTape, PartialDistributedGradientTape)
from hvdtrain.tensorflow import elastic  # noqa: F401
