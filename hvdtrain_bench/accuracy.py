"""One rank of a time-to-accuracy job (``hvdtrain bench --to-accuracy``): trains a
benchmark MLP on a real dataset's training split, epoch by epoch, with the Trainer
(``trainer``, any compression in ``options``) or a stock Horovod loop (``plain``,
``pertensor``: :mod:`hvdtrain_bench.baselines`), and after each epoch measures the test
accuracy, stopping at ``target`` or after ``max_epochs``.

Every loop reads the same data the same way: the training split trimmed to whole global
batches, sharded by rank, shuffled per pass (buffer ``SHUFFLE_BUFFER``, seed + rank) and
batched; Adam at ``learning_rate`` per rank, times the ranks (linear scaling). The
clock runs from a barrier before the first step to the end of each epoch's last step
(its loss read), so it counts the first step's tracing but not the evaluations: each
rank scores its share of the test split and the counts are summed over the ranks (so
every rank takes the same stop decision).
"""
from __future__ import annotations

import time

from hvdtrain_bench.mlp import build_fn_for
from hvdtrain_bench.settings import BASELINE_MODES, DEFAULT_MODEL, INPUT_DIM

#: Datasets a time-to-accuracy job can train on (``hvdtrain.datasets`` loaders).
DATASETS = ("fashion_mnist", "mnist")
SHUFFLE_BUFFER = 10000
DEFAULT_TARGET, DEFAULT_MAX_EPOCHS, DEFAULT_LEARNING_RATE = 0.86, 5, 5e-4
ACCURACY_MODES = ("trainer", "plain", "pertensor")


def load(dataset: str):
    """``(x_train, y_train, x_test, y_test)`` of ``dataset``, the whole training split
    (no validation split held out), images flattened to 784 floats in [0, 1]."""
    from hvdtrain import datasets

    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    loader = {"fashion_mnist": datasets.load_fashion_mnist_dataset,
              "mnist": datasets.load_mnist_dataset}[dataset]
    x, y, _, _, x_test, y_test = loader(shape=(-1, INPUT_DIM), n_validation=0, download=False)
    return x, y, x_test, y_test


def _test_accuracy(net, x_test, y_test, rank: int, size: int) -> float:
    """The network's accuracy on the test split, each rank scoring every ``size``-th
    example from its rank on; a collective (every rank calls it)."""
    import numpy as np

    from hvdtrain.horovod import collectives as dist

    xs, ys = x_test[rank::size], y_test[rank::size]
    correct = 0
    for i in range(0, len(xs), 1000):
        logits = net(xs[i:i + 1000], training=False)
        correct += int(np.sum(np.argmax(np.asarray(logits), axis=-1) == ys[i:i + 1000]))
    total, count = dist.allreduce_sum([float(correct), float(len(xs))])
    return float(total / count)


def _trainer_epochs(x, y, *, model: str, batch_size: int, learning_rate: float, seed: int,
                    max_epochs: int, options: dict):
    """The Trainer on ``(x, y)``; returns its network and ``epoch()``, which runs one
    epoch's steps and returns the last loss."""
    import keras
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.horovod import collectives as dist

    steps = len(x) // (dist.size() * batch_size)
    trainer = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, y)), build_fn_for(model),
                               keras.optimizers.Adam, {"learning_rate": learning_rate},
                               batch_size=batch_size, num_epochs=max_epochs,
                               shuffle_buffer_size=SHUFFLE_BUFFER, seed=seed,
                               progress_bar=False, log_step_size=steps, **options)

    def epoch() -> float:
        logs = None
        for _ in range(steps):
            logs = trainer.train_on_batch()
        return float(logs["loss"])
    return trainer.training_network, epoch


def _horovod_epochs(mode: str, x, y, *, model: str, batch_size: int, learning_rate: float,
                    seed: int):
    """The stock Horovod loop ``mode`` on ``(x, y)``, fed as the Trainer feeds itself;
    returns its network and ``epoch()``."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain_bench import baselines

    size, rank = hvd.size(), hvd.rank()
    steps = len(x) // (size * batch_size)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank)
          .shuffle(SHUFFLE_BUFFER, seed=seed + rank, reshuffle_each_iteration=True)
          .batch(batch_size, drop_remainder=True).repeat())
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate * size)  # linear scaling
    net, train_step = baselines.horovod_loop(baselines.STEPS[mode], model, optimizer)
    batches = iter(ds)

    def epoch() -> float:
        loss = None
        for _ in range(steps):
            loss = train_step(*next(batches))
        return float(loss)
    return net, epoch


def run_to_accuracy(mode: str, *, target: float, max_epochs: int, dataset: str = "fashion_mnist",
                    model: str = DEFAULT_MODEL, batch_size: int = 128,
                    learning_rate: float = DEFAULT_LEARNING_RATE, seed: int = 0,
                    options: dict | None = None) -> dict:
    """Trains ``mode`` epoch by epoch until the test accuracy reaches ``target`` or
    ``max_epochs`` have run; Horovod must be started (every rank returns the same dict).

    Returns:
        ``epochs`` (per epoch: ``train_s`` so far, ``test_accuracy``, ``loss``),
        ``reached``, ``time_to_target_s`` and ``epochs_to_target`` (``None`` when not
        reached), ``final_accuracy``, ``train_s``, ``steps_per_epoch``, ``step_s``,
        ``samples_per_s`` and the settings.
    """
    import keras

    from hvdtrain.horovod import collectives as dist

    if mode not in ACCURACY_MODES:
        raise ValueError(f"mode must be one of {ACCURACY_MODES} with --to-accuracy, got {mode!r}")
    if not 0 < target <= 1:
        raise ValueError(f"target must be an accuracy in (0, 1], got {target!r}")
    options = {} if mode in BASELINE_MODES else dict(options or {})
    size, rank = dist.size(), dist.rank()
    x, y, x_test, y_test = load(dataset)
    n = len(x) - len(x) % (size * batch_size)
    x, y = x[:n], y[:n]
    keras.utils.set_random_seed(seed)
    kwargs = dict(model=model, batch_size=batch_size, learning_rate=learning_rate, seed=seed)
    if mode == "trainer":
        net, epoch = _trainer_epochs(x, y, max_epochs=max_epochs, options=options, **kwargs)
    else:
        net, epoch = _horovod_epochs(mode, x, y, **kwargs)
    epochs, train_s, reached_at = [], 0.0, None
    dist.barrier()
    for e in range(1, max_epochs + 1):
        start = time.perf_counter()
        loss = epoch()
        train_s += time.perf_counter() - start
        train_s = max(dist.allgather_object(train_s))  # the slowest rank's clock
        acc = _test_accuracy(net, x_test, y_test, rank, size)
        epochs.append({"epoch": e, "train_s": train_s, "test_accuracy": acc, "loss": loss})
        if acc >= target:
            reached_at = epochs[-1]
            break
    steps_per_epoch = n // (size * batch_size)
    steps = steps_per_epoch * len(epochs)
    return {"mode": mode, "model": model, "dataset": dataset, "np": size, "rank": rank,
            "target": target, "max_epochs": max_epochs, "batch_size": batch_size,
            "global_batch": batch_size * size, "learning_rate": learning_rate,
            "optimizer": "Adam", "seed": seed, "options": options, "examples": n,
            "epochs": epochs, "reached": reached_at is not None,
            "time_to_target_s": reached_at["train_s"] if reached_at else None,
            "epochs_to_target": reached_at["epoch"] if reached_at else None,
            "final_accuracy": epochs[-1]["test_accuracy"], "train_s": train_s,
            "steps_per_epoch": steps_per_epoch, "steps": steps, "step_s": train_s / steps,
            "samples_per_s": steps * batch_size * size / train_s}
