"""Launch helpers for tests that start real ``horovodrun`` / ``mpirun`` jobs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
BIN = Path(sys.executable).parent
LAUNCHERS = ("horovodrun", "mpirun")


def launch_command(launcher: str, np: int, argv: list[str]) -> list[str]:
    """The command that starts ``python argv...`` on ``np`` local ranks."""
    if launcher == "horovodrun":
        return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                sys.executable, *argv]
    if launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        assert mpirun, "mpirun not found: run `make install`"
        return [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "--tag-output", "-np", str(np), "-x", "PATH", sys.executable, *argv]
    if launcher == "python":
        return [sys.executable, *argv]
    raise ValueError(launcher)


def run_job(launcher: str, np: int, argv: list[str], *, timeout: float = 240,
            check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs a job to completion; a hang fails through ``timeout``. ``env`` adds to (or
    overrides) the environment, ``TF_CPP_MIN_LOG_LEVEL=2`` included; a variable given as
    ``None`` is removed."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    proc = subprocess.run(launch_command(launcher, np, argv), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{launcher} -np {np} {argv} exited {proc.returncode}\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n"
                             f"--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def read_ranks(out_dir: Path, np: int) -> list[dict]:
    """The ``rank<R>.json`` results every rank wrote, in rank order."""
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(np)]


def assert_settings_took_effect(ranks: list[dict]) -> None:
    """What ``workers/init_settings.py`` recorded on each rank: ``init()`` left TensorFlow
    unstarted, TensorFlow accepted every thread and device setting made after it, and runs
    with them."""
    for r in ranks:
        got = r["settings"]
        assert not got["context_started_by_init"], f"rank {r['rank']}: init() started TensorFlow"
        assert got["refused"] == {}, f"rank {r['rank']}: TensorFlow refused {got['refused']}"
        assert got["context_started"] and got["watchdog"], "TensorFlow or the watchdog is not on"
        for name, value in got["wanted"].items():
            assert got[name] == value, f"rank {r['rank']}: {name} is {got[name]}, set {value}"


@pytest.fixture(params=LAUNCHERS)
def launcher(request) -> str:
    """Each test using it runs once under horovodrun (Gloo) and once under mpirun."""
    return request.param


#: Test files that create the same network-namespace hosts (scripts/netns_hosts.sh):
#: they must not run at the same time.
_NETNS_FILES = ("test_multihost.py", "test_backend_bench.py", "test_slurm.py",
                "test_link_bench.py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups, however pytest was called
def pytest_collection_modifyitems(config, items):
    """With ``pytest -n N --dist loadgroup`` (``make test``), keeps each test file on one
    worker (module-scoped fixtures run once) and the namespace tests on the same worker.
    This hook sees every collected item, the unit tests' too."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("netns" if name in _NETNS_FILES else name))
