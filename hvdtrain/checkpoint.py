"""Checkpoints written atomically by rank 0, verified on restore, restored then broadcast.

Layout of a checkpoint directory::

    ckpt-00000120/          one committed checkpoint (step 120)
        state.index, state.data-00000-of-00001
        manifest.json       step, world size, and the size and SHA-256 of every file
    latest                  name of the newest committed checkpoint (written last)
    .tmp-ckpt-...           a checkpoint being written (never read; cleared on start)

A checkpoint is written into a temporary folder, its manifest last, and only then renamed
to ``ckpt-<step>``: a crash at any moment leaves either the old set or the new one. On
restore, every file is checked against the manifest; a torn or corrupt checkpoint is
reported and the previous good one is used. Every rank calls :meth:`Checkpointer.save`;
the rank-0 gating lives here.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Callable

import tensorflow as tf

from hvdtrain.options import CheckpointOptions


logger = logging.getLogger("hvdtrain")

PREFIX = "ckpt-"
MANIFEST = "manifest.json"
LATEST = "latest"
#: under an agreed cadence, how often (in steps) the ranks agree whether ``every_secs``
#: passed: a collective every step would cost more than it saves
SECS_CHECK_STEPS = 10


def check_writable(directory: str) -> str | None:
    """Returns why ``directory`` cannot hold checkpoints, or ``None`` when it can."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".hvdtrain-write-test"):
            pass
    except OSError as err:
        return f"checkpoint_dir {directory!r} is not a writable directory: {err}"
    return None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def verify(folder: str) -> dict:
    """Checks a checkpoint folder against its manifest and returns the manifest.

    Raises:
        ValueError: the manifest is missing or unreadable, or a file is missing, has the
            wrong size, or the wrong SHA-256 (a torn or corrupted checkpoint).
    """
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"no readable manifest ({err})") from None
    for name, meta in files.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ValueError(f"{name} is missing")
        if os.path.getsize(path) != meta["size"]:
            raise ValueError(f"{name} has {os.path.getsize(path)} bytes, the manifest says "
                             f"{meta['size']} (truncated?)")
        if _sha256(path) != meta["sha256"]:
            raise ValueError(f"{name} does not match its SHA-256 in the manifest (corrupted)")
    return manifest


def committed(directory: str) -> list[tuple[int, str]]:
    """``(step, folder)`` of every committed checkpoint in ``directory``, newest first."""
    out = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
            out.append((int(name[len(PREFIX):]), os.path.join(directory, name)))
    return sorted(out, reverse=True)


class SaveCadence:
    """When a checkpoint is due: the one rule of every backend's checkpoints.

    Args:
        every_steps: a save when the step reaches a multiple of this (``None``: never by
            steps).
        every_secs: a save once this many seconds passed since the last (``None``: never
            by time).
    """

    def __init__(self, every_steps: int | None, every_secs: float | None) -> None:
        self.every_steps, self.every_secs = every_steps, every_secs
        self._last = time.monotonic()

    def step_due(self, step: int, taken: int = 1) -> bool:
        """True when one of the ``taken`` steps that ended at ``step`` is a multiple of
        ``every_steps`` (``steps_per_execution`` runs several per call)."""
        n = self.every_steps
        return bool(n) and step // n > (step - taken) // n

    def time_due(self) -> bool:
        """True once ``every_secs`` passed since the last save (or the start)."""
        return self.every_secs is not None and time.monotonic() - self._last >= self.every_secs

    def due(self, step: int, taken: int = 1) -> bool:
        """Either trigger fired (on this rank: for a saver that decides alone)."""
        return self.step_due(step, taken) or self.time_due()

    def agreed_due(self, step: int, agree_any: Callable[[bool], bool], taken: int = 1) -> bool:
        """Either trigger fired, the same on every rank: the step trigger is the same
        everywhere, and the time trigger is agreed (``agree_any``, a collective) when a
        step crosses a multiple of :data:`SECS_CHECK_STEPS`. For savers in which every
        rank takes part in a save."""
        if self.step_due(step, taken):
            return True
        if self.every_secs is None or step // SECS_CHECK_STEPS <= (step - taken) // SECS_CHECK_STEPS:
            return False
        return agree_any(self.time_due())

    def saved(self) -> None:
        """Restarts the clock (call after each save)."""
        self._last = time.monotonic()


class Checkpointer:
    """Saves and restores named trackable objects under ``directory`` (rank 0 only).

    Args:
        directory: where checkpoints go; ``None`` turns checkpointing off.
        keep_max: how many checkpoints to keep.
        every_steps: save when the step is a multiple of this (``None``: never by steps).
        every_secs: save when this many seconds passed since the last save.
        collectives: ``is_root()``, ``broadcast_object(obj)`` and ``agree_any(flag)`` over
            the ranks (e.g. :mod:`hvdtrain.horovod.collectives`).
        state: state kept outside ``objects`` whose save takes every rank (a gradient
            exchange strategy's: ``saves_state``, ``save_objects()``,
            ``restore_objects()``, ``optional_state``, ``after_restore(restored)``; see
            :class:`hvdtrain.horovod.exchange_strategies.Strategy`); then the save
            decision is agreed and every rank calls it. ``None``: rank 0 decides alone.
        **objects: trackables by name, e.g. ``model=``, ``optimizer=``, ``step=``.
    """

    def __init__(self, directory: str | None, *, collectives,
                 keep_max: int = CheckpointOptions.keep_max,
                 every_steps: int | None = CheckpointOptions.every_steps,
                 every_secs: float | None = CheckpointOptions.every_secs, state=None,
                 **objects) -> None:
        self._collectives = collectives
        self._state = state if state is not None and state.saves_state else None
        self.directory = directory
        self.keep_max = keep_max
        self.cadence = SaveCadence(every_steps, every_secs)
        self.restored_manifest: dict | None = None
        self._last_step = None
        self._objects = objects
        self._ckpt = None
        self.check_directory()
        self.rebind()

    def check_directory(self) -> None:
        """Rank 0 checks that it can write ``directory``; every rank learns the verdict (a
        start-up collective, see :mod:`hvdtrain.trainer.startup`: the constructor runs it).

        Raises:
            ValueError: on every rank, naming the directory and why.
        """
        if self.directory is None:
            return
        problem = check_writable(self.directory) if self._collectives.is_root() else None
        problem = self._collectives.broadcast_object(problem)
        if problem:
            raise ValueError(problem)

    def rebind(self) -> None:
        """Makes the current rank 0 the writer (after an elastic restart changed ranks)."""
        if self.directory is None:
            return
        if not self._collectives.is_root():
            self._ckpt = None
            return
        if self._ckpt is None:
            self._ckpt = tf.train.Checkpoint(**self._objects)
            for name in os.listdir(self.directory):  # leftovers of an interrupted save
                if name.startswith(".tmp-" + PREFIX):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    @property
    def latest(self) -> str | None:
        """Folder of the newest committed checkpoint (rank 0), else ``None``."""
        found = committed(self.directory) if self._ckpt is not None else []
        return found[0][1] if found else None

    def restore_latest(self, *, replay: bool = False) -> str | None:
        """Restores the newest good checkpoint on rank 0; returns its folder on every rank.

        Torn or corrupt checkpoints are reported and skipped for the previous one.

        Args:
            replay: on a worker that kept training, while a joining one starts: the same
                collectives, nothing read (the state is in memory; see
                :mod:`hvdtrain.trainer.startup`).

        Raises:
            ValueError: a verified checkpoint does not fit the model (on every rank).
        """
        if self.directory is None:
            return None
        path, problem, manifest = None, None, None
        if self._ckpt is not None and not replay:
            for step, folder in committed(self.directory):
                try:
                    manifest = verify(folder)
                except ValueError as err:
                    logger.warning("checkpoint %s is torn or corrupt (%s): using the previous "
                                   "one", folder, err)
                    continue
                try:
                    self._read(os.path.join(folder, "state"))
                except (AssertionError, ValueError, tf.errors.OpError) as err:
                    problem = (f"checkpoint {folder!r} does not match this model and optimizer: "
                               f"{str(err).splitlines()[0]}")
                path = folder
                break
        path, problem, manifest = self._collectives.broadcast_object((path, problem, manifest))
        if problem:
            raise ValueError(problem)
        if self._state is not None:
            self._state.after_restore(path is not None)
        if not replay:
            self.restored_manifest = manifest
        return path

    def _read(self, prefix: str) -> None:
        """Reads the checkpoint at ``prefix`` into the objects (rank 0); each must be in
        it, except the state's optional ones, which are reported when missing."""
        extra = self._state.restore_objects() if self._state is not None else {}
        optional = self._state.optional_state if self._state is not None else frozenset()
        required = {**self._objects, **{k: v for k, v in extra.items() if k not in optional}}
        ckpt = tf.train.Checkpoint(**required) if extra else self._ckpt
        ckpt.read(prefix).assert_existing_objects_matched()
        for name in sorted(set(extra) & optional):
            try:
                tf.train.Checkpoint(**{name: extra[name]}).read(prefix) \
                    .assert_existing_objects_matched()
            except AssertionError:
                logger.warning("checkpoint %s holds no %s state: it starts afresh", prefix, name)

    def maybe_save(self, step: int, meta: Callable[[], dict] | None = None,
                   taken: int = 1) -> str | None:
        """Saves when a step or time trigger fires; call it on every rank after a step.

        Args:
            step: the global step just taken.
            meta: returns the manifest's facts (see :meth:`save`); called only when a
                save is due, so a step that saves nothing reads nothing from the device.
            taken: steps taken since the last call (``steps_per_execution``): a step
                trigger inside them fires now.
        """
        if self._state is not None:  # every rank takes part in the save: agree on it
            if self.directory is None or not self.cadence.agreed_due(
                    step, self._collectives.agree_any, taken):
                return None
        elif self._ckpt is None or not self.cadence.due(step, taken):
            return None
        return self.save(step, **(meta() if meta else {}))

    def save(self, step: int, **meta) -> str | None:
        """Writes the checkpoint of ``step`` on rank 0 (no-op elsewhere or if it exists).

        Args:
            step: the global step (names the folder).
            **meta: JSON-able facts kept in the manifest (world size, epoch, ...).
        """
        if self.directory is None or step == self._last_step:
            return None
        extra = self._state.save_objects() if self._state is not None else {}  # every rank
        if self._ckpt is None:
            self._last_step = step
            return None
        final = os.path.join(self.directory, f"{PREFIX}{step:08d}")
        if os.path.isdir(final):
            try:
                verify(final)
                self._last_step = step
                return final  # this exact state is already saved (e.g. right after resume)
            except ValueError:
                shutil.rmtree(final)  # a corrupt copy: replace it
        tmp = tempfile.mkdtemp(prefix=f".tmp-{PREFIX}{step:08d}-", dir=self.directory)
        try:
            ckpt = tf.train.Checkpoint(**{**self._objects, **extra}) if extra else self._ckpt
            ckpt.write(os.path.join(tmp, "state"))
            files = {name: {"size": os.path.getsize(os.path.join(tmp, name)),
                            "sha256": _sha256(os.path.join(tmp, name))}
                     for name in sorted(os.listdir(tmp))}
            manifest = {"step": step, "time": time.time(), "files": files, **meta}
            _write_atomically(os.path.join(tmp, MANIFEST), json.dumps(manifest, indent=1))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _write_atomically(os.path.join(self.directory, LATEST), os.path.basename(final) + "\n")
        for _, old in committed(self.directory)[self.keep_max:]:
            shutil.rmtree(old, ignore_errors=True)
        self.cadence.saved()
        self._last_step = step
        logger.info("saved checkpoint %s", final)
        return final

    def close(self) -> None:
        """Nothing to release: every save is complete when :meth:`save` returns."""
