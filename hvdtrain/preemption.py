"""Preemption: a scheduler's signal to any rank stops every rank at the same step, rank 0
saves a checkpoint, and the job exits with :data:`PREEMPTED_EXIT_CODE`.

Slurm (``scancel``, preemption, ``--signal=USR1@60``), Kubernetes (pod deletion) and the
clouds' spot reclaims all send SIGTERM or SIGUSR1 some seconds before they kill. The
Trainer catches both while it trains; the request rides in the next step's collective (no
extra one on Horovod), so every rank sees it after the same step. The next start resumes
from the checkpoint exactly where the preempted run stopped.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Callable

logger = logging.getLogger("hvdtrain")

#: The exit status of a preempted job: ``EX_TEMPFAIL`` ("try again later"). Requeue the
#: job (e.g. ``scontrol requeue`` in a Slurm epilog, a Kubernetes ``restartPolicy``) on it.
PREEMPTED_EXIT_CODE = 75
#: The signals that request a preemption stop.
SIGNALS = ("SIGTERM", "SIGUSR1")


class Preempted(SystemExit):
    """Raised by ``train_on_batch`` on every rank after a preemption signal, once every
    rank stopped after the same step and rank 0 saved its checkpoint. Uncaught, it ends
    the process with :data:`PREEMPTED_EXIT_CODE` (it is a ``SystemExit``).

    Attributes:
        step: the last step trained (the checkpoint's step).
        signals: ``{rank: signal name}`` of the ranks that received one.
        checkpoint_dir: where rank 0 saved that step (``None``: nothing was saved).
    """

    def __init__(self, step: int, signals: dict, checkpoint_dir: str | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step, self.signals, self.checkpoint_dir = step, signals, checkpoint_dir

    def __str__(self) -> str:
        received = ", ".join(f"{name} on rank {r}" for r, name in sorted(self.signals.items()))
        saved = (f"rank 0 saved it in {self.checkpoint_dir}: start the job again to resume"
                 if self.checkpoint_dir else "no checkpoint_dir was given, so nothing was saved")
        return (f"preempted ({received or 'a signal'}): every rank stopped after step "
                f"{self.step}; {saved}; exit code {PREEMPTED_EXIT_CODE}")


class SignalWatch:
    """Records SIGTERM / SIGUSR1 while installed instead of dying at once.

    Args:
        rank: this process's rank, for the message.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.received: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived."""
        return self.received is not None

    def install(self) -> None:
        """Catches the signals (only the main thread can; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for name in SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Puts back the handlers that were there before :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            print(f"hvdtrain: rank {self.rank} received {name}: every rank stops after the "
                  "next step and rank 0 saves a checkpoint", file=sys.stderr, flush=True)


def stop_every_worker(backend, signals: SignalWatch, finish: Callable[[], None], step: int,
                      directory: str | None) -> None:
    """Every rank gets here after the same step: rank 0 saves, every rank waits for the
    save (a launcher kills the rest when one rank exits), then raises :class:`Preempted`
    (exit status :data:`PREEMPTED_EXIT_CODE`).

    Args:
        backend: the Trainer's backend (``allgather_object``, ``agree_any``).
        signals: this rank's :class:`SignalWatch`, whose ``received`` signals are reported.
        finish: ends training (the chief's final checkpoint among it).
        step: the step every rank stopped after.
        directory: where the checkpoint went (named in the error).
    """
    received = backend.allgather_object(signals.received)
    finish()
    backend.agree_any(False)  # a barrier: the checkpoint is complete
    err = Preempted(step, {r: s for r, s in enumerate(received) if s}, directory)
    logger.warning("%s", err)
    raise err
