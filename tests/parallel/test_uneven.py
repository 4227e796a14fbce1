"""Ranks with different amounts of data in Horovod's own front doors (``fit`` and tape
loops), and the collective watchdog there: real 2-rank jobs (workers/uneven_worker.py)."""
import json
import time

import numpy as np
import pytest

from conftest import WORKERS, assert_settings_took_effect, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]
WORKER = str(WORKERS / "uneven_worker.py")


def weights(out, name):
    with np.load(out / name) as w:
        return [w[k] for k in sorted(w, key=lambda k: int(k.split("_")[1]))]


def assert_same_weights(a, b, atol=0.0):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def cut_by_hand(tmp_path_factory):
    """The documented result: the same fit with every rank's data cut to the fewest rows."""
    out = tmp_path_factory.mktemp("cut")
    run_job("horovodrun", 2, [WORKER, "fit", str(out), "--truncate"], timeout=200)
    return out


@pytest.mark.parametrize("launcher,options", [
    ("horovodrun", ["--data", "numpy"]),
    ("mpirun", ["--data", "unknown", "--jit", "--validation"]),
], ids=["numpy-horovodrun", "unknown-cardinality-xla-validation-mpirun"])
def test_uneven_fit_ends_each_epoch_where_the_first_rank_runs_out(tmp_path, cut_by_hand,
                                                                  launcher, options):
    # rank 0 holds 640 examples and rank 1 448: 10 against 7 batches of 64 an epoch
    proc = run_job(launcher, 2, [WORKER, "fit", str(tmp_path), *options], timeout=200)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert_settings_took_effect(ranks)  # hvd.init() of hvdtrain.tensorflow.keras
    assert [r["iterations"] for r in ranks] == [14, 14]  # 7 steps in each of 2 epochs
    assert_same_weights(weights(tmp_path, "rank0.npz"), weights(tmp_path, "rank1.npz"))
    # what the documentation promises: the run with the data cut to 448 rows by hand
    assert_same_weights(weights(tmp_path, "rank0.npz"), weights(cut_by_hand, "rank0.npz"),
                        atol=1e-6 if "--jit" in options else 0.0)
    reference = json.loads((cut_by_hand / "rank0.json").read_text())["history"]["loss"]
    np.testing.assert_allclose(ranks[0]["history"]["loss"], reference, rtol=1e-5)
    text = proc.stdout + proc.stderr
    assert ("the epoch ended after 7 steps, where rank 1 ran out of data; rank 0 left the rest "
            "of its data out of this epoch (rank 0: 7 batches, 448 examples, rank 1: 7 "
            "batches, 448 examples)") in text
    assert "Your input ran out of data" not in text
    if "--validation" in options:  # uneven validation data: each rank evaluates all of its own
        assert ranks[0]["history"]["val_loss"] == ranks[1]["history"]["val_loss"]
        assert all(np.isfinite(ranks[0]["history"]["val_loss"]))


def test_tape_loop_with_join_trains_sparse_gradients_as_join_promises(tmp_path):
    # rank 0 runs 5 steps and rank 1 3, then both join; an embedding makes the gradients
    # sparse (tf.IndexedSlices), which Horovod's own join cannot reduce (it allgathers them)
    run_job("horovodrun", 2, [WORKER, "tape", str(tmp_path), "--rows", "5,3"], timeout=200)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["sparse"] for r in ranks)
    assert [r["last_joined"] for r in ranks] == [0, 0]
    final = weights(tmp_path, "rank0.npz")
    assert_same_weights(final, weights(tmp_path, "rank1.npz"))
    # the job replayed in one process: steps 4 and 5 average rank 0's gradient with zeros
    assert_same_weights(final, weights(tmp_path, "replay.npz"), atol=1e-6)


@pytest.mark.parametrize("launcher,mode,expected", [
    ("horovodrun", "fit-extra",
     "collective 'allreduce in on_epoch_end' waited {s} s on rank 0 (limit 5 s, "
     "HVDTRAIN_COLLECTIVE_TIMEOUT); rank 1 did not arrive: rank 1 waits in 'fit training "
     "step 8'"),
    ("mpirun", "tape-stop",
     "collective 'the gradient exchange' waited {s} s on rank 0 (limit 5 s, "
     "HVDTRAIN_COLLECTIVE_TIMEOUT); rank 1 did not arrive: rank 1 is in no collective (for "),
], ids=["fit-horovodrun", "tape-loop-mpirun"])
def test_watchdog_ends_a_mismatch_in_fit_and_in_a_tape_loop(tmp_path, launcher, mode, expected):
    started = time.time()
    proc = run_job(launcher, 2, [WORKER, mode, str(tmp_path)], timeout=150, check=False,
                   env={"HVDTRAIN_COLLECTIVE_TIMEOUT": "5"})
    took = time.time() - started
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and took < 90, text[-3000:]
    head, tail = expected.split("{s}")
    assert "of 2 stopped by the collective watchdog: " + head in text, text[-3000:]
    assert tail in text, text[-3000:]
