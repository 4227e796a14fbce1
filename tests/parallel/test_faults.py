"""Faults on one rank of a real 2-rank job end the whole job promptly: never a hang."""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import WORKERS, read_ranks, run_job
from hvdtrain.checkpoint import committed, verify

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(180)]
WORKER = str(WORKERS / "fault_worker.py")
DEADLINE_S = 60


def run_fault(launcher, scenario, out, env=None):
    proc = run_job(launcher, 2, [WORKER, scenario, str(out)], timeout=150, check=False,
                   env=env)
    exit_after = time.time() - float((out / "fault_time").read_text())
    return proc, proc.stdout + proc.stderr, exit_after


def checkpoints_intact(out):
    found = committed(str(out / "ckpt"))
    assert found, "no checkpoint was written before the fault"
    for _, folder in found:
        verify(folder)
    return [step for step, _ in found]


def test_exception_on_one_rank_ends_every_rank(launcher, tmp_path):
    proc, text, exit_after = run_fault(launcher, "raise", tmp_path)
    assert proc.returncode != 0
    assert exit_after < DEADLINE_S
    assert "hvdtrain: rank 1 of 2 failed: RuntimeError: boom at step 5" in text
    # the last checkpoint before the fault (step 4) is intact and nothing later exists
    assert checkpoints_intact(tmp_path)[0] == 4


def test_sigkill_on_one_rank_ends_the_job(launcher, tmp_path):
    proc, text, exit_after = run_fault(launcher, "sigkill", tmp_path)
    assert proc.returncode != 0
    assert exit_after < DEADLINE_S
    expected = {"horovodrun": "Process 1 exit with status code 137",
                "mpirun": "exited on signal 9 (Killed)"}[launcher]
    assert expected in text
    assert checkpoints_intact(tmp_path)[0] == 4


def test_a_frozen_rank_ends_the_job_naming_it_its_host_and_pid(launcher, tmp_path):
    """Rank 1 stops itself (SIGSTOP) at step 5: neither failing nor exiting. Under Gloo its
    transport times out first (30 s) and the message names the silent rank from the
    watchdog's reports; under MPI, which waits for ever, the liveness check ends it
    (20 s here to keep the suite short; the default 60 s is measured in the README)."""
    proc, text, exit_after = run_fault(launcher, "sigstop", tmp_path,
                                       env={"HVDTRAIN_LIVENESS_TIMEOUT": "20"})
    try:
        assert proc.returncode != 0 and exit_after < DEADLINE_S, (exit_after, text[-3000:])
        pid = int((tmp_path / "fault_pid").read_text())
        assert re.search(rf"hvdtrain: rank 0 of 2 stopped.*rank 1 of 2 \(host [^,]+, pid {pid}\) "
                         r"has not reported for \d+ s .*frozen.* or cut off", text), text[-3000:]
        deadline = time.monotonic() + 15  # the launcher's kill may take a moment to land
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(f"/proc/{pid}"), "the frozen rank outlived the job by 15 s"
    finally:
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
    assert checkpoints_intact(tmp_path)[0] == 4


@pytest.mark.parametrize("launcher,door", [("horovodrun", "fit"), ("mpirun", "tape")])
def test_a_frozen_rank_in_fit_or_a_tape_loop_is_named(launcher, door, tmp_path):
    """The same freeze through the other front doors (fit via hvdtrain.tensorflow.keras
    under Gloo, whose transport times out; a DistributedGradientTape loop under MPI, which
    the liveness check ends): rank 0 names rank 1, its host and pid."""
    proc = run_job(launcher, 2, [WORKER, "sigstop", str(tmp_path), door], timeout=150,
                   check=False, env={"HVDTRAIN_LIVENESS_TIMEOUT": "20"})
    text, pid = proc.stdout + proc.stderr, int((tmp_path / "fault_pid").read_text())
    try:
        exit_after = time.time() - float((tmp_path / "fault_time").read_text())
        assert proc.returncode != 0 and exit_after < DEADLINE_S, (exit_after, text[-3000:])
        assert re.search(rf"hvdtrain: rank 0 of 2 stopped.*rank 1 of 2 \(host [^,]+, pid {pid}\) "
                         r"has not reported for \d+ s .*frozen.* or cut off", text), text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the frozen rank, if the launcher left it
            os.kill(pid, signal.SIGKILL)


def test_nan_loss_on_one_rank_stops_every_rank(launcher, tmp_path):
    proc, text, exit_after = run_fault(launcher, "nan", tmp_path)
    assert proc.returncode != 0 and exit_after < DEADLINE_S
    for rank in (0, 1):
        assert (f"hvdtrain: rank {rank} of 2 failed: FloatingPointError: non-finite loss at "
                "step 5 on rank(s) [1]") in text
    assert checkpoints_intact(tmp_path)[0] == 4


def test_nan_loss_can_be_skipped(tmp_path):
    run_job("horovodrun", 2, [WORKER, "nan_skip", str(tmp_path)], timeout=150)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["skipped_steps"] == r1["skipped_steps"] == 3  # the poisoned batch, once an epoch
    assert r0["global_step"] == r1["global_step"] == 3 * 32
    assert r0["weights"] == r1["weights"]
    assert "nan" not in json.dumps(r0["weights"]).lower()


def test_ranks_with_different_models_fail_at_the_broadcast(launcher, tmp_path):
    proc, text, exit_after = run_fault(launcher, "models", tmp_path)
    assert proc.returncode != 0 and exit_after < DEADLINE_S
    for rank in (0, 1):
        assert (f"hvdtrain: rank {rank} of 2 failed: ValueError: the ranks built different models"
                in text)
    assert "rank 1 has sequential/dense/kernel (4, 9) float32 where rank 0 has " \
           "sequential/dense/kernel (4, 8) float32" in text


def test_a_nan_or_inf_record_on_one_rank_stops_every_front_door_naming_it(tmp_path):
    """One job, one bad record in rank 1's in-memory data per run (a ReLU MLP, whose loss
    can stay finite while its gradients are not): the Trainer (NaN, Inf), a
    DistributedGradientTape loop (NaN) and fit via hvdtrain.tensorflow.keras (Inf, then
    NaN, which ends the job) each stop at the poisoned step by default, name rank 1, and
    leave the weights as they were before it, equal on both ranks."""
    proc, text, exit_after = run_fault("horovodrun", "bad_records", tmp_path)
    assert proc.returncode != 0 and exit_after < DEADLINE_S, text[-3000:]
    found = [json.loads((tmp_path / f"bad_records{r}.json").read_text()) for r in (0, 1)]
    for run in found:
        for kind in ("trainer_nan", "trainer_inf"):
            assert re.search(r"non-finite (loss|gradients) at step 5 on rank\(s\) \[1\]"
                             r".* \(epoch 1, batch 5 of each rank's shard\)",
                             run[kind]["error"] or ""), run[kind]
        # the NaN feature through a ReLU: a finite loss, non-finite gradients
        assert "non-finite gradients at step 5 on rank(s) [1]" in run["trainer_nan"]["error"]
        assert "hvdtrain: non-finite gradients on rank(s) [1]" in (run["tape_nan"]["error"] or
                                                                   ""), run["tape_nan"]
        assert run["tape_nan"]["steps_done"] == 4
        assert re.search(r"hvdtrain: non-finite gradients at step 5 on rank\(s\) \[1\]; the "
                         r"update was not applied .*; it was batch 5 of epoch 1 on each rank",
                         run["fit_inf"]["error"] or ""), run["fit_inf"]
        assert run["fit_inf"]["iterations"] == 4, run["fit_inf"]  # the stopped step not counted
        for kind in ("trainer_nan", "trainer_inf", "tape_nan", "fit_inf"):
            assert run[kind]["finite"], (kind, run[kind])
    for kind in ("trainer_nan", "trainer_inf", "tape_nan", "fit_inf"):
        assert found[0][kind]["sum"] == found[1][kind]["sum"], kind
    for rank in (0, 1):
        assert (f"hvdtrain: rank {rank} of 2 failed: FloatingPointError: hvdtrain: non-finite "
                "gradients at step 5 on rank(s) [1]") in text, text[-3000:]
