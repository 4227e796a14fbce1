"""Starting Horovod in this process, and where the process stands in the job.

:func:`init` starts Horovod once and the collective watchdog with it, pins the rank to its
GPU(s), shares the CPU cores between the ranks of a host and installs the failure hook; the small functions below it
(:func:`rank`, :func:`size`, ...) answer where this process stands. The launcher
(``horovodrun``, ``mpirun`` or a plain ``python``) never leaks into the training code.
"""
from __future__ import annotations

import logging
import os
import sys

import tensorflow as tf

import horovod
import horovod.tensorflow as hvd

from hvdtrain import gpu_visibility, reporting
from hvdtrain import threads as thread_sharing
from hvdtrain.horovod import bootstrap, communicator, watchdog

logger = logging.getLogger("hvdtrain")

_initialized = False
_comm = None  # what init(comm=...) started Horovod on
_membership: communicator.Membership | None = None  # set when that is part of the world


def init(*, pin_gpu: bool = True, threads_per_rank: int | None = None,
         gpus_per_rank: int = 1, timeline: bool = False, comm=None,
         process_sets=None) -> None:
    """Start Horovod once, pin this rank to its GPU(s) and share the CPU cores fairly.

    Args:
        pin_gpu: make only the GPU numbered ``local_rank`` visible to TensorFlow, or with
            ``gpus_per_rank=k`` the node's GPUs ``[local_rank*k, local_rank*k + k)``.
        threads_per_rank: TensorFlow intra-op threads for this process. The default gives
            each local rank an equal share of the cores (at least one), so ranks on one
            host do not fight over the same cores. ``HVDTRAIN_THREADS`` overrides it.
        gpus_per_rank: GPUs each rank uses (model parallelism, see ``hvdtrain.hybrid``).
        timeline: let the job record Horovod's timeline at run time (``Trainer(timeline=...)``,
            :func:`hvdtrain.horovod.collectives.start_timeline`). Off by default:
            with it on, Horovod's timeline writer thread polls for events all the time, which
            cost a third of the throughput of two ranks on two cores (see docs/performance.md).
        comm: run this process's Horovod job on part of the ``mpirun`` job: an mpi4py
            communicator (``MPI.COMM_WORLD.Split(color)``) or a list of world ranks. Every
            rank, size and collective is then the sub-job's, so a Trainer built afterwards
            trains, checkpoints, logs and stops among those ranks only; the CPU cores and
            GPUs of a host are still shared among all the job's processes on it. Needs the
            MPI controller (``mpirun``): refused under Gloo, which would ignore it.
        process_sets: passed to ``horovod.tensorflow.init`` (process sets to register, or
            ``"dynamic"``).

    Raises:
        ValueError: ``comm`` is not a communicator or rank list, Horovod cannot run on it,
            or Horovod already runs on another one.
    """
    global _initialized, _comm, _membership
    if _initialized:
        if comm is not None and not _same_comm(comm, _comm):
            raise ValueError(f"hvdtrain.init(comm={comm!r}): Horovod already runs on "
                             f"{_comm!r}; call init(comm=...) once, before the Trainer "
                             "(a later init() without comm keeps it)")
        return
    if comm is not None:
        communicator.check(comm)
    _install_failure_hook()
    if timeline:  # lets start_timeline switch Horovod's timeline on and off at run time
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init(comm=comm, process_sets=process_sets)
    _initialized = True
    if comm is not None:
        communicator.check_started(comm, hvd.size(), bool(hvd.mpi_enabled()))
        _comm, _membership = comm, communicator.membership(comm, hvd.rank())
        if _membership is not None:
            reporting.set_job_label(_membership.describe())
    gpus = tf.config.list_physical_devices("GPU")
    if host_local_rank() == 0:  # GPUs without NCCL, or GPUs TensorFlow cannot use
        warning = (check_gpu_build(len(gpus)) if gpus
                   else gpu_visibility.unusable_gpus_warning(0))
        if warning:
            logger.warning("%s", warning)
    if pin_gpu and gpus:
        _pin_gpus(gpus, gpus_per_rank)
    threads = threads_per_rank or int(os.environ.get("HVDTRAIN_THREADS", "0"))
    if not threads:
        threads = max(1, thread_sharing.usable_cores() // max(1, host_processes()))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    except RuntimeError:  # the runtime already started: the environment variables set
        # when hvdtrain was imported (TF_NUM_INTRAOP_THREADS) apply, if it came first
        if os.environ.get("TF_NUM_INTRAOP_THREADS") is None and host_processes() > 1:
            logger.warning("TensorFlow started before hvdtrain.init(): its %d local ranks may "
                           "oversubscribe the cores; import hvdtrain before tensorflow or call "
                           "hvdtrain.init() first", host_processes())
    if os.environ.get("HOROVOD_ELASTIC") != "1":  # elastic drivers handle lost workers
        watchdog.start(hvd.rank(), hvd.size(), hvd.local_size(), _announce, where=where_am_i())


def _same_comm(a, b) -> bool:
    if isinstance(a, (list, tuple, range)) or isinstance(b, (list, tuple, range)):
        return (isinstance(a, (list, tuple, range)) and isinstance(b, (list, tuple, range))
                and list(a) == list(b))
    return a is b or a == b


def _announce(offer):
    """Rank 0's watchdog address to every rank, outside TensorFlow (a Horovod broadcast
    would start TensorFlow's context, after which the script's own thread and device
    settings fail); ``None`` (no watchdog) where no such channel exists."""
    try:
        return bootstrap.broadcast(offer, rank=hvd.rank(), mpi=bool(hvd.mpi_enabled()),
                                   comm=_comm, key="watchdog")
    except (bootstrap.Unavailable, OSError) as err:
        logger.warning("%s runs without the collective watchdog: %s", where_am_i(), err)
        return None


def _pin_gpus(gpus: list, gpus_per_rank: int) -> None:
    """Makes only this local rank's GPU(s) visible to TensorFlow, with memory growth.

    TensorFlow having already initialized its GPUs (an op ran before :func:`init`) leaves
    the devices as they are, with a warning; any other failure raises.
    """
    local = host_local_rank()
    first = local * gpus_per_rank
    if gpus_per_rank > 1 and first + gpus_per_rank > len(gpus):
        raise ValueError(f"{gpus_per_rank} GPUs per rank: local rank {local} "
                         f"needs the node's GPUs {first}..{first + gpus_per_rank - 1}, "
                         f"but it has {len(gpus)}")
    wanted = ([local % len(gpus)] if gpus_per_rank <= 1
              else list(range(first, first + gpus_per_rank)))
    mine = [gpus[i] for i in wanted]
    which = "GPU " + ", ".join(map(str, wanted))
    try:
        tf.config.set_visible_devices(mine, "GPU")
        for gpu in mine:
            tf.config.experimental.set_memory_growth(gpu, True)
    except Exception as err:  # noqa: BLE001 - a warning, or named and raised again
        who = f"rank {hvd.rank()}" if _membership is None else where_am_i()
        where = f"{who} (local rank {local}) could not pin {which}"
        if not (isinstance(err, RuntimeError) and "initialized" in str(err)):
            raise RuntimeError(f"{where}: {type(err).__name__}: {err}") from err
        logger.warning("%s: TensorFlow already initialized its GPUs (%s), so this rank may "
                       "share a GPU with other ranks; call hvdtrain.init() before any "
                       "TensorFlow op touches a GPU", where, err)


def shutdown() -> None:
    """Shuts Horovod down in this process; :func:`init` may start it again."""
    global _initialized, _comm, _membership
    hvd.shutdown()
    _initialized, _comm, _membership = False, None, None
    reporting.set_job_label("")


def is_initialized() -> bool:
    """True once :func:`init` has started Horovod in this process."""
    return _initialized


def _install_failure_hook() -> None:
    """On an uncaught exception: name the rank and the cause, then exit at once.

    Exiting with ``os._exit`` skips Horovod's shutdown, which would otherwise wait for
    peers that are themselves waiting in a collective; the launcher (horovodrun, mpirun)
    sees the non-zero exit and ends the other ranks promptly.
    """
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            where = where_am_i()
        except Exception:  # noqa: BLE001 - Horovod may be half shut down
            where = "a rank"
        previous(exc_type, exc, tb)
        silent = watchdog.suspects()  # who stopped reporting, if a transport timed out
        if silent:
            sys.stderr.write(f"hvdtrain: {where} stopped: a collective failed, and {silent}: "
                             "it is frozen or cut off (its transport timed out waiting for "
                             "it)\n")
        elif "Horovod has been shut down" in str(exc) or "Connection reset by peer" in str(exc):
            sys.stderr.write(f"hvdtrain: {where} stopped: a collective failed because another "
                             "rank failed or exited (its own message names the cause)\n")
        else:
            sys.stderr.write(f"hvdtrain: {where} failed: {exc_type.__name__}: "
                             f"{_first_line(exc)}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    if not getattr(sys.excepthook, "_hvdtrain", False):
        hook._hvdtrain = True
        sys.excepthook = hook


def _first_line(exc: BaseException) -> str:
    """The line of ``exc``'s text that says what failed: hvdtrain's own message where a
    TensorFlow error wraps it (``Graph execution error:`` comes first), else the first."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if "hvdtrain:" in line), lines[0] if lines else "")


def elastic_enabled() -> bool:
    """True when this process was started by an elastic ``horovodrun`` (``--min-np`` /
    ``--host-discovery-script``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def alone() -> bool:
    """True when this process is the whole job and stays so: one rank, not elastic.

    Collectives may be skipped then. In an elastic job a world of one can grow, and a
    ``tf.function`` traced while alone would keep skipping its all-reduce after a worker
    joined (the others would wait in theirs forever), so there they always run.
    """
    return hvd.size() == 1 and not elastic_enabled()


def rank() -> int:
    """This process's rank in the job (0 when alone)."""
    return hvd.rank()


def size() -> int:
    """Number of processes in the job."""
    return hvd.size()


def world_ranks() -> list[int] | None:
    """The world ranks this Horovod job spans, in rank order, when ``init(comm=...)`` put
    it on part of the ``mpirun`` job; ``None`` when it spans the whole job."""
    return None if _membership is None else list(_membership.world_ranks)


def job_label() -> str:
    """``"world ranks 1, 3 of 4"`` on a sub-communicator, else ``""``."""
    return "" if _membership is None else _membership.describe()


def where_am_i() -> str:
    """This process for messages: ``"rank 1 of 2"``, and on a sub-communicator also its
    world rank and the world ranks of its sub-job (every sub-job has a rank 0)."""
    if _membership is None:
        return f"rank {hvd.rank()} of {hvd.size()}"
    return _membership.where(hvd.rank(), hvd.size())


def host_processes() -> int:
    """Processes on this host that share its cores and GPUs: Horovod's ``local_size()``,
    or on a sub-communicator those of the whole ``mpirun`` job (the launcher's count)."""
    if _membership is None:
        return hvd.local_size()
    return communicator.host_processes(hvd.local_size())


def host_local_rank() -> int:
    """This process's index on its host for GPU pinning: ``local_rank()``, or on a
    sub-communicator its index among the whole job's processes there."""
    if _membership is None:
        return hvd.local_rank()
    return communicator.host_local_rank(hvd.local_rank())


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


def build_record() -> dict | None:
    """How hvdtrain's installer built this Horovod (``horovod/hvdtrain_build.py``: flavour,
    CUDA, NCCL, patches, cache key), or None for a Horovod built some other way."""
    try:
        from horovod import hvdtrain_build
    except ImportError:
        return None
    return dict(hvdtrain_build.RECORD)


def nccl_runtime_version() -> str | None:
    """The version of the ``libnccl`` this process loaded for Horovod (``ncclGetVersion``),
    or None when none is loaded (a CPU-only build)."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libnccl.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            code = ctypes.c_int()
            if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) != 0:
                continue
        except (OSError, AttributeError):
            continue
        major = code.value // 10000 if code.value >= 20900 else code.value // 1000
        rest = code.value % 10000 if code.value >= 20900 else code.value % 1000
        return f"{major}.{rest // 100}.{rest % 100}"
    return None


def build_info() -> dict:
    """Horovod's version, the controllers and GPU operations it was compiled with, and for
    an NCCL build the CUDA it was compiled with and the NCCL it loaded."""
    info = {"horovod": horovod.__version__}
    for name in ("mpi", "gloo", "nccl"):
        built = getattr(hvd, f"{name}_built", None)
        info[f"{name}_built"] = bool(built()) if built else None
    record = build_record() or {}
    info["horovod_flavour"] = record.get("flavour", "not built by hvdtrain")
    if info["nccl_built"]:
        info["horovod_cuda"] = record.get("cuda")
        info["horovod_nccl"] = record.get("nccl")
        info["nccl_loaded"] = nccl_runtime_version()
    return info


def build_summary() -> str:
    """One line naming Horovod's version, controllers and GPU operations.

    Example: ``Horovod 0.28.1: controllers mpi, gloo; GPU operations: NCCL 2.32.3``.
    """
    info = build_info()
    controllers = ", ".join(n for n in ("mpi", "gloo") if info[f"{n}_built"]) or "none"
    gpu_ops = "none (CPU-only build)"
    if info["nccl_built"]:
        gpu_ops = "NCCL" + (f" {info['nccl_loaded']}" if info.get("nccl_loaded") else "")
    return f"Horovod {info['horovod']}: controllers {controllers}; GPU operations: {gpu_ops}"


def check_gpu_build(gpus: int) -> str | None:
    """A warning when this process sees GPUs but Horovod was built without NCCL.

    Args:
        gpus: the number of GPUs this process sees.

    Returns:
        The warning's text, or ``None`` when there is nothing to warn about.
    """
    if gpus <= 0 or build_info()["nccl_built"]:
        return None
    return (f"this process sees {gpus} GPU(s) but Horovod {horovod.__version__} was built "
            "without NCCL: gradients would travel GPU -> host -> Gloo/MPI; rebuild with "
            "`HVDTRAIN_GPU_BUILD=nccl make install`, or `hvdtrain install-horovod --gpu nccl` "
            "in your own environment")
