"""Trainer callbacks with Keras's hook names, the built-in reporting callbacks, and the
adapter that runs ``keras.callbacks.Callback`` objects in the Trainer."""
from __future__ import annotations

import logging
import math
import sys
from typing import Callable, Iterable

import keras

from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")


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
    """Dispatches each hook to a list of callbacks in order.

    Args:
        callbacks: :class:`Callback` instances (see :func:`adopt` for Keras's).
        trainer: the Trainer they observe.
        after_epoch_begin: called after every ``on_epoch_begin`` (the Trainer agrees
            the learning rate there).
    """

    def __init__(self, callbacks: Iterable[Callback] | None, trainer,
                 after_epoch_begin: Callable[[], None] | None = None) -> None:
        self.callbacks = list(callbacks or [])
        self._after_epoch_begin = after_epoch_begin
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError("callbacks must be hvdtrain.Callback or keras.callbacks.Callback "
                                f"instances, got {type(cb).__name__}")
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
        if hook == "on_epoch_begin" and self._after_epoch_begin is not None:
            self._after_epoch_begin()


def adopt(callbacks: Iterable | None) -> tuple[list, keras.callbacks.BackupAndRestore | None]:
    """The Trainer's callbacks, with each ``keras.callbacks.Callback`` in a
    :class:`KerasCallback`; a ``BackupAndRestore`` is taken out and returned apart (it
    becomes the Trainer's own checkpointing, which resumes exactly)."""
    adopted, backup = [], None
    for cb in callbacks or []:
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            if backup is not None:
                raise ValueError("give at most one keras.callbacks.BackupAndRestore")
            backup = cb
        elif isinstance(cb, keras.callbacks.Callback):
            adopted.append(KerasCallback(cb))
        else:
            adopted.append(cb)
    return adopted, backup


def backup_settings(backup: keras.callbacks.BackupAndRestore | None, checkpoint_dir: str | None,
                    save_checkpoint_steps: int | None) -> tuple[str | None, int | None, bool]:
    """``(checkpoint_dir, save_checkpoint_steps, save_each_epoch)`` with a Keras
    ``BackupAndRestore`` turned into the Trainer's checkpoints in its ``backup_dir``.

    Raises:
        ValueError: ``checkpoint_dir`` names another folder.
    """
    if backup is None:
        return checkpoint_dir, save_checkpoint_steps, False
    if checkpoint_dir is not None and checkpoint_dir != backup.backup_dir:
        raise ValueError(f"BackupAndRestore(backup_dir={backup.backup_dir!r}) and "
                         f"checkpoint_dir={checkpoint_dir!r} disagree: give one folder")
    if getattr(backup, "delete_checkpoint", False):
        logger.info("BackupAndRestore: the checkpoints in %s are kept after training (they are "
                    "the Trainer's own); delete the folder to start over", backup.backup_dir)
    save_freq = getattr(backup, "save_freq", "epoch")
    if isinstance(save_freq, int) and save_freq > 0:
        return backup.backup_dir, save_freq, False
    return backup.backup_dir, save_checkpoint_steps, save_freq == "epoch"


# Keras callbacks that never set ``model.stop_training`` (no agreement on stops needed)
_NEVER_STOP = (keras.callbacks.CSVLogger, keras.callbacks.ModelCheckpoint,
               keras.callbacks.TensorBoard, keras.callbacks.ProgbarLogger,
               keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau,
               keras.callbacks.History, keras.callbacks.RemoteMonitor)
# Keras callbacks that write files or print: they run on the chief (rank 0) only
_CHIEF_ONLY = (keras.callbacks.CSVLogger, keras.callbacks.ModelCheckpoint,
               keras.callbacks.TensorBoard, keras.callbacks.ProgbarLogger,
               keras.callbacks.RemoteMonitor)


class KerasCallback(Callback):
    """Runs a ``keras.callbacks.Callback`` in the Trainer, as ``fit`` would.

    Its ``model`` is ``trainer.training_network``, with the Trainer's optimizer as
    ``model.optimizer`` while training; ``batch`` counts steps within the epoch. Its
    decisions are agreed: ``model.stop_training = True`` on any rank stops every rank
    after the same step, and the learning rate it sets on rank 0 is every rank's from
    the next epoch on (the Trainer agrees it at each epoch's start). Callbacks that write
    files (ModelCheckpoint, CSVLogger, TensorBoard) run on rank 0 only.

    Args:
        callback: the Keras callback.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        self.callback = callback
        self.can_stop = not isinstance(callback, _NEVER_STOP)
        self.chief_only = isinstance(callback, _CHIEF_ONLY)
        self._had_optimizer = None

    def set_trainer(self, trainer) -> None:
        super().set_trainer(trainer)
        if self.chief_only and trainer.rank != 0:
            return  # never touched here (Keras's TensorBoard opens its files in set_model)
        self.callback.set_model(trainer.training_network)
        self._resolve_auto_mode(trainer.metric_objects)
        spe = trainer.steps_per_epoch
        self.callback.set_params({"epochs": trainer.num_epochs, "verbose": 0,
                                  "steps": spe if spe and spe > 0 else None})

    def _resolve_auto_mode(self, metrics: list) -> None:
        """``mode="auto"`` on a monitoring callback: Keras looks for the monitored metric
        in a compiled model's metrics, which the network has not; the Trainer's do."""
        cb = self.callback
        if getattr(cb, "mode", None) != "auto" or getattr(cb, "monitor_op", 0) is not None:
            return
        name = str(getattr(cb, "monitor", "")).removeprefix("val_")
        for m in metrics:
            direction = keras_private.metric_direction(m)
            if m.name == name and direction in ("up", "down"):
                cb.mode = "max" if direction == "up" else "min"

    def _call(self, hook: str, *args) -> None:
        if self.chief_only and self.trainer.rank != 0:
            return
        getattr(self.callback, hook)(*args)
        network = self.trainer.training_network
        if getattr(network, "stop_training", False):
            self.trainer.stop_training = True
            network.stop_training = False

    def on_train_begin(self, logs=None):
        network = self.trainer.training_network
        self._had_optimizer = network.__dict__.get("optimizer")
        keras_private.set_untracked(network, "optimizer", self.trainer.optimizer)
        network.stop_training = False
        self._call("on_train_begin", logs)

    def on_train_end(self, logs=None):
        self._call("on_train_end", logs)
        keras_private.set_untracked(self.trainer.training_network, "optimizer", self._had_optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._call("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._call("on_train_batch_begin", self.trainer.epoch_step, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._call("on_train_batch_end", max(self.trainer.epoch_step - 1, 0), logs)


class TensorBoard(Callback):
    """Writes scalars for TensorBoard on rank 0: the loss and log tensors, the learning
    rate and samples/s every ``log_step_size`` steps, each epoch's logs (``epoch_loss``,
    ...), and the validation metrics.

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

    def on_epoch_end(self, epoch, logs=None):
        if logs:  # the epoch's means, as Keras's TensorBoard names them
            self._write(self.trainer.global_step, {f"epoch_{k}": v for k, v in logs.items()})

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
