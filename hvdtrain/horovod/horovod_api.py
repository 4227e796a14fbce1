"""``horovod.tensorflow``'s public names for :mod:`hvdtrain.tensorflow`: those that work
on Keras 3 as they are, and hvdtrain's versions of those that do not.

Horovod's collectives on tensors, its process sets, build queries and timeline work
unchanged on TensorFlow 2.21 and are Horovod's own objects here. What touches Keras 3
variables or optimizers (``broadcast_variables``, the tapes, ``DistributedOptimizer``,
``elastic``) is hvdtrain's; see ``tape.py``, ``optimizer.py`` and ``keras_state.py``.
"""
from __future__ import annotations

import keras
import tensorflow as tf

import horovod.tensorflow as hvd
from horovod.tensorflow import (  # noqa: F401 - re-exported unchanged
    Adasum, Average, Compression, Max, Min, ProcessSet, Product, Sum, add_process_set,
    broadcast_, broadcast_global_variables, broadcast_object_fn, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled,
    gpu_available, is_homogeneous, local_rank_op, local_size_op, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, process_set_included_op, rank_op, remove_process_set,
    rocm_built, size_op, start_timeline, stop_timeline)

from hvdtrain.horovod import collectives, keras_steps, runtime, watchdog
from hvdtrain.horovod import optimizer as optimizer_lib
from hvdtrain.horovod.runtime import (  # noqa: F401 - hvdtrain's, same meaning
    is_initialized, local_rank, local_size, rank, size)

# Horovod's own collectives, marked for hvdtrain's collective watchdog (a mismatch ends the
# job within HVDTRAIN_COLLECTIVE_TIMEOUT, naming the ranks); same signatures and results.
allgather = collectives.watched(hvd.allgather)
allgather_object = collectives.watched(hvd.allgather_object)
allreduce = collectives.watched(hvd.allreduce)
alltoall = collectives.watched(hvd.alltoall)
broadcast = collectives.watched(hvd.broadcast)
broadcast_object = collectives.watched(hvd.broadcast_object)
grouped_allgather = collectives.watched(hvd.grouped_allgather)
grouped_allreduce = collectives.watched(hvd.grouped_allreduce)
grouped_reducescatter = collectives.watched(hvd.grouped_reducescatter)
reducescatter = collectives.watched(hvd.reducescatter)


def init(comm=None, process_sets=None) -> None:
    """``hvd.init(comm, process_sets)``, plus hvdtrain's start-up: a failing rank ends the
    job with its rank and cause, and the cores are shared between the host's ranks. GPUs
    are not pinned here (Horovod's scripts pin them themselves); ``hvdtrain.init`` does."""
    runtime.init(pin_gpu=False, comm=comm, process_sets=process_sets)


def join():
    """Tells the other ranks that this one has finished its data (``hvd.join()``).

    Until every rank has joined, this rank takes part in the others' all-reduces with
    zeros, so a tape loop whose ranks run different numbers of steps ends without a hang;
    then it returns the last rank that joined (a scalar tensor). hvdtrain's tapes and
    distributed optimizer reduce sparse gradients (``tf.IndexedSlices``) by all-reduce
    too, which Horovod's join supports (its allgather, broadcast and alltoall it does not).
    Averages divide by every rank, joined ones included, as in Horovod.
    """
    with watchdog.joined():
        return hvd.join()


def shutdown() -> None:
    """Shuts Horovod down in this process (``init`` may start it again)."""
    runtime.shutdown()


def broadcast_variables(variables, root_rank: int, process_set=global_process_set,
                        inplace: bool = False):
    """Sets ``variables`` (Keras 3 or ``tf.Variable``) to ``root_rank``'s values.

    Works eagerly and inside ``tf.function`` (Horovod's first-batch idiom). Called eagerly,
    it first checks that every rank passes the same variables (names, shapes, dtypes) and
    fails on every rank naming the differences, where Horovod would hang or mix them up.
    """
    return collectives.broadcast_variables(
        variables, root_rank, process_set=collectives.process_set_or_none(process_set),
        inplace=inplace)


def barrier(process_set=global_process_set) -> None:
    """Waits until every rank of ``process_set`` gets here (Horovod's PyTorch ``barrier``;
    its TensorFlow API has none)."""
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name=None, process_set=process_set)


def check_extension(*args, **kwargs) -> None:
    """Horovod's check that its TensorFlow extension was built: hvdtrain needs it, so it
    is there when this module imports."""


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """``horovod.tensorflow.DistributedOptimizer``: a Keras 3 optimizer becomes hvdtrain's
    distributed optimizer (see :func:`keras_distributed_optimizer`); a TF1
    ``tf.compat.v1.train.Optimizer`` gets Horovod's own wrapper, which still works."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return hvd.DistributedOptimizer(
            optimizer, name, use_locking, device_dense, device_sparse, compression,
            sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
            average_aggregated_gradients, num_groups, groups, process_set, scale_local_gradients)
    if op is Adasum:
        raise ValueError("op == Adasum is not supported yet with Keras (as in Horovod); use "
                         "hvdtrain.keras.DistributedOptimizer(op='adasum')")
    del use_locking, scale_local_gradients
    return keras_distributed_optimizer(
        optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        num_groups, groups, process_set)


def keras_distributed_optimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                num_groups=0, groups=None, process_set=global_process_set,
                                scale_local_gradients=True):
    """``horovod.tensorflow.keras.DistributedOptimizer`` on a Keras 3 optimizer, with its
    arguments and defaults (the accumulated gradients of ``backward_passes_per_step``
    passes are summed unless ``average_aggregated_gradients``). ``name``, the devices and
    ``scale_local_gradients`` are accepted and have no effect (the optimizer keeps its name;
    TensorFlow places the exchange)."""
    del name, device_dense, device_sparse, scale_local_gradients
    return optimizer_lib.DistributedOptimizer(
        optimizer, compression=compression, op=op,
        backward_passes_per_step=backward_passes_per_step, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        num_groups=num_groups, process_set=collectives.process_set_or_none(process_set))


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """``horovod.tensorflow.keras.load_model``: loads a ``.keras`` model saved with its
    optimizer and makes that optimizer distributed (its state is kept).

    Raises:
        ValueError: ``legacy_opts`` (Keras 2's optimizers are gone in Keras 3).
    """
    if legacy_opts:
        raise ValueError("legacy_opts=True asks for Keras 2's legacy optimizers, which Keras 3 "
                         "does not have")
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if model.optimizer is not None and not optimizer_lib.is_distributed(model.optimizer):
        optimizer_lib.DistributedOptimizer(model.optimizer, compression=compression)
    keras_steps.attach(model)  # handed to hvdtrain: fit's step is hvdtrain's (XLA split)
    return model
