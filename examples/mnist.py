"""Train TensorLayer's MNIST MLP with hvdtrain on one process or many.

The same script runs alone or under a launcher:

    python examples/mnist.py                                        # one process
    horovodrun -np 2 -H localhost:2 --gloo python examples/mnist.py # two ranks (Gloo)
    mpirun -np 2 --bind-to none python examples/mnist.py            # two ranks (MPI)

``--strategy`` runs the same model and data on another backend: ``mirrored`` (this
process's devices; ``--devices N`` logical CPU devices without a GPU),
``multi_worker_mirrored`` (one process per worker, each with its ``TF_CONFIG``) or
``parameter_server`` (every task started by ``scripts/launch_ps.py``).

``--batch-size`` is per rank, so the global batch is ``batch_size * ranks``; the Trainer
multiplies the learning rate by the number of ranks to match (the linear scaling rule).
MNIST is used when it can be found or downloaded, Fashion-MNIST otherwise (Debian's
``dataset-fashion-mnist`` package installs it); ``--dataset`` chooses explicitly.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain import datasets  # noqa: E402

LOADERS = {"mnist": datasets.load_mnist_dataset,
           "fashion_mnist": datasets.load_fashion_mnist_dataset}
FOLDERS = {"mnist": "mnist", "fashion_mnist": "fashion-mnist"}  # under --data-dir


# ----------------------------------------------------------------------------- the model
def mlp(dropout=(0.1, 0.2, 0.2)) -> keras.Sequential:
    """TensorLayer's tutorial MLP: 784 -> 800 -> 800 -> 10 logits, with dropout."""
    return keras.Sequential([
        keras.layers.Dropout(dropout[0]),
        keras.layers.Dense(800, activation="relu"),
        keras.layers.Dropout(dropout[1]),
        keras.layers.Dense(800, activation="relu"),
        keras.layers.Dropout(dropout[2]),
        keras.layers.Dense(10),
    ], name="mlp")


def cross_entropy(y, logits):
    """Mean softmax cross-entropy of integer labels ``y`` (built with keras.ops)."""
    return keras.ops.mean(
        keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def accuracy(y, logits):
    """Fraction of examples whose largest logit is the label."""
    predicted = keras.ops.cast(keras.ops.argmax(logits, axis=-1), "int32")
    # keras.ops.equal, not ==: on symbolic inputs Python's == would not build a tensor.
    correct = keras.ops.equal(predicted, keras.ops.cast(y, "int32"))
    return keras.ops.mean(keras.ops.cast(correct, "float32"))


def make_build_functions(dropout):
    """The Trainer's build functions; called once each with symbolic ``keras.Input``s."""
    def build_training_func(x, y):
        network = mlp(dropout)
        logits = network(x)  # the Trainer runs this with training=True: dropout is on
        return network, cross_entropy(y, logits), {"acc": accuracy(y, logits)}

    def build_validation_func(x, y, network):  # the trained network, run with training=False
        logits = network(x)
        return network, {"acc": accuracy(y, logits), "loss": cross_entropy(y, logits)}

    return build_training_func, build_validation_func


# ----------------------------------------------------------------------------- data
def start_backend(args) -> tuple[int, int]:
    """Starts the backend before TensorFlow does; returns (this worker's rank, the number
    of data-parallel replicas)."""
    if args.strategy == "horovod":
        # before any TensorFlow op, so the per-rank thread settings apply
        hvdtrain.init(timeline=bool(args.horovod_timeline))
        return hvdtrain.rank(), hvdtrain.size()
    if args.strategy == "parameter_server":
        spec = hvdtrain.TaskSpec()
        return (0 if spec.is_master() else 1), spec.num_workers
    # collective ops are configured before TensorFlow starts
    strategy = hvdtrain.get_strategy(args.strategy, devices=args.devices)
    resolver = getattr(strategy, "cluster_resolver", None)
    return (resolver.task_id or 0) if resolver else 0, strategy.num_replicas_in_sync


def load_data(name: str, data_dir: str | None, agree: bool = True):
    """Loads ``name`` ("mnist", "fashion_mnist" or "auto"); returns ``(name, splits)``.

    With ``data_dir`` the files are read from ``data_dir/mnist/`` or
    ``data_dir/fashion-mnist/`` only; without it the loaders search their usual places and
    download if they can. Under Horovod only local rank 0 of each host downloads; the
    other ranks of the host wait for it, then read its copy. "auto" takes MNIST when every
    rank has it, else Fashion-MNIST: the ranks agree first, so all of them train on the
    same data.
    """
    def load(which):
        path = None if data_dir is None else os.path.join(data_dir, FOLDERS[which])
        return datasets.load_once_per_host(LOADERS[which], shape=(-1, 784), path=path)

    if name != "auto":
        return name, load(name)
    try:
        splits = load("mnist")
    except FileNotFoundError:
        splits = None
    if not (hvdtrain.dist.agree_any(splits is None) if agree else splits is None):
        return "mnist", splits
    if not agree or hvdtrain.rank() == 0:
        print("MNIST could not be found or downloaded; using Fashion-MNIST", flush=True)
    return "fashion_mnist", load("fashion_mnist")


def to_dataset(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    """Unbatched ``(image, label)`` pairs; the Trainer shards, shuffles and batches them."""
    return tf.data.Dataset.from_tensor_slices((x, y))


def learning_rate(args, n_train: int, size: int):
    """The learning rate for one rank: constant, or a cosine decay to 0 over the whole run.

    The decay is counted in steps, and each rank takes one step per global batch: the
    smallest shard (``n_train // size`` examples) sets the steps per epoch.
    """
    if args.lr_schedule == "constant":
        return args.lr
    steps = args.epochs * math.ceil((n_train // size) / args.batch_size)
    if args.max_steps:
        steps = min(steps, args.max_steps)
    return keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=steps)


# ----------------------------------------------------------------------------- CLI
def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def dropout_rate(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("auto", "mnist", "fashion_mnist"), default="auto",
                   help="auto: MNIST if it can be found or downloaded, else Fashion-MNIST")
    p.add_argument("--data-dir", default=None,
                   help="read DIR/mnist/ or DIR/fashion-mnist/ (IDX files) only, no download")
    p.add_argument("--epochs", type=positive_int, default=2, help="passes over the training set")
    p.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop at this step (steps are synchronous: every rank takes this many, "
                   "counting those before a resumed checkpoint)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="examples per step per rank")
    p.add_argument("--lr", type=positive_float, default=1e-3,
                   help="Adam learning rate for one rank; multiplied by the number of ranks")
    p.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                   help="cosine: decay the learning rate to 0 by the last step")
    p.add_argument("--dropout", type=dropout_rate, nargs=3, default=(0.1, 0.2, 0.2),
                   metavar=("IN", "HIDDEN1", "HIDDEN2"),
                   help="dropout rates (TensorLayer's 0.2 0.5 0.5 needs more than 2 epochs)")
    p.add_argument("--shuffle-buffer", type=non_negative_int, default=10000,
                   help="shuffle buffer per rank (0: no shuffling)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None,
                   help="rank 0 saves checkpoints here; a rerun resumes from the latest")
    p.add_argument("--log-step-size", type=positive_int, default=100,
                   help="log the training loss and accuracy every this many steps")
    p.add_argument("--log-dir", default=None, help="rank 0 writes TensorBoard scalars here")
    p.add_argument("--horovod-timeline", default=None,
                   help="write Horovod's timeline of the run to this file (chrome://tracing)")
    p.add_argument("--mixed-precision", choices=("float32", "mixed_float16", "mixed_bfloat16"),
                   default=None, help="dtype policy (default: Keras's global policy)")
    p.add_argument("--compression", choices=("none", "fp16", "topk", "randomk"), default=None,
                   help="gradient compression on the wire")
    p.add_argument("--compression-ratio", type=positive_float, default=None,
                   help="fraction of gradient entries topk / randomk send (default 0.01)")
    p.add_argument("--backward-passes", type=positive_int, default=1,
                   help="gradients accumulated locally over this many batches per exchange")
    p.add_argument("--strategy", default="horovod",
                   choices=("horovod", "mirrored", "multi_worker_mirrored", "parameter_server"),
                   help="the backend (default: horovod; see the module docstring)")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="--strategy mirrored without a GPU: logical CPU devices (replicas)")
    p.add_argument("--metrics-out", default=None,
                   help="rank 0 writes the final metrics here as JSON")
    p.add_argument("--save", default=None, metavar="FILE.keras",
                   help="rank 0 writes the trained network here (keras.models.load_model reads it)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="rank 0 exports the trained network here as a SavedModel for serving")
    return p.parse_args(argv)


def write_json(path: str, obj: dict) -> None:
    """Writes ``obj`` to ``path`` through a temporary file, so readers never see half."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(out)


def main(argv=None) -> dict:
    args = parse_args(argv)
    horovod = args.strategy == "horovod"
    rank, size = start_backend(args)
    keras.utils.set_random_seed(args.seed + rank)  # rank 0's initial weights are broadcast

    try:
        name, (x_train, y_train, x_val, y_val, x_test, y_test) = load_data(
            args.dataset, args.data_dir, agree=horovod)
    except FileNotFoundError as err:  # the loader says where it looked and what to do
        sys.exit(f"error: {err}")
    if rank == 0:
        source = datasets.describe_source(name.replace("_", "-"))
        print(f"dataset: {name} ({len(x_train)} train / {len(x_val)} validation / "
              f"{len(x_test)} test) from {source}", flush=True)

    build_training_func, build_validation_func = make_build_functions(args.dropout)
    trainer = hvdtrain.Trainer(
        to_dataset(x_train, y_train), build_training_func,
        keras.optimizers.Adam, {"learning_rate": learning_rate(args, len(x_train), size)},
        batch_size=args.batch_size, checkpoint_dir=args.checkpoint_dir,
        log_step_size=args.log_step_size,
        validation_dataset=to_dataset(x_val, y_val), build_validation_func=build_validation_func,
        max_iteration=args.max_steps * size if args.max_steps else float("inf"),
        num_epochs=args.epochs, shuffle_buffer_size=args.shuffle_buffer or None, seed=args.seed,
        log_dir=args.log_dir, timeline=args.horovod_timeline, mixed_precision=args.mixed_precision,
        compression=args.compression, compression_ratio=args.compression_ratio,
        backward_passes_per_step=args.backward_passes, strategy=args.strategy)
    if rank == 0:
        print(f"{size} rank(s), global batch {args.batch_size * size}, learning rate "
              f"{args.lr} x {trainer.lr_scale:g}, {trainer.steps_per_epoch} steps per epoch",
              flush=True)

    start_step, t0 = trainer.global_step, time.perf_counter()
    trainer.train_to_end()  # or: while not trainer.session.should_stop(): trainer.train_on_batch()
    train_seconds = time.perf_counter() - t0
    steps = trainer.global_step - start_step

    validation = trainer.validation_metrics  # [(name, mean over the whole validation set)]
    test = trainer.evaluate(to_dataset(x_test, y_test))  # every rank scores its share
    if args.save:
        trainer.save(args.save)  # the network alone: keras.models.load_model reads it
    if args.export:
        trainer.export(args.export)  # a SavedModel for TensorFlow Serving
    metrics = {
        "dataset": name,
        "strategy": args.strategy,
        "world_size": size,
        "batch_size": args.batch_size,
        "global_batch": args.batch_size * size,
        "learning_rate": args.lr * trainer.lr_scale,
        "steps": steps,
        "global_step": trainer.global_step,
        "epochs": args.epochs,
        "train_seconds": train_seconds,
        "samples_per_sec": steps * args.batch_size * size / train_seconds if train_seconds else 0.0,
        "validation": dict(validation),
        "test_accuracy": test["acc"],
        "test_loss": test["loss"],
    }
    if rank == 0:
        print("validation: " + ", ".join(f"{k} {v:.4f}" for k, v in validation), flush=True)
        print(f"test accuracy {test['acc']:.4f}, test loss {test['loss']:.4f} "
              f"({steps} steps in {train_seconds:.1f} s, "
              f"{metrics['samples_per_sec']:.0f} samples/s)", flush=True)
        if args.metrics_out:
            write_json(args.metrics_out, metrics)
    return metrics


if __name__ == "__main__":
    main()
