"""Running a training function on Ray workers through Horovod's ``horovod.ray.RayExecutor``.

:func:`run` starts ``num_workers`` Ray actors, lets Horovod's executor give each one its
rank and the Gloo rendezvous (``HOROVOD_RANK``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR``, ...), runs
the function on all of them and returns their results in rank order. Inside the function
``hvdtrain.Trainer(...)`` (or ``hvdtrain.init()``) starts Horovod from those variables, as
under ``horovodrun --gloo``. Public entry point: :mod:`hvdtrain.ray`.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

logger = logging.getLogger("hvdtrain")

#: The Ray release this project pins in requirements.txt and tests with Horovod's executor.
RAY_VERSION = "2.60.0"


def _import_ray():
    """``ray`` and ``horovod.ray.RayExecutor``, or an ImportError that says what to install."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"hvdtrain.ray needs Ray: pip install ray=={RAY_VERSION} "
                          "(requirements.txt pins it; `make install` installs it)") from err
    try:
        from horovod.ray import RayExecutor
    except ImportError as err:
        raise ImportError(f"Horovod's Ray executor (horovod.ray) failed to import with Ray "
                          f"{getattr(ray, '__version__', '?')}: {err}; this project tests "
                          f"ray=={RAY_VERSION}") from err
    return ray, RayExecutor


def run(train_fn: Callable[..., Any], num_workers: int = 2, *, args: Sequence[Any] = (),
        kwargs: dict | None = None, cpus_per_worker: int = 1, use_gpu: bool = False,
        address: str | None = None, timeout_s: float | None = 600,
        start_timeout_s: int = 60) -> list:
    """Run ``train_fn(*args, **kwargs)`` on ``num_workers`` Ray workers as one Horovod job.

    Args:
        train_fn: the training function; it must be picklable (a module-level function of
            an importable module, or one defined in the driver's ``__main__``). It builds
            ``hvdtrain.Trainer(...)`` as in any hvdtrain script.
        num_workers: Horovod ranks, one Ray actor each.
        args, kwargs: passed to ``train_fn`` on every worker.
        cpus_per_worker: Ray CPUs reserved for each worker.
        use_gpu: reserve one GPU per worker (Horovod's executor sets CUDA_VISIBLE_DEVICES).
        address: Ray cluster to connect to (``"auto"``, ``"HOST:PORT"``) when Ray is not
            initialized in this process yet; None starts or finds one as ``ray.init()`` does.
        timeout_s: seconds to wait for all results; None waits forever.
        start_timeout_s: seconds Horovod waits for the workers' Gloo rendezvous and for
            Ray to place the workers.

    Returns:
        Each worker's return value, rank 0 first.

    Raises:
        ImportError: Ray (or horovod.ray) cannot be imported.
        ValueError: ``num_workers`` is below 1.
        TimeoutError: the results did not come within ``timeout_s``.
        Exception: the first worker's exception, as soon as it comes (Ray's
            ``RayTaskError``, also an instance of the worker's exception type); the job's
            workers are ended either way.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    ray, RayExecutor = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)
    settings = RayExecutor.create_settings(timeout_s=start_timeout_s,
                                           placement_group_timeout_s=start_timeout_s)
    executor = RayExecutor(settings, num_workers=num_workers,
                           cpus_per_worker=cpus_per_worker, use_gpu=use_gpu)
    try:
        executor.start()
        refs = executor.run_remote(train_fn, args=list(args), kwargs=dict(kwargs or {}))
        return _results(ray, refs, timeout_s)
    finally:
        _shutdown(ray, executor)


def _results(ray, refs: list, timeout_s: float | None) -> list:
    """The workers' results in rank order. The first worker to fail raises its error at
    once (the others may be waiting for it in a collective); none past ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            raise TimeoutError(f"{len(pending)} of {len(refs)} Ray workers gave no result "
                               f"within {timeout_s} s")
        ray.get(ready)  # a worker's exception is raised here
    return list(ray.get(refs))


def _shutdown(ray, executor) -> None:
    """Ends the job's actors (hung ones too) and frees their placement group."""
    adapter = getattr(executor, "adapter", None)
    if adapter is None:  # start() failed before it made any
        return
    workers = list(getattr(adapter, "workers", None) or [])
    try:
        executor.shutdown()
    finally:
        for worker in workers:
            try:
                ray.kill(worker)
            except Exception as err:  # noqa: BLE001 - already gone
                logger.debug("ray.kill of a Horovod worker: %s", err)
