"""Throughput of the Trainer against a hand-written Horovod loop, measured in the same run.

The model is an MLP 784-800-800-10 (ReLU) trained with plain SGD on in-memory random
data. Two workers train it:

* ``trainer``: :class:`hvdtrain.Trainer` with a build function, timing the documented
  loop ``while not t.should_stop(): t.train_on_batch()``.
* ``plain``: what a Horovod user writes by hand: ``ds.shard(size, rank).batch(B).repeat()``,
  a ``tf.function`` step with ``tf.GradientTape``, one ``hvd.grouped_allreduce`` of the
  gradients, a Keras SGD update and a broadcast of the initial weights. Like the Trainer it
  skips the collective when there is only one rank, so both modes do the same work at
  every size.

Both workers call :func:`hvdtrain.dist.init` (same thread settings), take the same number
of warm-up steps (the first traces the ``tf.function``), then time the same number of
steps between two barriers; the elapsed time is the largest over the ranks. Rank 0 writes
one JSON object with the samples/s summed over ranks (``global batch * steps / seconds``).

The driver, :func:`run_bench`, launches the workers as subprocesses (``python`` for one
rank, ``horovodrun --gloo`` or ``mpirun`` for more), alternates the modes ``repeats``
times, and reports medians, the trainer/plain ratio and the scaling efficiency
``samples/s(np) / (np * samples/s(1))`` of each mode. Nothing here imports TensorFlow
until a worker runs, so the driver stays light.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

MODES = ("trainer", "plain", "fit")
DEFAULT_MODES = ("trainer", "plain")
#: Trainer / DistributedOptimizer options the bench can vary (``--compression`` etc.).
OPTION_KEYS = ("compression", "compression_ratio", "op", "backward_passes_per_step",
               "mixed_precision")
LAUNCHERS = ("horovodrun", "mpirun")
MODEL = "MLP 784-800-800-10 (ReLU), SGD"
INPUT_DIM, HIDDEN, CLASSES = 784, 800, 10
LEARNING_RATE = 0.01

DEFAULT_STEPS = 200
DEFAULT_WARMUP = 10
DEFAULT_BATCH_SIZE = 128
DEFAULT_EXAMPLES = 8192
DEFAULT_REPEATS = 3
DEFAULT_SEED = 0
DEFAULT_TIMEOUT = 300.0


# --------------------------------------------------------------------------- worker side
def _make_data(examples: int, seed: int, size: int, batch_size: int):
    """Random inputs and labels; trimmed so every shard holds whole batches."""
    import numpy as np

    rng = np.random.default_rng(seed)
    per_step = size * batch_size
    n = max(per_step, examples - examples % per_step)
    x = rng.random((n, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(n,), dtype=np.int32)
    return x, y


def _mlp():
    import keras

    return keras.Sequential([keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(CLASSES)], name="mlp")


def _mean_xent(y, logits):
    import keras

    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                       from_logits=True))


def _build_fn(x, y):
    """The build function the Trainer gets: ``(network, loss, {})``."""
    net = _mlp()
    return net, _mean_xent(y, net(x)), {}


def _time_trainer(x, y, *, batch_size: int, steps: int, warmup: int, options: dict):
    """Warm-up steps, then the Trainer's own loop timed to its end."""
    import keras
    import tensorflow as tf

    from hvdtrain import dist
    from hvdtrain.trainer import Trainer

    size = dist.size()
    steps_per_epoch = len(x) // (size * batch_size)
    total = warmup + steps
    trainer = Trainer(tf.data.Dataset.from_tensor_slices((x, y)), _build_fn,
                      keras.optimizers.SGD, {"learning_rate": LEARNING_RATE},
                      batch_size=batch_size, log_step_size=10**9,
                      num_epochs=-(-total // steps_per_epoch) + 1,
                      max_iteration=total * size, progress_bar=False, **options)
    logs = None
    for _ in range(warmup):
        logs = trainer.train_on_batch()
    if logs is not None:
        float(logs["loss"])
    dist.barrier()
    start = time.perf_counter()
    while not trainer.should_stop():
        logs = trainer.train_on_batch()
    loss = float(logs["loss"])
    elapsed = time.perf_counter() - start
    if trainer.global_step != total:
        raise RuntimeError(f"the Trainer took {trainer.global_step} steps, expected {total}")
    return elapsed, loss


def _time_plain(x, y, *, batch_size: int, steps: int, warmup: int, options: dict):
    """The hand-written Horovod loop (the baseline, so it uses Horovod directly)."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain import dist

    size, rank = hvd.size(), hvd.rank()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(batch_size).repeat()
    model = _mlp()
    model.build((None, INPUT_DIM))
    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * size)  # linear scaling
    optimizer.build(model.trainable_variables)
    if size > 1:
        hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables],
                                root_rank=0)
    variables = model.trainable_variables

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = _mean_xent(yb, model(xb, training=True))
        grads = tape.gradient(loss, variables)
        if size > 1:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        optimizer.apply(grads, variables)
        return loss

    batches = iter(ds)
    loss = None
    for _ in range(warmup):
        loss = train_step(*next(batches))
    if loss is not None:
        float(loss)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(*next(batches))
    loss = float(loss)
    elapsed = time.perf_counter() - start
    return elapsed, loss


def _time_fit(x, y, *, batch_size: int, steps: int, warmup: int, options: dict):
    """Keras ``model.fit`` with ``hvdtrain.keras``: the steps after ``warmup`` are timed."""
    import keras
    import tensorflow as tf

    import hvdtrain.keras as hvk
    from hvdtrain import dist

    size, rank = dist.size(), dist.rank()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(batch_size).repeat()
    opt_kwargs = {k: v for k, v in options.items() if k != "mixed_precision"}
    policy = options.get("mixed_precision") or "float32"
    keras.mixed_precision.set_global_policy(policy)
    model = _mlp()
    model.build((None, INPUT_DIM))
    optimizer = hvk.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE * size), **opt_kwargs)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    clock = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == warmup - 1:
                dist.barrier()
                clock["start"] = time.perf_counter()

        def on_train_end(self, logs=None):
            clock["end"] = time.perf_counter()

    if warmup == 0:
        clock["start"] = time.perf_counter()
    hist = model.fit(ds, steps_per_epoch=warmup + steps, epochs=1, verbose=0,
                     callbacks=[hvk.BroadcastGlobalVariablesCallback(0), Clock()])
    return clock["end"] - clock["start"], float(hist.history["loss"][-1])


def bytes_sent_per_step(param_counts: Sequence[int], options: dict) -> float:
    """Bytes one rank puts on the wire per optimizer step, averaged over backward passes."""
    from hvdtrain import compression as compression_lib

    comp = compression_lib.resolve(options.get("compression"), options.get("compression_ratio"))
    if isinstance(comp, compression_lib.Sparsifier):
        total = sum(comp.bytes_per_step(n) for n in param_counts)
    else:
        value_bytes = 2 if options.get("compression") == "fp16" else 4
        total = sum(param_counts) * value_bytes
    return total / options.get("backward_passes_per_step", 1)


def run_worker(mode: str, *, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
               batch_size: int = DEFAULT_BATCH_SIZE, examples: int = DEFAULT_EXAMPLES,
               seed: int = DEFAULT_SEED, options: dict | None = None) -> dict:
    """Runs one timed training on this rank; every rank returns the same summary.

    Returns:
        A dict with ``samples_per_s`` (summed over ranks), ``elapsed_s`` (largest over
        ranks), the per-rank times and the settings.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    import keras

    from hvdtrain import dist

    dist.init()
    size, rank = dist.size(), dist.rank()
    keras.utils.set_random_seed(seed)
    x, y = _make_data(examples, seed, size, batch_size)
    options = dict(options or {})
    timed = {"trainer": _time_trainer, "plain": _time_plain, "fit": _time_fit}[mode]
    elapsed, loss = timed(x, y, batch_size=batch_size, steps=steps, warmup=warmup,
                          options=options if mode != "plain" else {})
    params = [INPUT_DIM * HIDDEN, HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN * CLASSES, CLASSES]
    per_rank = [float(t) for t in dist.allgather_object(float(elapsed))]
    slowest = max(per_rank)
    global_batch = batch_size * size
    return {
        "mode": mode, "np": size, "rank": rank, "steps": steps, "warmup": warmup,
        "batch_size": batch_size, "global_batch": global_batch, "examples": len(x),
        "elapsed_s": slowest, "elapsed_per_rank_s": per_rank,
        "samples_per_s": global_batch * steps / slowest, "final_loss": loss,
        "bytes_sent_per_step": bytes_sent_per_step(params, options if mode != "plain" else {}),
        "options": options if mode != "plain" else {},
    }


def _number_parser(cast, accept, what: str):
    """An argparse ``type`` that casts with ``cast`` and keeps values ``accept`` allows."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return parse


_positive_int = _number_parser(int, lambda v: v > 0, "a positive integer")
_non_negative_int = _number_parser(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number_parser(float, lambda v: v > 0, "a positive number")


def worker_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m hvdtrain.bench --worker`` (one timed run per rank)."""
    p = argparse.ArgumentParser(prog="python -m hvdtrain.bench --worker",
                                description="One timed benchmark run on this rank.")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--steps", type=_positive_int, default=DEFAULT_STEPS)
    p.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP)
    p.add_argument("--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--examples", type=_positive_int, default=DEFAULT_EXAMPLES)
    p.add_argument("--seed", type=_non_negative_int, default=DEFAULT_SEED)
    p.add_argument("--out", help="rank 0 writes the JSON result here (and always prints it)")
    p.add_argument("--options", type=json.loads, default={},
                   help="JSON object of Trainer options (compression, op, ...)")
    return p


RESULT_MARKER = "HVDTRAIN_BENCH_RESULT "


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hvdtrain.bench --worker ...`` runs a worker; anything else is ``hvdtrain bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" not in argv:
        from hvdtrain import cli

        return cli.main(["bench", *argv])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = worker_parser().parse_args(argv)
    result = run_worker(args.mode, steps=args.steps, warmup=args.warmup,
                        batch_size=args.batch_size, examples=args.examples, seed=args.seed,
                        options=args.options)
    if result["rank"] == 0:
        line = json.dumps(result)
        if args.out:
            tmp = Path(args.out).with_suffix(".tmp")
            tmp.write_text(line + "\n")
            tmp.replace(args.out)
        print(RESULT_MARKER + line, flush=True)
    return 0


# --------------------------------------------------------------------------- driver side
def worker_command(np: int, mode: str, *, launcher: str, steps: int, warmup: int,
                   batch_size: int, examples: int, seed: int, out: str,
                   python: str | None = None, options: dict | None = None) -> list[str]:
    """The command that runs one timed job of ``np`` ranks."""
    python = python or sys.executable
    worker = [python, "-m", "hvdtrain.bench", "--worker", "--mode", mode,
              "--steps", str(steps), "--warmup", str(warmup), "--batch-size", str(batch_size),
              "--examples", str(examples), "--seed", str(seed), "--out", out]
    if options and mode != "plain":
        worker += ["--options", json.dumps(options, sort_keys=True)]
    if np == 1:
        return worker
    if launcher == "horovodrun":
        horovodrun = shutil.which("horovodrun", path=str(Path(python).parent)) \
            or shutil.which("horovodrun")
        if not horovodrun:
            raise RuntimeError("horovodrun not found next to the Python interpreter or on PATH")
        return [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--gloo", *worker]
    if launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise RuntimeError("mpirun not found on PATH (install openmpi-bin)")
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        for var in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH", "PYTHONUNBUFFERED", "PATH"):
            cmd += ["-x", var]
        return cmd + worker
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def _worker_env() -> dict:
    package_parent = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    pythonpath = package_parent + (os.pathsep + path if path else "")
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)


def _kill_group(proc: subprocess.Popen) -> None:
    """Ends the job we started (its own process group), politely first."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_job(cmd: list[str], out: Path, timeout: float) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_worker_env(), start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output = proc.communicate()[0] or ""
        raise RuntimeError(f"benchmark job timed out after {timeout:g} s: {shlex.join(cmd)}\n"
                           f"{output[-3000:]}") from None
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"benchmark job exited {proc.returncode} without a result: "
                           f"{shlex.join(cmd)}\n{output[-3000:]}")
    return json.loads(out.read_text())


def summarize(runs: list[dict], np_list: Sequence[int],
              modes: Sequence[str] = DEFAULT_MODES) -> list[dict]:
    """Medians per (np, mode), the trainer/plain ratio and each mode's scaling efficiency.

    Efficiency at ``np`` ranks is ``samples/s(np) / (np * samples/s(1))``; it is ``None``
    when one rank was not measured.
    """
    medians = {}
    for np in np_list:
        for mode in modes:
            values = [r["samples_per_s"] for r in runs if r["np"] == np and r["mode"] == mode]
            medians[np, mode] = statistics.median(values) if values else None
    rows = []
    for np in np_list:
        row: dict = {"np": np}
        for mode in modes:
            values = [r["samples_per_s"] for r in runs if r["np"] == np and r["mode"] == mode]
            row[mode] = {"samples_per_s": medians[np, mode], "runs_samples_per_s": values}
        t, p = medians.get((np, "trainer")), medians.get((np, "plain"))
        f = medians.get((np, "fit"))
        row["ratio_trainer_over_plain"] = t / p if t and p else None
        if "fit" in modes:
            row["ratio_fit_over_trainer"] = f / t if f and t else None
            row["ratio_fit_over_plain"] = f / p if f and p else None
        row["bytes_sent_per_step"] = {
            mode: next((r.get("bytes_sent_per_step") for r in runs
                        if r["np"] == np and r["mode"] == mode), None) for mode in modes}
        row["efficiency"] = {}
        for mode in modes:
            base = medians.get((1, mode))
            value = medians[np, mode]
            row["efficiency"][mode] = value / (np * base) if base and value else None
        rows.append(row)
    return rows


def run_bench(np_list: Sequence[int] = (1, 2), steps: int = DEFAULT_STEPS,
              batch_size: int = DEFAULT_BATCH_SIZE, repeats: int = DEFAULT_REPEATS,
              launcher: str = "horovodrun", *, warmup: int = DEFAULT_WARMUP,
              examples: int = DEFAULT_EXAMPLES, seed: int = DEFAULT_SEED,
              timeout: float = DEFAULT_TIMEOUT, modes: Sequence[str] = DEFAULT_MODES,
              python: str | None = None, progress=None, options: dict | None = None) -> dict:
    """Launches the workers and returns the report (see :func:`format_table`).

    Each repeat runs every size once in each mode, alternating which mode goes first so
    a drift in machine load falls on both; the report holds medians over the repeats.

    Args:
        np_list: numbers of ranks to measure (one rank runs under plain ``python``).
        steps: timed steps per run (after ``warmup`` untimed ones).
        batch_size: examples per step on each rank.
        repeats: runs per (size, mode).
        launcher: ``"horovodrun"`` (Gloo) or ``"mpirun"`` for more than one rank.
        timeout: seconds before a job is killed and the benchmark fails.
        progress: called with a line of text after each run (e.g. ``print``).
        options: Trainer / DistributedOptimizer options for the trainer and fit modes
            (keys from ``OPTION_KEYS``); the plain loop stays the uncompressed baseline.

    Raises:
        ValueError: a bad argument, named.
        RuntimeError: a job failed or timed out, with its command and output.
    """
    np_list = list(dict.fromkeys(np_list))  # each size once, in the order given
    if not np_list or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in np_list):
        raise ValueError(f"np_list must hold positive integers, got {np_list!r}")
    for name, value in (("steps", steps), ("batch_size", batch_size), ("repeats", repeats),
                        ("examples", examples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be drawn from {MODES}, got {list(modes)!r}")
    options = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown bench options {unknown}; known: {list(OPTION_KEYS)}")
    runs, commands = [], {}
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for rep in range(repeats):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for np in np_list:
                for mode in order:
                    out = Path(tmp) / f"np{np}-{mode}-{rep}.json"
                    cmd = worker_command(np, mode, launcher=launcher, steps=steps, warmup=warmup,
                                         batch_size=batch_size, examples=examples, seed=seed,
                                         out=str(out), python=python, options=options)
                    commands.setdefault(f"np={np} {mode}", shlex.join(cmd).replace(
                        str(out), "<result.json>"))
                    t0 = time.perf_counter()
                    result = _run_job(cmd, out, timeout)
                    run = {"np": np, "mode": mode, "repeat": rep,
                           "samples_per_s": result["samples_per_s"],
                           "elapsed_s": result["elapsed_s"],
                           "elapsed_per_rank_s": result["elapsed_per_rank_s"],
                           "final_loss": result["final_loss"],
                           "bytes_sent_per_step": result.get("bytes_sent_per_step"),
                           "job_wall_s": time.perf_counter() - t0}
                    if result["np"] != np:
                        raise RuntimeError(f"asked for {np} ranks but the job ran {result['np']}: "
                                           f"{shlex.join(cmd)}")
                    runs.append(run)
                    if progress:
                        progress(f"  np={np} {mode:<7} repeat {rep + 1}/{repeats}: "
                                 f"{run['samples_per_s']:,.0f} samples/s")
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "benchmark": MODEL,
        "config": {"np": np_list, "steps": steps, "warmup": warmup, "batch_size": batch_size,
                   "examples": examples, "seed": seed, "repeats": repeats, "launcher": launcher,
                   "modes": list(modes), "options": options, "cpu_count": os.cpu_count(),
                   "load_average_after": load},
        "results": summarize(runs, np_list, modes),
        "runs": runs,
        "commands": commands,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: dict) -> str:
    """The report as a readable table."""
    cfg = report["config"]
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun --bind-to none"}[cfg["launcher"]]
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per rank, {cfg['steps']} timed "
             f"steps after {cfg['warmup']} warm-up, median of {cfg['repeats']}; "
             f"np>1 via {launch}; {cfg['cpu_count']} CPUs",
             "",
             f"{'np':>3} | {'trainer samples/s':>17} | {'plain samples/s':>15} | "
             f"{'trainer/plain':>13} | {'trainer eff.':>12} | {'plain eff.':>10}",
             "-" * 87]
    fit_rows = []
    for row in report["results"]:
        if "fit" in row:
            fit_rows.append(f"{row['np']:>3} | {_fmt(row['fit']['samples_per_s'], ',.0f'):>13} | "
                            f"{_fmt(row.get('ratio_fit_over_trainer'), '.3f'):>11} | "
                            f"{_fmt(row['efficiency'].get('fit'), '.3f'):>8}")
        t = row.get("trainer", {}).get("samples_per_s")
        p = row.get("plain", {}).get("samples_per_s")
        eff = row["efficiency"]
        lines.append(f"{row['np']:>3} | {_fmt(t, ',.0f'):>17} | {_fmt(p, ',.0f'):>15} | "
                     f"{_fmt(row['ratio_trainer_over_plain'], '.3f'):>13} | "
                     f"{_fmt(eff.get('trainer'), '.3f'):>12} | {_fmt(eff.get('plain'), '.3f'):>10}")
    if fit_rows:
        lines += ["", f"{'np':>3} | {'fit samples/s':>13} | {'fit/trainer':>11} | {'fit eff.':>8}",
                  "-" * 45, *fit_rows]
    sent = report["results"][-1].get("bytes_sent_per_step", {})
    if cfg.get("options"):
        lines += ["", f"options (trainer, fit): {json.dumps(cfg['options'], sort_keys=True)}"]
    if sent:
        lines += ["bytes sent per step per rank: " + ", ".join(
            f"{m} {_fmt(v, ',.0f')}" for m, v in sent.items())]
    lines += ["", "efficiency = samples/s at np ranks / (np x samples/s at 1 rank); "
              "samples/s are summed over ranks.",
              "Timings share the machine with whatever else runs on it."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
