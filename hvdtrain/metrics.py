"""Keras metric objects over every worker's data: each worker updates its own copy, and the
metrics' state variables are summed across workers before ``result()``.

A per-batch mean of a metric is wrong for AUC, precision, recall or IoU (a mean of ratios
is not the ratio of the sums). Keras metrics keep sums (true positives per threshold, a
confusion matrix, a total and a count), so summing each state variable over the workers
gives the state one process would have reached on all the data, and ``result()`` on that
state is the metric over the whole set. Metrics whose state is not a sum (a running max,
say) are not supported.
"""
from __future__ import annotations

from typing import Callable, Iterable

import keras
import numpy as np
import tensorflow as tf


def check_metrics(metrics: Iterable | None) -> list:
    """The user's ``metrics=`` as a list of Keras metric objects.

    Raises:
        TypeError: an entry is not a ``keras.metrics.Metric`` instance.
        ValueError: two metrics share a name, or a name clashes with ``loss``.
    """
    if metrics is None:
        return []
    if isinstance(metrics, (keras.metrics.Metric, str)):
        metrics = [metrics]
    metrics, names = list(metrics), set()
    for m in metrics:
        if not isinstance(m, keras.metrics.Metric):
            raise TypeError("metrics must be keras.metrics.Metric instances (e.g. "
                            f"keras.metrics.AUC()), got {m!r} of type {type(m).__name__}")
        if m.name in names or m.name == "loss":
            raise ValueError(f"metric name {m.name!r} is used twice (or is 'loss'): give the "
                             "metrics distinct names, e.g. keras.metrics.AUC(name='auc_2')")
        names.add(m.name)
    return metrics


def describe(metrics: list) -> list:
    """What must agree across workers: each metric's class and configuration."""
    return [(type(m).__name__, repr(sorted(m.get_config().items()))) for m in metrics]


class MetricSet:
    """Fresh copies of the user's metrics (the user's objects keep their own state). Make
    it outside any distribution strategy's scope, so the variables are this worker's own.

    Args:
        metrics: Keras metric objects, as checked by :func:`check_metrics`.
    """

    def __init__(self, metrics: list) -> None:
        self.metrics = [_copy(m) for m in metrics]

    def __bool__(self) -> bool:
        return bool(self.metrics)

    @property
    def names(self) -> list[str]:
        """The metrics' names, in the order given."""
        return [m.name for m in self.metrics]

    def update(self, y_true, y_pred) -> None:
        """Adds one batch to every metric (traceable inside a ``tf.function``)."""
        for m in self.metrics:
            m.update_state(y_true, y_pred)

    def reset(self) -> None:
        """Clears every metric's state on this worker."""
        for m in self.metrics:
            m.reset_state()

    def results(self, allgather: Callable[[object], list]) -> dict[str, float]:
        """``{name: result}`` over every worker's updates (a collective: call it on every
        worker). This worker's own state is left as it was.

        Args:
            allgather: gathers one picklable object from every worker, in worker order
                (``Backend.allgather_object``).
        """
        mine = [[np.asarray(v.numpy()) for v in m.variables] for m in self.metrics]
        everyone = allgather(mine)
        out = {}
        for i, m in enumerate(self.metrics):
            states = [worker[i] for worker in everyone]
            if any(len(s) != len(mine[i]) for s in states):
                raise ValueError(f"metric {m.name!r} has a different number of state variables "
                                 "on different workers; build it the same way on every worker")
            totals = [np.sum(parts, axis=0) for parts in zip(*states)]
            for variable, total in zip(m.variables, totals):
                variable.assign(total)
            out[m.name] = _scalar(m.result(), m.name)
            for variable, own in zip(m.variables, mine[i]):
                variable.assign(own)
        return out


def _copy(metric: keras.metrics.Metric) -> keras.metrics.Metric:
    """A new metric of the same class and configuration, with variables of its own."""
    with tf.init_scope():
        try:
            return type(metric).from_config(metric.get_config())
        except (TypeError, ValueError, NotImplementedError) as err:
            raise TypeError(f"metric {metric.name!r} ({type(metric).__name__}) cannot be copied "
                            f"from its get_config(): {err}. Implement get_config/from_config") from err


def _scalar(value, name: str) -> float:
    array = np.asarray(keras.ops.convert_to_numpy(value))
    if array.size != 1:
        raise ValueError(f"metric {name!r} returned a result of shape {array.shape}; only "
                         "metrics with one number as result can be logged")
    return float(array.reshape(()))
