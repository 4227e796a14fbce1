"""CPU threads per rank: TensorFlow's thread settings, made before its runtime starts,
give each local rank an equal share of the cores (imports nothing heavy)."""
from __future__ import annotations

import os


def usable_cpu_ids() -> list[int]:
    """The ids of the cores this process may run on, in order (its CPU affinity, which
    launchers and container limits narrow; every core where the platform has none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which launchers and container
    limits narrow), not every core the machine has."""
    return max(1, len(usable_cpu_ids()))


#: What launchers tell each process about the processes of the whole job on its host:
#: Open MPI's ``mpirun``, ``horovodrun`` and MPICH/Intel MPI's Hydra.
_LOCAL_SIZE_KEYS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS")
_LOCAL_RANK_KEYS = ("OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "MPI_LOCALRANKID")


def _launcher_number(keys: tuple) -> int | None:
    for key in keys:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return None


def launcher_local_size() -> int | None:
    """Processes of the whole launched job on this host (``None``: no launcher said), which
    a sub-communicator's ``local_size()`` does not count."""
    found = _launcher_number(_LOCAL_SIZE_KEYS)
    return None if found is None else max(1, found)


def launcher_local_rank() -> int | None:
    """This process's index among the launched job's processes on this host, or ``None``."""
    return _launcher_number(_LOCAL_RANK_KEYS)


#: The TensorFlow thread variables hvdtrain set itself (the user's own are left alone).
_THREAD_ENV_SET: list = []


def share_cores_before_tensorflow_starts() -> None:
    """Gives each local rank an equal share of the cores through TensorFlow's environment
    variables, which TensorFlow reads when its runtime starts. Setting them at import time
    still works when the user creates datasets or tensors before ``hvdtrain.init()``."""
    local_size = launcher_local_size()
    if local_size is None:
        return
    threads = os.environ.get("HVDTRAIN_THREADS") or str(max(1, usable_cores() // local_size))
    for key, value in (("TF_NUM_INTRAOP_THREADS", threads),
                       ("TF_NUM_INTEROP_THREADS", str(max(2, int(threads))))):
        if key not in os.environ:
            os.environ[key] = value
            _THREAD_ENV_SET.append(key)


def restore_thread_environment() -> None:
    """Undoes :func:`share_cores_before_tensorflow_starts` (for stock baselines)."""
    while _THREAD_ENV_SET:
        os.environ.pop(_THREAD_ENV_SET.pop(), None)
