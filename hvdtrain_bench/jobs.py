"""Runs the jobs of both benchmarks: every process of a job in its own process group,
the first failure or the timeout ending the job at once, and the result file read back.
Also where the bench's helper scripts are, the job's command as shown in a report, and
free ports.

Nothing here depends on a checkout's layout: the helper scripts come from
``HVDTRAIN_BENCH_SCRIPTS`` or from the package's own ``scripts/`` (package data: in a
checkout, links to the top-level ``scripts/``; in a wheel, copies of them), and the
workers import ``hvdtrain`` and ``hvdtrain_bench`` from where this process did."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import hvdtrain
from hvdtrain.backends.ps.cluster import free_ports  # noqa: F401  (the one port helper)
from hvdtrain_bench.settings import LAUNCHED_AT_ENV

#: A folder holding the helper scripts (``netns_hosts.sh``, ``netns_rsh.sh``,
#: ``launch_ps.py``) to use instead of the ones the package ships.
SCRIPTS_ENV = "HVDTRAIN_BENCH_SCRIPTS"
#: The helper scripts the package ships (package data).
PACKAGE_SCRIPTS = Path(__file__).resolve().parent / "scripts"

#: One process of a job: its command and the variables added to its environment.
Process = tuple[list[str], dict]


def script(name: str) -> Path:
    """The helper script ``name``: in ``$HVDTRAIN_BENCH_SCRIPTS`` when that is set, else
    the package's copy (its links resolved, so a checkout shows ``scripts/NAME``).

    Raises:
        RuntimeError: the script is not there, naming where it was looked for.
    """
    folder = os.environ.get(SCRIPTS_ENV)
    path = (Path(folder) if folder else PACKAGE_SCRIPTS) / name
    if not path.is_file():
        where = f"${SCRIPTS_ENV} ({folder})" if folder else f"the package's {PACKAGE_SCRIPTS}"
        raise RuntimeError(f"the bench's helper script {name} is not in {where}; set "
                           f"{SCRIPTS_ENV} to a folder holding it (a checkout's scripts/)")
    return path.resolve()


def import_roots() -> list[str]:
    """The folders this process imported ``hvdtrain`` and ``hvdtrain_bench`` from (one
    when they are side by side, as installed or in a checkout)."""
    roots = (Path(hvdtrain.__file__).resolve().parents[1], Path(__file__).resolve().parents[1])
    return list(dict.fromkeys(str(r) for r in roots))


def worker_env() -> dict:
    """This process's environment for a worker: quiet TensorFlow, unbuffered output and
    the same ``hvdtrain`` and ``hvdtrain_bench`` importable (:func:`import_roots`)."""
    path = os.environ.get("PYTHONPATH", "")
    pythonpath = os.pathsep.join(import_roots() + ([path] if path else []))
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)


def kill_group(proc: subprocess.Popen) -> None:
    """Ends a process we started in its own process group, politely first."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _first_failed(procs: list[subprocess.Popen]) -> int | None:
    return next((i for i, p in enumerate(procs) if p.returncode), None)


def run_job(processes: list[Process], out: Path, timeout: float, *,
            what: str = "benchmark job", cwd: str | Path | None = None) -> dict:
    """Starts every process of a job and returns the JSON result it wrote to ``out``.

    Each process runs in its own process group with :func:`worker_env`, its extra
    variables and the launch time (``LAUNCHED_AT_ENV``). The first process to fail ends
    the others at once (a tf.distribute worker would otherwise wait for its dead peer
    until the timeout).

    Args:
        processes: the job's processes, ``(command, extra environment)`` each.
        out: the file the job writes its result to.
        timeout: seconds before the whole job is ended.
        what: the job in words, for the error messages.
        cwd: the processes' working directory (default: this one's).

    Raises:
        RuntimeError: the job timed out, or a process failed, or no result was written;
            with the failing process's command, exit status and the end of its output.
    """
    env0 = worker_env()
    timed_out, failed = False, None
    with tempfile.TemporaryDirectory(prefix="hvdtrain-job-") as logs:
        procs, files = [], []
        try:
            for i, (cmd, extra) in enumerate(processes):
                files.append(open(Path(logs) / f"{i}.log", "w+"))
                env = {**env0, **extra, LAUNCHED_AT_ENV: repr(time.time())}
                procs.append(subprocess.Popen(cmd, stdout=files[-1], stderr=subprocess.STDOUT,
                                              text=True, env=env, cwd=cwd,
                                              start_new_session=True))
            deadline = time.monotonic() + timeout
            while failed is None and [p.poll() for p in procs].count(None):
                failed = _first_failed(procs)
                timed_out = time.monotonic() > deadline
                if timed_out:
                    break
                time.sleep(0.05)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    kill_group(proc)
            outputs = []
            for f in files:
                f.seek(0)
                outputs.append(f.read())
                f.close()
    if timed_out:
        raise RuntimeError(f"{what} timed out after {timeout:g} s: "
                           f"{shlex.join(processes[0][0])}\n{''.join(outputs)[-3000:]}")
    if failed is None:
        failed = _first_failed(procs)
    if failed is not None or not out.is_file():
        i = failed or 0
        raise RuntimeError(f"{what} exited {procs[i].returncode} without a result: "
                           f"{shlex.join(processes[i][0])}\n{outputs[i][-3000:]}")
    return json.loads(out.read_text())


def write_result(result: dict, out: str | None, marker: str) -> None:
    """Prints ``marker`` and ``result`` as JSON on one line, and writes the JSON to
    ``out`` (through a temporary file, so a reader never sees half of it)."""
    line = json.dumps(result)
    if out:
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(line + "\n")
        tmp.replace(out)
    print(marker + line, flush=True)


def shown_command(processes: list[Process],
                  out: str | Path | Sequence[str | Path]) -> str:
    """A job's command as a reader would rerun it from the working directory (where the
    jobs run): one line per process joined by `` & ``, paths below that directory
    relative to it, ``out`` as ``<result.json>`` (several outs: ``<result0.json>``, ...)."""
    root = os.path.join(os.getcwd(), "")
    outs = [out] if isinstance(out, (str, Path)) else list(out)
    names = {str(o): "<result.json>" if len(outs) == 1 else f"<result{i}.json>"
             for i, o in enumerate(outs)}
    lines = []
    for cmd, extra in processes:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
        shown = shlex.join(cmd)
        for path, name in names.items():
            shown = shown.replace(path, name)
        lines.append((env + " " if env else "") + shown.replace(root, ""))
    return " & ".join(lines)

