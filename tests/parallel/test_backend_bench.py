"""``hvdtrain bench-backends``: every backend trains the same model in one run, with real
processes (horovodrun, mpirun, TF_CONFIG workers, a parameter-server cluster, and mpirun
across network-namespace hosts). A smoke test of the plumbing: a few steps per backend,
and no speed is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain_bench import backends as backend_bench

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.parallel
STEPS = 3


def _cli(*args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "hvdtrain.cli", "bench-backends", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _namespaces_allowed() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["ip", "netns", "add", "hvdtprobe"], capture_output=True)
    subprocess.run(["ip", "netns", "delete", "hvdtprobe"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.timeout(900)
def test_every_backend_trains_the_same_model_in_one_run():
    backends = list(backend_bench.BACKENDS) + (["multihost"] if _namespaces_allowed() else [])
    proc = _cli("--np", "2", "--steps", str(STEPS), "--warmup", "1", "--json",
                "--backends", *backends)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = {r["backend"]: r for r in report["results"]}
    assert list(rows) == backends
    base = rows["horovod_gloo"]["samples_per_s"]
    for name, row in rows.items():
        assert row["workers"] == 2, name
        assert row["samples_per_s"] > 0 and row["elapsed_s"] > 0, name
        assert row["samples_per_s"] == pytest.approx(128 * 2 * STEPS / row["elapsed_s"]), name
        assert row["ratio_over_horovod_gloo"] == pytest.approx(row["samples_per_s"] / base)
        assert row["final_loss"] == row["final_loss"], f"{name}: the loss is NaN"
    cmds = report["commands"]
    assert "horovodrun -np 2" in cmds["horovod_gloo"] and "--gloo" in cmds["horovod_gloo"]
    assert "mpirun" in cmds["horovod_mpi"]
    assert cmds["multi_worker_mirrored"].count("TF_CONFIG=") == 2
    assert "launch_ps.py --ps 1 --workers 2" in cmds["parameter_server"]
    assert "--devices 2" in cmds["mirrored"]
    for name in ("mirrored", "multi_worker_mirrored", "parameter_server"):
        assert f"-m hvdtrain_bench --worker --strategy {name} --steps {STEPS}" in cmds[name]
    assert "-m hvdtrain_bench --worker --mode trainer" in cmds["horovod_mpi"]
    assert report["config"]["steps"] == STEPS and report["config"]["np"] == 2
    if "multihost" in rows:
        assert "plm_rsh_agent" in cmds["multihost"] and "btl_tcp_if_include hvdt0" in cmds["multihost"]
        leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "hvdtn" not in leftovers


def test_an_unknown_backend_is_refused_by_name():
    proc = _cli("--backends", "horovod_tcp", timeout=60)
    assert proc.returncode == 2 and "horovod_tcp" in proc.stderr
    with pytest.raises(ValueError, match="backends must be drawn from"):
        backend_bench.run_backends(["ring"])
