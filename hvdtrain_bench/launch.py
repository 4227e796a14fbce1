"""The command lines of one timed ``hvdtrain bench`` job: ``python`` for one rank,
``horovodrun --gloo`` or ``mpirun`` for more, ``np`` ``TF_CONFIG`` workers for
MultiWorkerMirrored, and ``taskset`` to give a one-rank job one rank's share of the cores."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from hvdtrain.threads import usable_cpu_ids
from hvdtrain_bench.jobs import Process, free_ports
from hvdtrain_bench.settings import BASELINE_MODES, DEFAULT_MODEL, LAUNCHERS


def worker_command(np: int, mode: str, *, launcher: str, steps: int, warmup: int,
                   batch_size: int, examples: int, seed: int, out: str,
                   python: str | None = None, options: dict | None = None,
                   model: str = DEFAULT_MODEL) -> list[str]:
    """The command that runs one timed job of ``np`` ranks in ``mode`` on ``model``.

    Raises:
        ValueError: an unknown launcher.
        RuntimeError: the launcher is not installed.
    """
    python = python or sys.executable
    worker = [python, "-m", "hvdtrain_bench", "--worker", "--mode", mode,
              "--steps", str(steps), "--warmup", str(warmup), "--batch-size", str(batch_size),
              "--examples", str(examples), "--seed", str(seed), "--model", model, "--out", out]
    if options and mode not in BASELINE_MODES:
        worker += ["--options", json.dumps(options, sort_keys=True)]
    if np == 1 or mode == "mwms":
        return worker
    if launcher == "horovodrun":
        horovodrun = shutil.which("horovodrun", path=str(Path(python).parent)) \
            or shutil.which("horovodrun")
        if not horovodrun:
            raise RuntimeError("horovodrun not found next to the Python interpreter or on PATH")
        return [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--gloo", *worker]
    if launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise RuntimeError("mpirun not found on PATH (install openmpi-bin)")
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        for var in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH", "PYTHONUNBUFFERED", "PATH"):
            cmd += ["-x", var]
        return cmd + worker
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def tf_config_workers(cmd: list[str], np: int) -> list[Process]:
    """``np`` copies of ``cmd``, each with the ``TF_CONFIG`` of one worker of a cluster
    on free local ports."""
    hosts = [f"127.0.0.1:{port}" for port in free_ports(np)]
    return [(cmd, {"TF_CONFIG": json.dumps({"cluster": {"worker": hosts},
                                            "task": {"type": "worker", "index": i}})})
            for i in range(np)]


def job_processes(np: int, mode: str, *, launcher: str, reference_cores: int | None = None,
                  **kwargs) -> list[Process]:
    """The processes (command, extra environment) of one timed job of ``np`` ranks.

    Horovod jobs are one launcher command; a MultiWorkerMirrored job is ``np`` workers
    that find each other through ``TF_CONFIG``. With ``reference_cores`` a one-rank job
    runs on that many cores (``taskset``): the share of the machine one rank gets in the
    larger jobs, so scaling efficiency compares like with like. ``kwargs`` go to
    :func:`worker_command`.
    """
    cmd = worker_command(np, mode, launcher=launcher, **kwargs)
    if mode == "mwms" and np > 1:
        return tf_config_workers(cmd, np)
    if np == 1 and reference_cores:
        cores = usable_cpu_ids()[:reference_cores]
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
    return [(cmd, {})]
