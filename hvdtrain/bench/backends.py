"""Samples/s of every backend on the same model, batch and steps, measured in one run.

``hvdtrain bench-backends --np 2`` trains the benchmark MLP of :mod:`hvdtrain.bench`
(784-800-800-10, plain SGD, random in-memory data) with the same user code,
``Trainer(..., strategy=S)``, under each backend:

* ``horovod_gloo``: ``horovodrun --gloo``, ``np`` ranks;
* ``horovod_mpi``: ``mpirun --bind-to none``, ``np`` ranks;
* ``mirrored``: one process, ``MirroredStrategy`` over ``np`` logical CPU devices;
* ``multi_worker_mirrored``: ``np`` processes with ``TF_CONFIG`` on 127.0.0.1;
* ``parameter_server``: one parameter server, ``np`` workers and a coordinator, started by
  ``scripts/launch_ps.py``;
* ``multihost``: ``mpirun`` across ``np`` hosts made of Linux network namespaces
  (``scripts/netns_hosts.sh``, one rank and one thread per host, traffic over veths;
  root only, opt-in with ``--multihost``).

Each job takes ``warmup`` untimed steps, then times ``steps`` steps; samples/s is the
global batch (``batch_size`` per worker times the workers) times the steps over the
slowest worker's time. Asynchronous parameter-server steps are timed from the first
scheduled step to the join of the last one.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from hvdtrain.bench import core as bench

BACKENDS = ("horovod_gloo", "horovod_mpi", "mirrored", "multi_worker_mirrored",
            "parameter_server")
OPTIONAL_BACKENDS = ("multihost",)
STRATEGY_OF = {"mirrored": "mirrored", "multi_worker_mirrored": "multi_worker_mirrored",
               "parameter_server": "parameter_server"}
ROOT = Path(__file__).resolve().parent.parent
RESULT_MARKER = "HVDTRAIN_BACKEND_RESULT "
NETNS_IFACE = "hvdt0"  # the interface name scripts/netns_hosts.sh gives every host


@contextlib.contextmanager
def _namespace_hosts(n: int, hostfile: str):
    """``n`` network-namespace hosts (scripts/netns_hosts.sh), removed afterwards."""
    script = ROOT / "scripts" / "netns_hosts.sh"
    up = subprocess.run(["sh", str(script), "up", str(n), "--hostfile", hostfile],
                        capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        raise RuntimeError(f"could not create {n} namespace hosts (needs root): "
                           f"{(up.stderr or up.stdout).strip()[-1000:]}")
    try:
        yield
    finally:
        subprocess.run(["sh", str(script), "down"], capture_output=True, timeout=120)


# --------------------------------------------------------------------------- worker side
def run_strategy_worker(strategy: str, *, steps: int, warmup: int, batch_size: int,
                        examples: int, seed: int, world: int, devices: int = 1) -> dict | None:
    """One timed run of ``Trainer(strategy=strategy)``.

    Returns:
        The result on the task that reports (the chief / coordinator), else ``None``.
    """
    if strategy in ("mirrored", "multi_worker_mirrored"):
        from hvdtrain.backends import tfdist  # before TensorFlow starts: devices, collective ops

        tfdist.get_strategy(strategy, devices=devices)
    import keras
    import tensorflow as tf

    from hvdtrain.trainer import Trainer

    keras.utils.set_random_seed(seed)
    total = warmup + steps
    x, y = bench._make_data(examples, seed, world, batch_size)
    trainer = Trainer(tf.data.Dataset.from_tensor_slices((x, y)), bench._build_fn,
                      keras.optimizers.SGD, {"learning_rate": bench.LEARNING_RATE},
                      batch_size=batch_size, log_step_size=10**9, num_epochs=10**6,
                      max_iteration=total * world, strategy=strategy, progress_bar=False)
    size = trainer.size
    if size != world:
        raise RuntimeError(f"asked for {world} workers, the {strategy} Trainer has {size}")
    for _ in range(warmup):
        trainer.train_on_batch()
    _wait(trainer)
    start = time.perf_counter()
    logs = None
    while not trainer.should_stop():
        logs = trainer.train_on_batch()
    _wait(trainer)
    elapsed = time.perf_counter() - start
    if trainer.global_step != total:
        raise RuntimeError(f"the Trainer took {trainer.global_step} steps, expected {total}")
    if trainer.rank != 0:
        return None
    loss = float(_value(logs["loss"])) if logs is not None else float("nan")
    return {"strategy": strategy, "workers": size, "steps": steps, "warmup": warmup,
            "batch_size": batch_size, "global_batch": batch_size * size, "elapsed_s": elapsed,
            "samples_per_s": batch_size * size * steps / elapsed, "final_loss": loss}


def _wait(trainer) -> None:
    """Blocks until the scheduled steps are done (parameter server) or the last step's
    values exist (synchronous strategies)."""
    join = getattr(trainer, "join", None)
    if callable(join):
        join()


def _value(tensor):
    fetch = getattr(tensor, "fetch", None)
    return fetch() if callable(fetch) else tensor


def worker_main(argv: Sequence[str]) -> int:
    """``python -m hvdtrain.backend_bench --worker --strategy S ...`` on one task."""
    p = argparse.ArgumentParser(prog="python -m hvdtrain.backend_bench --worker")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--strategy", choices=sorted(STRATEGY_OF.values()), required=True)
    p.add_argument("--steps", type=bench._positive_int, default=bench.DEFAULT_STEPS)
    p.add_argument("--warmup", type=bench._non_negative_int, default=bench.DEFAULT_WARMUP)
    p.add_argument("--batch-size", type=bench._positive_int, default=bench.DEFAULT_BATCH_SIZE)
    p.add_argument("--examples", type=bench._positive_int, default=bench.DEFAULT_EXAMPLES)
    p.add_argument("--seed", type=bench._non_negative_int, default=bench.DEFAULT_SEED)
    p.add_argument("--devices", type=bench._positive_int, default=1)
    p.add_argument("--world", type=bench._positive_int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    result = run_strategy_worker(args.strategy, steps=args.steps, warmup=args.warmup,
                                 batch_size=args.batch_size, examples=args.examples,
                                 seed=args.seed, world=args.world, devices=args.devices)
    if result is not None:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(args.out)
        print(RESULT_MARKER + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- driver side
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _strategy_worker_argv(strategy: str, cfg: dict, out: str, world: int,
                          devices: int = 1) -> list[str]:
    return [sys.executable, "-m", "hvdtrain.backend_bench", "--worker", "--strategy", strategy,
            "--steps", str(cfg["steps"]), "--warmup", str(cfg["warmup"]),
            "--batch-size", str(cfg["batch_size"]), "--examples", str(cfg["examples"]),
            "--seed", str(cfg["seed"]), "--devices", str(devices), "--world", str(world),
            "--out", out]


def _run(cmds: list[tuple[list[str], dict]], out: Path, timeout: float) -> dict:
    """Starts every command (with its extra environment), waits for all, reads ``out``."""
    env0 = bench._worker_env()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**env0, **extra}, start_new_session=True, cwd=ROOT)
             for cmd, extra in cmds]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            left = max(1.0, deadline - time.monotonic())
            outputs.append(proc.communicate(timeout=left)[0] or "")
    except subprocess.TimeoutExpired:
        for proc in procs:
            bench._kill_group(proc)
        raise RuntimeError(f"backend job timed out after {timeout:g} s: "
                           f"{shlex.join(cmds[0][0])}") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                bench._kill_group(proc)
    bad = [(p.returncode, o) for p, o in zip(procs, outputs) if p.returncode != 0]
    if bad or not out.is_file():
        code, text = bad[0] if bad else (0, outputs[0] if outputs else "")
        raise RuntimeError(f"backend job exited {code} without a result: "
                           f"{shlex.join(cmds[0][0])}\n{text[-3000:]}")
    return json.loads(out.read_text())


def backend_commands(backend: str, np: int, cfg: dict, out: str) -> list[tuple[list[str], dict]]:
    """The processes (command, extra environment) of one backend's job."""
    if backend in ("horovod_gloo", "horovod_mpi"):
        launcher = "horovodrun" if backend == "horovod_gloo" else "mpirun"
        cmd = bench.worker_command(np, "trainer", launcher=launcher, steps=cfg["steps"],
                                   warmup=cfg["warmup"], batch_size=cfg["batch_size"],
                                   examples=cfg["examples"], seed=cfg["seed"], out=out)
        return [(cmd, {})]
    if backend == "mirrored":
        return [(_strategy_worker_argv("mirrored", cfg, out, np, devices=np), {})]
    if backend == "multi_worker_mirrored":
        hosts = [f"127.0.0.1:{p}" for p in _free_ports(np)]
        return [(_strategy_worker_argv("multi_worker_mirrored", cfg, out, np),
                 {"TF_CONFIG": json.dumps({"cluster": {"worker": hosts},
                                           "task": {"type": "worker", "index": i}})})
                for i in range(np)]
    if backend == "parameter_server":
        launch = [sys.executable, str(ROOT / "scripts" / "launch_ps.py"), "--ps", "1",
                  "--workers", str(np), "--"]
        return [(launch + _strategy_worker_argv("parameter_server", cfg, out, np), {})]
    if backend == "multihost":
        cmd = bench.worker_command(np, "trainer", launcher="mpirun", steps=cfg["steps"],
                                   warmup=cfg["warmup"], batch_size=cfg["batch_size"],
                                   examples=cfg["examples"], seed=cfg["seed"], out=out)
        # One rank per namespace host; both hosts share this machine's cores, so one
        # thread each, as the one-host runs take.
        across = ["--mca", "plm_rsh_agent", str(ROOT / "scripts" / "netns_rsh.sh"),
                  "--hostfile", cfg["hostfile"], "--map-by", "node",
                  "--mca", "oob_tcp_if_include", NETNS_IFACE, "--mca", "btl", "tcp,self",
                  "--mca", "btl_tcp_if_include", NETNS_IFACE, "-x", "HVDTRAIN_THREADS"]
        return [([cmd[0], *across, *cmd[1:]], {"HVDTRAIN_THREADS": "1"})]
    raise ValueError(f"backend must be one of {BACKENDS + OPTIONAL_BACKENDS}, got {backend!r}")


def run_backends(backends: Sequence[str] = BACKENDS, np: int = 2, *,
                 steps: int = bench.DEFAULT_STEPS, warmup: int = bench.DEFAULT_WARMUP,
                 batch_size: int = bench.DEFAULT_BATCH_SIZE, examples: int = bench.DEFAULT_EXAMPLES,
                 seed: int = bench.DEFAULT_SEED, timeout: float = bench.DEFAULT_TIMEOUT,
                 progress=None) -> dict:
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
            hosts = (_namespace_hosts(np, cfg.setdefault("hostfile", str(Path(tmp) / "hosts")))
                     if backend == "multihost" else contextlib.nullcontext())
            cmds = backend_commands(backend, np, cfg, str(out))
            commands[backend] = " & ".join(
                " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
                + (" " if extra else "") + shlex.join(cmd) for cmd, extra in cmds
            ).replace(str(out), "<result.json>")
            t0 = time.perf_counter()
            with hosts:
                result = _run(cmds, out, timeout)
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
    return {"benchmark": bench.MODEL, "config": {**cfg, "np": np, "cpu_count": os.cpu_count()},
            "results": rows, "commands": commands}


def format_table(report: dict) -> str:
    """The report as a readable table."""
    cfg = report["config"]
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per worker, {cfg['np']} workers, "
             f"{cfg['steps']} timed steps after {cfg['warmup']}; {cfg['cpu_count']} CPUs", "",
             f"{'backend':<22} | {'samples/s':>10} | {'/ horovod_gloo':>14}", "-" * 52]
    for row in report["results"]:
        lines.append(f"{row['backend']:<22} | {row['samples_per_s']:>10,.0f} | "
                     f"{bench._fmt(row['ratio_over_horovod_gloo'], '.3f'):>14}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    """``hvdtrain bench-backends``."""
    p = sub.add_parser("bench-backends", help="samples/s of every backend on one model",
                       description="Trains the benchmark MLP with Trainer(strategy=...) under "
                                   "each backend, in one run, and prints samples/s.")
    p.add_argument("--np", type=bench._positive_int, default=2, help="workers (default: 2)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS + OPTIONAL_BACKENDS,
                   default=list(BACKENDS), help="which to run (default: all but multihost)")
    p.add_argument("--multihost", action="store_true",
                   help="also run mpirun across network-namespace hosts (root only)")
    p.add_argument("--steps", type=bench._positive_int, default=bench.DEFAULT_STEPS)
    p.add_argument("--warmup", type=bench._non_negative_int, default=bench.DEFAULT_WARMUP)
    p.add_argument("--batch-size", type=bench._positive_int, default=bench.DEFAULT_BATCH_SIZE)
    p.add_argument("--timeout", type=bench._positive_float, default=bench.DEFAULT_TIMEOUT)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    backends = list(args.backends) + (["multihost"] if args.multihost
                                      and "multihost" not in args.backends else [])
    progress = None if args.json else (lambda line: print(line, flush=True))
    try:
        report = run_backends(backends, args.np, steps=args.steps, warmup=args.warmup,
                              batch_size=args.batch_size, timeout=args.timeout,
                              progress=progress)
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench-backends: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print()
        print(format_table(report))
        print("\ncommands:")
        for name, cmd in report["commands"].items():
            print(f"  {name}: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
