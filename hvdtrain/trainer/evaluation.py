"""What a trained network is for: metrics over a whole dataset, predictions in the data's
order, and the network written for Keras (``.keras``) or for serving (SavedModel).

:class:`Evaluation` is the Trainer's part for these: it is given the backend, the network,
the training program, the data's element spec, the validation build function and the
metrics, and nothing else of the Trainer. Each worker runs the network on its own shard of
the data (element ``i`` goes to worker ``i % workers``); the results travel in one
collective, so call these methods on every worker.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import data
from hvdtrain import program as programs
from hvdtrain.metrics import MetricSet

logger = logging.getLogger("hvdtrain")


class Evaluation:
    """Metrics, predictions and the written network of one Trainer's training.

    Args:
        backend: the Trainer's backend (collectives, the evaluation shard, ``evaluate``).
        network: the trained network (the build function's, or the model given).
        program: the training program (its outputs are the loss and log tensors).
        element_spec: the training data's element spec (the served input's signature).
        build_validation_func: ``f(x, y[, network]) -> (network, metrics)``, or ``None``.
        metrics: Keras metric objects applied to ``(y, network output)``.
        batch_size: the default examples per batch.
    """

    def __init__(self, backend, network: keras.layers.Layer, program: keras.Model,
                 element_spec, build_validation_func: Callable | None, metrics: list,
                 batch_size: int) -> None:
        self._backend, self._network, self._program = backend, network, program
        self._element_spec, self._build_validation_func = element_spec, build_validation_func
        self.batch_size = batch_size
        self.metric_objects = list(metrics)
        #: each worker's own metric states (made outside the strategy's scope, summed when
        #: read): one set for training logs (where workers run their own steps), one for
        #: evaluation
        self.train_metrics = MetricSet(metrics if backend.local_steps else [])
        self._eval_metrics = MetricSet(metrics)
        self._validation: keras.Model | None = None

    def training_program(self) -> keras.Model:
        """The program the training step runs: the training program, with the training
        metrics' updates when there are any."""
        if not self.train_metrics:
            return self._program
        return programs.with_metrics(self._program, self.train_metrics)

    def evaluate(self, dataset: tf.data.Dataset, batch_size: int | None = None) -> dict:
        """The metrics over every example of ``dataset``, on every worker.

        Reports the training program's loss and log tensors (or, with
        ``build_validation_func``, its metrics) as means over all examples, and each of
        the Trainer's ``metrics`` over the whole set (their states summed across workers).

        Args:
            dataset: unbatched ``(x, y)`` pairs; each worker evaluates its shard.
            batch_size: examples per batch (default: the Trainer's ``batch_size``).

        Returns:
            ``{name: value}``, the same on every worker.
        """
        data.check_dataset(dataset, "dataset")
        return dict(self.metrics_over(dataset, batch_size or self.batch_size))

    def predict(self, dataset: tf.data.Dataset, batch_size: int | None = None):
        """The network's outputs (inference mode) for every element, in dataset order.

        Every worker computes its shard; the outputs are gathered so that every worker
        returns all of them (keep it to datasets whose outputs fit in memory).

        Args:
            dataset: unbatched elements: ``x``, or ``(x, y)`` / ``(x, y, weight)`` pairs
                whose ``x`` is used.
            batch_size: examples per batch (default: the Trainer's ``batch_size``).

        Returns:
            A NumPy array (or the network's structure of arrays) with one row per element.
        """
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
        if isinstance(dataset.element_spec, tuple) and len(dataset.element_spec) in (2, 3):
            dataset = dataset.map(lambda *element: element[0])
        network = self._network
        forward = tf.function(lambda x: network(x, training=False))
        parts = [tf.nest.map_structure(lambda t: t.numpy(), forward(x))
                 for x in self._my_batches(dataset, batch_size)]
        mine = (tf.nest.map_structure(lambda *a: np.concatenate(a), *parts) if parts else None)
        return _interleave(self._backend.allgather_object(mine))

    def save(self, path: str) -> None:
        """Writes the trained network (not the Trainer's internal program) as a ``.keras``
        file on the chief; ``keras.models.load_model(path)`` reads it back anywhere.

        A collective: every worker returns once the file is complete, or raises the
        chief's error.

        Raises:
            ValueError: ``path`` does not end in ``.keras``.
        """
        if not str(path).endswith(".keras"):
            raise ValueError(f"Trainer.save writes a .keras file; got {str(path)!r}. Name it "
                             "'....keras', or use Trainer.export(path) for a SavedModel")
        self._on_chief(lambda: self._servable().save(str(path)), "saving", path)

    def export(self, path: str) -> None:
        """Writes the trained network as a TensorFlow SavedModel for serving (its ``serve``
        endpoint takes a batch of ``x``), on the chief; ``tf.saved_model.load(path)`` reads
        it back without hvdtrain or Keras. A collective, as :meth:`save`."""
        x_spec = self._element_spec[0]
        signature = [tf.TensorSpec((None, *x_spec.shape), x_spec.dtype, name="x")]
        self._on_chief(lambda: self._servable().export(str(path), format="tf_saved_model",
                                                        verbose=False, input_signature=signature),
                       "exporting", path)

    # ------------------------------------------------------------------ internals
    def _my_batches(self, dataset: tf.data.Dataset, batch_size: int | None) -> tf.data.Dataset:
        """This worker's shard of ``dataset``, batched."""
        shards, index = self._backend.evaluation_shard()
        return data.shard_and_batch(dataset, num_shards=shards, index=index,
                                    batch_size=batch_size or self.batch_size, prefetch_size=2)

    def metrics_over(self, dataset: tf.data.Dataset, batch_size: int) -> list:
        """``[(name, value)]``: the program's means, then the metrics (a collective)."""
        program = self._evaluation_program()
        sums, count = self._backend.evaluate(program, dataset, batch_size)
        means = [(k, sums.get(k, 0.0) / count if count else 0.0) for k in sorted(program.output_keys)]
        if not self._eval_metrics:
            return means
        metric_set = self._eval_metrics
        metric_set.reset()
        network = self._network

        @tf.function
        def update(x, y):
            metric_set.update(y, network(x, training=False))

        for x, y in self._my_batches(dataset, batch_size):
            update(x, y)
        return means + list(metric_set.results(self._backend.allgather_object).items())

    def _evaluation_program(self) -> keras.Model:
        if self._validation is None:
            self._validation = (programs.build_validation_program(
                self._build_validation_func, self._element_spec, self._network)
                if self._build_validation_func is not None else self._program)
        return self._validation

    def _servable(self) -> keras.Model:
        """The network as a ``keras.Model`` (a layer is wrapped with an ``Input``)."""
        if isinstance(self._network, keras.Model):
            return self._network
        x_spec = self._element_spec[0]
        x = keras.Input(shape=tuple(x_spec.shape), dtype=x_spec.dtype.name)
        return keras.Model(x, self._network(x), name=self._network.name)

    def _on_chief(self, write, what: str, path) -> None:
        """Runs ``write`` on the chief; every worker then learns whether it worked."""
        error, what = None, f"{what} {path}"
        if self._backend.rank == 0:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(str(path))), exist_ok=True)
                write()
                logger.info("%s: done", what)
            except Exception as err:  # noqa: BLE001 -- every worker must hear of it
                error = f"{type(err).__name__}: {err}"
        errors = self._backend.allgather_object(error)
        if errors[0] is not None:
            raise RuntimeError(f"{what} failed on the chief (rank 0): {errors[0]}")


def _interleave(parts: list):
    """Worker ``r`` holds elements ``r, r + n, r + 2n, ...``: puts them back in order."""
    present = [p for p in parts if p is not None]
    if not present:
        raise ValueError("predict got an empty dataset")
    n = len(parts)

    def merge(*arrays):
        sizes = [len(a) for a in arrays]
        out = np.empty((sum(sizes), *arrays[0].shape[1:]), arrays[0].dtype)
        for r, a in enumerate(arrays):
            out[r::n][:len(a)] = a
        return out

    filled = [p if p is not None else tf.nest.map_structure(lambda a: a[:0], present[0])
              for p in parts]
    return tf.nest.map_structure(merge, *filled)
