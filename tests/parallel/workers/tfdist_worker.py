"""A small training run under a tf.distribute backend; the chief writes ``rank<R>.json``.

    python tfdist_worker.py MODE OUT_DIR --batch-size B [--devices N] [--strategy S]

MODE ``parity``: 256 examples, 2 epochs, plain SGD without learning-rate scaling, so
``R`` replicas with batch ``B`` must equal one device with batch ``R * B``. MODE
``uneven``: 203 examples (shards of 102 and 101). The strategy is created first, before
any tensor, as MultiWorkerMirroredStrategy requires.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["parity", "uneven"])
parser.add_argument("out")
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--strategy", default="mirrored")
parser.add_argument("--checkpoint", default=None)
parser.add_argument("--max-iteration", type=float, default=float("inf"))
parser.add_argument("--die-at", type=int, default=0, help="worker 1 exits at this step")
parser.add_argument("--stop-at", type=int, default=0,
                    help="a callback on the last worker only asks to stop at this step")
args = parser.parse_args()

import hvdtrain  # noqa: E402

strategy = hvdtrain.get_strategy(args.strategy, devices=args.devices)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


n = 256 if args.mode == "parity" else 203
rng = np.random.default_rng(0)
x = rng.normal(size=(n, 20)).astype("float32")
y = (x[:, :3].argmax(1)).astype("int32")
keras.utils.set_random_seed(0)


def build(xs, ys):
    net = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    logits = net(xs)
    loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True))
    acc = keras.ops.mean(keras.ops.cast(keras.ops.equal(
        keras.ops.cast(keras.ops.argmax(logits, -1), "int32"), ys), "float32"))
    return net, loss, {"acc": acc}


def build_validation(xs, ys, net):
    logits = net(xs)
    return net, {"acc": keras.ops.mean(keras.ops.cast(keras.ops.equal(
        keras.ops.cast(keras.ops.argmax(logits, -1), "int32"), ys), "float32"))}


class StopOnLastWorker(hvdtrain.Callback):
    """Sets ``stop_training`` on the last worker only: the Trainer must agree it."""

    def on_train_batch_end(self, batch, logs=None):
        if self.trainer.rank == self.trainer.num_workers - 1 and batch >= args.stop_at:
            self.trainer.stop_training = True


ds = tf.data.Dataset.from_tensor_slices((x, y))
trainer = hvdtrain.Trainer(ds, build, keras.optimizers.SGD, {"learning_rate": 0.1},
                           batch_size=args.batch_size, num_epochs=2, log_step_size=4,
                           scaling_learning_rate=False, strategy=args.strategy,
                           validation_dataset=ds.take(101), build_validation_func=build_validation,
                           checkpoint_dir=args.checkpoint, max_iteration=args.max_iteration,
                           callbacks=[StopOnLastWorker()] if args.stop_at else None)
losses = []
while not trainer.session.should_stop():
    if args.die_at and trainer.rank == 1 and trainer.global_step == args.die_at:
        print(f"worker 1 dies at step {trainer.global_step}", flush=True)
        os._exit(3)
    losses.append(float(trainer.train_on_batch()["loss"]))
metrics = dict(trainer.validation_metrics)
net = trainer.training_network
expected = float(np.mean(np.argmax(net.predict(x[:101], verbose=0), -1) == y[:101]))
result = {
    "rank": trainer.rank, "size": trainer.size, "num_workers": trainer.num_workers,
    "global_step": trainer.global_step, "steps_per_epoch": trainer.steps_per_epoch,
    "losses": losses, "val_acc": metrics["acc"], "val_acc_expected": expected,
    "weights": [w.tolist() for w in net.get_weights()],
    "variable_types": sorted({type(v.value).__name__ for v in net.weights}),
    "strategy": type(trainer.strategy).__name__,
    "restored_from": trainer.restored_from,
}
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{trainer.rank}.json"), "w") as f:
    json.dump(result, f)
