"""Shared fixtures for one-process tests (world size 1, no launcher)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(autouse=True)
def no_launcher_variables_leak():
    """A test must leave Horovod's and hvdtrain's environment variables as it found them:
    the pytest process that ran it may go on to start real jobs (tests/parallel under
    xdist), whose ranks would inherit a stray ``HOROVOD_RANK`` or ``HOROVOD_SIZE``."""
    def ours():
        return {k: v for k, v in os.environ.items() if k.startswith(("HOROVOD_", "HVDTRAIN_"))}

    before = ours()
    yield
    after = ours()
    assert after == before, f"the test changed the environment: {before} -> {after}"


@pytest.fixture
def xy():
    """A small, learnable binary classification problem."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    return x, y


@pytest.fixture
def dataset(xy):
    return tf.data.Dataset.from_tensor_slices(xy)


def build_classifier(x, y):
    """A build function in hvdtrain's contract: (network, loss, log tensors)."""
    net = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    logits = net(x)
    loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    acc = keras.ops.mean(keras.ops.cast(
        keras.ops.equal(keras.ops.argmax(logits, -1), keras.ops.cast(y, "int64")), "float32"))
    return net, loss, {"acc": acc}


@pytest.fixture
def build():
    return build_classifier
