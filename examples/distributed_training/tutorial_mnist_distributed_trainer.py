"""TensorLayer's ``tutorial_mnist_distributed_trainer.py`` on hvdtrain.

An MLP on MNIST (Fashion-MNIST when MNIST cannot be found or downloaded), trained with
the Trainer in an explicit loop, then validated over the whole validation set:

    horovodrun -np 2 -H localhost:2 --gloo python tutorial_mnist_distributed_trainer.py
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.datasets import (load_fashion_mnist_dataset, load_mnist_dataset,  # noqa: E402
                               load_once_per_host)


def make_dataset(images, labels):
    """Unbatched (image, label) pairs; the Trainer shards, shuffles and batches them."""
    return tf.data.Dataset.from_tensor_slices((images, labels))


def model():
    """TensorLayer's MLP: dropout 0.2, 800 relu, dropout 0.5, 800 relu, dropout 0.5, 10."""
    return keras.Sequential([
        keras.layers.Dropout(0.2),
        keras.layers.Dense(800, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(800, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10),
    ], name="mlp")


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
    """Called once for validation, with the network being trained (dropout off there)."""
    cost, accuracy = cost_and_accuracy(network(x), y)
    return network, {"cost": cost, "accuracy": accuracy}


def load_data(data_dir):
    """MNIST if every rank has it (or can download it), else Fashion-MNIST on every rank.

    With ``data_dir``, only ``data_dir/mnist/`` and ``data_dir/fashion-mnist/`` are read.
    A download is done by local rank 0 of each host alone; the host's other ranks read it.
    """
    def path(folder):
        return None if data_dir is None else os.path.join(data_dir, folder)

    try:
        splits = load_once_per_host(load_mnist_dataset, shape=(-1, 784), path=path("mnist"))
    except FileNotFoundError:
        splits = None
    # All ranks must train on the same data, so they fall back together or not at all.
    if not hvdtrain.dist.agree_any(splits is None):
        return "MNIST", splits
    return "Fashion-MNIST", load_once_per_host(load_fashion_mnist_dataset, shape=(-1, 784),
                                               path=path("fashion-mnist"))


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main():
    parser = argparse.ArgumentParser(description="TensorLayer's distributed MNIST tutorial")
    parser.add_argument("--data-dir", default=None,
                        help="holds mnist/ and/or fashion-mnist/ (the IDX files)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="per rank")
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument("--max-steps", type=positive_int, default=None,
                        help="stop after this many steps on every rank")
    parser.add_argument("--log-step-size", type=positive_int, default=100)
    args = parser.parse_args()

    hvdtrain.init()
    try:
        name, (X_train, y_train, X_val, y_val, X_test, y_test) = load_data(args.data_dir)
    except FileNotFoundError as err:  # the loader says where it looked and what to do
        sys.exit(f"error: {err}")
    if hvdtrain.rank() == 0:
        print(f"training on {name} with {hvdtrain.size()} rank(s)", flush=True)

    trainer = hvdtrain.Trainer(
        training_dataset=make_dataset(X_train, y_train), build_training_func=build_train,
        optimizer=keras.optimizers.RMSprop, optimizer_args={"learning_rate": 0.001},
        batch_size=args.batch_size, num_epochs=args.epochs, log_step_size=args.log_step_size,
        shuffle_buffer_size=10000, seed=0,
        # max_iteration counts steps over all workers, as in TensorLayer
        max_iteration=args.max_steps * hvdtrain.size() if args.max_steps else float("inf"),
        validation_dataset=make_dataset(X_val, y_val), build_validation_func=build_validation)

    # There are several ways to use the trainer:
    #   1. train on all the data: trainer.train_to_end()
    #   2. validate every N steps: trainer.train_and_validate_to_end(validate_step_size=N)
    #   3. full control, one step at a time:
    while not trainer.session.should_stop():
        trainer.train_on_batch()  # one synchronous step on every rank; returns its logs
        # ... anything else you want to do between steps, on every rank

    # The mean over the whole validation set, computed by all ranks together: every rank
    # must ask for it, only rank 0 prints it.
    metrics = trainer.validation_metrics
    if hvdtrain.rank() == 0:
        print(f"after {trainer.global_step} steps, validation: "
              + ", ".join(f"{n} {m:.4f}" for n, m in metrics), flush=True)


if __name__ == "__main__":
    main()
