"""Trainer callbacks with Keras's hook names."""
from __future__ import annotations

from typing import Iterable


class Callback:
    """Base class: override the hooks you need. ``self.trainer`` is set before training.

    A callback may set ``self.trainer.stop_training = True`` on any rank; the Trainer
    agrees the decision across ranks before acting on it, so every rank stops together.
    """

    trainer = None

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
        """Called after each step with its logs (tensors; convert with ``float``)."""


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

    def call(self, hook: str, *args) -> None:
        """Calls ``hook(*args)`` on every callback."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)
