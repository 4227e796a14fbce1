"""hvdtrain's log lines, through Python's logging: the ``hvdtrain`` logger at INFO on the
chief and WARNING elsewhere (``HVDTRAIN_LOG_LEVEL`` changes it), shown on stderr as
``[hvdtrain] ...`` until the user configures logging (before or after), then only by the
user's handlers."""
from __future__ import annotations

import logging
import os
import sys
import time

logger = logging.getLogger("hvdtrain")

ENV_LEVEL = "HVDTRAIN_LOG_LEVEL"
_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SHOWN = "hvdtrain_shown"  # set on a record the fallback wrote to stderr


def level_from_env() -> int | None:
    """The level in ``HVDTRAIN_LOG_LEVEL`` (a name or a number), or None when unset.

    Raises:
        ValueError: the value is neither a level name nor a number >= 0.
    """
    text = os.environ.get(ENV_LEVEL, "").strip()
    if not text:
        return None
    if text.upper() in _NAMES:
        return logging.getLevelName(text.upper())
    if text.isdigit():
        return int(text)
    raise ValueError(f"{ENV_LEVEL}={text!r} is not a log level: use one of "
                     f"{', '.join(_NAMES)} or a number >= 0")


def _is_implicit(handler: logging.Handler, owner: logging.Logger) -> bool:
    """A handler that a bare ``logging.basicConfig()`` made on the root logger: the one
    absl's logging adds when TensorFlow logs before anyone configured logging."""
    return (owner is logging.root and logging.root.level == logging.WARNING
            and type(handler) is logging.StreamHandler and handler.stream is sys.stderr
            and getattr(handler.formatter, "_fmt", None) == logging.BASIC_FORMAT)


def _drop_shown(record: logging.LogRecord) -> bool:
    """Filter for implicit handlers: records the fallback showed are not shown again."""
    return not getattr(record, _SHOWN, False)


class _Fallback(logging.Handler):
    """Writes hvdtrain's records to stderr while no other handler would get them."""

    @property
    def stream(self):
        return sys.stderr  # looked up each time: tests and tools replace sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        implicit = []
        source = logging.getLogger(record.name)
        while source is not None:
            for handler in source.handlers:
                if handler is self:
                    continue
                if not _is_implicit(handler, source):
                    return  # the user's configuration shows it
                implicit.append(handler)
            source = source.parent if source.propagate else None
        for handler in implicit:
            handler.addFilter(_drop_shown)  # once each: addFilter skips one already there
        setattr(record, _SHOWN, True)
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging's own policy for failing handlers
            self.handleError(record)


_fallback = _Fallback()
_state = {"level": None,  # the level setup_logging last set (any other one is the user's)
          "job": ""}  # which part of the launched job this is (set_job_label)


def set_job_label(label: str) -> None:
    """Names this process's job in the ``[hvdtrain ...]`` prefix, e.g. ``"world ranks 1, 3
    of 4"`` for a Trainer on a sub-communicator: every sub-job has its own rank 0 logging.

    Args:
        label: the name, or ``""`` for none.
    """
    _state["job"] = label
    _fallback.setFormatter(logging.Formatter(_prefix(_state.get("rank", 0)) + " %(message)s"))


def _prefix(rank: int) -> str:
    parts = ([] if rank == 0 else [f"rank {rank}"]) + ([_state["job"]] if _state["job"] else [])
    return "[" + ", ".join(["hvdtrain " + parts[0]] + parts[1:]) + "]" if parts else "[hvdtrain]"


def setup_logging(rank: int) -> None:
    """Sets the ``hvdtrain`` logger's level for ``rank`` and adds the stderr fallback once.

    Rank 0 logs at ``HVDTRAIN_LOG_LEVEL`` (default INFO), the other ranks at WARNING or the
    higher level given. A level the user set on the logger is kept. Called again (another
    rank after an elastic change), it updates the level and the ``[hvdtrain rank N]`` prefix.

    Raises:
        ValueError: ``HVDTRAIN_LOG_LEVEL`` is not a level.
    """
    env = level_from_env()
    if rank == 0:
        level = logging.INFO if env is None else env
    else:
        level = max(logging.WARNING, logging.NOTSET if env is None else env)
    if logger.level in (logging.NOTSET, _state["level"]):
        logger.setLevel(level)
        _state["level"] = level
    _state["rank"] = rank
    _fallback.setFormatter(logging.Formatter(_prefix(rank) + " %(message)s"))
    if _fallback not in logger.handlers:
        logger.addHandler(_fallback)


def format_logs(values: dict) -> str:
    """``name=value`` pairs with four decimals, in the order given."""
    return " ".join(f"{k}={float(v):.4f}" for k, v in values.items())


class StepReporter:
    """The chief's step and validation lines, and the samples/s between logging steps.

    The clock starts after the first (compiling) step and skips validation time.

    Args:
        rank: this worker (only rank 0 writes lines).
        samples_per_step: examples one global step trains on over every worker.
    """

    def __init__(self, rank: int, samples_per_step: int) -> None:
        self.rank, self.samples_per_step = rank, samples_per_step
        self._t0, self._step0, self._timed = None, 0, False

    def restart_clock(self, step: int) -> None:
        """Times from now and ``step`` (training begins, or an evaluation ended)."""
        self._t0, self._step0 = time.perf_counter(), step

    def after_step(self, step: int) -> None:
        """Starts the clock after the first step this run (it compiles)."""
        if not self._timed:
            self._timed = True
            self.restart_clock(step)

    def log_step(self, step: int, logs: dict, learning_rate: float) -> dict:
        """Logs a step on the chief; returns its logs as floats plus ``learning_rate`` and,
        once a step after the compiling one was timed, ``samples_per_sec``."""
        now = time.perf_counter()
        floats = {k: float(v) for k, v in logs.items()}
        record = dict(floats, learning_rate=learning_rate)
        rate_text = ""
        if step > self._step0 and now > self._t0:
            record["samples_per_sec"] = (step - self._step0) * self.samples_per_step / (now - self._t0)
            rate_text = f" ({record['samples_per_sec']:.0f} samples/s)"
        self._t0, self._step0 = now, step
        if self.rank == 0:
            logger.info("step %d: %s%s", step, format_logs(floats), rate_text)
        return record

    def log_validation(self, step: int, metrics: list) -> None:
        """Logs ``[(name, mean)]`` on the chief and keeps the evaluation out of samples/s."""
        if self.rank == 0:
            logger.info("step %d validation: %s", step, format_logs(dict(metrics)))
        self.restart_clock(step)
