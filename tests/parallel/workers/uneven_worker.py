"""Ranks with different amounts of data, through Horovod's own front doors.

``uneven_worker.py MODE OUT_DIR [options]``; each rank writes ``rank<R>.json`` and its
final weights ``rank<R>.npz``:

* ``fit``: ``model.fit`` through ``hvdtrain.tensorflow.keras`` with Horovod's callbacks.
  Rank r holds ``--rows R0,R1,...`` examples (``--truncate``: every rank the fewest);
  ``--data numpy|dataset|unknown`` (a ``tf.data`` pipeline whose cardinality is unknown);
  ``--jit`` compiles with XLA; ``--validation`` adds uneven validation data.
* ``tape``: a tape loop through ``hvdtrain.tensorflow`` (an embedding, so sparse
  gradients) in which rank r runs ``--rows`` batches, then ``hvd.join()``. Rank 0 also
  replays the whole job in one process as join promises it (a rank that has finished adds
  zeros; averages divide by every rank) and saves that as ``replay.npz``.
* ``fit-extra``: ``fit`` in which rank 0 runs an all-reduce of its own at the first epoch's
  end (a mismatch: the watchdog must end the job).
* ``tape-stop``: a tape loop in which rank 1 stops after 2 steps without ``join()`` and
  keeps busy (the watchdog must end the job).
"""
import argparse
import json
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow as hvd
import hvdtrain.tensorflow.keras as hvk
import init_settings

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["fit", "tape", "fit-extra", "tape-stop"])
parser.add_argument("out", type=Path)
parser.add_argument("--rows", default="640,448")
parser.add_argument("--truncate", action="store_true")
parser.add_argument("--data", default="numpy", choices=["numpy", "dataset", "unknown"])
parser.add_argument("--jit", action="store_true")
parser.add_argument("--validation", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

hvk.init()  # the Keras front door (hvd.init() is the same function)
settings = init_settings.set_after_init(hvk.local_rank())
rank, size = hvd.rank(), hvd.size()
rows = [int(n) for n in args.rows.split(",")]
BATCH = 64


def rank_data(r: int, n: int):
    """Rank r's examples (the same wherever they are made)."""
    rng = np.random.default_rng(100 + r)
    x = rng.normal(size=(n, 8)).astype("float32")
    return x, (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("float32")


def save(result: dict, weights: list) -> None:
    np.savez(args.out / f"rank{rank}.npz", *weights)
    (args.out / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "settings": {**settings, **init_settings.read_back()}, **result}))


def fit(extra: bool = False) -> None:
    n = min(rows) if args.truncate else rows[rank]
    x, y = rank_data(rank, n)
    keras.utils.set_random_seed(rank)  # different start on each rank: the broadcast fixes it
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = hvk.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(opt, loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=args.jit)
    if args.data == "numpy":
        data = dict(x=x, y=y, batch_size=BATCH)
    else:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if args.data == "unknown":
            ds = ds.filter(lambda a, b: True)
        data = dict(x=ds.batch(BATCH))
    callbacks = [hvk.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvk.callbacks.MetricAverageCallback()]
    if extra:
        class Extra(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if rank == 0 and epoch == 0:
                    hvd.allreduce(tf.ones([1]), name="only_rank_0")
        callbacks.append(Extra())
    if args.validation:
        data["validation_data"] = rank_data(50 + rank, 100 + 60 * rank)
    history = model.fit(**data, epochs=args.epochs, shuffle=False, verbose=0,
                        callbacks=callbacks)
    save({"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
          "iterations": int(opt.iterations.numpy())}, [w.numpy() for w in model.weights])


def embed_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                             keras.layers.Flatten(), keras.layers.Dense(1)])


def tape_batches(r: int, n: int):
    rng = np.random.default_rng(200 + r)
    return [(rng.integers(0, 50, size=(16, 3)).astype("int32"),
             rng.normal(size=(16, 1)).astype("float32")) for _ in range(n)]


def loss_of(model, x, y):
    return tf.reduce_mean(tf.square(model(x) - y))


def tape_step(model, opt):
    """Horovod's tape-loop step; ``.sparse`` says whether the gradients were sparse."""
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        train_step.sparse = isinstance(grads[0], tf.IndexedSlices)  # seen when traced
        opt.apply(grads, model.trainable_variables)
        return loss

    return train_step


def tape() -> None:
    model = embed_model()
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)
    start = [w.numpy() for w in model.weights]

    train_step = tape_step(model, opt)
    for x, y in tape_batches(rank, rows[rank]):
        train_step(x, y)
    last = int(hvd.join())  # Horovod's idiom: the last rank to join has every update
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=last)
    save({"last_joined": last, "sparse": train_step.sparse}, [w.numpy() for w in model.weights])
    if rank == 0:
        replay(start)


def replay(start: list) -> None:
    """The job in one process: each step averages the gradients of the ranks that still
    have data, divided by every rank."""
    model = embed_model()
    for w, v in zip(model.weights, start):
        w.assign(v)
    opt = keras.optimizers.SGD(0.1)
    batches = [tape_batches(r, rows[r]) for r in range(size)]
    for step in range(max(rows)):
        total = None
        for r in range(size):
            if step >= rows[r]:
                continue
            with tf.GradientTape() as t:
                loss = loss_of(model, *batches[r][step])
            grads = [tf.convert_to_tensor(g) for g in t.gradient(loss, model.trainable_variables)]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        opt.apply([g / size for g in total], model.trainable_variables)
    np.savez(args.out / "replay.npz", *[w.numpy() for w in model.weights])


def tape_stop() -> None:
    train_step = tape_step(embed_model(), keras.optimizers.SGD(0.1))
    for x, y in tape_batches(rank, 2 if rank == 1 else 6):
        train_step(x, y)
    if rank == 1:
        time.sleep(300)  # "other work": no collective


if args.mode == "fit":
    fit()
elif args.mode == "fit-extra":
    fit(extra=True)
elif args.mode == "tape":
    tape()
else:
    tape_stop()
print(f"rank {rank} finished", flush=True)
