"""Keras ``model.fit`` made data-parallel with hvdtrain: the lines marked ``# hvdtrain``.

    python examples/distributed_training/keras_mnist.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/distributed_training/keras_mnist.py

The model is TensorFlow's distributed-tutorial one: Dense(64, relu) -> Dense(10) logits,
Adam and sparse categorical cross-entropy. Each rank trains on its shard; gradients are
averaged every step, so all ranks keep identical weights.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvdtrain.keras as hvk  # noqa: E402  # hvdtrain
from hvdtrain import datasets  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-out", default=None, help="rank 0 writes test metrics (JSON)")
    p.add_argument("--weights-out", default=None, help="every rank writes rank<R>.npz here")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    if args.lr <= 0 or args.warmup_epochs < 0:
        p.error("--lr must be > 0 and --warmup-epochs >= 0")
    return args


def load(data_dir):
    """MNIST, else Fashion-MNIST. Each host downloads once (local rank 0), and a dataset
    missing on any rank is missing on every rank, so all ranks fall back together."""
    try:
        splits = datasets.load_once_per_host(datasets.load_mnist_dataset, shape=(-1, 784),
                                             path=data_dir)
        return "mnist", splits
    except FileNotFoundError:
        return "fashion_mnist", datasets.load_once_per_host(
            datasets.load_fashion_mnist_dataset, shape=(-1, 784), path=data_dir)


def main(argv=None):
    args = parse_args(argv)
    hvk.init()  # hvdtrain
    keras.utils.set_random_seed(args.seed + hvk.rank())  # ranks differ until the broadcast
    name, (x_train, y_train, x_val, y_val, x_test, y_test) = load(args.data_dir)
    if hvk.rank() == 0:
        print(f"dataset: {name}, ranks: {hvk.size()}")
    # Each rank takes every size-th example; equal shard lengths give equal step counts.
    n = len(x_train) // hvk.size() * hvk.size()
    x_shard, y_shard = x_train[hvk.rank():n:hvk.size()], y_train[hvk.rank():n:hvk.size()]

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    lr = args.lr * hvk.size()  # hvdtrain: linear scaling
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.Adam(lr)),  # hvdtrain
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvk.BroadcastGlobalVariablesCallback(0),  # hvdtrain
                 hvk.MetricAverageCallback()]  # hvdtrain
    if args.warmup_epochs and hvk.size() > 1:
        callbacks.append(hvk.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs))
    start = time.perf_counter()
    history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                        shuffle=True, validation_data=(x_val, y_val), callbacks=callbacks,
                        verbose=2 if hvk.rank() == 0 else 0)  # hvdtrain: print on rank 0
    seconds = time.perf_counter() - start
    test_loss, test_acc = model.evaluate(x_test, y_test, verbose=0)
    if args.weights_out:
        os.makedirs(args.weights_out, exist_ok=True)
        np.savez(os.path.join(args.weights_out, f"rank{hvk.rank()}.npz"), *model.get_weights())
    if hvk.rank() == 0:
        print(f"test accuracy {test_acc:.4f}, loss {test_loss:.4f}, {seconds:.1f} s")
        if args.metrics_out:
            with open(args.metrics_out, "w") as f:
                json.dump({"dataset": name, "world_size": hvk.size(), "test_accuracy": test_acc,
                           "test_loss": test_loss, "epochs": args.epochs,
                           "global_batch": args.batch_size * hvk.size(), "train_seconds": seconds,
                           "final_lr": float(model.optimizer.learning_rate),
                           "history": {k: [float(v) for v in vs]
                                       for k, vs in history.history.items()}}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
