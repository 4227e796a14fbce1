"""Trains a small regression model with the Trainer under ``hvdtrain.elastic.run``.

Every worker appends JSON lines to ``OUT_DIR/progress-<pid>.jsonl``: one at start, one per
commit and one per elastic restart, each with its host, pid, rank, world size and global
step; at the end it writes ``OUT_DIR/final-<pid>.json``.

Usage: elastic_worker.py OUT_DIR [--max-iteration N] [--commit-steps K] [--sleep SECONDS]
                         [--checkpoint-dir DIR]
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.horovod import elastic  # noqa: E402


class Sleep(hvdtrain.Callback):
    """Slows every step down, so a test can act while training runs."""
    can_stop = False

    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def build(x, y):
    net = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    pred = net(x)
    return net, keras.ops.mean(keras.ops.square(pred - y)), {}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-iteration", type=int, default=600)
    parser.add_argument("--commit-steps", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()
    started = time.time()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1))).astype("float32")
    keras.utils.set_random_seed(1 + int(os.environ.get("HOROVOD_LOCAL_RANK", "0")))
    trainer = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, y)), build,
                               keras.optimizers.SGD, {"learning_rate": 0.01}, batch_size=4,
                               max_iteration=args.max_iteration, num_epochs=1000,
                               log_step_size=50, callbacks=[Sleep(args.sleep)],
                               progress_bar=False, checkpoint_dir=args.checkpoint_dir,
                               save_checkpoint_steps=50)
    path = os.path.join(args.out, f"progress-{os.getpid()}.jsonl")

    def record(event, state=None):
        line = {"event": event, "time": time.time(), "pid": os.getpid(),
                "host": os.environ.get("HOROVOD_HOSTNAME"),
                "local_rank": os.environ.get("HOROVOD_LOCAL_RANK"),
                "rank": trainer.rank, "size": trainer.size, "step": trainer.global_step,
                "lr": float(trainer.optimizer.learning_rate)}
        if state is not None:
            line["resets"] = state.resets
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    record("start")
    state = elastic.run(trainer, commit_steps=args.commit_steps,
                        on_commit=lambda s: record("commit", s),
                        on_reset=lambda s: record("reset", s))
    record("end", state)
    weights = [w.tolist() for w in trainer.training_network.get_weights()]
    with open(os.path.join(args.out, f"final-{os.getpid()}.json"), "w") as f:
        json.dump({"rank": trainer.rank, "size": trainer.size, "step": trainer.global_step,
                   "max_steps": trainer.max_steps, "sizes": state.sizes,
                   "resets": state.resets, "weights": weights,
                   "seconds": time.time() - started}, f)


if __name__ == "__main__":
    main()
