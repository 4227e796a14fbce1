"""The benchmark's model and data: an MLP 784-800-800-10 (ReLU) with a mean
cross-entropy loss, on random in-memory inputs. Keras loads when a function runs."""
from __future__ import annotations

from hvdtrain.bench.settings import CLASSES, HIDDEN, INPUT_DIM


def make_data(examples: int, seed: int, size: int, batch_size: int):
    """Random inputs and labels, trimmed so each of ``size`` shards holds whole batches.

    Returns:
        ``(x, y)``: float32 inputs of shape ``(n, 784)`` and int32 labels in ``[0, 10)``.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    per_step = size * batch_size
    n = max(per_step, examples - examples % per_step)
    x = rng.random((n, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(n,), dtype=np.int32)
    return x, y


def mlp():
    """A fresh, unbuilt MLP 784-800-800-10 that outputs logits."""
    import keras

    return keras.Sequential([keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(CLASSES)], name="mlp")


def mean_xent(y, logits):
    """Mean sparse cross-entropy of ``logits`` against the labels ``y``."""
    import keras

    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                       from_logits=True))


def build_fn(x, y):
    """The build function the Trainer gets: ``(network, loss, {})``."""
    net = mlp()
    return net, mean_xent(y, net(x)), {}
