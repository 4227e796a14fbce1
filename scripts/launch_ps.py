#!/usr/bin/env python
"""Starts a parameter-server job on this machine: every task a real process on 127.0.0.1.

    python scripts/launch_ps.py --ps 2 --workers 2 [--timeout S] -- \\
        python examples/mnist.py --strategy parameter_server ...

``--workers`` counts the workers that train, the master included: the master (TF2's
coordinator, which also hosts worker 0) plus ``workers - 1`` worker tasks, and ``--ps``
parameter servers. Each process gets its ``TF_CONFIG`` (TensorLayer's form, with a
``master`` job) on free ports; its output is streamed with the task's name in front. The
launcher waits for the master, then ends the servers and exits with the master's code. If
any task ends first, or ``--timeout`` passes, it ends every task and exits non-zero,
naming the task and its exit code.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hvdtrain.backends.ps.cluster import TaskSpecDef, free_ports  # noqa: E402  (does not import TensorFlow)

GRACE_S = 5.0


def cluster_tasks(num_ps: int, num_workers: int, host: str = "127.0.0.1") -> list[tuple[str, dict]]:
    """``(name, TF_CONFIG dict)`` of every task: the master first, then workers, then ps."""
    ports = free_ports(num_ps + num_workers, host)
    hosts = [f"{host}:{p}" for p in ports]
    master, workers, ps = hosts[0], hosts[1:num_workers], hosts[num_workers:]
    tasks = [("master", "master", 0)] + [(f"worker{i}", "worker", i) for i in range(len(workers))]
    tasks += [(f"ps{i}", "ps", i) for i in range(num_ps)]
    return [(name, TaskSpecDef(kind, index, None, ps, workers, master).tf_config())
            for name, kind, index in tasks]


def _stream(proc: subprocess.Popen, name: str, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()


def _end(procs: dict) -> None:
    """SIGTERM to every live task's process group, SIGKILL after a grace period."""
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def launch(num_ps: int, num_workers: int, command: list[str], timeout: float | None = None,
           host: str = "127.0.0.1") -> int:
    """Runs the job; returns the exit code the launcher should exit with."""
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen] = {}
    threads = []

    def say(text: str) -> None:
        with lock:
            print(f"[launch_ps] {text}", file=sys.stderr, flush=True)

    def on_signal(signum, _frame):
        say(f"got signal {signum}: ending every task")
        _end(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tasks = cluster_tasks(num_ps, num_workers, host)
    say(f"{num_ps} ps, {num_workers} worker(s) (master included): "
        + json.dumps(tasks[0][1]["cluster"]))
    env0 = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, tf_config in tasks:
        env = dict(env0, TF_CONFIG=json.dumps(tf_config))
        procs[name] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, errors="replace",
                                       start_new_session=True)
        t = threading.Thread(target=_stream, args=(procs[name], name, lock), daemon=True)
        t.start()
        threads.append(t)
    deadline = None if timeout is None else time.monotonic() + timeout
    code = None
    try:
        while code is None:
            master_code = procs["master"].poll()
            if master_code is not None:
                code = master_code
                if master_code:
                    say(f"task master exited with code {master_code}")
                break
            for name, proc in procs.items():
                rc = proc.poll()
                if name != "master" and rc is not None:
                    say(f"task {name} exited early with code {rc}: ending the job")
                    code = rc or 1
                    break
            if code is None and deadline is not None and time.monotonic() > deadline:
                say(f"timed out after {timeout:g} s: ending the job")
                code = 124
            if code is None:
                time.sleep(0.2)
    finally:
        _end(procs)
        for t in threads:
            t.join(timeout=2)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: launch_ps.py --ps N --workers M [--timeout S] -- COMMAND ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="launch_ps.py", description=__doc__.splitlines()[0])
    p.add_argument("--ps", type=int, default=1, help="parameter servers (>= 1)")
    p.add_argument("--workers", type=int, default=2,
                   help="training workers, the master included (>= 1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="end the job (exit 124) after this many seconds")
    p.add_argument("--host", default="127.0.0.1", help="address every task listens on")
    args = p.parse_args(argv[:split])
    command = argv[split + 1:]
    if args.ps < 1:
        p.error(f"--ps must be >= 1, got {args.ps}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.timeout is not None and not args.timeout > 0:
        p.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not command:
        p.error("give the command to run after --")
    return launch(args.ps, args.workers, command, args.timeout, args.host)


if __name__ == "__main__":
    sys.exit(main())
