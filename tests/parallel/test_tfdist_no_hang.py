"""test_no_hang.py's cases under MultiWorkerMirroredStrategy: two real worker processes
on 127.0.0.1 (TF_CONFIG). The settings agree before the first step (rank 0's checkpoint
settings and stopping callback are the job's, a mismatch fails on both), and SIGTERM to
one worker stops both after the same step, saves, and resumes exactly."""
import os
import random
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import WORKERS, read_ranks
from hvdtrain.preemption import PREEMPTED_EXIT_CODE
from test_tfdist_parallel import finish_workers, run_workers, start_workers

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(240)]
WORKER = str(WORKERS / "no_hang_worker.py")
STRATEGY = "multi_worker_mirrored"
TOTAL_STEPS = 64  # scenario train: 512 examples, 2 workers, batch 8, 2 epochs


def _job(scenario, out, timeout):
    """Runs the scenario on two workers; returns (exit codes, outputs, seconds)."""
    return run_workers([WORKER, scenario, str(out), STRATEGY], timeout=timeout)


def _both(outputs):
    return "\n".join(f"--- worker {i} ---\n{o[-3000:]}" for i, o in enumerate(outputs))


def test_worker_0_only_checkpoint_dir_log_dir_and_stopping_callback(tmp_path):
    """Horovod's idiom: only worker 0 gets them; worker 0's callback stops both."""
    codes, outputs, _ = _job("idiom", tmp_path, timeout=90)
    assert codes == [0, 0], _both(outputs)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["global_step"] == r1["global_step"] == 6  # StopAt, on worker 0 only
    assert r0["weights"] == r1["weights"]
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("ckpt-6")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Tensors("loss")] == [1, 2, 3, 4, 5, 6]


def test_different_batch_sizes_fail_on_both_workers_naming_them(tmp_path):
    codes, outputs, seconds = _job("mismatch", tmp_path, timeout=60)
    assert codes[0] != 0 and codes[1] != 0 and seconds < 45, _both(outputs)
    for text in outputs:
        assert "ValueError: the ranks were started with different settings" in text, _both(outputs)
        assert "batch_size differs across ranks: rank 0 has 8, rank 1 has 4" in text
    assert not list(tmp_path.glob("rank*.json"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    codes, outputs, _ = _job("train", out, timeout=90)
    assert codes == [0, 0], _both(outputs)
    return read_ranks(out, 2)[0]


def _signal_worker_1_at(out, step, procs, timeout=60):
    """Sends SIGTERM to worker 1 once it reported ``step`` (or a later one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reported = (out / "step1").read_text() if (out / "step1").exists() else ""
        if reported and int(reported) >= step:
            os.kill(int((out / "pid1").read_text()), signal.SIGTERM)
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    pytest.fail(f"worker 1 never reached step {step}")


def test_sigterm_to_one_worker_stops_both_saves_and_resumes_exactly(tmp_path, uninterrupted):
    signal_at = random.Random().randint(3, 40)  # a random step of the 64, in either epoch
    procs = start_workers([WORKER, "train", str(tmp_path), STRATEGY])
    try:
        _signal_worker_1_at(tmp_path, signal_at, procs)
    finally:
        codes, outputs = finish_workers(procs, timeout=60)
    ckpt = str(tmp_path / "ckpt")
    latest = tf.train.latest_checkpoint(ckpt)
    assert latest, f"signalled at step {signal_at}\n{_both(outputs)}"
    stopped = int(latest.rpartition("-")[2])
    assert signal_at <= stopped < TOTAL_STEPS, _both(outputs)
    assert codes == [PREEMPTED_EXIT_CODE] * 2, _both(outputs)
    assert (f"preempted (SIGTERM on rank 1): every rank stopped after step {stopped}; rank 0 "
            f"saved it in {ckpt}") in outputs[0], _both(outputs)
    assert "rank 1 received SIGTERM" in outputs[1]
    assert not list(tmp_path.glob("rank*.json"))  # the run did not go on to the end

    codes, outputs, _ = _job("train", tmp_path, timeout=90)
    assert codes == [0, 0], _both(outputs)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["restored_from"] == r1["restored_from"] == latest
    assert r0["global_step"] == r1["global_step"] == uninterrupted["global_step"] == TOTAL_STEPS
    for resumed, straight in zip(r0["weights"], uninterrupted["weights"]):
        np.testing.assert_allclose(resumed, straight, rtol=1e-5, atol=1e-7)
    assert r0["weights"] == r1["weights"]
