"""Loading a dataset once per host under Horovod: local rank 0 downloads, the others read.

Without this, every rank of a job that finds no copy of a dataset downloads it itself:
safe (:func:`~hvdtrain.datasets.sources.fetch` renames a finished temporary file) but N
ranks fetch N copies. :func:`load_once_per_host` lets local rank 0 of each host load first
(downloading if it must); the other local ranks then read what it wrote, never downloading.

Horovod is imported only when this process has already started it through hvdtrain, so
importing :mod:`hvdtrain.datasets` stays free of TensorFlow and Horovod.
"""
from __future__ import annotations

import socket
import sys
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")

_RUNTIME = "hvdtrain.horovod.runtime"


def _running_job() -> bool:
    """True when hvdtrain has started Horovod in this process and the job has several ranks."""
    if _RUNTIME not in sys.modules:  # never imported: Horovod cannot have been started
        return False
    from hvdtrain.horovod import runtime
    return runtime.is_initialized() and runtime.size() > 1


def _agree_on_failure(error: Optional[Exception], failed: str) -> None:
    """Every rank calls this at the same point: a failure on any rank fails every rank.

    ``failed`` says what went wrong on a failing rank, with ``{host}`` and ``{rank}`` in it.

    The vote is an allreduce, so it is also the barrier. When no rank failed it returns on
    every rank. Otherwise the ranks exchange what went wrong and each raises: a rank that
    failed re-raises its own error, the others raise one that names the host(s) and rank(s)
    that failed. Every rank raises a ``FileNotFoundError`` if every failure was one (the
    files are missing), else a non-``FileNotFoundError``, so callers that fall back on
    ``FileNotFoundError`` (say, to another dataset) take the same branch on every rank.
    """
    from hvdtrain.horovod import collectives
    if not collectives.agree_any(error is not None):
        return
    mine = None
    if error is not None:
        first = (str(error).strip().splitlines() or [""])[0]
        mine = (socket.gethostname(), collectives.rank(), type(error).__name__, first,
                isinstance(error, FileNotFoundError))
    failures = [f for f in collectives.allgather_object(mine) if f is not None]
    missing = all(f[4] for f in failures)
    if error is not None and isinstance(error, FileNotFoundError) == missing:
        raise error
    where = "; ".join(failed.format(host=host, rank=rank) + f": {kind}: {msg}"
                      for host, rank, kind, msg, _ in failures)
    raise (FileNotFoundError if missing else RuntimeError)(
        f"dataset not loaded on rank {collectives.rank()}: {where}") from error


def load_once_per_host(loader: Callable[..., T], /, **kwargs: Any) -> T:
    """Call ``loader(**kwargs)`` so that each host downloads the dataset at most once.

    Under Horovod (started with ``hvdtrain.init()``, more than one rank), local rank 0 of
    each host calls ``loader(**kwargs)`` first and may download; every rank then waits for
    it; then the other local ranks call ``loader(**kwargs, download=False)`` and read the
    files it wrote. All ranks return data or all of them raise: a failure on any rank is
    agreed between the ranks, and a rank whose own load worked raises a
    ``FileNotFoundError`` naming the host and rank that failed (another exception type
    when that failure was not a missing file) rather than trying a download of its own.
    Without Horovod, or on one rank, it is just ``loader(**kwargs)``.

    Args:
        loader: A dataset loader that takes a ``download`` keyword, e.g.
            :func:`~hvdtrain.datasets.load_mnist_dataset`.
        **kwargs: Passed to ``loader`` (``shape``, ``path``, ``download``, ...).

    Returns:
        What ``loader`` returns, on every rank.

    Raises:
        FileNotFoundError: The dataset is missing and could not be downloaded (on any rank).
        Exception: Whatever else the loader raised on some rank (e.g. ``ValueError`` for a
            corrupt file), as itself there and as ``RuntimeError`` on the other ranks.
    """
    if not _running_job():
        return loader(**kwargs)
    from hvdtrain.horovod import runtime
    first = runtime.local_rank() == 0
    result, error = None, None
    if first:
        try:
            result = loader(**kwargs)
        except Exception as err:  # noqa: BLE001 - agreed with the other ranks below
            error = err
    _agree_on_failure(error, "local rank 0 of host {host} (rank {rank}) could not load it")
    if not first:
        try:
            result = loader(**{**kwargs, "download": False})
        except Exception as err:  # noqa: BLE001 - agreed with the other ranks below
            error = err
    _agree_on_failure(error, "rank {rank} on host {host} could not read local rank 0's copy")
    return result
