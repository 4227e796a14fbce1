"""No configuration hangs or trains silently wrong, and a preemption loses nothing: real
2-rank jobs under horovodrun and mpirun."""
import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, WORKERS, launch_command, read_ranks, run_job
from hvdtrain.checkpoint import committed, verify
from hvdtrain.preemption import PREEMPTED_EXIT_CODE

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(240)]
WORKER = str(WORKERS / "no_hang_worker.py")


def test_rank_0_only_checkpoint_dir_log_dir_and_stopping_callback(launcher, tmp_path):
    """Horovod's idiom: only rank 0 gets them; rank 0's callback stops every rank."""
    run_job(launcher, 2, [WORKER, "idiom", str(tmp_path)], timeout=120)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["global_step"] == r1["global_step"] == 6  # StopAt, on rank 0 only
    assert r0["weights"] == r1["weights"]
    assert [step for step, _ in committed(str(tmp_path / "ckpt"))] == [6]
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Tensors("loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Tensors("epoch_loss")] == [6]  # the epoch StopAt ended


def test_different_batch_sizes_fail_on_every_rank_naming_them(launcher, tmp_path):
    started = time.time()
    proc = run_job(launcher, 2, [WORKER, "mismatch", str(tmp_path)], timeout=120, check=False)
    assert proc.returncode != 0 and time.time() - started < 60
    for rank in (0, 1):
        assert (f"hvdtrain: rank {rank} of 2 failed: ValueError: the ranks were started with "
                "different settings") in proc.stderr
    assert "batch_size differs across ranks: rank 0 has 8, rank 1 has 4" in proc.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    run_job("horovodrun", 2, [WORKER, "train", str(out)], timeout=150)
    return read_ranks(out, 2)[0]


def test_sigterm_to_one_rank_stops_every_rank_saves_and_resumes_exactly(launcher, tmp_path,
                                                                        uninterrupted):
    signal_at = random.Random().randint(3, 40)  # a random step of the 64
    job = subprocess.Popen(launch_command(launcher, 2, [WORKER, "train", str(tmp_path)]),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            step = (tmp_path / "step1").read_text() if (tmp_path / "step1").exists() else ""
            if step and int(step) >= signal_at:
                os.kill(int((tmp_path / "pid1").read_text()), signal.SIGTERM)
                break
            time.sleep(0.02)
        else:
            pytest.fail("rank 1 never reached the step to signal")
        text, _ = job.communicate(timeout=90)
    finally:
        job.kill()
    stopped = [step for step, _ in committed(str(tmp_path / "ckpt"))][0]
    assert signal_at <= stopped < 64, text[-3000:]
    verify(str(tmp_path / "ckpt" / f"ckpt-{stopped:08d}"))
    assert (f"preempted (SIGTERM on rank 1): every rank stopped after step {stopped}; rank 0 "
            f"saved it in {tmp_path / 'ckpt'}") in text
    if launcher == "horovodrun":  # it reports the ranks' status and exits 1
        assert f"Exit code: {PREEMPTED_EXIT_CODE}" in text
    else:
        assert job.returncode == PREEMPTED_EXIT_CODE
    assert not (tmp_path / "rank0.json").exists()  # the run did not go on to the end

    run_job(launcher, 2, [WORKER, "train", str(tmp_path)], timeout=150)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["restored_from"].endswith(f"ckpt-{stopped:08d}")
    assert r0["global_step"] == uninterrupted["global_step"] == 64
    for resumed, straight in zip(r0["weights"], uninterrupted["weights"]):
        np.testing.assert_allclose(resumed, straight, rtol=1e-5, atol=1e-7)
    assert r0["weights"] == r1["weights"]


@pytest.mark.parametrize("launcher,scenario,expected", [
    # rank 1 stops calling train_on_batch after step 3
    ("horovodrun", "stall",
     "collective 'training step 4' waited {s} s on rank 0 (limit 5 s, "
     "HVDTRAIN_COLLECTIVE_TIMEOUT); rank 1 did not arrive: rank 1 is in no collective "
     "(last step 3"),
    # rank 0 runs a collective of its own while rank 1 trains on
    ("mpirun", "extra",
     "collective 'barrier in main' waited {s} s on rank 0 (limit 5 s, "
     "HVDTRAIN_COLLECTIVE_TIMEOUT); rank 1 did not arrive: rank 1 waits in 'training step 4'"),
], ids=["stall-horovodrun", "extra-mpirun"])  # each under one launcher: the watchdog is ours
def test_watchdog_ends_a_job_whose_ranks_went_different_ways(launcher, tmp_path, scenario,
                                                             expected):
    started = time.time()
    proc = run_job(launcher, 2, [WORKER, scenario, str(tmp_path)], timeout=120, check=False,
                   env={"HVDTRAIN_COLLECTIVE_TIMEOUT": "5"})
    took = time.time() - started
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and took < 60, text[-3000:]
    head, tail = expected.split("{s}")
    assert "stopped by the collective watchdog: " + head in text, text[-3000:]
    assert tail in text
