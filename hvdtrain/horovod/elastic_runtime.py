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
from typing import Callable, Iterator

import tensorflow as tf

import horovod.tensorflow as hvd

from hvdtrain.horovod.collectives import broadcast_object
from hvdtrain.horovod.horovod_private import (ElasticStateBase, HorovodInternalError,
                                                       HostsUpdatedInterrupt, elastic_run_fn)
from hvdtrain.horovod.runtime import rank

logger = logging.getLogger("hvdtrain")

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


def reinit() -> None:
    """Shuts Horovod down and starts it again with the current membership (elastic reset).

    Under an elastic ``horovodrun`` the new ``init`` waits at the driver's rendezvous until
    every worker of the new world has arrived, then rank and size reflect that world.
    """
    hvd.shutdown()
    hvd.init()


class ElasticState(ElasticStateBase):
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
        with collective_failures_as_internal_errors():
            return func(state, *args, **kwargs)

    return elastic_run_fn(translated, reinit)
