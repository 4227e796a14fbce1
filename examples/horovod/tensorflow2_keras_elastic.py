"""A Horovod elastic Keras script on Keras 3: ``KerasState``, the three state callbacks
and ``hvd.elastic.run`` around ``model.fit``.

Only the import changed (``import horovod.tensorflow.keras as hvd`` became
``import hvdtrain.tensorflow.keras as hvd``). Under an elastic ``horovodrun`` (``--min-np``,
``--host-discovery-script``) a failed worker rolls the others back to the last commit and
training goes on; under a fixed ``horovodrun`` or ``mpirun`` it trains once.
"""
import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="Horovod-style elastic Keras fit")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--batches-per-commit", type=int, default=10)
parser.add_argument("--out", default=None, help="write rank<R>.npz and rank<R>.json")
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

keras.utils.set_random_seed(2000 + hvd.rank())
rng = np.random.RandomState(0)
x = rng.rand(4096, 20).astype("float32")
y = (x[:, :10].sum(axis=1) > x[:, 10:].sum(axis=1)).astype("int64")

model = keras.Sequential([
    keras.Input((20,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(2),
])
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * hvd.size()))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=opt, metrics=["accuracy"])


def on_state_reset():
    # The world size changed: scale the learning rate to it again.
    model.optimizer.learning_rate = args.lr * hvd.size()


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.callbacks.MetricAverageCallback(),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
]


@hvd.elastic.run
def train(state):
    # The shard follows the current world: workers may have come or gone.
    x_shard, y_shard = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    return model.fit(x_shard, y_shard, batch_size=args.batch_size, shuffle=False,
                     epochs=args.epochs - state.epoch, callbacks=callbacks,
                     verbose=1 if hvd.rank() == 0 else 0)


history = train(state)

if args.out:
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"size": hvd.size(), "epoch": state.epoch,
                   "accuracy": float(history.history["accuracy"][-1])}, f)
