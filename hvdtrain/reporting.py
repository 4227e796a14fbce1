"""hvdtrain's log lines: ``[hvdtrain] ...`` at INFO on the chief, warnings only elsewhere."""
from __future__ import annotations

import logging
import time

logger = logging.getLogger("hvdtrain")


def setup_logging(rank: int) -> None:
    """INFO logging on rank 0 (the chief), warnings only on the other ranks. A handler is
    added only when neither hvdtrain's logger nor the root logger has one."""
    if rank != 0:
        logger.setLevel(logging.WARNING)
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hvdtrain] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


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
