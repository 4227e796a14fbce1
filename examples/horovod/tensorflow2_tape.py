"""A Horovod TensorFlow 2 training loop, as Horovod users write it, on Keras 3.

The only hvdtrain line is the import: ``import horovod.tensorflow as hvd`` became
``import hvdtrain.tensorflow as hvd``; the one Keras 3 edit is ``opt.variables`` (a
property now, ``opt.variables()`` before). Run with
``horovodrun -np 2 python examples/horovod/tensorflow2_tape.py``.
"""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow as hvd  # was: import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="Horovod-style DistributedGradientTape loop")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--out", default=None, help="write rank<R>.npz with the final weights")
args = parser.parse_args()

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

keras.utils.set_random_seed(args.seed)
rng = np.random.RandomState(0)
images = rng.rand(args.steps * args.batch_size * hvd.size(), 28, 28).astype("float32")
labels = (images[:, :14].mean(axis=(1, 2)) * 10 % 10).astype("int64")
# Each rank its own shard (every size-th example), in order: global batch i is the union
# of every rank's batch i, the same examples a single process sees at size x batch.
dataset = tf.data.Dataset.from_tensor_slices((images[hvd.rank()::hvd.size()],
                                              labels[hvd.rank()::hvd.size()]))
dataset = dataset.batch(args.batch_size)

mnist_model = keras.Sequential([
    keras.Input((28, 28)),
    keras.layers.Reshape((28, 28, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10),
])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.Adam(args.lr * hvd.size())  # Horovod: scale the rate by the size


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
    # Horovod's idiom: broadcast after the first step, once the optimizer has its slots.
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a property
    return loss_value


for batch, (images, labels) in enumerate(dataset.take(args.steps)):
    loss_value = training_step(images, labels, batch == 0)
    if batch % 20 == 0 and hvd.local_rank() == 0:
        print(f"Step #{batch}\tLoss: {loss_value:.6f}")

if args.out:
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), *mnist_model.get_weights())
