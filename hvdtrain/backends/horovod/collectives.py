"""Every collective hvdtrain uses, behind one small interface.

This is the only module that imports Horovod. The rest of hvdtrain talks about ranks,
broadcasts and reductions through the functions here, so the launcher (``horovodrun``,
``mpirun`` or a plain ``python``) never leaks into the training code.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from horovod.common.elastic import State as _HorovodElasticState
from horovod.common.elastic import run_fn as _horovod_run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

import hvdtrain

logger = logging.getLogger("hvdtrain")

Average = hvd.Average
Sum = hvd.Sum
Adasum = hvd.Adasum

_OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}
_COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}

_initialized = False


def init(*, pin_gpu: bool = True, threads_per_rank: int | None = None,
         gpus_per_rank: int = 1, timeline: bool = False) -> None:
    """Start Horovod once, pin this rank to its GPU(s) and share the CPU cores fairly.

    Args:
        pin_gpu: make only the GPU numbered ``local_rank`` visible to TensorFlow, or with
            ``gpus_per_rank=k`` the node's GPUs ``[local_rank*k, local_rank*k + k)``.
        threads_per_rank: TensorFlow intra-op threads for this process. The default gives
            each local rank an equal share of the cores (at least one), so ranks on one
            host do not fight over the same cores. ``HVDTRAIN_THREADS`` overrides it.
        gpus_per_rank: GPUs each rank uses (model parallelism, see ``hvdtrain.hybrid``).
        timeline: let the job record Horovod's timeline at run time (``Trainer(timeline=...)``,
            :func:`start_timeline`). Off by default: with it on, Horovod's timeline writer
            thread polls for events all the time, which cost a third of the throughput of
            two ranks on two cores (see docs/performance.md).
    """
    global _initialized
    if _initialized:
        return
    _install_failure_hook()
    if timeline:  # lets start_timeline switch Horovod's timeline on and off at run time
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init()
    _initialized = True
    if pin_gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            first = hvd.local_rank() * gpus_per_rank
            if gpus_per_rank > 1 and first + gpus_per_rank > len(gpus):
                raise ValueError(f"{gpus_per_rank} GPUs per rank: local rank {hvd.local_rank()} "
                                 f"needs the node's GPUs {first}..{first + gpus_per_rank - 1}, "
                                 f"but it has {len(gpus)}")
            mine = ([gpus[hvd.local_rank() % len(gpus)]] if gpus_per_rank <= 1
                    else gpus[first:first + gpus_per_rank])
            try:
                tf.config.set_visible_devices(mine, "GPU")
                for gpu in mine:
                    tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError as err:  # TF already started: leave the devices as they are
                logger.debug("GPU pinning skipped: %s", err)
    threads = threads_per_rank or int(os.environ.get("HVDTRAIN_THREADS", "0"))
    if not threads:
        threads = max(1, hvdtrain._usable_cores() // max(1, hvd.local_size()))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    except RuntimeError:  # the runtime already started: the environment variables set
        # when hvdtrain was imported (TF_NUM_INTRAOP_THREADS) apply, if it came first
        if os.environ.get("TF_NUM_INTRAOP_THREADS") is None and hvd.local_size() > 1:
            logger.warning("TensorFlow started before hvdtrain.init(): its %d local ranks may "
                           "oversubscribe the cores; import hvdtrain before tensorflow or call "
                           "hvdtrain.init() first", hvd.local_size())


def _install_failure_hook() -> None:
    """On an uncaught exception: name the rank and the cause, then exit at once.

    Exiting with ``os._exit`` skips Horovod's shutdown, which would otherwise wait for
    peers that are themselves waiting in a collective; the launcher (horovodrun, mpirun)
    sees the non-zero exit and ends the other ranks promptly.
    """
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            where = f"rank {hvd.rank()} of {hvd.size()}"
        except Exception:  # noqa: BLE001 - Horovod may be half shut down
            where = "a rank"
        previous(exc_type, exc, tb)
        if "Horovod has been shut down" in str(exc) or "Connection reset by peer" in str(exc):
            sys.stderr.write(f"hvdtrain: {where} stopped: a collective failed because another "
                             "rank failed or exited (its own message names the cause)\n")
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            sys.stderr.write(f"hvdtrain: {where} failed: {exc_type.__name__}: {first}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    if not getattr(sys.excepthook, "_hvdtrain", False):
        hook._hvdtrain = True
        sys.excepthook = hook


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
    check_timeline_possible(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    hvd.start_timeline(path, mark_cycles=mark_cycles)


def check_timeline_possible(path: str) -> None:
    """Raises a ValueError naming the fix when :func:`start_timeline` cannot record ``path``."""
    fixed = os.environ.get("HOROVOD_TIMELINE")
    if fixed and fixed != "DYNAMIC":
        raise ValueError(f"timeline={path!r}: this job already records Horovod's timeline to "
                         f"{fixed!r}; drop one of the two")
    if _initialized and fixed != "DYNAMIC":
        raise ValueError(f"timeline={path!r}: Horovod was started without run-time timelines; "
                         "call hvdtrain.init(timeline=True) before the first Trainer (or let "
                         "the Trainer start Horovod)")


def stop_timeline() -> None:
    """Stops writing Horovod's timeline."""
    hvd.stop_timeline()


def check_same_variables(variables: Sequence, root_rank: int = 0) -> None:
    """Checks that every rank holds the same variables (names, shapes, dtypes) as
    ``root_rank``, so a broadcast cannot hang or fail on mismatched models.

    Raises:
        ValueError: on every rank, listing the first differences.
    """
    if hvd.size() == 1:
        return
    mine = [(str(getattr(v, "path", v.name)), tuple(v.shape), str(v.dtype)) for v in variables]
    everyone = allgather_object(mine)
    reference = everyone[root_rank]
    problems = []
    for r, theirs in enumerate(everyone):
        if theirs == reference:
            continue
        if len(theirs) != len(reference):
            problems.append(f"rank {r} has {len(theirs)} variables, rank {root_rank} has "
                            f"{len(reference)}")
        for a, b in zip(reference, theirs):
            if a != b:
                problems.append(f"rank {r} has {b[0]} {b[1]} {b[2]} where rank {root_rank} has "
                                f"{a[0]} {a[1]} {a[2]}")
                break
    if problems:
        raise ValueError("the ranks built different models, so their variables cannot be "
                         "broadcast: " + "; ".join(problems[:5]))


def broadcast_variables(variables: Iterable, root_rank: int = 0) -> None:
    """Sets every variable to rank ``root_rank``'s value (Keras 3 or ``tf.Variable``),
    after checking that all ranks hold the same variables."""
    variables = list(variables)
    if hvd.size() == 1 or not variables:
        return
    check_same_variables(variables, root_rank)
    tf_vars = [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in variables]
    hvd.broadcast_variables([v for v in tf_vars if isinstance(v, tf.Variable)],
                            root_rank=root_rank)


def allreduce_mean(tensor: tf.Tensor) -> tf.Tensor:
    """The mean of ``tensor`` over all ranks (works inside ``tf.function``)."""
    if hvd.size() == 1:
        return tensor
    return hvd.allreduce(tensor, op=hvd.Average)


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


def barrier() -> None:
    """Waits until every rank gets here."""
    allreduce_sum([0.0])


Compression = hvd.Compression


# ---------------------------------------------------------------------- elastic mode
# Horovod's elastic machinery (used by hvdtrain.elastic), kept here so that module never
# imports Horovod itself.
_FAILURE_MARKERS = ("horovod", "gloo")


def elastic_enabled() -> bool:
    """True when this process was started by an elastic ``horovodrun`` (``--min-np`` /
    ``--host-discovery-script``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def is_collective_failure(err: BaseException) -> bool:
    """True when ``err`` is a failed Horovod collective (a peer died, the ring broke):
    the kind of error elastic training recovers from by rolling back to the last commit.

    Horovod's own ``horovod.tensorflow.elastic.run`` only recognises ``UnknownError``s that
    name ``HorovodAllreduce``/``Allgather``/``Broadcast``; the failures seen from a
    ``tf.function`` (``HorovodGroupedAllreduce``) and from eager collectives are broader.
    """
    if isinstance(err, HorovodInternalError):
        return True
    if isinstance(err, tf.errors.OpError) and not isinstance(
            err, (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError,
                  tf.errors.ResourceExhaustedError)):
        text = str(err).lower()
        return any(m in text for m in _FAILURE_MARKERS)
    return False


@contextlib.contextmanager
def collective_failures_as_internal_errors():
    """Re-raises a failed collective (see :func:`is_collective_failure`) as Horovod's
    ``HorovodInternalError``, the error its elastic loop recovers from."""
    try:
        yield
    except (HorovodInternalError, HostsUpdatedInterrupt):
        raise
    except Exception as err:  # a dead peer surfaces as several TensorFlow error types
        if is_collective_failure(err):
            lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()] or [""]
            first_line = next((ln for ln in lines
                               if any(m in ln.lower() for m in _FAILURE_MARKERS)), lines[0])[:300]
            logger.warning("a collective failed (%s: %s): restarting from the last commit",
                           type(err).__name__, first_line)
            raise HorovodInternalError(f"{type(err).__name__}: {first_line}") from err
        raise


def reinit() -> None:
    """Shuts Horovod down and starts it again with the current membership (elastic reset).

    Under an elastic ``horovodrun`` the new ``init`` waits at the driver's rendezvous until
    every worker of the new world has arrived, then rank and size reflect that world.
    """
    hvd.shutdown()
    hvd.init()


class ElasticState(_HorovodElasticState):
    """Horovod's elastic ``State`` (commit / restore / sync, host-change notifications),
    with hvdtrain's object broadcast and rank. Subclasses implement ``save``, ``restore``
    and ``sync``."""

    def __init__(self) -> None:
        super().__init__(bcast_object=broadcast_object, get_rank=rank)


def elastic_run(func):
    """Horovod's elastic loop around ``func(state, ...)``.

    ``state.sync()`` runs before ``func``; when a collective fails, the state is restored
    to its last commit, Horovod is re-initialised with the surviving workers, the state's
    reset callbacks run and ``func`` is called again; when hosts are added or removed
    (noticed at ``state.commit()``), the same happens without the restore.

    Outside an elastic ``horovodrun`` nothing could restart Horovod, so ``func`` simply
    runs once after ``state.sync()`` and a failed collective is an error as usual.
    """
    if not elastic_enabled():
        def once(state, *args, **kwargs):
            state.sync()
            return func(state, *args, **kwargs)
        return once

    def translated(state, *args, **kwargs):
        with collective_failures_as_internal_errors():
            return func(state, *args, **kwargs)

    return _horovod_run_fn(translated, reinit)
