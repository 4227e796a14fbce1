"""Rank 0 tells the other ranks a small value at start-up, without TensorFlow.

``hvd.init()`` must leave TensorFlow's runtime unstarted, as Horovod's does: a script sets
its threads, visible GPUs, memory growth and virtual devices after it, and TensorFlow
refuses each of those once its context exists. A Horovod collective (``broadcast_object``)
would start that context, so what hvdtrain's start-up exchanges (the collective
watchdog's address) goes over the channel the launcher already set up:

- the MPI controller (``mpirun``, ``srun``, ``horovodrun --mpi``): an mpi4py broadcast on
  the communicator Horovod runs on (``MPI_COMM_WORLD``, or the ``init(comm=...)`` one);
- the Gloo controller (``horovodrun --gloo``, Ray, Spark): the key-value store of the
  rendezvous server whose address Horovod's launcher puts in every rank's environment
  (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``), the store Horovod's Gloo start-up uses.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

#: The rendezvous store's scope for hvdtrain's start-up values (Horovod's own are
#: ``global``, ``local`` and ``cross``).
_SCOPE = "hvdtrain"
_WAIT_S = 120.0  # for rank 0's value: every rank has passed hvd.init() by then
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy


class Unavailable(RuntimeError):
    """No channel outside TensorFlow reaches the other ranks (a custom launcher)."""


def broadcast(value: Any, *, rank: int, mpi: bool, comm=None, key: str) -> Any:
    """Every rank gets rank 0's ``value`` (JSON-serialisable); a collective.

    Args:
        value: what rank 0 sends (ignored elsewhere).
        rank: this process's Horovod rank.
        mpi: Horovod runs on its MPI controller (``hvd.mpi_enabled()``).
        comm: what ``hvd.init(comm=...)`` was given (an mpi4py communicator or a list of
            world ranks), ``None`` for the whole job.
        key: names the value in the rendezvous store (one per value sent in a job).

    Raises:
        Unavailable: neither MPI nor Horovod's rendezvous server is there.
        TimeoutError: rank 0's value did not reach this rank in time.
    """
    if mpi:
        return _mpi_communicator(comm).bcast(value, root=0)
    address = _rendezvous_address()
    if address is None:
        raise Unavailable("Horovod runs on Gloo without the launcher's rendezvous server "
                          "(HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT are not set)")
    url = f"http://{address[0]}:{address[1]}/{_SCOPE}/{key}"
    if rank == 0:
        request = urllib.request.Request(url, data=json.dumps(value).encode(), method="PUT")
        _DIRECT.open(request, timeout=10).close()
        return value
    return _poll(url)


def _mpi_communicator(comm):
    from mpi4py import MPI  # MPI runs already: Horovod initialized it

    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, (list, tuple, range)):  # a collective of the listed ranks only
        world = MPI.COMM_WORLD
        return world.Create_group(world.Get_group().Incl(list(comm)))
    return comm


def _rendezvous_address() -> tuple[str, int] | None:
    host = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "")
    return (host, int(port)) if host and port.isdigit() else None


def _poll(url: str) -> Any:
    deadline = time.monotonic() + _WAIT_S
    while True:
        try:
            with _DIRECT.open(url, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as err:  # 404: rank 0 has not put it yet
            if err.code != 404:
                raise
        except urllib.error.URLError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0's start-up value did not reach this rank in "
                               f"{_WAIT_S:.0f} s (from {url})")
        time.sleep(0.05)
