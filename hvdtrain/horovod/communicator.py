"""Horovod on part of an ``mpirun`` job: ``hvdtrain.init(comm=...)``.

Given an mpi4py communicator (``MPI.COMM_WORLD.Split(rank % 2)``) or a list of world
ranks, Horovod's whole job is that communicator: ``rank()``, ``size()``, ``local_rank()``
and ``local_size()`` and every collective are the sub-job's, so a Trainer built after it
shards, agrees, checkpoints, logs and stops among its own ranks only. Two facts still
belong to the world, and this module keeps them:

- which world ranks a sub-job holds, so that a message (a failure, the watchdog's verdict,
  a log line) names the process as ``mpirun`` knows it, not only as "rank 0", which every
  sub-job has;
- how many processes share this host: the CPU cores and GPUs are divided among all of
  them, whichever sub-job they belong to, while Horovod's ``local_size()`` counts only the
  sub-job's.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

from hvdtrain import checks, threads


@dataclasses.dataclass(frozen=True)
class Membership:
    """Where a sub-job sits in the ``mpirun`` job.

    Attributes:
        world_ranks: the world rank of each of the sub-job's ranks, in sub-job rank order.
        world_rank: this process's world rank.
        world_size: processes in the whole ``mpirun`` job.
    """

    world_ranks: tuple[int, ...]
    world_rank: int
    world_size: int

    def describe(self) -> str:
        """e.g. ``"world ranks 1, 3 of 4"``."""
        return f"world ranks {', '.join(map(str, self.world_ranks))} of {self.world_size}"

    def where(self, rank: int, size: int) -> str:
        """e.g. ``"rank 1 of 2 (world rank 3; sub-communicator of world ranks 1, 3 of 4)"``."""
        return (f"rank {rank} of {size} (world rank {self.world_rank}; "
                f"sub-communicator of {self.describe()})")


def check(comm: Any) -> None:
    """Refuses a ``comm`` that Horovod could not start on, naming the argument.

    Args:
        comm: an mpi4py intracommunicator, or a non-empty list of distinct world ranks.

    Raises:
        ValueError: anything else (an empty or repeated rank list, ``MPI.COMM_NULL``).
    """
    if isinstance(comm, (list, tuple, range)):
        ranks = list(comm)
        if (not ranks or len(set(ranks)) != len(ranks)
                or not all(checks.is_integer(r) and r >= 0 for r in ranks)):
            raise ValueError("comm= as a list must hold distinct world ranks (ints >= 0), "
                             f"got {comm!r}")
        return
    mpi = sys.modules.get("mpi4py.MPI")  # a communicator exists only once it was imported
    if mpi is None or not isinstance(comm, mpi.Intracomm) or comm == mpi.COMM_NULL:
        raise ValueError("comm= must be an mpi4py intracommunicator (e.g. "
                         "MPI.COMM_WORLD.Split(color)) or a list of world ranks, got "
                         f"{comm!r}; a process outside every group gets MPI.COMM_NULL from "
                         "Create/Split and must not call init(comm=...)")


def check_started(comm: Any, size: int, mpi_enabled: bool) -> None:
    """After ``hvd.init(comm=...)``: Horovod really runs on ``comm``.

    Horovod's Gloo controller (``horovodrun`` without ``--mpi``) ignores ``comm`` and
    starts on every rank; a sweep would then silently train one job, not two.

    Raises:
        ValueError: Horovod is not on the MPI controller, or its size is not ``comm``'s.
    """
    if not mpi_enabled:
        raise ValueError("hvdtrain.init(comm=...) needs Horovod's MPI controller (launch "
                         "with mpirun, or horovodrun --mpi): this job runs Gloo, which "
                         f"ignores comm= and started Horovod on all {size} ranks")
    wanted = len(comm) if isinstance(comm, (list, tuple, range)) else comm.Get_size()
    if wanted != size:
        raise ValueError(f"comm= holds {wanted} ranks but Horovod started on {size}")


def membership(comm: Any, rank: int) -> Membership | None:
    """The world ranks of the job Horovod started on ``comm``, or ``None`` when ``comm``
    is the whole world (nothing to tell apart).

    Args:
        comm: what ``hvd.init`` was given (after :func:`check_started`).
        rank: this process's Horovod rank (its index in a rank list).
    """
    mpi = _mpi()  # MPI is initialized by now (by mpi4py or by Horovod): no collective here
    world = mpi.COMM_WORLD
    if isinstance(comm, (list, tuple, range)):
        ranks = tuple(int(r) for r in comm)
    else:
        ranks = tuple(mpi.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                                world.Get_group()))
    if ranks == tuple(range(world.Get_size())):
        return None
    return Membership(ranks, world.Get_rank(), world.Get_size())


def host_processes(local_size: int) -> int:
    """Processes of the whole ``mpirun`` job on this host (the launcher's count), at least
    ``local_size`` (Horovod's, which counts only this sub-job's)."""
    return max(local_size, threads.launcher_local_size() or 0)


def host_local_rank(local_rank: int) -> int:
    """This process's index among the whole job's processes on this host (the launcher's),
    else Horovod's ``local_rank`` (which numbers only this sub-job's processes)."""
    found = threads.launcher_local_rank()
    return local_rank if found is None else found


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as err:  # pragma: no cover - mpi4py is pinned in requirements.txt
        raise ValueError("hvdtrain.init(comm=...) needs mpi4py (pip install mpi4py, built "
                         "against the MPI that mpirun comes from)") from err
    return MPI
