"""Checkpoints written by rank 0 only and restored on rank 0, then broadcast.

Every rank calls :meth:`Checkpointer.save`; the rank-0 gating lives here. TensorFlow's
``CheckpointManager`` writes the data files first and the ``checkpoint`` index last, so a
crash mid-write leaves the previous checkpoint as the latest.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time

import tensorflow as tf

from hvdtrain import dist

logger = logging.getLogger("hvdtrain")


def check_writable(directory: str) -> str | None:
    """Returns why ``directory`` cannot hold checkpoints, or ``None`` when it can."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".hvdtrain-write-test"):
            pass
    except OSError as err:
        return f"checkpoint_dir {directory!r} is not a writable directory: {err}"
    return None


class Checkpointer:
    """Saves and restores named trackable objects under ``directory`` (rank 0 only).

    Args:
        directory: where checkpoints go; ``None`` turns checkpointing off.
        objects: trackables by name, e.g. ``model=``, ``optimizer=``, ``step=``.
        keep_max: how many checkpoints to keep.
        every_steps: save when the step is a multiple of this (``None``: never by steps).
        every_secs: save when this many seconds passed since the last save.
    """

    def __init__(self, directory: str | None, *, keep_max: int = 5, every_steps: int | None = None,
                 every_secs: float | None = 600, **objects) -> None:
        self.directory = directory
        self.every_steps = every_steps
        self.every_secs = every_secs
        self._last_time = time.monotonic()
        self._last_step = None
        self._manager = None
        if directory is None:
            return
        problem = check_writable(directory) if dist.is_root() else None
        problem = dist.broadcast_object(problem)
        if problem:
            raise ValueError(problem)
        if dist.is_root():
            ckpt = tf.train.Checkpoint(**objects)
            self._manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=keep_max)

    @property
    def latest(self) -> str | None:
        """Path prefix of the newest checkpoint (rank 0), else ``None``."""
        return self._manager.latest_checkpoint if self._manager else None

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint on rank 0; returns its path on every rank.

        Raises:
            ValueError: the checkpoint does not fit the model (on every rank).
        """
        if self.directory is None:
            return None
        path, problem = None, None
        if self._manager is not None and self._manager.latest_checkpoint:
            path = self._manager.latest_checkpoint
            try:
                self._manager.checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as err:
                problem = (f"checkpoint {path!r} does not match this model and optimizer: "
                           f"{str(err).splitlines()[0]}")
        path, problem = dist.broadcast_object((path, problem))
        if problem:
            raise ValueError(problem)
        return path

    def maybe_save(self, step: int) -> str | None:
        """Saves when a step or time trigger fires; call it on every rank after a step."""
        if self._manager is None:
            return None
        due = bool(self.every_steps) and step % self.every_steps == 0
        due = due or (self.every_secs is not None
                      and time.monotonic() - self._last_time >= self.every_secs)
        return self.save(step) if due else None

    def save(self, step: int) -> str | None:
        """Writes a checkpoint for ``step`` on rank 0; a no-op elsewhere or if already saved."""
        if self._manager is None or step == self._last_step:
            return None
        path = self._manager.save(checkpoint_number=step)
        self._last_time = time.monotonic()
        self._last_step = step
        logger.info("saved checkpoint %s", path)
        return path
