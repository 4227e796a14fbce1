"""One rank of a ``hvdtrain bench`` job: ``python -m hvdtrain_bench --worker --mode M``.

Every mode starts its world (``hvdtrain``'s Horovod set-up, or stock ``hvd.init()`` and
stock thread settings for the hand-written baselines, or ``TF_CONFIG`` for
MultiWorkerMirrored), trains the benchmark MLP (``--model``) on the same random data,
times the same number of steps and counts the device-to-host reads they made. Rank 0
prints one result line (``RESULT_MARKER`` then JSON) and writes it to ``--out``; the
``probe`` mode times all-reduces instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

from hvdtrain import threads
from hvdtrain_bench import baselines, loops, probe
from hvdtrain_bench.jobs import write_result
from hvdtrain_bench.mlp import make_data
from hvdtrain_bench.settings import (BASELINE_MODES, DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLES,
                                     DEFAULT_MODEL, DEFAULT_SEED, DEFAULT_STEPS,
                                     DEFAULT_WARMUP, LAUNCHED_AT_ENV, MODELS, MODES,
                                     RESULT_MARKER, add_worker_arguments, param_counts)
from hvdtrain_bench.timing import Timing

#: The timed loop of each mode that trains on in-memory data.
TIMED = {"trainer": loops.time_trainer, "plain": baselines.time_plain,
         "pertensor": baselines.time_pertensor, "mwms": baselines.time_mwms,
         "fit": loops.time_fit}


def bytes_sent_per_step(param_counts: Sequence[int], options: dict) -> float:
    """Bytes one rank puts on the wire per optimizer step, averaged over backward passes."""
    from hvdtrain.horovod import compression as compression_lib

    comp = compression_lib.resolve(options.get("compression"), options.get("compression_ratio"))
    if isinstance(comp, compression_lib.Sparsifier):
        total = sum(comp.bytes_per_step(n) for n in param_counts)
    else:
        value_bytes = 2 if options.get("compression") == "fp16" else 4
        total = sum(param_counts) * value_bytes
    return total / options.get("backward_passes_per_step", 1)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _horovod_world(stock: bool):
    """Starts Horovod (``hvd.init()`` alone for a stock baseline, else hvdtrain's
    ``init()``); returns (size, rank, gather) where ``gather(obj)`` lists every rank's
    ``obj``."""
    from hvdtrain.horovod import collectives as dist

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


def _time_mode(mode: str, x, y, size: int, *, model: str, options: dict,
               **kwargs) -> tuple[Timing, int]:
    """Runs ``mode``'s timed loop; returns its timing and the examples it trained on."""
    if mode == "trainer_files":
        source = loops.fashion_mnist_source(size, kwargs["batch_size"])
        return loops.time_trainer(None, None, options=options, model=model, source=source,
                                  **kwargs), source[1]
    return TIMED[mode](x, y, options=options, model=model, **kwargs), len(x)


def run_worker(mode: str, *, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
               batch_size: int = DEFAULT_BATCH_SIZE, examples: int = DEFAULT_EXAMPLES,
               seed: int = DEFAULT_SEED, options: dict | None = None,
               model: str = DEFAULT_MODEL) -> dict:
    """Runs one timed training on this rank; every rank returns the same summary.

    Returns:
        A dict with ``samples_per_s`` (summed over ranks), ``elapsed_s`` (largest over
        ranks), the per-rank times, ``host_reads`` (this rank's device-to-host reads in
        the timed steps) and the settings.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {tuple(MODELS)}, got {model!r}")
    import keras

    launched_at = float(os.environ.get(LAUNCHED_AT_ENV, "nan"))
    started = {}

    def first_step():
        started.setdefault("s", time.time() - launched_at)

    options = dict(options or {}) if mode not in BASELINE_MODES else {}
    if mode == "mwms":
        size, rank, gather = _tf_config_world()
    else:
        size, rank, gather = _horovod_world(stock=mode in BASELINE_MODES)
    keras.utils.set_random_seed(seed)
    x, y = make_data(examples, seed, size, batch_size)
    timing, n_examples = _time_mode(mode, x, y, size, model=model, options=options,
                                    batch_size=batch_size, steps=steps, warmup=warmup,
                                    first_step=first_step)
    per_rank = [float(t) for t in gather(float(timing.elapsed_s))]
    slowest = max(per_rank)
    global_batch = batch_size * size
    startup = [s for s in gather(started.get("s")) if s is not None and s == s]
    rss = [float(m) for m in gather(peak_rss_mb())]
    return {
        "mode": mode, "model": model, "np": size, "rank": rank, "steps": steps,
        "warmup": warmup, "batch_size": batch_size, "global_batch": global_batch,
        "examples": n_examples, "elapsed_s": slowest, "elapsed_per_rank_s": per_rank,
        "samples_per_s": global_batch * steps / slowest, "final_loss": timing.final_loss,
        "host_reads": timing.host_reads, "host_reads_per_step": timing.host_reads / steps,
        "params": sum(param_counts(model)),
        "bytes_sent_per_step": bytes_sent_per_step(param_counts(model), options),
        "startup_s": max(startup) if startup else None,
        "peak_rss_mb_per_rank": rss, "options": options,
    }


def worker_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m hvdtrain_bench --worker`` (one timed run per rank)."""
    p = argparse.ArgumentParser(prog="python -m hvdtrain_bench --worker",
                                description="One timed benchmark run on this rank.")
    p.add_argument("--mode", choices=MODES + ("probe",), required=True)
    add_worker_arguments(p)
    p.add_argument("--model", choices=tuple(MODELS), default=DEFAULT_MODEL,
                   help="the benchmark model (default: %(default)s)")
    p.add_argument("--out", help="rank 0 writes the JSON result here (and always prints it)")
    p.add_argument("--options", type=json.loads, default={},
                   help="JSON object of Trainer options (compression, op, ...)")
    p.add_argument("--to-accuracy", type=float, default=None, metavar="TARGET",
                   help="instead: train epochs on --dataset until this test accuracy "
                        "(hvdtrain_bench.accuracy)")
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--lr", type=float, default=None, help="--to-accuracy's rate per rank")
    return p


def run_accuracy_worker(args: argparse.Namespace) -> dict:
    """A ``--to-accuracy`` job's rank: its world started as :func:`run_worker` starts
    it, then :func:`hvdtrain_bench.accuracy.run_to_accuracy`."""
    from hvdtrain_bench import accuracy

    _horovod_world(stock=args.mode in BASELINE_MODES)
    kwargs = {k: v for k, v in (("max_epochs", args.max_epochs),
                                ("learning_rate", args.lr)) if v is not None}
    return accuracy.run_to_accuracy(args.mode, target=args.to_accuracy, dataset=args.dataset,
                                    model=args.model, batch_size=args.batch_size,
                                    seed=args.seed, options=args.options,
                                    **{"max_epochs": accuracy.DEFAULT_MAX_EPOCHS, **kwargs})


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one worker from its command line; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = worker_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.mode in BASELINE_MODES:
        threads.restore_thread_environment()  # stock TensorFlow threads, as users get
    if args.to_accuracy is not None:
        result = run_accuracy_worker(args)
    elif args.mode == "probe":
        from hvdtrain.horovod import collectives as dist

        result = {"mode": "probe", "probes": probe.probe_allreduce()}
        result.update(np=dist.size(), rank=dist.rank())
    else:
        result = run_worker(args.mode, steps=args.steps, warmup=args.warmup,
                            batch_size=args.batch_size, examples=args.examples, seed=args.seed,
                            options=args.options, model=args.model)
    if result["rank"] == 0:
        write_result(result, args.out, RESULT_MARKER)
    return 0
