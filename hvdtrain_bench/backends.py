"""``hvdtrain bench-backends``: samples/s of every backend on the same model, batch and
steps, measured in one run.

``hvdtrain bench-backends --np 2`` trains the benchmark MLP (784-800-800-10, plain SGD,
random in-memory data) with the same user code, ``Trainer(..., strategy=S)``, under each
backend:

* ``horovod_gloo``: ``horovodrun --gloo``, ``np`` ranks;
* ``horovod_mpi``: ``mpirun --bind-to none``, ``np`` ranks;
* ``mirrored``: one process, ``MirroredStrategy`` over ``np`` logical CPU devices;
* ``multi_worker_mirrored``: ``np`` processes with ``TF_CONFIG`` on 127.0.0.1;
* ``parameter_server``: one parameter server, ``np`` workers and a coordinator, started by
  ``launch_ps.py`` (the helper scripts: :func:`hvdtrain_bench.jobs.script`);
* ``multihost``: ``mpirun`` across ``np`` hosts made of Linux network namespaces
  (:mod:`hvdtrain_bench.netns`, one rank and one thread per host, traffic over veths;
  root only, opt-in with ``--multihost``).

The Horovod backends run the ``trainer`` worker of ``hvdtrain bench``
(:mod:`hvdtrain_bench.worker`), the others :mod:`hvdtrain_bench.strategy_worker`. Each
job takes ``warmup`` untimed steps, then times ``steps`` steps; samples/s is the global
batch (``batch_size`` per worker times the workers) times the steps over the slowest
worker's time.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from hvdtrain_bench.jobs import Process, run_job, script, shown_command
from hvdtrain_bench.launch import tf_config_workers, worker_command
from hvdtrain_bench.netns import IFACE, namespace_hosts, rsh_agent
from hvdtrain_bench.report import fmt
from hvdtrain_bench.settings import (DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLES, DEFAULT_SEED,
                                     DEFAULT_STEPS, DEFAULT_TIMEOUT, DEFAULT_WARMUP, MODEL)
from hvdtrain_bench.strategy_worker import strategy_worker_argv

BACKENDS = ("horovod_gloo", "horovod_mpi", "mirrored", "multi_worker_mirrored",
            "parameter_server")
OPTIONAL_BACKENDS = ("multihost",)


def backend_commands(backend: str, np: int, cfg: dict, out: str) -> list[Process]:
    """The processes (command, extra environment) of one backend's job.

    Raises:
        ValueError: an unknown backend.
    """
    if backend in ("horovod_gloo", "horovod_mpi", "multihost"):
        launcher = "horovodrun" if backend == "horovod_gloo" else "mpirun"
        cmd = worker_command(np, "trainer", launcher=launcher, steps=cfg["steps"],
                             warmup=cfg["warmup"], batch_size=cfg["batch_size"],
                             examples=cfg["examples"], seed=cfg["seed"], out=out)
        if backend != "multihost":
            return [(cmd, {})]
        # One rank per namespace host; both hosts share this machine's cores, so one
        # thread each, as the one-host runs take.
        across = ["--mca", "plm_rsh_agent", str(rsh_agent()),
                  "--hostfile", cfg["hostfile"], "--map-by", "node",
                  "--mca", "oob_tcp_if_include", IFACE, "--mca", "btl", "tcp,self",
                  "--mca", "btl_tcp_if_include", IFACE, "-x", "HVDTRAIN_THREADS"]
        return [([cmd[0], *across, *cmd[1:]], {"HVDTRAIN_THREADS": "1"})]
    if backend == "mirrored":
        return [(strategy_worker_argv("mirrored", cfg, out, np, devices=np), {})]
    if backend == "multi_worker_mirrored":
        return tf_config_workers(strategy_worker_argv("multi_worker_mirrored", cfg, out, np), np)
    if backend == "parameter_server":
        launch = [sys.executable, str(script("launch_ps.py")), "--ps", "1",
                  "--workers", str(np), "--"]
        return [(launch + strategy_worker_argv("parameter_server", cfg, out, np), {})]
    raise ValueError(f"backend must be one of {BACKENDS + OPTIONAL_BACKENDS}, got {backend!r}")


def run_backends(backends: Sequence[str] = BACKENDS, np: int = 2, *,
                 steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                 batch_size: int = DEFAULT_BATCH_SIZE, examples: int = DEFAULT_EXAMPLES,
                 seed: int = DEFAULT_SEED, timeout: float = DEFAULT_TIMEOUT,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Runs every backend once and returns the report (see :func:`format_table`).

    Raises:
        ValueError: an unknown backend, named.
        RuntimeError: a job failed or timed out, with its command and output.
    """
    unknown = [b for b in backends if b not in BACKENDS + OPTIONAL_BACKENDS]
    if unknown or not backends:
        raise ValueError(f"backends must be drawn from {list(BACKENDS + OPTIONAL_BACKENDS)}, "
                         f"got {list(backends)!r}")
    cfg = {"steps": steps, "warmup": warmup, "batch_size": batch_size, "examples": examples,
           "seed": seed}
    rows, commands = [], {}
    with tempfile.TemporaryDirectory(prefix="hvdtrain-backends-") as tmp:
        for backend in backends:
            out = Path(tmp) / f"{backend}.json"
            hosts = (namespace_hosts(np, cfg.setdefault("hostfile", str(Path(tmp) / "hosts")))
                     if backend == "multihost" else contextlib.nullcontext())
            cmds = backend_commands(backend, np, cfg, str(out))
            commands[backend] = shown_command(cmds, out)
            t0 = time.perf_counter()
            with hosts:
                result = run_job(cmds, out, timeout, what="backend job")
            rows.append({"backend": backend, "samples_per_s": result["samples_per_s"],
                         "workers": result.get("workers", result.get("np")),
                         "elapsed_s": result["elapsed_s"], "final_loss": result["final_loss"],
                         "job_wall_s": time.perf_counter() - t0})
            if progress:
                progress(f"  {backend:<22} {rows[-1]['samples_per_s']:>9,.0f} samples/s")
    base = next((r["samples_per_s"] for r in rows if r["backend"] == "horovod_gloo"), None)
    for row in rows:
        row["ratio_over_horovod_gloo"] = row["samples_per_s"] / base if base else None
    cfg.pop("hostfile", None)
    return {"benchmark": MODEL, "config": {**cfg, "np": np, "cpu_count": os.cpu_count()},
            "results": rows, "commands": commands}


def format_table(report: dict) -> str:
    """The report of :func:`run_backends` as a readable table."""
    cfg = report["config"]
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per worker, {cfg['np']} workers, "
             f"{cfg['steps']} timed steps after {cfg['warmup']}; {cfg['cpu_count']} CPUs", "",
             f"{'backend':<22} | {'samples/s':>10} | {'/ horovod_gloo':>14}", "-" * 52]
    for row in report["results"]:
        lines.append(f"{row['backend']:<22} | {row['samples_per_s']:>10,.0f} | "
                     f"{fmt(row['ratio_over_horovod_gloo'], '.3f'):>14}")
    return "\n".join(lines)
