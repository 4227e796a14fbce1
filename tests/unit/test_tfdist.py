"""The tf.distribute backends in one process: MirroredStrategy over 2 logical CPU devices
(in a subprocess, since logical devices must exist before TensorFlow starts), and the
Trainer's checks of what these backends do not support."""
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.backends import tfdist

pytestmark = pytest.mark.timeout(300)
WORKER = Path(__file__).resolve().parents[1] / "parallel" / "workers" / "tfdist_worker.py"


def _run(out: Path, *args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(WORKER), "parity", str(out), *args],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("one"), "--batch-size", "32", "--devices", "1")


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def test_two_mirrored_replicas_match_one_device_with_double_batch(tmp_path, single):
    two = _run(tmp_path, "--batch-size", "16", "--devices", "2")
    assert two["size"] == 2 and single["size"] == 1
    assert two["variable_types"] == ["MirroredVariable"]
    # 256 examples, global batch 32, 2 epochs -> 16 steps either way.
    assert two["global_step"] == single["global_step"] == 16
    assert _max_diff(two["weights"], single["weights"]) < 1e-5
    np.testing.assert_allclose(two["losses"], single["losses"], rtol=1e-5)
    assert two["losses"][-1] < two["losses"][0]
    # The validation metric is the mean over the whole validation set (101 examples,
    # split unevenly over the replicas).
    assert two["val_acc"] == pytest.approx(two["val_acc_expected"], abs=1e-6)


def test_mirrored_resume_gives_the_uninterrupted_weights(tmp_path, single):
    ckpt = tmp_path / "ckpt"
    first = _run(tmp_path / "a", "--batch-size", "16", "--devices", "2",
                 "--checkpoint", str(ckpt), "--max-iteration", "20")
    assert first["global_step"] == 10 and first["restored_from"] is None
    second = _run(tmp_path / "b", "--batch-size", "16", "--devices", "2",
                  "--checkpoint", str(ckpt))
    assert second["restored_from"].endswith("ckpt-10")
    assert second["global_step"] == 16 and len(second["losses"]) == 6
    assert _max_diff(second["weights"], single["weights"]) < 1e-5


@pytest.mark.parametrize("kwargs, words", [
    ({"compression": "fp16"}, "compression only work(s) with strategy='horovod'"),
    ({"op": "sum"}, "op only work"),
    ({"backward_passes_per_step": 2}, "backward_passes_per_step only work"),
    ({"mixed_precision": "mixed_float16"}, "mixed_precision only work"),
    ({"nan_policy": "skip"}, "nan_policy only work"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"max_iteration": 0}, "max_iteration must be a positive number"),
])
def test_unsupported_or_bad_arguments_are_named(dataset, build, kwargs, words):
    kwargs = {"batch_size": 8, **kwargs}
    with pytest.raises(ValueError) as err:
        hvdtrain.Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1},
                         strategy=tf.distribute.MirroredStrategy(), **kwargs)
    assert words in str(err.value)


def test_data_of_unknown_length_and_too_little_data_are_refused(dataset, build):
    strategy = tf.distribute.MirroredStrategy()
    with pytest.raises(ValueError, match="known, finite length"):
        hvdtrain.Trainer(dataset.filter(lambda x, y: y >= 0), build, "sgd",
                         {"learning_rate": 0.1}, strategy=strategy)
    with pytest.raises(ValueError, match="too few for one step"):
        hvdtrain.Trainer(dataset.take(3), build, "sgd", {"learning_rate": 0.1},
                         batch_size=8, strategy=strategy)


def test_strategy_names_are_checked():
    with pytest.raises(ValueError, match="strategy must be one of 'horovod', 'mirrored'"):
        hvdtrain.Trainer(None, strategy="mirroed")
    with pytest.raises(ValueError, match="strategy name must be one of"):
        tfdist.get_strategy("horovod")
    with pytest.raises(ValueError, match="devices must be None or a positive integer"):
        tfdist.get_strategy("mirrored", devices=0)


def test_multi_worker_mirrored_without_tf_config_says_what_is_missing(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs TF_CONFIG"):
        tfdist.get_strategy("multi_worker_mirrored")


def test_multi_worker_mirrored_after_tensorflow_started_says_what_to_do(tmp_path):
    script = ("import numpy as np, tensorflow as tf\n"
              "tf.constant(1.0)\n"
              "from hvdtrain import tfdist\n"
              "tfdist.get_strategy('multi_worker_mirrored')\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
         "task": {"type": "worker", "index": 0}}))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode != 0
    assert "get_strategy('multi_worker_mirrored') at the top of the program" in proc.stderr


def test_a_trained_mirrored_model_on_one_device_learns(dataset, build):
    trainer = hvdtrain.Trainer(dataset, build, keras.optimizers.Adam, {"learning_rate": 0.05},
                               batch_size=16, num_epochs=5, strategy=tf.distribute.MirroredStrategy(),
                               validation_dataset=dataset, log_step_size=1000)
    first = float(trainer.train_on_batch()["loss"])
    trainer.train_to_end()
    assert trainer.global_step == 5 * (96 // 16)
    metrics = dict(trainer.validation_metrics)
    assert metrics["loss"] < first and metrics["acc"] > 0.8
    assert trainer.session.should_stop()
    with pytest.raises(RuntimeError, match="training has ended"):
        trainer.train_on_batch()
