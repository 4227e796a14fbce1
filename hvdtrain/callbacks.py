"""Trainer callbacks with Keras's hook names, and the built-in reporting callbacks."""
from __future__ import annotations

import math
import sys
from typing import Iterable


class Callback:
    """Base class: override the hooks you need. ``self.trainer`` is set before training.

    A callback may set ``self.trainer.stop_training = True`` on any rank; the Trainer
    agrees the decision across ranks before acting on it, so every rank stops together.
    """

    trainer = None
    #: Whether this callback may set ``trainer.stop_training``. When no callback can, the
    #: Trainer skips the per-step agreement on stopping (one small collective).
    can_stop = True

    def set_trainer(self, trainer) -> None:
        """Attaches the trainer this callback observes."""
        self.trainer = trainer

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Called once before the first step."""

    def on_train_end(self, logs: dict | None = None) -> None:
        """Called once after the last step."""

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Called at the start of each pass over the data."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Called at the end of each pass over the data."""

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        """Called before each step, with the global step about to run."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Called after each step with its logs (tensors; convert with ``float``). On
        logging steps the logs also hold ``learning_rate`` and ``samples_per_sec``."""

    def on_test_end(self, logs: dict | None = None) -> None:
        """Called after each validation with ``{"val_<name>": mean}``."""


class CallbackList:
    """Dispatches each hook to a list of callbacks in order."""

    def __init__(self, callbacks: Iterable[Callback] | None, trainer) -> None:
        self.callbacks = list(callbacks or [])
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError("callbacks must be hvdtrain.Callback instances, got "
                                f"{type(cb).__name__}")
            cb.set_trainer(trainer)

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    @property
    def can_stop(self) -> bool:
        """True when some callback may request a stop."""
        return any(cb.can_stop for cb in self.callbacks)

    def call(self, hook: str, *args) -> None:
        """Calls ``hook(*args)`` on every callback."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)


class TensorBoard(Callback):
    """Writes scalars for TensorBoard on rank 0: the loss and log tensors, the learning
    rate and samples/s every ``log_step_size`` steps, and the validation metrics.

    Args:
        log_dir: folder for the event files.
    """

    can_stop = False

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writer = None

    def _write(self, step: int, scalars: dict) -> None:
        import tensorflow as tf
        if self.trainer.rank != 0:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, float(value))

    def on_train_batch_end(self, batch, logs=None):
        if logs and "learning_rate" in logs:  # a logging step: the logs are floats
            self._write(batch, logs)

    def on_test_end(self, logs=None):
        if logs:
            self._write(self.trainer.global_step, logs)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class ProgressBar(Callback):
    """A tqdm progress bar over the training steps, on rank 0 only."""

    can_stop = False

    def __init__(self, file=None) -> None:
        self.file = file
        self._bar = None

    def on_train_begin(self, logs=None):
        if self.trainer.rank != 0:
            return
        from tqdm import tqdm
        t = self.trainer
        total = t.max_steps
        if t.steps_per_epoch and t.steps_per_epoch > 0:
            total = min(total, t.steps_per_epoch * t.num_epochs)
        self._bar = tqdm(total=None if math.isinf(total) else int(total), initial=t.global_step,
                         unit="step", file=self.file or sys.stderr, dynamic_ncols=True)

    def on_train_batch_end(self, batch, logs=None):
        if self._bar is None:
            return
        self._bar.update(1)
        if logs and "samples_per_sec" in logs:
            self._bar.set_postfix(loss=f"{logs['loss']:.4f}", rate=f"{logs['samples_per_sec']:.0f}/s")

    def on_train_end(self, logs=None):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
