"""hvdtrain.ray: a Trainer run on two Ray workers through Horovod's RayExecutor.

A local two-node Ray cluster (``ray start`` twice, one CPU each) runs
workers/ray_worker.py's training function; the Ray driver runs in its own process, as a
user's script would. Its two ranks must end with the same weights as each other and as the
same training under ``horovodrun -np 2``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import BIN, WORKERS, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]

WORKER = str(WORKERS / "ray_worker.py")
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "ray"), *args], env={**os.environ, **RAY_ENV},
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"ray {' '.join(args)} exited {proc.returncode}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def ray_address():
    """A head node and one more node on this machine, one CPU each; stopped afterwards."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ("--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0",
              "--object-store-memory=100000000", "--disable-usage-stats")
    try:
        _ray("start", "--head", f"--port={port}", "--include-dashboard=false", *common)
        _ray("start", f"--address={address}", *common)
        yield address
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env={**os.environ, **RAY_ENV},
                       capture_output=True, timeout=60)


def test_run_checks_num_workers():
    from hvdtrain import ray as hvd_ray

    with pytest.raises(ValueError, match="num_workers"):
        hvd_ray.run(print, num_workers=0)


def test_missing_ray_names_the_pinned_version(monkeypatch):
    from hvdtrain import ray as hvd_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=f"pip install ray=={hvd_ray.RAY_VERSION}"):
        hvd_ray.run(print, num_workers=2)


def test_pinned_version_is_in_requirements():
    from hvdtrain import ray as hvd_ray

    requirements = (WORKERS.parents[2] / "requirements.txt").read_text().split()
    assert f"ray=={hvd_ray.RAY_VERSION}" in requirements


def test_trainer_on_ray_workers_matches_horovodrun(ray_address, tmp_path):
    ray_out, hvd_out = tmp_path / "ray", tmp_path / "horovodrun"
    ray_out.mkdir()
    hvd_out.mkdir()
    run_job("python", 1, [WORKER, "ray", ray_address, str(ray_out)], timeout=180, env=RAY_ENV)
    on_ray = json.loads((ray_out / "ray.json").read_text())
    run_job("horovodrun", 2, [WORKER, "horovod", str(hvd_out)], timeout=180)
    on_horovodrun = read_ranks(hvd_out, 2)

    assert [(r["rank"], r["size"]) for r in on_ray] == [(0, 2), (1, 2)]  # rank order
    steps = {r["global_step"] for r in on_ray + on_horovodrun}
    assert len(steps) == 1 and steps.pop() > 0, steps
    for other in (on_ray[1], *on_horovodrun):
        for mine, theirs in zip(on_ray[0]["weights"], other["weights"], strict=True):
            np.testing.assert_allclose(np.array(mine), np.array(theirs), rtol=0, atol=1e-5)


def test_a_failing_worker_ends_the_job(ray_address, tmp_path):
    """Rank 1 raises while rank 0 waits for it: the driver gets rank 1's error at once
    (not after its timeout) and the job's workers are ended."""
    run_job("python", 1, [WORKER, "fail", ray_address, str(tmp_path)], timeout=180, env=RAY_ENV)
    got = json.loads((tmp_path / "error.json").read_text())
    assert got["error"] and "rank 1 failed on purpose" in got["error"], got
    assert got["is_value_error"], got
    assert got["seconds"] < 100, got  # run()'s timeout_s is 120
