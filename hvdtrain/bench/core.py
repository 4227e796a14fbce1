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

MODES = ("trainer", "plain", "fit", "mwms", "trainer_files")
DEFAULT_MODES = ("trainer", "plain", "mwms")
#: What a user writes by hand with stock settings: no hvdtrain defaults apply to them.
BASELINE_MODES = ("plain", "mwms")
#: The driver passes the launch time (``time.time()``) so workers can time their start-up.
LAUNCHED_AT_ENV = "HVDTRAIN_BENCH_LAUNCHED_AT"
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


def _time_trainer(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
                  first_step=lambda: None, source=None):
    """Warm-up steps, then the Trainer's own loop timed to its end.

    ``source`` is an unbatched ``(dataset, examples)`` to train on instead of ``(x, y)``.
    """
    import keras
    import tensorflow as tf

    from hvdtrain.backends.horovod import collectives as dist
    from hvdtrain.trainer import Trainer

    size = dist.size()
    dataset, examples = source or (tf.data.Dataset.from_tensor_slices((x, y)), len(x))
    steps_per_epoch = examples // (size * batch_size)
    total = warmup + steps
    trainer = Trainer(dataset, _build_fn,
                      keras.optimizers.SGD, {"learning_rate": LEARNING_RATE},
                      batch_size=batch_size, log_step_size=10**9,
                      num_epochs=-(-total // steps_per_epoch) + 1,
                      max_iteration=total * size, progress_bar=False, **options)
    logs = None
    for i in range(warmup):
        logs = trainer.train_on_batch()
        if i == 0:
            float(logs["loss"])
            first_step()
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


def _time_plain(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
                first_step=lambda: None):
    """The hand-written Horovod loop (the baseline, so it uses Horovod directly)."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain.backends.horovod import collectives as dist

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
    for i in range(warmup):
        loss = train_step(*next(batches))
        if i == 0:
            float(loss)
            first_step()
    if loss is not None:
        float(loss)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(*next(batches))
    loss = float(loss)
    elapsed = time.perf_counter() - start
    return elapsed, loss


def _time_fit(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
              first_step=lambda: None):
    """Keras ``model.fit`` with ``hvdtrain.keras``: the steps after ``warmup`` are timed."""
    import keras
    import tensorflow as tf

    import hvdtrain.keras as hvk
    from hvdtrain.backends.horovod import collectives as dist

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
            if batch == 0:
                first_step()
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
    from hvdtrain.backends.horovod import compression as compression_lib

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

    launched_at = float(os.environ.get(LAUNCHED_AT_ENV, "nan"))
    started = {}

    def first_step():
        started.setdefault("s", time.time() - launched_at)

    options = dict(options or {}) if mode not in BASELINE_MODES else {}
    if mode == "mwms":
        size, rank, gather = _tf_config_world()
    else:
        size, rank, gather = _horovod_world(stock=mode == "plain")
    keras.utils.set_random_seed(seed)
    x, y = _make_data(examples, seed, size, batch_size)
    n_examples = len(x)
    kwargs = dict(batch_size=batch_size, steps=steps, warmup=warmup, first_step=first_step)
    if mode == "mwms":
        from hvdtrain.bench import modes as bench_modes

        elapsed, loss, _ = bench_modes.time_mwms(x, y, **kwargs)
    elif mode == "trainer_files":
        from hvdtrain.bench import modes as bench_modes

        source = bench_modes.fashion_mnist_source(size, batch_size)
        n_examples = source[1]
        elapsed, loss = _time_trainer(None, None, options=options, source=source, **kwargs)
    else:
        timed = {"trainer": _time_trainer, "plain": _time_plain, "fit": _time_fit}[mode]
        elapsed, loss = timed(x, y, options=options, **kwargs)
    params = [INPUT_DIM * HIDDEN, HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN * CLASSES, CLASSES]
    per_rank = [float(t) for t in gather(float(elapsed))]
    slowest = max(per_rank)
    global_batch = batch_size * size
    startup = [s for s in gather(started.get("s")) if s is not None and s == s]
    rss = [float(m) for m in gather(peak_rss_mb())]
    return {
        "mode": mode, "np": size, "rank": rank, "steps": steps, "warmup": warmup,
        "batch_size": batch_size, "global_batch": global_batch, "examples": n_examples,
        "elapsed_s": slowest, "elapsed_per_rank_s": per_rank,
        "samples_per_s": global_batch * steps / slowest, "final_loss": loss,
        "bytes_sent_per_step": bytes_sent_per_step(params, options),
        "startup_s": max(startup) if startup else None,
        "peak_rss_mb_per_rank": rss, "options": options,
    }


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _horovod_world(stock: bool):
    """Starts Horovod (``hvd.init()`` alone for a stock baseline, else hvdtrain's
    ``dist.init()``); returns (size, rank, gather) where ``gather(obj)`` lists every
    rank's ``obj``."""
    from hvdtrain.backends.horovod import collectives as dist

    if stock:
        import horovod.tensorflow as hvd

        hvd.init()
    else:
        dist.init()
    return dist.size(), dist.rank(), dist.allgather_object


def _tf_config_world():
    """(size, rank, gather) of a tf.distribute job from ``TF_CONFIG``; only this worker's
    values are gathered (its clock times the same synchronous steps as the others')."""
    cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
    size = max(1, len(cfg.get("cluster", {}).get("worker", [])))
    return size, int(cfg.get("task", {}).get("index", 0)), lambda obj: [obj]


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
    p.add_argument("--mode", choices=MODES + ("probe",), required=True)
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
    if args.mode in BASELINE_MODES:
        import hvdtrain

        hvdtrain._restore_thread_environment()  # stock TensorFlow threads, as users get
    if args.mode == "probe":
        from hvdtrain.bench import modes as bench_modes
        from hvdtrain.backends.horovod import collectives as dist

        result = {"mode": "probe", "probes": bench_modes.probe_allreduce()}
        result.update(np=dist.size(), rank=dist.rank())
    else:
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
    if options and mode not in BASELINE_MODES:
        worker += ["--options", json.dumps(options, sort_keys=True)]
    if np == 1 or mode == "mwms":
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


def job_processes(np: int, mode: str, *, launcher: str, reference_cores: int | None = None,
                  **kwargs) -> list[tuple[list[str], dict]]:
    """The processes (command, extra environment) of one timed job of ``np`` ranks.

    Horovod jobs are one launcher command; a MultiWorkerMirrored job is ``np`` workers
    that find each other through ``TF_CONFIG``. With ``reference_cores`` a one-rank job
    runs on that many cores (``taskset``): the share of the machine one rank gets in the
    larger jobs, so scaling efficiency compares like with like.
    """
    cmd = worker_command(np, mode, launcher=launcher, **kwargs)
    if mode == "mwms" and np > 1:
        from hvdtrain.bench import backends as backend_bench

        hosts = [f"127.0.0.1:{port}" for port in backend_bench._free_ports(np)]
        return [(cmd, {"TF_CONFIG": json.dumps({"cluster": {"worker": hosts},
                                                "task": {"type": "worker", "index": i}})})
                for i in range(np)]
    if np == 1 and reference_cores:
        cores = sorted(_usable_cpus())[:reference_cores]
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
    return [(cmd, {})]


def _usable_cpus() -> set:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


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


def _run_job(processes: list[tuple[list[str], dict]], out: Path, timeout: float) -> dict:
    """Starts every process of a job (each in its own process group, with the launch time
    in its environment) and returns the result rank 0 wrote to ``out``.

    The first process to fail ends the others at once (a tf.distribute worker would
    otherwise wait for its dead peer until the timeout).
    """
    env0 = _worker_env()
    shown = shlex.join(processes[0][0])
    timed_out, failed = False, None
    with tempfile.TemporaryDirectory(prefix="hvdtrain-job-") as logs:
        procs, files = [], []
        for i, (cmd, extra) in enumerate(processes):
            files.append(open(Path(logs) / f"{i}.log", "w+"))
            env = {**env0, **extra, LAUNCHED_AT_ENV: repr(time.time())}
            procs.append(subprocess.Popen(cmd, stdout=files[-1], stderr=subprocess.STDOUT,
                                          text=True, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout
        try:
            while failed is None and [p.poll() for p in procs].count(None):
                failed = next((i for i, p in enumerate(procs) if p.returncode), None)
                timed_out = time.monotonic() > deadline
                if timed_out:
                    break
                time.sleep(0.05)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    _kill_group(proc)
        outputs = []
        for f in files:
            f.seek(0)
            outputs.append(f.read())
            f.close()
    if timed_out:
        raise RuntimeError(f"benchmark job timed out after {timeout:g} s: {shown}\n"
                           f"{''.join(outputs)[-3000:]}")
    if failed is None:
        failed = next((i for i, p in enumerate(procs) if p.returncode), None)
    if failed is not None or not out.is_file():
        i = failed or 0
        raise RuntimeError(f"benchmark job exited {procs[i].returncode} without a result: "
                           f"{shlex.join(processes[i][0])}\n{outputs[i][-3000:]}")
    return json.loads(out.read_text())


#: (name, numerator mode, denominator mode) of the ratios the report gives per size.
RATIOS = (("trainer_over_plain", "trainer", "plain"), ("trainer_over_mwms", "trainer", "mwms"),
          ("fit_over_trainer", "fit", "trainer"), ("fit_over_plain", "fit", "plain"),
          ("trainer_files_over_trainer", "trainer_files", "trainer"))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], np_list: Sequence[int],
              modes: Sequence[str] = DEFAULT_MODES) -> list[dict]:
    """Medians per (np, mode), the ratios between modes and each mode's scaling efficiency.

    Efficiency at ``np`` ranks is ``samples/s(np) / (np * samples/s(1))``; it is ``None``
    when one rank was not measured. Start-up is launch to the end of the first step (the
    slowest rank); memory is the peak resident set of the largest rank.
    """
    def pick(np, mode, key):
        return [r.get(key) for r in runs if r["np"] == np and r["mode"] == mode]

    medians = {(np, m): _median(pick(np, m, "samples_per_s")) for np in np_list for m in modes}
    rows = []
    for np in np_list:
        row: dict = {"np": np}
        for mode in modes:
            rss = [max(v) for v in pick(np, mode, "peak_rss_mb_per_rank") if v]
            row[mode] = {"samples_per_s": medians[np, mode],
                         "runs_samples_per_s": pick(np, mode, "samples_per_s"),
                         "startup_s": _median(pick(np, mode, "startup_s")),
                         "peak_rss_mb": _median(rss)}
        for name, top, bottom in RATIOS:
            if top in modes and bottom in modes:
                t, b = medians[np, top], medians[np, bottom]
                row[f"ratio_{name}"] = t / b if t and b else None
        if "trainer" in modes and "plain" in modes:
            t, p = row["trainer"]["peak_rss_mb"], row["plain"]["peak_rss_mb"]
            row["rss_trainer_over_plain"] = t / p if t and p else None
        row["bytes_sent_per_step"] = {m: next(iter(pick(np, m, "bytes_sent_per_step")), None)
                                      for m in modes}
        row["efficiency"] = {}
        for mode in modes:
            base, value = medians.get((1, mode)), medians[np, mode]
            row["efficiency"][mode] = value / (np * base) if base and value else None
        rows.append(row)
    return rows


def figures(report: dict) -> list[dict]:
    """Every figure of the report, flat, each with the command that produced it."""
    cmds, out = report["commands"], []
    for row in report["results"]:
        np = row["np"]
        for mode in report["config"]["modes"]:
            cmd = cmds.get(f"np={np} {mode}")
            for key in ("samples_per_s", "startup_s", "peak_rss_mb"):
                out.append({"figure": key, "np": np, "mode": mode, "value": row[mode][key],
                            "command": cmd})
            out.append({"figure": "efficiency", "np": np, "mode": mode,
                        "value": row["efficiency"][mode],
                        "command": [cmds.get(f"np=1 {mode}"), cmd]})
        for key, value in row.items():
            if key.startswith(("ratio_", "rss_")):
                out.append({"figure": key, "np": np, "value": value,
                            "command": [c for k, c in cmds.items() if k.startswith(f"np={np} ")]})
    if report.get("probes"):
        out.append({"figure": "allreduce_probes", "value": report["probes"],
                    "command": cmds.get("probe")})
    return out


def run_bench(np_list: Sequence[int] = (1, 2), steps: int = DEFAULT_STEPS,
              batch_size: int = DEFAULT_BATCH_SIZE, repeats: int = DEFAULT_REPEATS,
              launcher: str = "horovodrun", *, warmup: int = DEFAULT_WARMUP,
              examples: int = DEFAULT_EXAMPLES, seed: int = DEFAULT_SEED,
              timeout: float = DEFAULT_TIMEOUT, modes: Sequence[str] = DEFAULT_MODES,
              python: str | None = None, progress=None, options: dict | None = None,
              probe: bool = True) -> dict:
    """Launches the workers and returns the report (see :func:`format_table`).

    Each repeat runs every size once in each mode, alternating which mode goes first so
    a drift in machine load falls on both; the report holds medians over the repeats.
    One-rank runs use the cores one rank gets at the largest size (see
    :func:`job_processes`).

    Args:
        np_list: numbers of ranks to measure (one rank runs under plain ``python``).
        steps: timed steps per run (after ``warmup`` untimed ones).
        batch_size: examples per step on each rank.
        repeats: runs per (size, mode).
        launcher: ``"horovodrun"`` (Gloo) or ``"mpirun"`` for more than one rank.
        timeout: seconds before a job is killed and the benchmark fails.
        progress: called with a line of text after each run (e.g. ``print``).
        options: Trainer / DistributedOptimizer options for the hvdtrain modes (keys
            from ``OPTION_KEYS``); the baselines stay uncompressed.
        probe: also time all-reduces of several sizes at the largest size (the inputs of
            the cost model in :mod:`hvdtrain.perf_model`).

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
    largest = max(np_list)
    reference_cores = max(1, len(_usable_cpus()) // largest) if largest > 1 else None
    common = dict(launcher=launcher, steps=steps, warmup=warmup, batch_size=batch_size,
                  examples=examples, seed=seed, python=python)
    runs, commands, probes = [], {}, None
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for rep in range(repeats):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for np in np_list:
                for mode in order:
                    out = Path(tmp) / f"np{np}-{mode}-{rep}.json"
                    procs = job_processes(np, mode, reference_cores=reference_cores,
                                          out=str(out), options=options, **common)
                    commands.setdefault(f"np={np} {mode}", _shown(procs, out))
                    t0 = time.perf_counter()
                    result = _run_job(procs, out, timeout)
                    if result["np"] != np:
                        raise RuntimeError(f"asked for {np} ranks but the job ran {result['np']}: "
                                           f"{shlex.join(procs[0][0])}")
                    run = {key: result.get(key) for key in (
                        "samples_per_s", "elapsed_s", "elapsed_per_rank_s", "final_loss",
                        "bytes_sent_per_step", "startup_s", "peak_rss_mb_per_rank")}
                    run.update(np=np, mode=mode, repeat=rep, job_wall_s=time.perf_counter() - t0)
                    runs.append(run)
                    if progress:
                        progress(f"  np={np} {mode:<13} repeat {rep + 1}/{repeats}: "
                                 f"{run['samples_per_s']:,.0f} samples/s")
        if probe and largest > 1:
            out = Path(tmp) / "probe.json"
            procs = job_processes(largest, "probe", out=str(out), options=None, **common)
            commands["probe"] = _shown(procs, out)
            probes = _run_job(procs, out, timeout)["probes"]
            if progress:
                progress(f"  np={largest} all-reduce probes: " + ", ".join(
                    f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in probes))
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    report = {
        "benchmark": MODEL,
        "config": {"np": np_list, "steps": steps, "warmup": warmup, "batch_size": batch_size,
                   "examples": examples, "seed": seed, "repeats": repeats, "launcher": launcher,
                   "modes": list(modes), "options": options, "cpu_count": os.cpu_count(),
                   "reference_cores": reference_cores, "load_average_after": load},
        "results": summarize(runs, np_list, modes),
        "runs": runs,
        "probes": probes,
        "commands": commands,
    }
    report["figures"] = figures(report)
    return report


def _shown(procs: list[tuple[list[str], dict]], out: Path) -> str:
    """A job's command as a reader would rerun it from the repository root (one line per
    process; paths inside the checkout are relative to it)."""
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    lines = []
    for cmd, extra in procs:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
        shown = shlex.join(cmd).replace(str(out), "<result.json>").replace(root, "")
        lines.append((env + " " if env else "") + shown)
    return " & ".join(lines) if len(lines) > 1 else lines[0]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


_LABELS = {"trainer": "trainer", "plain": "plain hvd", "mwms": "MWMS", "fit": "fit",
           "trainer_files": "trainer files"}


def format_table(report: dict) -> str:
    """The report as a readable table."""
    cfg = report["config"]
    modes = cfg["modes"]
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun --bind-to none"}[cfg["launcher"]]
    ref = cfg.get("reference_cores")
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per rank, {cfg['steps']} timed "
             f"steps after {cfg['warmup']} warm-up, median of {cfg['repeats']}; "
             f"np>1 via {launch}; {cfg['cpu_count']} CPUs"
             + (f"; np=1 runs on {ref} core(s), one rank's share" if ref else ""), "",
             "samples/s (scaling efficiency)"]
    width = 19
    lines.append(f"{'np':>3} | " + " | ".join(f"{_LABELS[m]:>{width}}" for m in modes))
    lines.append("-" * (6 + (width + 3) * len(modes)))
    for row in report["results"]:
        cells = []
        for m in modes:
            value, eff = row[m]["samples_per_s"], row["efficiency"][m]
            cells.append(f"{_fmt(value, ',.0f')} ({_fmt(eff, '.2f')})".rjust(width))
        lines.append(f"{row['np']:>3} | " + " | ".join(cells))
    ratio_names = [name for name, top, bottom in RATIOS if top in modes and bottom in modes]
    if ratio_names:
        lines += ["", "ratios: " + "; ".join(
            f"np={row['np']} " + ", ".join(
                f"{name.replace('_over_', '/')} {_fmt(row.get('ratio_' + name), '.3f')}"
                for name in ratio_names) for row in report["results"])]
    lines += ["", f"{'np':>3} | " + " | ".join(f"{_LABELS[m] + ' start s / RSS MB':>28}"
                                                for m in modes)]
    for row in report["results"]:
        lines.append(f"{row['np']:>3} | " + " | ".join(
            f"{_fmt(row[m]['startup_s'], '.1f')} / {_fmt(row[m]['peak_rss_mb'], ',.0f')}".rjust(28)
            for m in modes))
    if report.get("probes"):
        lines += ["", "all-reduce probes (np={}): ".format(report["probes"][0]["np"]) + ", ".join(
            f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in report["probes"])]
    sent = report["results"][-1].get("bytes_sent_per_step", {})
    if cfg.get("options"):
        lines += ["", f"options (hvdtrain modes): {json.dumps(cfg['options'], sort_keys=True)}"]
    if sent:
        lines += ["bytes sent per step per rank: " + ", ".join(
            f"{_LABELS[m]} {_fmt(v, ',.0f')}" for m, v in sent.items() if v is not None)]
    lines += ["", "efficiency = samples/s at np ranks / (np x samples/s at 1 rank); "
              "samples/s are summed over ranks;",
              "start s = launch to the end of the first step; RSS = peak resident memory of "
              "the largest rank.",
              "plain hvd / MWMS = hand-written Horovod / MultiWorkerMirroredStrategy loops "
              "with stock settings.",
              "Timings share the machine with whatever else runs on it."]
    return "\n".join(lines)


def write_report(report: dict, out_dir) -> dict:
    """Writes the measured table, the fitted cost model and its predictions for 2-512
    workers (:mod:`hvdtrain.perf_model`) to ``out_dir``: ``performance.md``,
    ``scaling.png`` and the whole report as ``bench.json``.

    Raises:
        ValueError: the report lacks one rank, a larger size, or the all-reduce probes.
    """
    from hvdtrain.bench import perf_model

    cfg, rows = report["config"], {r["np"]: r for r in report["results"]}
    larger = sorted(n for n in rows if n > 1)
    if 1 not in rows or not larger or not report.get("probes") or "trainer" not in cfg["modes"]:
        raise ValueError("--report needs the trainer mode at --np 1 and a larger size, and the "
                         "all-reduce probes (leave --no-probe off)")
    batch = cfg["batch_size"]
    model = perf_model.fit_step(
        batch / rows[1]["trainer"]["samples_per_s"],
        [{"np": n, "step_s": batch * n / rows[n]["trainer"]["samples_per_s"]} for n in larger],
        rows[larger[-1]]["bytes_sent_per_step"]["trainer"], perf_model.fit_link(report["probes"]))
    modes = cfg["modes"]
    ratio_names = [name for name, top, bottom in RATIOS if top in modes and bottom in modes]
    columns = (["np"] + [f"{_LABELS[m]} samples/s (eff.)" for m in modes]
               + [name.replace("_over_", "/") for name in ratio_names]
               + [f"{_LABELS[m]} start s / RSS MB" for m in modes])
    table = []
    for row in report["results"]:
        cells = {"np": row["np"]}
        for m in modes:
            cells[f"{_LABELS[m]} samples/s (eff.)"] = (
                f"{_fmt(row[m]['samples_per_s'], ',.0f')} ({_fmt(row['efficiency'][m], '.2f')})")
            cells[f"{_LABELS[m]} start s / RSS MB"] = (
                f"{_fmt(row[m]['startup_s'], '.1f')} / {_fmt(row[m]['peak_rss_mb'], ',.0f')}")
        for name in ratio_names:
            cells[name.replace("_over_", "/")] = _fmt(row.get("ratio_" + name), ".3f")
        table.append(cells)
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun"}[cfg["launcher"]]
    paths = perf_model.write_report({
        "title": f"{MODEL}, batch {batch}/rank, {launch}, {cfg['cpu_count']} CPUs",
        "model": model,
        "measured_columns": columns, "measured_rows": table}, out_dir)
    paths["json"] = Path(out_dir) / "bench.json"
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    return paths


if __name__ == "__main__":
    sys.exit(main())
