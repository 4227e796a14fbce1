"""The bad-input matrix: every bad input gets a clear error that names it, and an existing
checkpoint is never deleted or overwritten.

Each case runs against a checkpoint directory holding a good checkpoint; after every
case its files must be byte-for-byte what they were. (The same errors are raised on every
rank of a real job: see tests/parallel/test_trainer_parallel.py::test_bad_input_*.)
"""
import gzip
import hashlib
import math
import struct
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import Trainer, datasets

ROOT = Path(__file__).resolve().parents[2]
X = np.random.default_rng(0).normal(size=(48, 6)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")
DS = tf.data.Dataset.from_tensor_slices((X, Y))


def build(x, y):
    net = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    return net, keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        y, net(x), from_logits=True)), {}


def build_other(x, y):
    net = keras.Sequential([keras.layers.Dense(5), keras.layers.Dense(2)])
    return net, keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        y, net(x), from_logits=True)), {}


def trainer(ckpt, **overrides):
    kw = dict(training_dataset=DS, build_training_func=build, optimizer=keras.optimizers.SGD,
              optimizer_args={"learning_rate": 0.1}, batch_size=8, checkpoint_dir=str(ckpt),
              log_step_size=1000)
    kw.update(overrides)
    return Trainer(**kw)


def idx_file(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def wrong_magic(tmp):
    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        idx_file(tmp / name, 1234, (2, 28, 28), bytes(2 * 784))
    for name in ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        idx_file(tmp / name, 2049, (2,), bytes(2))
    return datasets.load_fashion_mnist_dataset(path=tmp)


def truncated(tmp):
    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        idx_file(tmp / name, 2051, (2, 28, 28), bytes(784))  # half the pixels
    for name in ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        idx_file(tmp / name, 2049, (2,), bytes(2))
    return datasets.load_fashion_mnist_dataset(path=tmp)


def cli(*argv):
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"})
    raise ValueError(f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1]}")


CASES = [
    # (name, call(tmp, ckpt), exception, message pattern)
    ("batch_size zero", lambda t, c: trainer(c, batch_size=0), ValueError, "batch_size"),
    ("batch_size string", lambda t, c: trainer(c, batch_size="64"), ValueError, "batch_size"),
    ("log_step_size negative", lambda t, c: trainer(c, log_step_size=-1), ValueError,
     "log_step_size"),
    ("num_epochs zero", lambda t, c: trainer(c, num_epochs=0), ValueError, "num_epochs"),
    ("prefetch_size negative", lambda t, c: trainer(c, prefetch_size=-2), ValueError,
     "prefetch_size"),
    ("max_iteration negative", lambda t, c: trainer(c, max_iteration=-5), ValueError,
     "max_iteration"),
    ("max_iteration nan", lambda t, c: trainer(c, max_iteration=math.nan), ValueError,
     "max_iteration"),
    ("optimizer_args without learning_rate",
     lambda t, c: trainer(c, optimizer_args={"momentum": 0.9}), ValueError, "learning_rate"),
    ("optimizer_args not a dict", lambda t, c: trainer(c, optimizer_args=[0.1]), ValueError,
     "optimizer_args must be a dict"),
    ("optimizer not an optimizer", lambda t, c: trainer(c, optimizer=42), TypeError,
     "optimizer must be a Keras optimizer"),
    ("optimizer_args unknown key",
     lambda t, c: trainer(c, optimizer_args={"learning_rate": 0.1, "speed": 3}), ValueError,
     "optimizer_args do not fit SGD"),
    ("op unknown", lambda t, c: trainer(c, op="max"), ValueError, "op must be one of"),
    ("compression unknown", lambda t, c: trainer(c, compression="zip"), ValueError,
     "compression must be one of"),
    ("topk ratio zero", lambda t, c: trainer(c, compression="topk", compression_ratio=0),
     ValueError, r"ratio must be in \(0, 1\]"),
    ("backward_passes_per_step zero", lambda t, c: trainer(c, backward_passes_per_step=0),
     ValueError, "backward_passes_per_step"),
    ("lr_scaling unknown", lambda t, c: trainer(c, lr_scaling="cubic"), ValueError,
     "lr scaling rule"),
    ("mixed_precision unknown", lambda t, c: trainer(c, mixed_precision="fp8"), ValueError,
     "mixed_precision must be one of"),
    ("nan_policy unknown", lambda t, c: trainer(c, nan_policy="explode"), ValueError,
     "nan_policy"),
    ("warmup_steps negative", lambda t, c: trainer(c, warmup_steps=-1), ValueError,
     "warmup_steps"),
    ("save_checkpoint_steps zero", lambda t, c: trainer(c, save_checkpoint_steps=0), ValueError,
     "save_checkpoint_steps"),
    ("keep_checkpoint_max zero", lambda t, c: trainer(c, keep_checkpoint_max=0), ValueError,
     "keep_checkpoint_max"),
    ("dataset is a numpy array", lambda t, c: trainer(c, training_dataset=X), TypeError,
     "training_dataset must be a tf.data.Dataset"),
    ("dataset elements not pairs",
     lambda t, c: trainer(c, training_dataset=tf.data.Dataset.from_tensor_slices(X)), TypeError,
     r"\(x, y\) pairs"),
    ("dataset empty", lambda t, c: trainer(c, training_dataset=DS.take(0)), ValueError,
     "training_dataset is empty"),
    ("validation dataset of triples",
     lambda t, c: trainer(c, validation_dataset=tf.data.Dataset.from_tensor_slices((X, Y, Y))),
     TypeError, "validation_dataset must yield"),
    ("build function returns two things",
     lambda t, c: trainer(c, build_training_func=lambda x, y: (1, 2)), TypeError,
     r"\(network, loss, log_tensors\)"),
    ("build function loss not scalar",
     lambda t, c: trainer(c, build_training_func=lambda x, y: (
         keras.layers.Dense(2), keras.layers.Dense(2)(x), {})), ValueError, "scalar"),
    ("build function and model both given",
     lambda t, c: trainer(c, model=keras.Sequential([keras.layers.Dense(2)]), loss="mse"),
     ValueError, "exactly one of"),
    ("checkpoint_dir under a file", lambda t, c: trainer(c / "latest" / "sub"), ValueError,
     "not a writable directory"),
    ("checkpoint of a different model", lambda t, c: trainer(c, build_training_func=build_other),
     ValueError, "does not match this model"),
    ("fashion-mnist folder empty", lambda t, c: datasets.load_fashion_mnist_dataset(path=t),
     FileNotFoundError, "train-images-idx3-ubyte"),
    ("IDX file with a wrong magic number", lambda t, c: wrong_magic(t), ValueError, "magic"),
    ("IDX file truncated", lambda t, c: truncated(t), ValueError, "train-images-idx3-ubyte"),
    ("dataset shape impossible",
     lambda t, c: datasets.load_fashion_mnist_dataset(shape=(-1, 783)), ValueError, "shape"),
    ("cifar-10 folder empty", lambda t, c: datasets.load_cifar10_dataset(path=t, download=False),
     FileNotFoundError, "cifar"),
    ("mnist example --batch-size 0",
     lambda t, c: cli("examples/mnist.py", "--batch-size", "0"), ValueError,
     "exit 2: .*argument --batch-size"),
    ("keras example --epochs 0",
     lambda t, c: cli("examples/distributed_training/keras_mnist.py", "--epochs", "0"),
     ValueError, "exit 2: .*--epochs"),
    ("hvdtrain bench --np 0", lambda t, c: cli("-m", "hvdtrain.cli", "bench", "--np", "0"),
     ValueError, "exit 2: .*argument --np"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint directory with one good checkpoint, and the hash of every file."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    trainer(ckpt, max_iteration=2).train_to_end()
    return ckpt, snapshot(ckpt)


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_matrix_is_large():
    assert len(CASES) >= 25


@pytest.mark.parametrize("name, call, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, call, exc, match, saved, tmp_path):
    ckpt, before = saved
    with pytest.raises(exc, match=match):
        call(tmp_path, ckpt)
    assert snapshot(ckpt) == before, f"{name} changed the saved checkpoint"


def test_timeline_after_horovod_started_without_it(monkeypatch):
    """Horovod's run-time timeline must be enabled when Horovod starts (it costs speed, so
    it is off unless asked for): asking for it later names the fix."""
    import hvdtrain

    monkeypatch.delenv("HOROVOD_TIMELINE", raising=False)
    hvdtrain.init()
    with pytest.raises(ValueError, match=r"hvdtrain.init\(timeline=True\)"):
        Trainer(DS, build, keras.optimizers.SGD, {"learning_rate": 0.1}, batch_size=8,
                timeline="timeline.json")
