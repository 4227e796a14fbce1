"""Each epoch's logs, as Keras's ``fit`` reports them: the epoch's mean loss (and log
tensors) over every worker's steps, the metrics over the epoch, the learning rate and the
latest validation, kept in a ``keras.callbacks.History``."""
from __future__ import annotations

import keras
import tensorflow as tf

COUNT_KEY = "\0count"


class EpochRecord:
    """Sums each step's logs on the device (no read per step) and closes epochs.

    Args:
        network: the model the History belongs to (``history.model``).
        keys: the names of the step's logs (the same on every worker).
        local_steps: the steps run in this process, so their logs are tensors here
            (else, as on parameter servers, an epoch reports its latest step's logs).
    """

    def __init__(self, network, keys, local_steps: bool) -> None:
        self.history = keras.callbacks.History()
        if isinstance(network, keras.Model):
            self.history.set_model(network)
        self.history.epoch, self.history.history = [], {}
        self.validation: dict = {}
        self._keys, self._local = sorted(keys), local_steps
        self._sums: dict = {}
        self._count = 0
        self._last: dict = {}

    def add(self, logs: dict, steps: int = 1) -> None:
        """Counts the logs of ``steps`` steps (their mean): added on the device, without
        waiting for the steps."""
        self._last = logs
        if self._local:
            for k in self._keys:
                v = tf.cast(logs[k], tf.float32)
                v = v * steps if steps > 1 else v
                self._sums[k] = self._sums[k] + v if k in self._sums else v
            self._count += steps

    def close_epoch(self, epoch: int, backend, metrics, learning_rate: float) -> dict:
        """The epoch's logs, recorded in the History; starts the next epoch's sums. A
        collective (every worker closes the same epoch after the same step).

        Args:
            epoch: the epoch that ended.
            backend: sums over workers (``sum_over_workers``, ``allgather_object``).
            metrics: the training :class:`hvdtrain.metrics.MetricSet` (may be empty).
            learning_rate: the current learning rate.
        """
        logs = {k: float(v) for k, v in self._last.items()}
        if self._local:  # the same keys on every worker, even one that joined mid-epoch
            totals = backend.sum_over_workers(
                {**{k: float(self._sums.get(k, 0.0)) for k in self._keys}, COUNT_KEY: self._count})
            if totals[COUNT_KEY]:
                logs = {k: totals[k] / totals[COUNT_KEY] for k in self._keys}
        if metrics:
            logs.update(metrics.results(backend.allgather_object))
            metrics.reset()
        logs["learning_rate"] = learning_rate
        logs.update(self.validation)
        self._sums, self._count = {}, 0
        self.history.epoch.append(epoch)
        for k, v in logs.items():
            self.history.history.setdefault(k, []).append(v)
        return logs

    def final_validation(self, metrics: dict) -> None:
        """Puts the validation that ran after the last epoch into its entry."""
        self.validation = dict(metrics)
        if not self.history.epoch:
            return
        for k, v in metrics.items():
            values = self.history.history.setdefault(k, [])
            if len(values) == len(self.history.epoch):
                values[-1] = v
            else:
                values.append(v)
