#!/usr/bin/env python
"""The fault matrix (issue 32), run for real on 2 ranks with default settings.

Each fault on rank 1 as its step 5 begins (an exception, SIGKILL, SIGSTOP, a cut link, a
NaN record, an Inf record) through each front door (the Trainer; ``fit`` via the drop-in
``hvdtrain.tensorflow.keras``; a ``DistributedGradientTape`` loop) under each launcher
(``horovodrun --gloo``, ``mpirun``), with the test suite's worker
(``tests/parallel/workers/fault_worker.py``). Per cell: the seconds from the fault to the
launcher's return (and to the last rank's exit), the exit code, the line of the job's
output that names the faulty rank and the kind of fault, and, for the Trainer (the door
given a checkpoint directory), whether every checkpoint left verifies and a restart
resumes to the uninterrupted run's weights.

A cut link needs two hosts: two network-namespace hosts (``scripts/netns_hosts.sh``, root
only), one rank each, host 2's veth set down once rank 1 reaches step 5; the hosts exist
only while ``/tmp/hvdtrain-netns.lock`` is held. ``mpirun`` there gets Open MPI's keepalive
flags (``KEEPALIVE``: without them it does not return after a cut; ``--mpirun-defaults``
runs that cell too, for the record).

Usage: .venv/bin/python scripts/fault_matrix.py [--faults F ...] [--doors D ...]
       [--launchers L ...] [--json FILE] [--mpirun-defaults]
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402


def _parallel_conftest():
    """tests/parallel/conftest.py (the tests' launchers), loaded by its path: inside a
    pytest run the name ``conftest`` may be another directory's conftest."""
    path = ROOT / "tests" / "parallel" / "conftest.py"
    spec = importlib.util.spec_from_file_location("hvdtrain_parallel_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TESTS = _parallel_conftest()
WORKERS, launch_command = _TESTS.WORKERS, _TESTS.launch_command
from hvdtrain.checkpoint import committed, verify  # noqa: E402
from hvdtrain_bench.jobs import worker_env  # noqa: E402
from hvdtrain_bench.links import across_hosts  # noqa: E402
from hvdtrain_bench.netns import PREFIX, SUBNET, VETH, namespace_hosts, rsh_agent  # noqa: E402

WORKER = str(WORKERS / "fault_worker.py")
FAULTS = ("raise", "sigkill", "sigstop", "cut", "nan_record", "inf_record")
DOORS = ("trainer", "fit", "tape")
LAUNCHERS = ("horovodrun", "mpirun")
LOCK = "/tmp/hvdtrain-netns.lock"
#: Open MPI notices a daemon it cannot reach after 10 + 3 * 5 s instead of never.
KEEPALIVE = ["--mca", "oob_tcp_keepalive_time", "10", "--mca", "oob_tcp_keepalive_intvl", "5",
             "--mca", "oob_tcp_keepalive_probes", "3"]
_SILENT = r"rank 1 of 2 \(host {host}, pid \d+\) has not reported for \d+ s.*cut off"
#: Per fault: the output that names rank 1 and the kind of fault.
NAMED = {
    "raise": r"rank 1 of 2 failed: RuntimeError: boom at step 5",
    "sigkill": r"Process 1 exit with status code 137|process rank 1 with PID \d+ on node \S+ "
               r"exited on signal 9 \(Killed\)",
    "sigstop": _SILENT.format(host="[^,]+"),
    "cut": _SILENT.format(host="hvdtn2"),
    "nan_record": r"non-finite (loss|gradients) (at step 5 )?on rank\(s\) \[1\]",
    "inf_record": r"non-finite (loss|gradients) (at step 5 )?on rank\(s\) \[1\]",
}
DEADLINE_S = 90


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def rank_pids(out: Path) -> list[int]:
    return [int((out / f"pid{r}").read_text()) for r in range(2) if (out / f"pid{r}").is_file()]


def message(fault: str, text: str) -> tuple[bool, str]:
    """Whether the output names the faulty rank and the fault, and the line that does (the
    one that ended the job first), else the last line hvdtrain printed."""
    lines = [re.sub(r"^(\[[\d,]+\]<std(err|out)>:)+", "", line).strip()
             for line in text.splitlines()]
    found = [line for line in lines if re.search(NAMED[fault], line)]
    if found:
        for prefer in (r"^hvdtrain: .* stopped( by|:)", r"^hvdtrain: rank", r""):
            first = next((line for line in found if re.search(prefer, line)), None)
            if first:
                return True, first
    said = [line for line in lines if "hvdtrain:" in line or "ORTE" in line]
    return False, (said[-1] if said else (lines[-1] if lines else ""))


def run_cell(cmd: list[str], env: dict, out: Path, fault: str, timeout: float) -> dict:
    """Runs one cell's job; times it from the fault to the launcher's return."""
    out.mkdir(parents=True)
    log = open(out / "output.log", "w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    start, cut = time.time(), False
    try:
        deadline = start + timeout
        while fault == "cut" and proc.poll() is None and time.time() < deadline:
            if (out / "cut_ready").is_file():
                subprocess.run(["ip", "link", "set", f"{VETH}2", "down"], check=True)
                (out / "fault_time").write_text(str(time.time()))
                cut = True
                break
            time.sleep(0.05)
        deadline = time.time() + timeout
        pids, gone = [], None
        while proc.poll() is None and time.time() < deadline:
            pids = pids or rank_pids(out)
            if gone is None and len(pids) == 2 and not any(map(alive, pids)):
                gone = time.time()
            time.sleep(0.1)
        returned = proc.poll() is not None
        ended = time.time()
    finally:
        if cut:
            restore_link()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in rank_pids(out):  # a rank the launcher left behind (ours, by id)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.seek(0)
        text = log.read()
        log.close()
    fault_at = float((out / "fault_time").read_text()) if (out / "fault_time").is_file() \
        else None
    gone = gone or (ended if returned else None)
    named, line = message(fault, text)
    return {"exit_s": None if not (returned and fault_at) else round(ended - fault_at, 1),
            "ranks_gone_s": None if not (gone and fault_at) else round(gone - fault_at, 1),
            "returned": returned, "code": proc.returncode if returned else None,
            "named": named, "message": line, "start_to_fault_s":
                None if fault_at is None else round(fault_at - start, 1)}


def restore_link(wait_s: float = 30.0) -> None:
    """Sets host 2's veth up again and waits until host 2 reaches the bridge (a TCP
    connect answered or refused), so the next cell's launcher finds it."""
    subprocess.run(["ip", "link", "set", f"{VETH}2", "up"], check=False)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        probe = subprocess.run(["ip", "netns", "exec", f"{PREFIX}2", "timeout", "2", "bash",
                                "-c", f"exec 3<>/dev/tcp/{SUBNET}.1/9"],
                               capture_output=True, text=True)
        if probe.returncode == 0 or "refused" in probe.stderr:
            return
        time.sleep(0.5)


def checkpoint_state(out: Path) -> str:
    """The checkpoints left in ``out/ckpt``, each verified."""
    found = committed(str(out / "ckpt"))
    if not found:
        return "none"
    for step, folder in found:
        try:
            verify(folder)
        except Exception as e:  # noqa: BLE001 - reported in the table
            return f"step {step} corrupt: {e}"
    return "intact (steps " + ", ".join(str(step) for step, _ in found) + ")"


def weights(out: Path) -> list[np.ndarray]:
    return [np.array(w) for w in json.loads((out / "rank0.json").read_text())["weights"]]


def resume(launcher: str, out: Path, reference: list[np.ndarray], env: dict) -> str:
    """Restarts the Trainer without the fault on ``out``'s checkpoint; compares its final
    weights with the uninterrupted run's."""
    for r in range(2):
        (out / f"rank{r}.json").unlink(missing_ok=True)
    proc = subprocess.run(launch_command(launcher, 2, [WORKER, "clean", str(out), "trainer"]),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not (out / "rank0.json").is_file():
        return f"restart failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-300:]}"
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(weights(out), reference))
    same = np.allclose(diff, 0, atol=1e-6)
    return f"{'equal' if same else 'DIFFERENT'} (max |diff| {diff:.1e})"


@contextlib.contextmanager
def netns_hosts(tmp: Path):
    """Two namespace hosts, a hostfile and ``ssh`` as the rsh agent, under the lock."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fake_bin = tmp / "bin"
        fake_bin.mkdir(exist_ok=True)
        if not (fake_bin / "ssh").exists():
            (fake_bin / "ssh").symlink_to(rsh_agent())
        with namespace_hosts(2, str(tmp / "hostfile")):
            yield str(tmp / "hostfile"), str(fake_bin)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--doors", nargs="+", choices=DOORS, default=list(DOORS))
    ap.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    ap.add_argument("--mpirun-defaults", action="store_true",
                    help="also run the Trainer's cut-link cell under mpirun without KEEPALIVE")
    ap.add_argument("--timeout", type=float, default=150.0,
                    help="seconds a cell may run after its fault before it is killed")
    ap.add_argument("--json", help="write the cells here")
    args = ap.parse_args(argv)
    env = worker_env()
    for name in ("HVDTRAIN_LIVENESS_TIMEOUT", "HVDTRAIN_COLLECTIVE_TIMEOUT",
                 "HOROVOD_GLOO_TIMEOUT_SECONDS", "HVDTRAIN_NAN_POLICY"):
        env.pop(name, None)  # the defaults
    cells, reference = [], {}
    tmp = Path(tempfile.mkdtemp(prefix="hvdtrain-faults-"))

    def record(cell, out, say=True):
        cells.append(cell)
        if say:
            print(json.dumps(cell), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(cells, indent=1) + "\n")

    def checkpoint_and_resume(cell, out):
        cell["checkpoint"] = checkpoint_state(out)
        cell["resume"] = resume(cell["launcher"].split()[0], out,
                                reference[cell["launcher"].split()[0]], env)

    for launcher in args.launchers:
        if "trainer" in args.doors:
            out = tmp / f"clean-{launcher}"
            out.mkdir()
            subprocess.run(launch_command(launcher, 2, [WORKER, "clean", str(out), "trainer"]),
                           cwd=ROOT, env=env, capture_output=True, timeout=300, check=True)
            reference[launcher] = weights(out)
        for fault in (f for f in args.faults if f != "cut"):
            for door in args.doors:
                out = tmp / f"{fault}-{door}-{launcher}"
                cell = {"fault": fault, "door": door, "launcher": launcher,
                        **run_cell(launch_command(launcher, 2, [WORKER, fault, str(out), door]),
                                   env, out, fault, args.timeout)}
                if door == "trainer":
                    checkpoint_and_resume(cell, out)
                record(cell, out)
    if "cut" in args.faults:
        later = []
        with netns_hosts(tmp) as (hostfile, fake_bin):
            runs = [(lau, door, lau == "mpirun") for lau in args.launchers for door in args.doors]
            if args.mpirun_defaults and "mpirun" in args.launchers and "trainer" in args.doors:
                runs.append(("mpirun", "trainer", False))
            for launcher, door, keepalive in runs:
                label = launcher + (" +keepalive" if keepalive else "")
                out = tmp / f"cut-{door}-{label.replace(' +', '-')}"
                cmd, extra = across_hosts([sys.executable, WORKER, "cut", str(out), door], 2,
                                          launcher, hostfile, fake_bin)
                if keepalive:
                    cmd[1:1] = KEEPALIVE
                cell = {"fault": "cut", "door": door, "launcher": label,
                        **run_cell(cmd, {**env, **extra}, out, "cut", args.timeout)}
                if door == "trainer":
                    later.append((cell, out))
                else:
                    record(cell, out)
        for cell, out in later:  # restarts on one host, once the hosts are gone
            checkpoint_and_resume(cell, out)
            record(cell, out)
    print(table(cells))
    bad = [c for c in cells if not (c["named"] and c["exit_s"] is not None
                                    and c["exit_s"] <= DEADLINE_S)
           and (c["fault"], c["launcher"]) != ("cut", "mpirun")]  # Open MPI's known limit
    return 1 if bad else 0


def table(cells: list[dict]) -> str:
    """The cells as a Markdown table."""
    rows = ["| fault | front door | launcher | s to exit (ranks gone) | exit code | names "
            "rank 1 and the fault | checkpoint | restart |", "|" + "---|" * 8]
    for c in cells:
        exit_s = "did not return" if c["exit_s"] is None else f"{c['exit_s']:g}"
        if c["ranks_gone_s"] is not None and c["ranks_gone_s"] != c["exit_s"]:
            exit_s += f" ({c['ranks_gone_s']:g})"
        rows.append(f"| {c['fault']} | {c['door']} | {c['launcher']} | {exit_s} | "
                    f"{c['code']} | {'yes' if c['named'] else 'NO'}: `{c['message'][:140]}` | "
                    f"{c.get('checkpoint', 'n/a')} | {c.get('resume', 'n/a')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
