"""GPU throughput of the Trainer against hand-written Horovod loops (ResNet-50, synthetic data).

One process (or one ``horovodrun`` job) measures one (mode, precision) pair, because mixed
precision is a global Keras policy:

* ``trainer``: :class:`hvdtrain.Trainer` with a build function, timing ``--steps`` calls
  of ``train_on_batch()`` (each checks ``should_stop()`` and fetches its batch).
* ``plain``: what a Horovod user writes by hand: a ``tf.function`` step with
  ``tf.GradientTape``, one ``hvd.grouped_allreduce`` of the gradients, a Keras SGD update
  (wrapped in ``keras.optimizers.LossScaleOptimizer`` for ``mixed_float16``) and a broadcast
  of the initial weights.
* ``keras``: single-process Keras ``fit`` with no Horovod in the step (``compile`` with
  its defaults, so XLA where a GPU is visible): what one GPU does on its own. One rank only.
* ``tape``: Horovod's documented idiom: the same step, but the tape is wrapped in
  ``hvd.DistributedGradientTape``, whose ``gradient()`` all-reduces each gradient tensor
  on its own (Horovod's background thread fuses what arrives together). On Keras 3 the
  gradients are taken with respect to the model's ``tf.Variable``s (``v.value``): Horovod's
  tape keys them by ``Variable.ref()``, which Keras 3 variables lack.

All modes read the same input pipeline: one random batch per rank, sliced, repeated,
sharded and batched, so the data never runs out and costs next to nothing. All call
``hvdtrain.init()`` first (``hvd.init()``, the usual one-GPU-per-local-rank pinning,
an even split of CPU threads), take ``--warmup`` untimed steps (tracing, cuDNN autotuning),
then time ``--steps`` steps between two barriers; the time is the slowest rank's. Rank 0
prints one JSON line (and writes it to ``--out``) with the images/s summed over ranks.

``--summarize RUN.json ...`` merges such results into one summary (``--out``) and prints a
table with the trainer/plain and trainer/tape ratios per precision; it does not import
TensorFlow.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

MODES = ("trainer", "plain", "tape", "keras")
PRECISIONS = ("float32", "mixed_float16")
MODELS = ("resnet50", "tiny")
CLASSES = 1000
LEARNING_RATE = 0.01


def make_model(name: str, image_size: int):
    """A fresh, unbuilt-weights classifier (logits) under the current dtype policy.

    Args:
        name: ``"resnet50"`` (``keras.applications.ResNet50``) or ``"tiny"`` (two small
            convolutions, for CPU tests).
        image_size: height and width of the square RGB input.
    """
    import keras

    shape = (image_size, image_size, 3)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape, classes=CLASSES,
                                           classifier_activation=None)
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES),
    ], name="tiny")


def mean_xent(labels, logits):
    """Mean sparse cross-entropy, computed in float32 whatever the logits' dtype."""
    import keras

    logits = keras.ops.cast(logits, "float32")
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))


def synthetic_dataset(batch_size: int, image_size: int, seed: int = 0, ranks: int | None = None):
    """Unbatched ``(image, label)`` pairs: one random batch per rank, repeated forever."""
    import numpy as np
    import tensorflow as tf

    if ranks is None:
        from hvdtrain.horovod import collectives as dist

        ranks = dist.size()
    rng = np.random.default_rng(seed)
    n = batch_size * ranks  # every shard then holds one distinct batch
    x = rng.random((n, image_size, image_size, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(n,), dtype=np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat()


def time_trainer(args: argparse.Namespace) -> tuple[float, float]:
    """Warm-up steps, then ``--steps`` timed Trainer steps."""
    import keras

    import hvdtrain
    from hvdtrain.horovod import collectives as dist

    def build(x, y):
        net = make_model(args.model, args.image_size)
        return net, mean_xent(y, net(x)), {}

    total = args.warmup + args.steps
    trainer = hvdtrain.Trainer(synthetic_dataset(args.batch_size, args.image_size), build,
                               keras.optimizers.SGD, {"learning_rate": LEARNING_RATE},
                               batch_size=args.batch_size, log_step_size=10**9,
                               max_iteration=total * dist.size(), progress_bar=False,
                               mixed_precision=args.precision)
    logs = None
    for _ in range(args.warmup):
        logs = trainer.train_on_batch()
    if logs is not None:
        float(logs["loss"])  # wait for the device
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        logs = trainer.train_on_batch()
    loss = float(logs["loss"])
    elapsed = time.perf_counter() - start
    # The end of training (should_stop() tears down the prefetching input iterator, a
    # fixed cost of ~0.3 s) is left out of the throughput, as it is for the plain loop.
    if not trainer.should_stop() or trainer.global_step != total:
        raise RuntimeError(f"the Trainer took {trainer.global_step} steps, expected {total}")
    return elapsed, loss


def time_plain(args: argparse.Namespace) -> tuple[float, float]:
    """The hand-written Horovod loop with one grouped all-reduce of the gradients."""
    return _time_horovod_loop(args, per_tensor=False)


def time_tape(args: argparse.Namespace) -> tuple[float, float]:
    """The hand-written Horovod loop with ``hvd.DistributedGradientTape`` (per tensor)."""
    return _time_horovod_loop(args, per_tensor=True)


def _time_horovod_loop(args: argparse.Namespace, per_tensor: bool) -> tuple[float, float]:
    """A baseline loop as Horovod users write it (so it uses Horovod directly).

    Args:
        args: the command-line options.
        per_tensor: wrap the tape in ``hvd.DistributedGradientTape`` (one all-reduce per
            gradient) instead of one ``hvd.grouped_allreduce`` of all the gradients.
    """
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain.horovod import collectives as dist

    hvd.init()  # already done by dist.init(); a no-op here, kept as a user writes it
    size, rank = hvd.size(), hvd.rank()
    keras.mixed_precision.set_global_policy(args.precision)
    ds = (synthetic_dataset(args.batch_size, args.image_size).shard(size, rank)
          .batch(args.batch_size).prefetch(tf.data.AUTOTUNE))
    model = make_model(args.model, args.image_size)
    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * size)  # linear scaling
    if args.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    variables = model.trainable_variables
    tf_variables = [v.value for v in variables]  # Keras 3 variables have no .ref()
    optimizer.build(variables)
    if size > 1:
        hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables],
                                root_rank=0)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = mean_xent(labels, model(images, training=True))
            scaled = (optimizer.scale_loss(loss) if args.precision == "mixed_float16"
                      else loss)
        if per_tensor:  # Horovod's tape keys gradients by Variable.ref(): tf.Variables
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(scaled, tf_variables)
        else:
            grads = tape.gradient(scaled, variables)
            if size > 1:
                grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        optimizer.apply(grads, variables)  # the loss scaler unscales and skips overflows
        return loss

    batches = iter(ds)
    loss = None
    for _ in range(args.warmup):
        loss = train_step(*next(batches))
    if loss is not None:
        float(loss)
    dist.barrier()  # horovod.tensorflow 0.28 has no barrier(); the same one as the Trainer's
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(*next(batches))
    loss = float(loss)
    return time.perf_counter() - start, loss


def time_keras(args: argparse.Namespace) -> tuple[float, float]:
    """Single-process Keras ``fit``, no Horovod: warm-up steps, then ``--steps`` timed ones
    (Keras reads each step's logs back, so the clock sees finished steps)."""
    import keras

    keras.mixed_precision.set_global_policy(args.precision)
    model = make_model(args.model, args.image_size)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE), loss=mean_xent)
    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args.warmup - 1:
                marks["start"] = time.perf_counter()

    marks["start"] = time.perf_counter()
    data = synthetic_dataset(args.batch_size, args.image_size, ranks=1).batch(args.batch_size)
    history = model.fit(data, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0,
                        callbacks=[Clock()])
    return time.perf_counter() - marks["start"], float(history.history["loss"][-1])


def device_name() -> str:
    """The name of this rank's first visible GPU, or ``"CPU"``."""
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return "CPU"
    try:
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name)
    except (RuntimeError, ValueError):
        return gpus[0].name


def run(args: argparse.Namespace) -> dict | None:
    """Runs one timed training on this rank; rank 0 returns the result, others ``None``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    if args.mode == "keras":  # no Horovod at all: one process on its own
        if int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("HOROVOD_SIZE", "1"))) > 1:
            raise SystemExit("--mode keras runs one process without Horovod: launch it alone")
        slowest, loss = time_keras(args)
        size = 1
    else:
        from hvdtrain.horovod import collectives as dist

        dist.init()
        modes: dict[str, Callable] = {"trainer": time_trainer, "plain": time_plain,
                                      "tape": time_tape}
        elapsed, loss = modes[args.mode](args)
        slowest = max(float(t) for t in dist.allgather_object(float(elapsed)))
        if dist.rank() != 0:
            return None
        size = dist.size()
    return {
        "images_per_s": args.batch_size * size * args.steps / slowest,
        "mode": args.mode, "precision": args.precision, "np": size,
        "batch": args.batch_size, "global_batch": args.batch_size * size,
        "steps": args.steps, "warmup": args.warmup, "elapsed_s": slowest,
        "model": args.model, "image_size": args.image_size, "device": device_name(),
        "final_loss": loss, "tensorflow": tf.__version__,
    }


def summarize(paths: Sequence[str]) -> dict:
    """Merges per-run results.

    ``ratios[precision]`` is trainer/plain images/s, ``ratios_tape[precision]``
    trainer/tape and ``ratios_keras[precision]`` trainer/keras (``None`` where a run is
    missing).
    """
    results = [json.loads(Path(p).read_text()) for p in paths]
    speed = {(r["precision"], r["mode"]): r["images_per_s"] for r in results}
    precisions = list(dict.fromkeys(r["precision"] for r in results))

    def ratio(prec: str, baseline: str) -> float | None:
        t, b = speed.get((prec, "trainer")), speed.get((prec, baseline))
        return t / b if t and b else None

    return {"results": results, "ratios": {p: ratio(p, "plain") for p in precisions},
            "ratios_tape": {p: ratio(p, "tape") for p in precisions},
            "ratios_keras": {p: ratio(p, "keras") for p in precisions}}


def format_table(summary: dict) -> str:
    """The summary as a table: images/s per (precision, mode), trainer/plain, trainer/tape."""
    rows = summary["results"]
    first = rows[0] if rows else {}
    lines = [f"{first.get('model')} {first.get('image_size')}px, batch {first.get('batch')} "
             f"per worker, np={first.get('np')}, {first.get('steps')} timed steps after "
             f"{first.get('warmup')} warm-up, device: {first.get('device')}",
             "plain: one grouped all-reduce per step; tape: hvd.DistributedGradientTape, "
             "one all-reduce per gradient tensor; keras: one process's Keras fit, no Horovod",
             f"{'precision':<14} | {'trainer img/s':>13} | {'plain img/s':>11} | "
             f"{'tape img/s':>10} | {'keras img/s':>11} | {'trainer/plain':>13} | "
             f"{'trainer/tape':>12} | {'trainer/keras':>13}", "-" * 122]
    tape_ratios = summary.get("ratios_tape", {})
    keras_ratios = summary.get("ratios_keras", {})
    for prec, ratio in summary["ratios"].items():
        cell = {m: next((f"{r['images_per_s']:,.1f}" for r in rows
                         if r["precision"] == prec and r["mode"] == m), "-") for m in MODES}
        per_tensor, alone = tape_ratios.get(prec), keras_ratios.get(prec)
        lines.append(f"{prec:<14} | {cell['trainer']:>13} | {cell['plain']:>11} | "
                     f"{cell['tape']:>10} | {cell['keras']:>11} | "
                     f"{'-' if ratio is None else format(ratio, '.3f'):>13} | "
                     f"{'-' if per_tensor is None else format(per_tensor, '.3f'):>12} | "
                     f"{'-' if alone is None else format(alone, '.3f'):>13}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64, help="images per step per worker")
    p.add_argument("--steps", type=int, default=100, help="timed steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before timing")
    p.add_argument("--mode", choices=MODES, default="trainer")
    p.add_argument("--precision", choices=PRECISIONS, default="float32")
    p.add_argument("--out", help="rank 0 writes its JSON line (or the summary) here")
    p.add_argument("--summarize", nargs="+", metavar="RUN_JSON",
                   help="merge these results into --out and print the table instead of running")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one benchmark, or summarizes results with ``--summarize``."""
    args = parser().parse_args(argv)
    if args.summarize:
        summary = summarize(args.summarize)
        text = json.dumps(summary, indent=1)
    else:
        if min(args.image_size, args.batch_size, args.steps) < 1 or args.warmup < 0:
            raise SystemExit("--image-size, --batch-size and --steps must be >= 1, --warmup >= 0")
        summary = run(args)
        if summary is None:
            return 0
        text = json.dumps(summary)
        print(text, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.out)
    if args.summarize:
        print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
