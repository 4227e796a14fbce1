"""MultiWorkerMirroredStrategy: two real worker processes on 127.0.0.1 with TF_CONFIG."""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, WORKERS, read_ranks

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(400)]
WORKER = str(WORKERS / "tfdist_worker.py")


def _ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_workers(argv, n=2, env=None):
    """Starts ``n`` workers of ``python argv...`` with their TF_CONFIG on 127.0.0.1 (and
    ``env`` on top of this process's environment); returns their Popen objects (output
    in ``stdout``, stderr merged)."""
    hosts = [f"127.0.0.1:{p}" for p in _ports(n)]
    procs = []
    for i in range(n):
        worker_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                      "TF_CONFIG": json.dumps({"cluster": {"worker": hosts},
                                               "task": {"type": "worker", "index": i}}),
                      **(env or {})}
        procs.append(subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=worker_env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def finish_workers(procs, timeout=240):
    """Waits for the workers (killing any still running after ``timeout`` seconds, which
    then raises ``subprocess.TimeoutExpired``); returns (exit codes, outputs)."""
    start, outputs = time.monotonic(), []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1, timeout - (time.monotonic() - start)))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], outputs


def run_workers(argv, n=2, timeout=240, env=None):
    """Runs ``n`` workers to their end (see :func:`start_workers`); returns (exit codes,
    outputs, seconds). A hang fails through ``timeout``."""
    start = time.monotonic()
    codes, outputs = finish_workers(start_workers(argv, n, env), timeout)
    return codes, outputs, time.monotonic() - start


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def test_two_workers_match_one_process_with_double_batch(tmp_path):
    codes, outputs, _ = run_workers([WORKER, "parity", str(tmp_path / "mw"), "--batch-size", "16",
                                     "--strategy", "multi_worker_mirrored",
                                     "--checkpoint", str(tmp_path / "ckpt")])
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    single = subprocess.run([sys.executable, WORKER, "parity", str(tmp_path / "one"),
                             "--batch-size", "32"], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert single.returncode == 0, single.stderr[-3000:]
    w0, w1 = read_ranks(tmp_path / "mw", 2)
    (one,) = read_ranks(tmp_path / "one", 1)
    assert w0["strategy"] == "CollectiveAllReduceStrategy"
    assert (w0["size"], w0["num_workers"], w1["rank"]) == (2, 2, 1)
    assert w0["global_step"] == w1["global_step"] == one["global_step"] == 16
    assert _max_diff(w0["weights"], w1["weights"]) == 0.0
    assert _max_diff(w0["weights"], one["weights"]) < 1e-5
    assert w0["val_acc"] == pytest.approx(w0["val_acc_expected"], abs=1e-6)
    # Only the chief logs and keeps checkpoints.
    assert "[hvdtrain] step 16" in outputs[0] and "[hvdtrain] step" not in outputs[1]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-16"))
    assert not list((tmp_path / "ckpt").glob("*worker1*"))


def test_uneven_shards_take_the_same_steps(tmp_path):
    codes, outputs, _ = run_workers([WORKER, "uneven", str(tmp_path), "--batch-size", "16",
                                     "--strategy", "multi_worker_mirrored"])
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    w0, w1 = read_ranks(tmp_path, 2)
    # 203 examples: shards of 102 and 101 -> 6 full batches of 16 on each, 2 epochs.
    assert w0["steps_per_epoch"] == w1["steps_per_epoch"] == 6
    assert w0["global_step"] == w1["global_step"] == 12


def test_a_worker_that_dies_ends_the_other_promptly(tmp_path):
    codes, outputs, seconds = run_workers(
        [WORKER, "parity", str(tmp_path), "--batch-size", "16", "--strategy",
         "multi_worker_mirrored", "--die-at", "5"], timeout=200)
    assert codes[1] == 3 and "worker 1 dies at step 5" in outputs[1]
    assert codes[0] != 0
    # hvdtrain names the worker that no longer answers (TensorFlow's error may only say
    # "Connection reset by peer"), with TensorFlow's own first line
    assert "failed on worker 0: worker 1 at 127.0.0.1:" in outputs[0], outputs[0][-2000:]
    assert "no longer answer" in outputs[0]
    assert seconds < 120
    assert not (tmp_path / "rank0.json").exists()


def test_mnist_example_under_multi_worker_mirrored(tmp_path):
    metrics = tmp_path / "metrics.json"
    codes, outputs, _ = run_workers(
        ["examples/mnist.py", "--strategy", "multi_worker_mirrored", "--dataset", "fashion_mnist",
         "--epochs", "1", "--max-steps", "150", "--batch-size", "64", "--log-step-size", "50",
         "--metrics-out", str(metrics)], timeout=300)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    result = json.loads(metrics.read_text())
    assert result["world_size"] == 2 and result["strategy"] == "multi_worker_mirrored"
    assert result["global_step"] == 150 and result["global_batch"] == 128
    # Data parallel with Horovod reaches ~0.83 after 150 steps of this setting.
    assert result["test_accuracy"] > 0.78


def test_a_stop_asked_by_one_worker_stops_both_at_the_same_step(tmp_path):
    codes, outputs, _ = run_workers([WORKER, "parity", str(tmp_path), "--batch-size", "16",
                                     "--strategy", "multi_worker_mirrored", "--stop-at", "5"])
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    w0, w1 = read_ranks(tmp_path, 2)
    assert w0["global_step"] == w1["global_step"] == 5
    assert len(w0["losses"]) == len(w1["losses"]) == 5
    assert _max_diff(w0["weights"], w1["weights"]) == 0.0
