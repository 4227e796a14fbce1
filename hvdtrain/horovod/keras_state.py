"""Elastic state for Horovod-style scripts on Keras 3: ``TensorFlowKerasState`` /
``KerasState`` (a model and its optimizer) and ``TensorFlowState`` (a list of variables).

Horovod 0.28.1's classes call ``optimizer.variables()`` (a property in Keras 3) and
broadcast with ``Variable.ref()`` (which Keras 3 variables lack); these keep their
arguments and meaning. ``commit()`` copies the values to host memory, ``restore()`` puts
them back after a failed collective, ``sync()`` gives every worker rank 0's values, and
extra keyword arguments (``epoch=0, batch=0``) are kept and synced as attributes.
"""
from __future__ import annotations

from typing import Callable

import keras
import numpy as np

from hvdtrain import checks
from hvdtrain.horovod import collectives, elastic_runtime, keras_steps, runtime
from hvdtrain.horovod.horovod_private import ObjectState


class TensorFlowState(elastic_runtime.OneBroadcastHostCheck, ObjectState):
    """Elastic state of a list of variables (Keras 3 or ``tf.Variable``).

    Args:
        variables: the variables to keep in step across workers.
        session: accepted for Horovod's signature (TensorFlow 1 only); must be None.
        kwargs: attributes to keep and sync (e.g. ``epoch=0, batch=0``).
    """

    def __init__(self, variables=None, session=None, **kwargs) -> None:
        if session is not None:
            raise ValueError("TensorFlowState(session=...) is TensorFlow 1's; eager "
                             "TensorFlow 2 needs none")
        if variables is None:
            raise ValueError("TensorFlowState needs its variables: TensorFlow 2 has no "
                             "global variable collection to default to")
        self.variables = list(variables)
        self._values: list[np.ndarray] = []
        self._save_values()
        super().__init__(bcast_object=collectives.broadcast_object, get_rank=runtime.rank,
                         **kwargs)

    def _tracked(self) -> list:
        return self.variables

    def _save_values(self) -> None:
        self._values = [np.array(v.numpy(), copy=True) for v in self._tracked()]

    def save(self) -> None:
        self._save_values()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self._tracked(), self._values):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        collectives.broadcast_variables(self._tracked(), root_rank=0)
        self._save_values()
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """Elastic state of a Keras 3 model and its optimizer (Horovod's
    ``TensorFlowKerasState``; ``KerasState`` in ``hvdtrain.tensorflow.keras.elastic``).

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: ``model.optimizer``); built here if it is not
            yet, so its slots are committed from the start.
        backend: accepted for Horovod's signature (TensorFlow 1's session); ignored.
        kwargs: attributes to keep and sync (e.g. ``epoch=0, batch=0``).

    Raises:
        ValueError: the model has not created its variables yet.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs) -> None:
        del backend
        if not keras_steps.model_built(model):
            raise ValueError("Model must be built first. Run `model.build(input_shape)` (or "
                             "give it a keras.Input) before creating its elastic state.")
        self.model = model
        keras_steps.attach(model)
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        super().__init__(variables=self._tracked(), **kwargs)

    def _tracked(self) -> list:
        opt = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + opt


def run(func: Callable) -> Callable:
    """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` is retried from the last commit
    when a worker fails and restarted when hosts are added or removed. Outside an elastic
    ``horovodrun`` it runs once, after ``state.sync()``."""
    return elastic_runtime.elastic_run(func)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at each epoch's end.

    Args:
        state: the elastic state (``KerasState``).
        batches_per_commit: batches between commits (a failure loses at most this many).
    """

    def __init__(self, state, batches_per_commit: int = 1) -> None:
        super().__init__()
        checks.positive_int(batches_per_commit, "batches_per_commit")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the last finished batch of the epoch (0 after an epoch),
    so a restarted ``fit`` knows where the epoch stood."""

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of finished epochs over restarts (``fit``
    counts from 0 each time it is called)."""

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
