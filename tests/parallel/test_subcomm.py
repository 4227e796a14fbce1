"""Two Trainers in one ``mpirun`` job, each on its own sub-communicator
(``hvdtrain.init(comm=...)``): a sweep of two learning rates on ``COMM_WORLD.Split(rank % 2)``.
"""
import json
import time

import numpy as np
import pytest

from conftest import WORKERS, run_job
from hvdtrain.checkpoint import committed

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(240)]
WORKER = str(WORKERS / "subcomm_worker.py")
DEADLINE_S = 60


def _results(out, np_):
    return [json.loads((out / f"world{r}.json").read_text()) for r in range(np_)]


def _weights(result, key="weights"):
    return [np.asarray(w) for w in result[key]]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The 4-rank sweep, run once: (results in world-rank order, the job's output, out dir)."""
    out = tmp_path_factory.mktemp("subcomm-sweep")
    proc = run_job("mpirun", 4, [WORKER, "sweep", str(out)], timeout=200)
    return _results(out, 4), proc.stdout + proc.stderr, out


def test_each_sub_job_trains_among_its_own_ranks(sweep):
    results, _, _ = sweep
    jobs = {0: [results[0], results[2]], 1: [results[1], results[3]]}
    for colour, (first, second) in jobs.items():
        members = [colour, colour + 2]
        # Horovod's ranks are the sub-job's; hvdtrain knows the world ranks behind them.
        assert [first["rank"], second["rank"]] == [0, 1]
        assert first["size"] == second["size"] == 2 and first["local_size"] == 2
        assert first["world_ranks"] == second["world_ranks"] == members
        # The cores are shared among all 4 processes on the host, not the sub-job's 2.
        assert first["host_processes"] == second["host_processes"] == 4
        # 256 examples, batch 16, 2 epochs over 2 ranks: 16 steps; lr scaled by 2, not 4.
        assert first["global_step"] == second["global_step"] == 16
        assert first["lr"] == second["lr"] == pytest.approx((0.05, 0.02)[colour] * 2)
        for a, b in zip(_weights(first), _weights(second)):
            np.testing.assert_array_equal(a, b)
        assert first["loss"][-1] < first["loss"][0]
        # Each sub-job's watchdog has its own server, which its ranks report to.
        assert first["watchdog"] == second["watchdog"]
    assert jobs[0][0]["watchdog"][1] != jobs[1][0]["watchdog"][1]
    # The two learning rates trained two different networks.
    assert any(not np.allclose(a, b)
               for a, b in zip(_weights(results[0]), _weights(results[1])))


def test_each_sub_job_checkpoints_and_logs_on_its_own(sweep):
    results, text, out = sweep
    for colour in (0, 1):
        folder = out / f"ckpt{colour}"
        assert [step for step, _ in committed(str(folder))] == [16]
        assert list((out / f"logs{colour}").rglob("events.out.tfevents*"))
        for r in (colour, colour + 2):
            # A second Trainer resumed from its own sub-job's checkpoint: the same weights.
            assert results[r]["restored_from"] == str(folder / "ckpt-00000016")
            assert results[r]["restored_step"] == 16
            for a, b in zip(_weights(results[r]), _weights(results[r], "restored_weights")):
                np.testing.assert_array_equal(a, b)
        # Each sub-job's rank 0 logs, under a prefix naming its world ranks.
        label = f"world ranks {colour}, {colour + 2} of 4"
        assert f"[hvdtrain {label}] strategy='horovod': 2 ranks (a sub-communicator: " \
               f"{label})" in text
        assert f"[hvdtrain {label}] saved checkpoint {folder / 'ckpt-00000016'}" in text


def test_a_sub_job_trains_as_the_same_trainer_alone_on_two_ranks(sweep, tmp_path):
    """Sub-job 0 (world ranks 0 and 2) shards, scales and broadcasts exactly as a plain
    2-rank job: anything read from the world (rank 2, size 4) would change its weights."""
    run_job("mpirun", 2, [WORKER, "alone", str(tmp_path)], timeout=150)
    alone, split = _results(tmp_path, 2)[0], sweep[0][0]
    assert alone["world_ranks"] is None and alone["host_processes"] == 2
    assert split["global_step"] == alone["global_step"]
    assert split["loss"] == pytest.approx(alone["loss"], rel=1e-6)
    for a, b in zip(_weights(split), _weights(alone)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_failure_in_one_sub_job_ends_the_whole_job_naming_its_world_rank(tmp_path):
    proc = run_job("mpirun", 4, [WORKER, "fail", str(tmp_path)], timeout=200, check=False)
    exit_after = time.time() - float((tmp_path / "fault_time").read_text())
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert exit_after < DEADLINE_S
    assert ("hvdtrain: rank 1 of 2 (world rank 3; sub-communicator of world ranks 1, 3 of 4) "
            "failed: RuntimeError: sub-job 1 fails on purpose") in text


def test_gloo_which_would_ignore_comm_refuses_it(tmp_path):
    """Horovod's Gloo controller starts on every rank whatever ``comm`` says: a sweep
    would silently become one job, so ``init(comm=...)`` fails there, naming mpirun."""
    proc = run_job("horovodrun", 2, [WORKER, "gloo", str(tmp_path)], timeout=150, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "failed: ValueError: hvdtrain.init(comm=...) needs Horovod's MPI controller " \
           "(launch with mpirun" in text
