"""Training runs that go wrong on purpose, for the fault tests.

Usage: fault_worker.py SCENARIO OUT_DIR
Scenarios: raise, sigkill, sigstop (rank 1 freezes), nan, nan_skip, models. The rank that causes the fault writes
``fault_time`` (epoch seconds) to OUT_DIR just before, so the test can time the exit.
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402

FAULT_STEP = 5


def build(width):
    def build_fn(x, y):
        net = keras.Sequential([keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(1)])
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}
    return build_fn


def data(poison_step=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if poison_step is not None and hvdtrain.rank() == 1:
        # rank 1's shard holds every 2nd example; batch 8 -> its step k uses rows 16(k-1)+1...
        x[16 * (poison_step - 1) + 1] = np.nan
    return tf.data.Dataset.from_tensor_slices((x, y))


class Fault(hvdtrain.Callback):
    can_stop = False

    def __init__(self, out, action):
        self.out, self.action = out, action

    def on_train_batch_begin(self, batch, logs=None):
        if batch + 1 == FAULT_STEP and self.trainer.rank == 1:
            with open(os.path.join(self.out, "fault_time"), "w") as f:
                f.write(str(time.time()))
            with open(os.path.join(self.out, "fault_pid"), "w") as f:
                f.write(str(os.getpid()))
            if self.action == "raise":
                raise RuntimeError(f"boom at step {FAULT_STEP}")
            os.kill(os.getpid(), signal.SIGSTOP if self.action == "sigstop" else signal.SIGKILL)


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    hvdtrain.init()
    # Checkpoints every 2 steps where a test checks what survives the fault.
    ckpt = None if scenario == "nan_skip" else os.path.join(out, "ckpt")
    kw = dict(batch_size=8, log_step_size=1, checkpoint_dir=ckpt, save_checkpoint_steps=2,
              num_epochs=3)
    if scenario in ("raise", "sigkill", "sigstop"):
        t = hvdtrain.Trainer(data(), build(8), "sgd", {"learning_rate": 0.01},
                             callbacks=[Fault(out, scenario)], **kw)
    elif scenario in ("nan", "nan_skip"):
        with open(os.path.join(out, "fault_time"), "w") as f:
            f.write(str(time.time()))
        t = hvdtrain.Trainer(data(poison_step=FAULT_STEP), build(8), "sgd",
                             {"learning_rate": 0.01},
                             nan_policy="stop" if scenario == "nan" else "skip", **kw)
    elif scenario == "models":
        with open(os.path.join(out, "fault_time"), "w") as f:
            f.write(str(time.time()))
        t = hvdtrain.Trainer(data(), build(8 + hvdtrain.rank()), "sgd", {"learning_rate": 0.01},
                             **kw)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    while not t.should_stop():
        t.train_on_batch()
    weights = [w.tolist() for w in t.training_network.get_weights()]
    with open(os.path.join(out, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump({"global_step": t.global_step, "skipped_steps": t.skipped_steps,
                   "weights": weights}, f)


if __name__ == "__main__":
    main()
