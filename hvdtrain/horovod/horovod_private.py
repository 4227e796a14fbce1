"""Horovod private APIs that hvdtrain uses (written against Horovod 0.28.1), each with its
reason (checked by ``tests/unit/test_private_apis.py``).

``horovod.common.*`` is not part of Horovod's documented API (its API reference covers
``horovod.tensorflow`` and friends). It lives here, inside ``hvdtrain.horovod``,
the only package that imports Horovod.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Callable

from horovod.common import elastic as _elastic
from horovod.common import exceptions as _exceptions
from horovod.runner.elastic import rendezvous as _rendezvous
from horovod.runner.elastic.worker import HostUpdateResult

ElasticStateBase = _elastic.State
"""``horovod.common.elastic.State(bcast_object, get_rank)``: the state Horovod's elastic
loop drives (``commit``, host-update checks, reset callbacks); ``hvd.elastic`` exports only
subclasses that broadcast a tf.keras model or session variables, not hvdtrain's state."""

HorovodInternalError = _exceptions.HorovodInternalError
"""``horovod.common.exceptions.HorovodInternalError``: the error the elastic loop recovers
from by restoring the last commit; ``horovod.tensorflow`` does not export it."""

HostsUpdatedInterrupt = _exceptions.HostsUpdatedInterrupt
"""``horovod.common.exceptions.HostsUpdatedInterrupt(skip_sync)``: raised by ``commit()``
when hosts were added or removed (a restart without restore); not exported either."""


def elastic_run_fn(func: Callable, reset: Callable[[], None]) -> Callable:
    """``horovod.common.elastic.run_fn(func, reset)``: Horovod's elastic retry loop with
    hvdtrain's reset; the public ``hvd.elastic.run`` recovers only from errors that name
    ``HorovodAllreduce``/``Allgather``/``Broadcast``, not from grouped or eager collectives."""
    return _elastic.run_fn(func, reset)


def check_host_updates(state, broadcast_ints: Callable[[list[int]], list[int]]) -> None:
    """``horovod.common.elastic.State.check_host_updates`` (called by every ``commit()``)
    with one broadcast of three integers instead of ``broadcast_object``'s two (its size,
    then its pickle): the same decision, half the collectives of a commit.

    Reads the state's private ``_host_messages`` (the driver's notifications, queued on
    rank 0) and ``_last_updated_timestamp``; as Horovod's, rank 0's view is every rank's.

    Args:
        state: a ``horovod.common.elastic.State``.
        broadcast_ints: returns rank 0's copy of a list of integers.

    Raises:
        HostsUpdatedInterrupt: the driver announced a host change since the last check
            (``skip_sync`` when hosts were only removed).
    """
    prev = last = state._last_updated_timestamp
    update = HostUpdateResult.no_update
    while not state._host_messages.empty():
        timestamp, result = state._host_messages.get()
        if timestamp > last:
            last, update = timestamp, update | result
    prev, last, update = broadcast_ints([int(prev), int(last), int(update)])
    state._last_updated_timestamp = last
    if last > prev:
        raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)


ObjectState = _elastic.ObjectState
"""``horovod.common.elastic.ObjectState(bcast_object, get_rank, **kwargs)``: the elastic
state that keeps plain attributes (``epoch``, ``batch``) and broadcasts them in ``sync``;
the base of Horovod's ``TensorFlowKerasState``, which itself cannot hold a Keras 3 model."""


SLOT_FIELDS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
"""The fields of the elastic rendezvous's answer, in order
(``horovod.runner.common.util.hosts.SlotInfo.to_response_string``)."""


def elastic_slot_after_reset(timeout: float) -> dict[str, int] | None:
    """This worker's place in the world after an elastic reset, or ``None`` when its slot
    is gone (its host was removed from the discovery output).

    Asks the driver's rendezvous server (``GET /rank_and_size/<host>:<local_rank>``, what
    Horovod's C++ ``GlooContext::Initialize`` asks on a re-init): the answer comes once
    every worker of the old world has asked, and the driver has placed the new one. The
    C++ side throws from its background thread for a removed slot (``has been removed
    from elastic job``: ``std::terminate``, an abort); asked from Python, the worker can
    leave cleanly instead. Ask once per reset: each question counts as arrival.

    Raises:
        RuntimeError: the rendezvous server did not answer.
    """
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    key = (f"{os.environ.get('HOROVOD_HOSTNAME', 'localhost')}:"
           f"{os.environ.get('HOROVOD_LOCAL_RANK', '0')}")
    url = f"http://{addr}:{port}/{_rendezvous.GET_RANK_AND_SIZE}/{key}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read().decode("ascii")
    except (OSError, urllib.error.URLError) as err:
        raise RuntimeError(f"the elastic rendezvous at {addr}:{port} did not place worker "
                           f"{key}: {err}") from err
    values = [int(v) for v in text.split(",")]
    if len(values) != len(SLOT_FIELDS):
        raise RuntimeError(f"the elastic rendezvous answered {text!r} for worker {key}, not "
                           f"the {len(SLOT_FIELDS)} numbers {', '.join(SLOT_FIELDS)}")
    return None if values[0] < 0 else dict(zip(SLOT_FIELDS, values))


def init_at_slot(slot: dict[str, int], init: Callable[[], None]) -> None:
    """Calls ``init`` (``hvd.init``) so that Horovod starts at ``slot`` (from
    :func:`elastic_slot_after_reset`) without asking the rendezvous again.

    Horovod's C++ start reads ``HOROVOD_RANK``, ``HOROVOD_SIZE``... from the environment,
    and asks the rendezvous only when ``HOROVOD_ELASTIC`` is set after a shutdown; its
    other elastic settings (``elastic_enabled``, NCCL's) are only ever switched on, so
    they stay on from the first start. ``HOROVOD_ELASTIC`` is back to ``1`` on return.
    """
    for name, value in slot.items():
        os.environ[f"HOROVOD_{name.upper()}"] = str(value)
    os.environ["HOROVOD_ELASTIC"] = "0"
    try:
        init()
    finally:
        os.environ["HOROVOD_ELASTIC"] = "1"
