"""A Horovod ``model.fit`` script, as Horovod users write it, on Keras 3.

The only hvdtrain line is the import (``import horovod.tensorflow.keras as hvd`` became
``import hvdtrain.tensorflow.keras as hvd``); the Keras 3 edits are the ones Keras 3 asks
of any script: ``compile()`` without ``experimental_run_tf_function`` and a ``.keras``
checkpoint file. The model has no ``Input``: Keras builds it at its first batch, and
``BroadcastGlobalVariablesCallback`` still gives every rank rank 0's start.
Run with ``horovodrun -np 2 python examples/horovod/tensorflow2_keras_fit.py``.
"""
import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="Horovod-style Keras fit")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--warmup-epochs", type=float, default=1, help="0: no warmup callback")
parser.add_argument("--jit", action="store_true", help="compile(jit_compile=True): XLA")
parser.add_argument("--examples", type=int, default=4096)
parser.add_argument("--checkpoint-dir", default=None)
parser.add_argument("--out", default=None, help="write rank<R>.npz and rank<R>.json")
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Every rank starts from different random weights: the broadcast callback must fix that.
keras.utils.set_random_seed(1000 + hvd.rank())
rng = np.random.RandomState(0)
x = rng.rand(args.examples, 20).astype("float32")
y = (x[:, :10].sum(axis=1) > x[:, 10:].sum(axis=1)).astype("int64")
x_shard, y_shard = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

model = keras.Sequential([
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(2),
])
scaled_lr = args.lr * hvd.size()
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=opt, metrics=["accuracy"], jit_compile=args.jit)

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
]
if args.warmup_epochs:
    callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1))
if hvd.rank() == 0 and args.checkpoint_dir:
    callbacks.append(keras.callbacks.ModelCheckpoint(
        os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                    shuffle=False, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)

if args.out:
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"size": hvd.size(), "loss": [float(v) for v in history.history["loss"]],
                   "accuracy": float(history.history["accuracy"][-1]),
                   "lr": float(model.optimizer.learning_rate.numpy())}, f)
