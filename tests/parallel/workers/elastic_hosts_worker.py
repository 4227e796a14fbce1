"""A Horovod-style elastic script on ``hvdtrain.tensorflow`` whose hosts change between
epochs: a tape loop under ``hvd.elastic.run`` or Keras ``fit`` with the elastic callbacks.

At the end of each epoch the state is committed, rank 0 writes the number of finished
epochs to ``OUT/epoch`` (the test's discovery script reads it), and when the host set
changes at that epoch (``--change-at``) every rank waits at ``check_host_updates`` until
the driver's notice arrives, so each epoch runs with one world. Every worker appends JSON
lines to ``OUT/progress-<pid>.jsonl``; a worker that finishes writes ``OUT/final-<pid>.json``
with its weights and, on rank 0, the weights of a one-process replay of the same global
batches (the sizes the epochs ran at), to compare with.

Usage: elastic_hosts_worker.py OUT --mode tape|fit [--epochs 3] [--change-at 1,2]
                               [--hang-in-reset-on HOST]
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain.tensorflow as hvd  # noqa: E402
import hvdtrain.tensorflow.keras as hvdk  # noqa: E402

ROWS, BATCH, LR = 48, 4, 0.05


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ rng.normal(size=(3, 1))).astype("float32")


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def replay(sizes):
    """The weights one process gets from the same global batches: at world size ``s`` a
    step averages the gradients of ranks ``0..s-1``'s batches, the gradient of the mean
    loss over their union (equal batch sizes)."""
    x, y = data()
    model, opt = make_model(), keras.optimizers.SGD(LR, momentum=0.9)
    for s in sizes:
        shards = [(x[r::s], y[r::s]) for r in range(s)]
        for b in range(len(shards[0][0]) // BATCH):
            xb = np.concatenate([sx[b * BATCH:(b + 1) * BATCH] for sx, _ in shards])
            yb = np.concatenate([sy[b * BATCH:(b + 1) * BATCH] for _, sy in shards])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables))
    return model.get_weights()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["tape", "fit"], required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--change-at", default="1,2")
    parser.add_argument("--hang-in-reset-on", default=None)
    args = parser.parse_args()
    change_at = {int(e) for e in args.change_at.split(",") if e}
    host = os.environ.get("HOROVOD_HOSTNAME")
    progress = os.path.join(args.out, f"progress-{os.getpid()}.jsonl")

    def record(event, **extra):
        line = {"event": event, "time": time.time(), "pid": os.getpid(), "host": host,
                "rank": hvd.rank(), "size": hvd.size(), **extra}
        with open(progress, "a") as f:
            f.write(json.dumps(line) + "\n")

    hvd.init()
    x, y = data()
    model = make_model()
    opt = keras.optimizers.SGD(LR, momentum=0.9)
    if args.mode == "fit":
        model.compile(optimizer=hvdk.DistributedOptimizer(opt), loss="mse")
        state = hvdk.elastic.KerasState(model, epoch=0, batch=0, sizes=[])
    else:
        state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0, sizes=[])
    record("start")

    def on_reset():
        record("reset", epoch=state.epoch)
        if host == args.hang_in_reset_on:
            time.sleep(3600)  # a worker stuck in its reset

    state.register_reset_callbacks([on_reset])

    def epoch_done():
        """After the epoch's commit: tell the discovery script, wait for the new hosts."""
        record("epoch", epoch=state.epoch)
        if hvd.rank() == 0:
            with open(os.path.join(args.out, "epoch.tmp"), "w") as f:
                f.write(str(state.epoch))
            os.replace(os.path.join(args.out, "epoch.tmp"), os.path.join(args.out, "epoch"))
        if state.epoch in change_at:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.25)
                state.check_host_updates()  # raises HostsUpdatedInterrupt on the notice
            raise RuntimeError(f"no host change arrived after epoch {state.epoch}")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    class SizeOfEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            state.sizes = state.sizes + [hvd.size()]

    class EpochDone(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epoch_done()

    # the epoch is counted before the epoch-end commit, so a restart begins the next one
    callbacks = [hvdk.elastic.UpdateEpochStateCallback(state), SizeOfEpoch(),
                 hvdk.elastic.CommitStateCallback(state, batches_per_commit=2), EpochDone()]

    @(hvdk.elastic.run if args.mode == "fit" else hvd.elastic.run)
    def train(state):
        while state.epoch < args.epochs:
            s, r = hvd.size(), hvd.rank()
            xs, ys = x[r::s], y[r::s]
            if args.mode == "fit":
                model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                          callbacks=callbacks)
                continue
            for b in range(state.batch, len(xs) // BATCH):
                step(xs[b * BATCH:(b + 1) * BATCH], ys[b * BATCH:(b + 1) * BATCH])
                state.batch = b + 1
                state.commit()
            state.epoch, state.batch, state.sizes = state.epoch + 1, 0, state.sizes + [s]
            state.commit()
            epoch_done()

    train(state)
    final = {"rank": hvd.rank(), "size": hvd.size(), "host": host, "epoch": state.epoch,
             "sizes": state.sizes, "weights": [w.tolist() for w in model.get_weights()]}
    if hvd.rank() == 0:
        final["replay"] = [w.tolist() for w in replay(state.sizes)]
    record("end")
    with open(os.path.join(args.out, f"final-{os.getpid()}.json"), "w") as f:
        json.dump(final, f)


if __name__ == "__main__":
    main()
