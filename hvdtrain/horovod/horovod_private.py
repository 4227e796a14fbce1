"""Horovod private APIs that hvdtrain uses (written against Horovod 0.28.1), each with its
reason (checked by ``tests/unit/test_private_apis.py``).

``horovod.common.*`` is not part of Horovod's documented API (its API reference covers
``horovod.tensorflow`` and friends). It lives here, inside ``hvdtrain.horovod``,
the only package that imports Horovod.
"""
from __future__ import annotations

from typing import Callable

from horovod.common import elastic as _elastic
from horovod.common import exceptions as _exceptions

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


ObjectState = _elastic.ObjectState
"""``horovod.common.elastic.ObjectState(bcast_object, get_rank, **kwargs)``: the elastic
state that keeps plain attributes (``epoch``, ``batch``) and broadcasts them in ``sync``;
the base of Horovod's ``TensorFlowKerasState``, which itself cannot hold a Keras 3 model."""
