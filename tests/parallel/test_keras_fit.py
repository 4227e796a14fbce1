"""Keras model.fit made data-parallel by hvdtrain.keras, on real 2-rank jobs."""
import json

import numpy as np
import pytest

from conftest import ROOT, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(600)]
EXAMPLE = str(ROOT / "examples" / "distributed_training" / "keras_mnist.py")


def test_keras_fit_two_ranks_identical_weights_and_same_accuracy(tmp_path):
    # 2 epochs: the first warms the learning rate up, the second trains at the scaled rate.
    run_job("horovodrun", 2, [EXAMPLE, "--epochs", "2", "--metrics-out", str(tmp_path / "np2.json"),
                              "--weights-out", str(tmp_path / "w2")], timeout=400)
    run_job("python", 1, [EXAMPLE, "--epochs", "2", "--metrics-out", str(tmp_path / "np1.json")],
            timeout=300)
    two = json.loads((tmp_path / "np2.json").read_text())
    one = json.loads((tmp_path / "np1.json").read_text())
    w0, w1 = np.load(tmp_path / "w2" / "rank0.npz"), np.load(tmp_path / "w2" / "rank1.npz")
    assert list(w0) == list(w1)
    for k in w0:
        np.testing.assert_array_equal(w0[k], w1[k])
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["global_batch"] == 2 * one["global_batch"]
    assert two["final_lr"] == pytest.approx(2 * 1e-3)  # linear scaling after the warmup
    assert two["test_accuracy"] > 0.8
    assert abs(two["test_accuracy"] - one["test_accuracy"]) <= 0.01


def test_keras_fit_under_mpirun(tmp_path):
    run_job("mpirun", 2, [EXAMPLE, "--epochs", "1", "--metrics-out", str(tmp_path / "m.json"),
                          "--weights-out", str(tmp_path / "w")], timeout=300)
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["world_size"] == 2 and m["test_accuracy"] > 0.75
    w0, w1 = np.load(tmp_path / "w" / "rank0.npz"), np.load(tmp_path / "w" / "rank1.npz")
    for k in w0:
        np.testing.assert_array_equal(w0[k], w1[k])
