"""Checkpoints: atomic commits, verification, fallback to the last good one."""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from hvdtrain import Trainer
from hvdtrain.checkpoint import committed, verify


def make(dataset, build, tmp_path, **kw):
    return Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1}, batch_size=16,
                   checkpoint_dir=str(tmp_path), save_checkpoint_steps=1, log_step_size=1000,
                   **kw)


def weights(t):
    return [w.copy() for w in t.training_network.get_weights()]


@pytest.fixture
def three_checkpoints(dataset, build, tmp_path):
    t = make(dataset, build, tmp_path, max_iteration=3)
    snapshots = {}
    while not t.should_stop():
        t.train_on_batch()
        snapshots[t.global_step] = weights(t)
    assert [s for s, _ in committed(str(tmp_path))] == [3, 2, 1]
    return snapshots


def test_truncated_latest_checkpoint_falls_back(dataset, build, tmp_path, three_checkpoints, caplog):
    data_file = next(p for p in (tmp_path / "ckpt-00000003").iterdir() if "data" in p.name)
    data_file.write_bytes(data_file.read_bytes()[:-7])
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        t = make(dataset, build, tmp_path, max_iteration=10)
    assert t.global_step == 2
    assert "ckpt-00000003 is torn or corrupt" in caplog.text and "truncated" in caplog.text
    for a, b in zip(weights(t), three_checkpoints[2]):
        np.testing.assert_array_equal(a, b)


def test_corrupted_bytes_and_missing_manifest_fall_back(dataset, build, tmp_path,
                                                        three_checkpoints, caplog):
    data_file = next(p for p in (tmp_path / "ckpt-00000003").iterdir() if "data" in p.name)
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    (tmp_path / "ckpt-00000002" / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        t = make(dataset, build, tmp_path, max_iteration=10)
    assert t.global_step == 1
    assert "SHA-256" in caplog.text and "no readable manifest" in caplog.text


def test_keep_checkpoint_max_and_latest_index(dataset, build, tmp_path):
    t = make(dataset, build, tmp_path, max_iteration=5, keep_checkpoint_max=2)
    t.train_to_end()
    assert [s for s, _ in committed(str(tmp_path))] == [5, 4]
    assert (tmp_path / "latest").read_text().strip() == "ckpt-00000005"
    for _, folder in committed(str(tmp_path)):
        assert verify(folder)["step"] in (4, 5)


def test_kill_9_during_writes_leaves_a_good_checkpoint(tmp_path):
    """A process saving a large model every step is SIGKILLed at random moments."""
    script = textwrap.dedent(f"""
        import os, keras, numpy as np, tensorflow as tf, hvdtrain
        x = np.random.default_rng(0).normal(size=(64, 512)).astype("float32")
        y = np.zeros((64, 1), "float32")
        def build(a, b):
            net = keras.Sequential([keras.layers.Dense(2048), keras.layers.Dense(1)])
            return net, keras.ops.mean(keras.ops.square(net(a) - b)), {{}}
        t = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, y)), build, "adam",
                             {{"learning_rate": 1e-3}}, batch_size=8, num_epochs=1000,
                             checkpoint_dir={str(tmp_path)!r}, save_checkpoint_steps=1,
                             keep_checkpoint_max=3, log_step_size=10**6)
        print("ready", flush=True)
        t.train_to_end()
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for delay in (0.05, 0.3, 0.77):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                                text=True)
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 90
        while not committed(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the first step compiles; then it saves every step
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        found = committed(str(tmp_path))
        assert found
        verify(found[0][1])  # the newest committed checkpoint is always complete
    # and the next run resumes from it
    proc = subprocess.run([sys.executable, "-c", script.replace("num_epochs=1000",
                                                                 "num_epochs=1, max_iteration=1")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed from" in proc.stderr


def test_one_save_cadence_rule_for_steps_time_and_several_steps_per_call():
    from hvdtrain.checkpoint import SaveCadence
    cadence = SaveCadence(every_steps=10, every_secs=None)
    assert [s for s in range(1, 31) if cadence.due(s)] == [10, 20, 30]
    assert cadence.due(12, taken=4) and not cadence.due(16, taken=4)  # 9..12 holds 10
    timed = SaveCadence(every_steps=None, every_secs=0.05)
    assert not timed.due(1)
    time.sleep(0.06)
    assert timed.due(2) and not timed.step_due(2)
    timed.saved()
    assert not timed.due(3)
