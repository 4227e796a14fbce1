"""TensorLayer's ``tutorial_cifar10_distributed_trainer.py`` on hvdtrain.

A small CNN on CIFAR-10 with random flips and shifts, validated on the test set every
``--validate-step-size`` steps:

    horovodrun -np 2 -H localhost:2 --gloo python tutorial_cifar10_distributed_trainer.py \\
        --data-dir ~/data            # the folder holding cifar-10-batches-py/

``--synthetic`` trains on random images of CIFAR-10's shapes instead, to try the program
out without the data.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.datasets import load_cifar10_dataset, load_once_per_host  # noqa: E402


def make_dataset(images, labels):
    """Unbatched (image, label) pairs; the Trainer shards, shuffles and batches them."""
    return tf.data.Dataset.from_tensor_slices((images, labels))


def model():
    """Two conv/pool blocks and two dense layers. The augmentation layers only act in
    training, so the same network serves for validation."""
    l2 = keras.regularizers.L2(1e-4)  # the Trainer adds these penalties to the loss
    return keras.Sequential([
        keras.layers.RandomFlip("horizontal"),
        keras.layers.RandomTranslation(0.1, 0.1),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu", kernel_regularizer=l2),
        keras.layers.Dense(10, kernel_regularizer=l2),
    ], name="cnn")


def cost_and_accuracy(logits, y):
    """Softmax cross-entropy and accuracy, with keras.ops (x and y are symbolic)."""
    cost = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    predicted = keras.ops.cast(keras.ops.argmax(logits, axis=-1), "int32")
    correct = keras.ops.equal(predicted, keras.ops.cast(y, "int32"))
    return cost, keras.ops.mean(keras.ops.cast(correct, "float32"))


def build_train(x, y):
    """Called once by the Trainer: returns (network, loss, log tensors)."""
    network = model()
    cost, accuracy = cost_and_accuracy(network(x), y)
    return network, cost, {"accuracy": accuracy}


def build_validation(x, y, network):
    """Called once for validation, with the network being trained."""
    cost, accuracy = cost_and_accuracy(network(x), y)
    return network, {"cost": cost, "accuracy": accuracy}


def synthetic_cifar10(n_train, n_test):
    """Random images and labels of CIFAR-10's shapes. The seed is fixed so that every rank
    holds the same arrays: the Trainer gives each rank its shard of one common dataset."""
    rng = np.random.default_rng(0)
    def images(n):
        return rng.random((n, 32, 32, 3), dtype=np.float32)
    def labels(n):
        return rng.integers(0, 10, size=n).astype(np.int32)
    return images(n_train), labels(n_train), images(n_test), labels(n_test)


def load_data(args):
    """CIFAR-10 from --data-dir (or the loader's usual places), or synthetic data.

    Exits with the loader's message when the files are missing on any rank.
    """
    if args.synthetic:
        return synthetic_cifar10(args.synthetic_size, max(args.synthetic_size // 4, 1))
    try:
        # one download per host: local rank 0 fetches, the host's other ranks read its copy
        splits = load_once_per_host(load_cifar10_dataset, shape=(-1, 32, 32, 3), path=args.data_dir)
        problem = None
    except FileNotFoundError as err:
        splits, problem = None, str(err)
    # Every rank learns whether any rank failed, so they all stop together (none hangs).
    problems = [p for p in hvdtrain.dist.allgather_object(problem) if p]
    if problems:
        if hvdtrain.rank() == 0:
            print(f"error: {problems[0]}\nRun with --synthetic to try the program on random data.",
                  file=sys.stderr, flush=True)
        sys.exit(1)
    return splits


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main():
    parser = argparse.ArgumentParser(description="TensorLayer's distributed CIFAR-10 tutorial")
    parser.add_argument("--data-dir", default=None,
                        help="folder holding cifar-10-batches-py/ (or that folder itself)")
    parser.add_argument("--synthetic", action="store_true",
                        help="train on random data of CIFAR-10's shapes (a smoke test)")
    parser.add_argument("--synthetic-size", type=positive_int, default=2048,
                        help="training examples with --synthetic (a quarter as many to validate)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="per rank")
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--max-steps", type=positive_int, default=None,
                        help="stop after this many steps on every rank")
    parser.add_argument("--validate-step-size", type=positive_int, default=50)
    parser.add_argument("--log-step-size", type=positive_int, default=10)
    args = parser.parse_args()

    hvdtrain.init()
    X_train, y_train, X_test, y_test = load_data(args)
    if hvdtrain.rank() == 0:
        print(f"training on {'synthetic ' if args.synthetic else ''}CIFAR-10 "
              f"({len(X_train)} train / {len(X_test)} test) with {hvdtrain.size()} rank(s)",
              flush=True)

    trainer = hvdtrain.Trainer(
        training_dataset=make_dataset(X_train, y_train), build_training_func=build_train,
        optimizer=keras.optimizers.Adam, optimizer_args={"learning_rate": 0.001},
        batch_size=args.batch_size, num_epochs=args.epochs, log_step_size=args.log_step_size,
        shuffle_buffer_size=10000, seed=0,
        max_iteration=args.max_steps * hvdtrain.size() if args.max_steps else float("inf"),
        validation_dataset=make_dataset(X_test, y_test), build_validation_func=build_validation)

    # Trains to the end, logging the validation metrics (mean over all ranks) every
    # validate_step_size steps and at the end; returns the last ones.
    history = trainer.train_and_validate_to_end(validate_step_size=args.validate_step_size)
    if hvdtrain.rank() == 0:
        print(f"after {trainer.global_step} steps, validation: "
              + ", ".join(f"{n[len('val_'):]} {v[-1]:.4f}" for n, v in history.history.items()
                          if n.startswith("val_")), flush=True)


if __name__ == "__main__":
    main()
