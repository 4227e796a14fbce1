"""Every collective hvdtrain uses, behind one small interface.

This is the only module that imports Horovod. The rest of hvdtrain talks about ranks,
broadcasts and reductions through the functions here, so the launcher (``horovodrun``,
``mpirun`` or a plain ``python``) never leaks into the training code.
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

logger = logging.getLogger("hvdtrain")

Average = hvd.Average
Sum = hvd.Sum
Adasum = hvd.Adasum

_OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}
_COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}

_initialized = False


def init(*, pin_gpu: bool = True, threads_per_rank: int | None = None) -> None:
    """Start Horovod once, pin this rank to its GPU and share the CPU cores fairly.

    Args:
        pin_gpu: make only the GPU numbered ``local_rank`` visible to TensorFlow.
        threads_per_rank: TensorFlow intra-op threads for this process. The default gives
            each local rank an equal share of the cores (at least one), so ranks on one
            host do not fight over the same cores. ``HVDTRAIN_THREADS`` overrides it.
    """
    global _initialized
    if _initialized:
        return
    # Lets a Trainer switch Horovod's timeline on and off at run time (start_timeline).
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init()
    _initialized = True
    if pin_gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            try:
                gpu = gpus[hvd.local_rank() % len(gpus)]
                tf.config.set_visible_devices(gpu, "GPU")
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError as err:  # TF already started: leave the devices as they are
                logger.debug("GPU pinning skipped: %s", err)
    threads = threads_per_rank or int(os.environ.get("HVDTRAIN_THREADS", "0"))
    if not threads:
        threads = max(1, (os.cpu_count() or 1) // max(1, hvd.local_size()))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    except RuntimeError:  # the runtime already started: the environment variables set
        # when hvdtrain was imported (TF_NUM_INTRAOP_THREADS) apply, if it came first
        if os.environ.get("TF_NUM_INTRAOP_THREADS") is None and hvd.local_size() > 1:
            logger.warning("TensorFlow started before hvdtrain.init(): its %d local ranks may "
                           "oversubscribe the cores; import hvdtrain before tensorflow or call "
                           "hvdtrain.init() first", hvd.local_size())


def rank() -> int:
    """This process's rank in the job (0 when alone)."""
    return hvd.rank()


def size() -> int:
    """Number of processes in the job."""
    return hvd.size()


def local_rank() -> int:
    """This process's rank on its host."""
    return hvd.local_rank()


def local_size() -> int:
    """Number of processes on this host."""
    return hvd.local_size()


def mpi_enabled() -> bool:
    """True when this job runs on the MPI controller (``mpirun``, ``horovodrun --mpi``)."""
    return bool(hvd.mpi_enabled())


def is_root() -> bool:
    """True on rank 0, the rank that logs and saves."""
    return hvd.rank() == 0


def resolve_op(op):
    """Turns ``"average"``/``"sum"``/``"adasum"`` or a Horovod op into a Horovod op.

    Raises:
        ValueError: for anything else, naming the accepted values.
    """
    if isinstance(op, str) and op.lower() in _OPS:
        return _OPS[op.lower()]
    if op in (hvd.Average, hvd.Sum, hvd.Adasum) and not isinstance(op, (bool, str)):
        return op
    raise ValueError(f"op must be one of 'average', 'sum', 'adasum' (or hvdtrain.Average/Sum/"
                     f"Adasum), got {op!r}")


def op_name(op) -> str:
    """The lower-case name of a Horovod reduction op."""
    return {hvd.Average: "average", hvd.Sum: "sum", hvd.Adasum: "adasum"}[op]


def resolve_compression(compression):
    """Turns ``None``/``"none"``/``"fp16"`` or a Horovod compressor into a compressor.

    Raises:
        ValueError: for anything else, naming the accepted values.
    """
    if compression is None:
        return hvd.Compression.none
    if isinstance(compression, str) and compression.lower() in _COMPRESSIONS:
        return _COMPRESSIONS[compression.lower()]
    if compression in _COMPRESSIONS.values():
        return compression
    raise ValueError(f"compression must be one of {sorted(_COMPRESSIONS)} (or hvdtrain."
                     f"Compression.none/fp16), got {compression!r}")


def reduce_gradients(grads: Sequence, *, op=hvd.Average, compression=hvd.Compression.none,
                     sparse_as_dense: bool = False, prescale: float = 1.0) -> list:
    """All-reduces a list of gradients (``None`` entries stay ``None``) in one fused call.

    Dense gradients go through one ``grouped_allreduce``; ``tf.IndexedSlices`` are
    densified when ``sparse_as_dense`` and otherwise reduced by Horovod's allgather path.
    """
    if hvd.size() == 1 and op is not hvd.Adasum:
        return list(grads)
    out = list(grads)
    dense_idx, dense = [], []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                out[i] = hvd.allreduce(g, op=op, compression=compression,
                                       prescale_factor=prescale)
                continue
        dense_idx.append(i)
        dense.append(g)
    if dense and op is hvd.Adasum:
        # Horovod 0.28.1's grouped_allreduce fails for Adasum (an unbound name on its
        # Adasum path), so Adasum reduces tensor by tensor.
        reduced = [hvd.allreduce(g, op=op, compression=compression, prescale_factor=prescale)
                   for g in dense]
    elif dense:
        reduced = hvd.grouped_allreduce(dense, op=op, compression=compression,
                                        prescale_factor=prescale)
    for i, g in zip(dense_idx, reduced if dense else []):
        out[i] = g
    return out


def allgather(tensor: tf.Tensor) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along the first axis, in rank order."""
    if hvd.size() == 1:
        return tensor
    return hvd.allgather(tensor)


def start_timeline(path: str, mark_cycles: bool = False) -> None:
    """Starts writing Horovod's timeline (a Chrome trace) to ``path`` (call on every rank).

    Raises:
        ValueError: the job was started with a fixed timeline file (``horovodrun
            --timeline-filename`` / ``HOROVOD_TIMELINE``), or Horovod was initialized
            before hvdtrain could enable run-time timelines.
    """
    if os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        raise ValueError(f"timeline={path!r}: this job already records Horovod's timeline to "
                         f"{os.environ.get('HOROVOD_TIMELINE')!r}; drop one of the two")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    hvd.start_timeline(path, mark_cycles=mark_cycles)


def stop_timeline() -> None:
    """Stops writing Horovod's timeline."""
    hvd.stop_timeline()


def broadcast_variables(variables: Iterable, root_rank: int = 0) -> None:
    """Sets every variable to rank ``root_rank``'s value (Keras 3 or ``tf.Variable``)."""
    tf_vars = [getattr(v, "value", v) if not isinstance(v, tf.Variable) else v
               for v in variables]
    tf_vars = [v for v in tf_vars if isinstance(v, tf.Variable)]
    if tf_vars and hvd.size() > 1:
        hvd.broadcast_variables(tf_vars, root_rank=root_rank)


def broadcast_object(obj, root_rank: int = 0):
    """Returns rank ``root_rank``'s copy of a picklable Python object."""
    if hvd.size() == 1:
        return obj
    return hvd.broadcast_object(obj, root_rank=root_rank)


def allgather_object(obj) -> list:
    """Returns the list of every rank's ``obj``, in rank order."""
    if hvd.size() == 1:
        return [obj]
    return hvd.allgather_object(obj)


def allreduce_sum(values: Sequence[float]) -> np.ndarray:
    """Sums a vector of numbers over all ranks (float64)."""
    arr = np.asarray(values, dtype=np.float64)
    if hvd.size() == 1:
        return arr
    return hvd.allreduce(tf.constant(arr), op=hvd.Sum, name=None).numpy()


def allreduce_dict(values: Mapping[str, float], *, weight: float = 1.0) -> dict[str, float]:
    """Weighted mean of named numbers over ranks; keys are sorted so all ranks agree.

    Args:
        values: this rank's numbers by name (every rank must pass the same names).
        weight: this rank's weight, e.g. its sample count.
    """
    names = sorted(values)
    vec = [float(values[k]) * weight for k in names] + [float(weight)]
    total = allreduce_sum(vec)
    denom = total[-1] if total[-1] else 1.0
    return {k: float(total[i] / denom) for i, k in enumerate(names)}


def agree_any(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one rank."""
    return bool(allreduce_sum([1.0 if flag else 0.0])[0] > 0)


def agree_min(value: int) -> int:
    """The smallest of every rank's integer ``value``."""
    if hvd.size() == 1:
        return int(value)
    return int(min(allgather_object(int(value))))


def barrier() -> None:
    """Waits until every rank gets here."""
    allreduce_sum([0.0])


Compression = hvd.Compression
