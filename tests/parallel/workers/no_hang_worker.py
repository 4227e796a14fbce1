"""Configurations that used to hang or train silently wrong, and preemption, for
tests/parallel/test_no_hang.py.

Usage: no_hang_worker.py SCENARIO OUT_DIR [STRATEGY]
Scenarios:
  idiom     rank-0-only checkpoint_dir, log_dir and stopping callback (stops at step 6)
  mismatch  batch_size 8 on rank 0, 4 on the others
  train     trains 2 shuffled epochs with dropout, checkpointing to OUT_DIR/ckpt; rank 1
            writes its pid to OUT_DIR/pid1 and each step to OUT_DIR/step1 (the test
            sends it a signal); exits with hvdtrain's preemption code when preempted
  stall     rank 1 stops calling train_on_batch after step 3 and sleeps (the watchdog
            must end the job)
  extra     rank 0 runs a barrier of its own after step 3 while rank 1 trains on
Every rank writes OUT_DIR/rank<R>.json with its step, restore point and weights.
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
import worker_start  # noqa: E402  (beside this script)

STOP_STEP = 6


def build(x, y):
    net = keras.Sequential([keras.layers.Dense(16, activation="tanh"), keras.layers.Dropout(0.2),
                            keras.layers.Dense(1)])
    return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))


class StopAt(hvdtrain.Callback):
    """Requests a stop at one step (given to rank 0 only)."""

    def on_train_batch_end(self, step, logs=None):
        if step == STOP_STEP:
            self.trainer.stop_training = True


class Progress(hvdtrain.Callback):
    """Rank 1 shows its pid and step to the test, slowly enough to be signalled mid-run."""
    can_stop = False

    def __init__(self, out):
        self.out = out

    def on_train_begin(self, logs=None):
        with open(os.path.join(self.out, "pid1"), "w") as f:
            f.write(str(os.getpid()))

    def on_train_batch_end(self, step, logs=None):
        with open(os.path.join(self.out, "step1.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(self.out, "step1.tmp"), os.path.join(self.out, "step1"))
        time.sleep(0.05)


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    strategy = sys.argv[3] if len(sys.argv) > 3 else "horovod"
    os.makedirs(out, exist_ok=True)
    rank = worker_start.start(strategy)
    keras.utils.set_random_seed(1)  # the same initial weights and dropout in every run
    ckpt = os.path.join(out, "ckpt")
    kw = dict(batch_size=8, strategy=strategy, save_checkpoint_secs=None)
    if scenario == "idiom":
        kw.update(checkpoint_dir=ckpt if rank == 0 else None, num_epochs=3, log_step_size=1,
                  log_dir=os.path.join(out, "tb") if rank == 0 else None,
                  callbacks=[StopAt()] if rank == 0 else [])
    elif scenario == "mismatch":
        kw.update(batch_size=8 if rank == 0 else 4)
    elif scenario in ("train", "stall", "extra"):
        kw.update(checkpoint_dir=ckpt, num_epochs=2, shuffle_buffer_size=512, seed=3,
                  callbacks=[Progress(out)] if rank == 1 and scenario == "train" else [])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    trainer = hvdtrain.Trainer(dataset(), build, "sgd", {"learning_rate": 0.01}, **kw)
    while not trainer.should_stop():
        trainer.train_on_batch()
        if scenario == "stall" and rank == 1 and trainer.global_step == 3:
            time.sleep(600)  # the other rank waits in step 4's all-reduce
        if scenario == "extra" and rank == 0 and trainer.global_step == 3:
            hvdtrain.dist.barrier()  # rank 1 is in step 4's all-reduce
    weights = [w.tolist() for w in trainer.training_network.get_weights()]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"global_step": trainer.global_step, "restored_from": trainer.restored_from,
                   "weights": weights}, f)


if __name__ == "__main__":
    main()
