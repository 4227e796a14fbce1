"""Horovod's elastic machinery, for :mod:`hvdtrain.horovod.elastic`: telling a
failed collective from other errors, restarting Horovod with the new membership, and the
elastic state and retry loop.

It is kept apart from ``elastic`` so that module holds only the Trainer's side (what a
commit saves, how a worker catches up) and none of Horovod's.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterator

import tensorflow as tf

import horovod.tensorflow as hvd

from hvdtrain.horovod import horovod_private
from hvdtrain.horovod.collectives import broadcast_ints, broadcast_object
from hvdtrain.horovod.horovod_private import (ElasticStateBase, HorovodInternalError,
                                                       HostsUpdatedInterrupt, elastic_run_fn)
from hvdtrain.horovod.runtime import elastic_enabled, rank  # noqa: F401 - re-exported

logger = logging.getLogger("hvdtrain")

_FAILURE_MARKERS = ("horovod", "gloo")

ENV_RESET_TIMEOUT = "HVDTRAIN_ELASTIC_RESET_TIMEOUT"
DEFAULT_RESET_TIMEOUT_S = 180.0


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
def collective_failures_as_internal_errors() -> Iterator[None]:
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


def reset_timeout_from_env() -> float:
    """Seconds a worker may spend in one elastic reset, from
    ``HVDTRAIN_ELASTIC_RESET_TIMEOUT`` (default 180). The rendezvous part may also wait as
    long as the driver's ``HOROVOD_ELASTIC_TIMEOUT`` when that is longer (the driver waits
    that long for enough hosts).

    Raises:
        ValueError: the variable is not a number > 0.
    """
    text = os.environ.get(ENV_RESET_TIMEOUT, "").strip()
    try:
        value = float(text) if text else DEFAULT_RESET_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{ENV_RESET_TIMEOUT} must be a number of seconds > 0, got {text!r}")
    return value


def worker_name() -> str:
    """This worker's slot as the elastic driver names it: ``host[local_rank]``."""
    return (f"{os.environ.get('HOROVOD_HOSTNAME', 'localhost')}"
            f"[{os.environ.get('HOROVOD_LOCAL_RANK', '0')}]")


class ResetGuard:
    """Bounds the time a worker spends in an elastic reset (shutdown, rendezvous, restart,
    reset callbacks, the state's sync): past the limit the worker says where it is stuck,
    naming itself, and exits with code 1, so the driver goes on without it (or ends the
    job) instead of every worker waiting in silence. Every quarter of the limit it logs
    that it is still waiting.

    Args:
        limit: seconds allowed for one reset.
        rendezvous_limit: seconds allowed while at the driver's rendezvous.
        exit: called with the exit code when the limit is passed (``os._exit``).
    """

    def __init__(self, limit: float, rendezvous_limit: float | None = None,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.limit = limit
        self.rendezvous_limit = max(limit, rendezvous_limit or 0.0)
        self._exit = exit
        self._lock = threading.Lock()
        self._stage: str | None = None
        self._since = 0.0
        self._who = ""
        self._thread: threading.Thread | None = None

    def arm(self, who: str) -> None:
        """A reset begins for ``who`` (the worker and its rank before the reset)."""
        with self._lock:
            self._stage, self._since, self._who = "shutting Horovod down", time.monotonic(), who
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="hvdtrain-elastic-reset-guard")
                self._thread.start()

    def stage(self, stage: str) -> None:
        """The reset moved on to ``stage``."""
        with self._lock:
            if self._stage is not None:
                self._stage = stage

    def disarm(self) -> None:
        """The reset is over: the worker trains again."""
        with self._lock:
            self._stage = None

    def check(self, now: float | None = None) -> str | None:
        """The message that ends the worker, once the current reset took too long."""
        with self._lock:
            if self._stage is None:
                return None
            waited = (time.monotonic() if now is None else now) - self._since
            limit = self.rendezvous_limit if self._stage.startswith("the rendezvous") \
                else self.limit
            if waited <= limit:
                return None
            return (f"elastic worker {self._who} stuck in an elastic reset for {waited:.0f} s "
                    f"(limit {limit:g} s, {ENV_RESET_TIMEOUT}), in {self._stage}: leaving "
                    "the job with exit code 1 so that the driver goes on without this worker")

    def _watch(self) -> None:
        warned = 0
        while True:
            time.sleep(min(1.0, self.limit / 8))
            message = self.check()
            if message is not None:
                sys.stderr.write(f"hvdtrain: {message}\n")
                sys.stderr.flush()
                sys.stdout.flush()
                self._exit(1)
                return
            with self._lock:
                waited = time.monotonic() - self._since if self._stage else 0.0
                stage, who = self._stage, self._who
            if stage is None:
                warned = 0
            elif waited > (warned + 1) * self.limit / 4:
                warned += 1
                logger.warning("elastic worker %s has been in an elastic reset for %.0f s, "
                               "now in %s", who, waited, stage)


_guard: ResetGuard | None = None


def _reset_guard() -> ResetGuard:
    global _guard
    if _guard is None:
        elastic_timeout = os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "").strip()
        _guard = ResetGuard(reset_timeout_from_env(),
                            float(elastic_timeout) if elastic_timeout.isdigit() else None)
    return _guard


def leave_removed_worker(who: str) -> None:
    """Ends this worker with exit code 0: the driver gave it no slot in the new world (its
    host left the discovery output), which is not a failure."""
    logger.warning("elastic worker %s has been removed from the elastic job (its host or "
                   "slot left the host discovery output): leaving with exit code 0", who)
    for handler in logging.getLogger().handlers + logger.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def reinit() -> None:
    """Shuts Horovod down and starts it again with the current membership (elastic reset).

    Under an elastic ``horovodrun`` this worker asks the driver's rendezvous for its place
    in the new world; the answer comes once every worker of the old world has asked. A
    worker whose slot is gone leaves with exit code 0 (:func:`leave_removed_worker`); the
    others start Horovod at their new rank. The whole reset is bounded by
    ``HVDTRAIN_ELASTIC_RESET_TIMEOUT`` (:class:`ResetGuard`).
    """
    guard = _reset_guard()
    try:
        who = f"{worker_name()} (rank {hvd.rank()} of {hvd.size()} before the reset)"
    except ValueError:  # Horovod not running (a failed start)
        who = worker_name()
    guard.arm(who)
    hvd.shutdown()
    guard.stage("the rendezvous of the new world (waiting for every worker of the old one "
                "to reach its reset, and for the driver to place the new one)")
    slot = horovod_private.elastic_slot_after_reset(timeout=guard.rendezvous_limit + 30)
    if slot is None:
        leave_removed_worker(worker_name())
    guard.stage(f"Horovod's start at rank {slot['rank']} of {slot['size']}")
    horovod_private.init_at_slot(slot, hvd.init)
    guard.stage(f"the reset callbacks and the sync of the state from rank 0 (now rank "
                f"{slot['rank']} of {slot['size']})")


class OneBroadcastHostCheck:
    """For Horovod's elastic states: ``commit()``'s check for host changes in one
    broadcast of three integers (:func:`horovod_private.check_host_updates`), not an object
    broadcast's two collectives. A commit per batch (Horovod's elastic examples) then costs
    one collective instead of two: time that decides how far training gets between a
    failure and the failed host's return after its blacklist cooldown."""

    def check_host_updates(self) -> None:
        horovod_private.check_host_updates(self, broadcast_ints)


class ElasticState(OneBroadcastHostCheck, ElasticStateBase):
    """Horovod's elastic ``State`` (commit / restore / sync, host-change notifications),
    with hvdtrain's object broadcast and rank. Subclasses implement ``save``, ``restore``
    and ``sync``."""

    def __init__(self) -> None:
        super().__init__(bcast_object=broadcast_object, get_rank=rank)


def elastic_run(func: Callable) -> Callable:
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
        if _guard is not None:
            _guard.disarm()  # the reset (if any) is over: training again
        with collective_failures_as_internal_errors():
            return func(state, *args, **kwargs)

    return elastic_run_fn(translated, reinit)
