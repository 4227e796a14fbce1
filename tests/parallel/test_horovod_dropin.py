"""Horovod scripts on Keras 3 with one changed import (``examples/horovod/``), and
hvdtrain.tensorflow's API, on real ``horovodrun`` and ``mpirun`` jobs."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import BIN, ROOT, WORKERS, assert_settings_took_effect, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(900)]
SCRIPTS = ROOT / "examples" / "horovod"
TAPE = str(SCRIPTS / "tensorflow2_tape.py")
FIT = str(SCRIPTS / "tensorflow2_keras_fit.py")
ELASTIC = str(SCRIPTS / "tensorflow2_keras_elastic.py")
BENCH = str(SCRIPTS / "tensorflow2_synthetic_benchmark.py")


def weights(out, rank=0):
    data = np.load(out / f"rank{rank}.npz")
    return [data[k] for k in sorted(data, key=lambda k: int(k.split("_")[1]))]


def assert_same_on_every_rank(out, np_=2):
    first = weights(out, 0)
    for r in range(1, np_):
        for a, b in zip(first, weights(out, r)):
            np.testing.assert_array_equal(a, b)


def assert_close(a_out, b_out, atol):
    for a, b in zip(weights(a_out), weights(b_out)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)


def one_process_at_double_batch(script, out, *extra):
    """``script`` in one process at twice the 2-rank batch (64) and at the rate the 2-rank
    run scales its base rate (0.001) to: the run a 2-rank job must equal."""
    run_job("python", 1, [script, "--batch-size", "64", "--lr", "0.002", "--out", str(out),
                          *extra])
    return out


def test_the_scripts_change_only_the_import_line():
    for script in (TAPE, FIT, ELASTIC, BENCH):
        lines = open(script).read().splitlines()
        assert not [ln for ln in lines if ln.startswith(("import horovod", "from horovod"))]
        imports = [ln for ln in lines if ln.startswith("import hvdtrain")]
        assert len(imports) == 1 and "# was: import horovod.tensorflow" in imports[0]


@pytest.fixture(scope="module")
def tape_reference(tmp_path_factory):
    """The tape loop's one-process reference, shared by both launchers."""
    return one_process_at_double_batch(TAPE, tmp_path_factory.mktemp("tape1"))


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_gradient_tape_loop_matches_one_process_at_double_batch(launcher, tmp_path,
                                                               tape_reference):
    run_job(launcher, 2, [TAPE, "--batch-size", "32", "--out", str(tmp_path)], timeout=300)
    assert_same_on_every_rank(tmp_path)
    assert_close(tmp_path, tape_reference, atol=2e-5)


@pytest.fixture(scope="module")
def fit_runs(tmp_path_factory):
    """2 ranks that start from different weights and a model built at its first batch
    (no warmup, so the mathematics match one process); without and with XLA."""
    runs = {}
    for name, extra, env in (("np2", [], None),
                             ("np2_xla", ["--jit"], {"TF_CPP_MIN_LOG_LEVEL": "0"})):
        out = tmp_path_factory.mktemp(name)
        proc = run_job("horovodrun", 2, [FIT, "--warmup-epochs", "0", "--out", str(out), *extra],
                       timeout=300, env=env)
        runs[name] = (out, proc.stdout + proc.stderr)
    runs["np1"] = (one_process_at_double_batch(FIT, tmp_path_factory.mktemp("np1"),
                                               "--warmup-epochs", "0"), "")
    return runs


def test_fit_with_a_first_batch_model_broadcasts_before_the_first_update(fit_runs):
    out, _ = fit_runs["np2"]
    assert_same_on_every_rank(out)
    # Rank 1 drew other initial weights; rank 0's start reached it before the first update,
    # so the run is the single-process run at double batch.
    assert_close(out, fit_runs["np1"][0], atol=1e-5)
    two = json.loads((out / "rank0.json").read_text())
    one = json.loads((fit_runs["np1"][0] / "rank0.json").read_text())
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-4)


def test_fit_with_xla_compiles_the_step_and_matches_the_run_without(fit_runs):
    out, log = fit_runs["np2_xla"]
    assert "Compiled cluster using XLA" in log
    assert "XLA compiles" in log and "exchange and the update run outside" in log
    assert_same_on_every_rank(out)
    assert_close(out, fit_runs["np2"][0], atol=1e-5)


def test_fit_with_the_usual_callbacks_and_a_rank0_checkpoint_under_mpirun(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_job("mpirun", 2, [FIT, "--epochs", "2", "--warmup-epochs", "1", "--checkpoint-dir",
                          str(ckpt), "--out", str(tmp_path / "out")], timeout=300)
    assert_same_on_every_rank(tmp_path / "out")
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["lr"] == pytest.approx(2 * 1e-3)  # warmed up to the scaled rate
    assert ranks[0]["loss"] == ranks[1]["loss"]  # MetricAverageCallback
    assert ranks[0]["accuracy"] > 0.9
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint-1.keras", "checkpoint-2.keras"]


@pytest.fixture(scope="module")
def elastic_reference(tmp_path_factory):
    """The elastic script's one-process reference, shared by both launchers."""
    return one_process_at_double_batch(ELASTIC, tmp_path_factory.mktemp("elastic1"))


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_elastic_keras_script_trains_every_epoch(launcher, tmp_path, elastic_reference):
    run_job(launcher, 2, [ELASTIC, "--out", str(tmp_path)], timeout=300)
    assert_same_on_every_rank(tmp_path)
    # Ranks drew different weights; the state's sync gave them rank 0's.
    assert_close(tmp_path, elastic_reference, atol=1e-5)
    for r in range(2):
        state = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert state["epoch"] == 3 and state["size"] == 2
        assert state["accuracy"] > 0.9


def test_synthetic_benchmark_runs_and_reports_images_per_second(tmp_path):
    """Under horovodrun only: the other drop-in tests run each launcher."""
    proc = run_job("horovodrun", 2, [BENCH, "--model", "MobileNetV2", "--image-size", "32",
                                 "--batch-size", "8", "--num-warmup-batches", "1",
                                 "--num-batches-per-iter", "2", "--num-iters", "2",
                                 "--fp16-allreduce", "--out", str(tmp_path)], timeout=300)
    assert "Total img/sec on 2 CPU(s)" in proc.stdout
    assert_same_on_every_rank(tmp_path)
    assert json.loads((tmp_path / "rank0.json").read_text())["img_sec"] > 0


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_the_api_on_two_ranks(launcher, tmp_path):
    run_job(launcher, 2, [str(WORKERS / "dropin_worker.py"), str(tmp_path)], timeout=300)
    r0, r1 = read_ranks(tmp_path, 2)
    assert_settings_took_effect([r0, r1])  # hvd.init() of hvdtrain.tensorflow
    assert r0["mpi"] == (launcher == "mpirun") and r0["gloo"] == (launcher == "horovodrun")
    assert (r0["size"], r0["local_size"], r0["cross_size"]) == (2, 2, 1)
    for r in (r0, r1):
        assert r["tape_vs_whole_batch"] < 1e-6
        for name in ("num_groups", "groups", "predivide", "sum"):
            assert r[f"tape_{name}"] < 1e-6, name
        assert r["tape_fp16"] < 1e-2
        assert r["partial_local"] < 1e-7 and r["partial_global"] < 1e-6
        assert (r["min"], r["max"]) == (0.0, 1.0)
        assert r["allgather_object"] == [{"r": 0}, {"r": 1}]
        assert r["broadcast_object"] == {"from": 1}
        assert r["reducescatter"] == [2.0, 2.0]
        assert r["keras_allreduce"] == 1.0
        assert "rank 1 has" in r["mismatch_error"] and "rank 0 has" in r["mismatch_error"]
        np.testing.assert_allclose(r["sync_bn_moving_mean"], r["sync_bn_global_mean"], rtol=1e-5)
        np.testing.assert_allclose(r["sync_bn_moving_var"], r["sync_bn_global_var"], rtol=1e-4)
        assert r["bpps_sum"] < 1e-5
        assert r["tape_own_process_set"] < 1e-7 and r["own_set_size"] == 1
    assert r0["alltoall"] == [0, 10] and r1["alltoall"] == [1, 11]
    assert r0["local_kept_bias"] != r1["local_kept_bias"]  # local_variables: not broadcast
    for key in ("broadcast_sum", "broadcast_graph_sum", "loaded_sum", "local_kept_kernel_sum"):
        assert r0[key] == r1[key], key


def _pids_running(script: str, under: int) -> list[int]:
    """The descendants of process ``under`` whose command line names ``script`` (read from
    /proc): only this test's workers, never those of a test running beside it."""
    parents, cmdlines = {}, {}
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit():
                stat = open(f"/proc/{entry}/stat").read()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
                cmdlines[int(entry)] = open(f"/proc/{entry}/cmdline", "rb").read()
        except OSError:
            pass

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == under:
                return True
        return False

    return [pid for pid, cmd in cmdlines.items() if script.encode() in cmd and descends(pid)]


def _rank_of(pid: int) -> int | None:
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"HOROVOD_RANK="):
            return int(item.split(b"=", 1)[1])
    return None


def test_elastic_keras_script_survives_a_killed_worker(tmp_path):
    """Under Horovod's elastic driver, rank 1 is killed mid-fit: rank 0 rolls back to
    the last commit, goes on alone, and finishes every epoch."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")  # one host name per worker (blacklisting)
    log_path = tmp_path / "horovodrun.log"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           "HVDTRAIN_HOSTS_FILE": str(hosts)}
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(ROOT / "scripts" / "discover_hosts.sh"),
           "--network-interface", "lo", "--gloo-timeout-seconds", "60",
           "--elastic-timeout", "60", sys.executable, ELASTIC, "--epochs", "8",
           "--batches-per-commit", "8", "--out", str(tmp_path / "out")]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while "Epoch 3/" not in log_path.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, \
                    log_path.read_text(errors="replace")[-4000:]
                time.sleep(0.2)
            victims = [pid for pid in _pids_running("tensorflow2_keras_elastic.py", proc.pid)
                       if _rank_of(pid) == 1]
            assert victims, "rank 1's process was not found"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            assert proc.wait(timeout=180) == 0, log_path.read_text(errors="replace")[-4000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    final = json.loads((tmp_path / "out" / "rank0.json").read_text())
    assert "restarting from the last commit" in log_path.read_text(errors="replace")
    assert final["size"] == 1 and final["epoch"] == 8
    assert final["accuracy"] > 0.9
    assert not (tmp_path / "out" / "rank1.json").exists()
