"""The benchmark's models and data: MLPs (ReLU) of the widths in
:data:`hvdtrain_bench.settings.MODELS` with a mean cross-entropy loss, on random in-memory
inputs. Keras loads when a function runs."""
from __future__ import annotations

from typing import Callable

from hvdtrain_bench.settings import CLASSES, DEFAULT_MODEL, INPUT_DIM, MODELS


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


def mlp(model: str = DEFAULT_MODEL):
    """A fresh, unbuilt MLP of the benchmark ``model`` (``mlp``: 784-800-800-10, ``wide``:
    784-2048x4-10) that outputs logits."""
    import keras

    hidden = [keras.layers.Dense(width, activation="relu") for width in MODELS[model].hidden]
    return keras.Sequential([*hidden, keras.layers.Dense(CLASSES)], name="mlp")


def mean_xent(y, logits):
    """Mean sparse cross-entropy of ``logits`` against the labels ``y``."""
    import keras

    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                       from_logits=True))


def build_fn(x, y):
    """The build function the Trainer gets for the default model: ``(network, loss, {})``."""
    return build_fn_for(DEFAULT_MODEL)(x, y)


def build_fn_for(model: str) -> Callable:
    """The Trainer's build function for the benchmark ``model``."""
    def build(x, y):
        net = mlp(model)
        return net, mean_xent(y, net(x)), {}
    return build
