"""A quiet TensorFlow start-up in every Python of an environment where hvdtrain is installed.

``hvdtrain-startup.pth`` (which setup.py puts into hvdtrain's wheel, editable or not)
calls :func:`install` when Python starts: in the launcher's own Python (``horovodrun``) and in
every rank (``mpirun``, ``srun``), before any script imports TensorFlow. It imports nothing
heavy and not the ``hvdtrain`` package; importing it does nothing more.

TensorFlow 2.21 writes its first log lines before it reads ``TF_CPP_MIN_LOG_LEVEL``: the
static initialisers of ``libtensorflow_framework.so.2`` and of the profiler plugin (which
carries its own copy of absl) print absl's ``WARNING: All log messages before
absl::InitializeLog() ...`` and INFO lines (``port.cc`` oneDNN, ``cudart_stub.cc``) while
Python loads them, so no environment variable silences them. Here:

* ``TF_CPP_MIN_LOG_LEVEL`` defaults to ``1`` (``setdefault``: a value the user set wins):
  TensorFlow's INFO lines are hidden, its warnings and errors show.
* During ``import tensorflow`` the process's stderr goes through a filter that applies that
  level to the lines TensorFlow writes before reading it, and drops absl's notice about
  them. Every other line passes through as it is written.
* On a machine without an NVIDIA GPU (no ``/dev/nvidia<N>``), the filter also covers
  TensorFlow's device discovery, run right after the import (it leaves TensorFlow's context
  unstarted), and drops the ``failed call to cuInit`` error it logs there.

``TF_CPP_MAX_VLOG_LEVEL`` or ``TF_CPP_VMODULE`` (verbose logs asked for) leave the import
unfiltered. ``HVDTRAIN_TF_LOGS=1`` turns all of this off and sets ``TF_CPP_MIN_LOG_LEVEL=0``
(``setdefault``), TensorFlow's own default, which a script's ``setdefault`` of a higher level
then leaves alone.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

SWITCH = "HVDTRAIN_TF_LOGS"
LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "1"  # hide INFO; warnings and errors show
_SEVERITIES = "IWEF"  # glog's letters; TF_CPP_MIN_LOG_LEVEL=N hides the first N


def logs_wanted() -> bool:
    """Whether ``HVDTRAIN_TF_LOGS`` asks for TensorFlow's own start-up logging."""
    return os.environ.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def min_level() -> int:
    """The ``TF_CPP_MIN_LOG_LEVEL`` in force, as TensorFlow reads it (0 when not a number)."""
    text = os.environ.get(LEVEL_VARIABLE, "0").strip()
    return int(text) if text.isdigit() else 0


def nvidia_gpu_files(dev: str = "/dev") -> list[str]:
    """The NVIDIA GPU device files of this machine (``/dev/nvidia0``, ...; WSL2's
    ``/dev/dxg`` where its NVIDIA driver library is present), sorted."""
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    found = [os.path.join(dev, n) for n in names if n.startswith("nvidia") and n[6:].isdigit()]
    if "dxg" in names and os.path.exists("/usr/lib/wsl/lib/libcuda.so.1"):
        found.append(os.path.join(dev, "dxg"))
    return sorted(found)


def make_filter(level: int, gpus_present: bool) -> Callable[[bytes], bool]:
    """The test of one stderr line (bytes, no newline): True drops it.

    Args:
        level: the ``TF_CPP_MIN_LOG_LEVEL`` to apply (severities below it are dropped).
        gpus_present: the machine has NVIDIA GPUs (then a failed ``cuInit`` is kept).
    """
    import re

    glog = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
    absl_notice = b"WARNING: All log messages before absl::InitializeLog() is called"
    hidden = _SEVERITIES[:min(level, 3)].encode()

    def drop(line: bytes) -> bool:
        if level < 1:
            return False
        if line.startswith(absl_notice):
            return True
        match = glog.match(line)
        if not match:
            return False
        if match.group(1) in hidden:
            return True
        return not gpus_present and b"failed call to cuInit" in line

    return drop


class FilteredStderr:
    """Within ``with``, file descriptor 2 goes through a pipe; a thread writes each line on
    to the real stderr unless ``drop(line)`` says so. A context manager."""

    def __init__(self, drop: Callable[[bytes], bool]) -> None:
        self._drop = drop
        self._saved = None
        self._thread = None

    def __enter__(self) -> "FilteredStderr":
        import threading

        _flush_stderr()
        try:
            self._saved = os.dup(2)
            out = os.dup(self._saved)
            read, write = os.pipe()
        except OSError:  # no usable stderr: nothing to filter
            self._saved = None
            return self
        _widen(write)
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read, out),
                                        name="hvdtrain-stderr-filter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        _flush_stderr()
        os.dup2(self._saved, 2)  # closes the pipe's last writer (a child may hold another)
        os.close(self._saved)
        self._thread.join(timeout=2.0)

    def _pump(self, read: int, out: int) -> None:
        """Reads the pipe to its end (a stderr that fails to take lines only loses them)."""
        pending = b""
        try:
            while True:
                chunk = os.read(read, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                _write_all(out, b"".join(ln + b"\n" for ln in lines if not self._drop(ln)))
            if not self._drop(pending):
                _write_all(out, pending)
        finally:
            os.close(read)
            os.close(out)


def _widen(fd: int) -> None:
    """Gives the pipe 1 MiB (Linux), so that native code writing while it holds the GIL (a
    library's static initialisers) does not wait for the thread that empties the pipe."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _TensorFlowImport:
    """A ``sys.meta_path`` finder that only wraps the import of ``tensorflow``: the module
    is found and loaded by the other finders, its execution runs in a
    :class:`FilteredStderr` (once: then the finder leaves ``sys.meta_path``)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "tensorflow":
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _TensorFlowImport):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module) -> None:
            del loader.exec_module  # the loader's own method again
            _remove_finder()
            gpus = bool(nvidia_gpu_files())
            with FilteredStderr(make_filter(min_level(), gpus)):
                run(module)
                if not gpus:
                    _discover_devices(module)

        loader.exec_module = exec_module
        return spec


def _discover_devices(tf) -> None:
    """Lists the physical devices (TensorFlow's context stays unstarted)."""
    try:
        tf.config.list_physical_devices()
    except Exception:  # noqa: BLE001 - the user's first TensorFlow call reports it again
        pass


def _verbose_logging_asked() -> bool:
    """Whether the user asked TensorFlow for verbose logs (then nothing is filtered)."""
    vlog = os.environ.get("TF_CPP_MAX_VLOG_LEVEL", "").strip()
    return (vlog.isdigit() and int(vlog) > 0) or bool(os.environ.get("TF_CPP_VMODULE", "").strip())


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TensorFlowImport)]


def install() -> None:
    """Sets TensorFlow's log level and, unless TensorFlow is imported already, the filter
    of its import (see the module's docstring). Idempotent."""
    if logs_wanted():
        os.environ.setdefault(LEVEL_VARIABLE, "0")
        return
    os.environ.setdefault(LEVEL_VARIABLE, DEFAULT_LEVEL)
    if "tensorflow" in sys.modules or min_level() < 1 or _verbose_logging_asked():
        return
    if not any(isinstance(f, _TensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _TensorFlowImport())

