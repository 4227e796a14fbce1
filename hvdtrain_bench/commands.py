"""The ``hvdtrain bench`` and ``hvdtrain bench-backends`` subcommands: their options and
what they print. :mod:`hvdtrain.cli` adds them to the ``hvdtrain`` command; nothing here
imports it."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from hvdtrain_bench import backends, driver, link_figures, links, memory, report, to_accuracy
from hvdtrain_bench.accuracy import DATASETS, DEFAULT_LEARNING_RATE, DEFAULT_MAX_EPOCHS
from hvdtrain_bench.links import LINK_MODES
from hvdtrain_bench.netns import DEFAULT_BURST, DEFAULT_LATENCY
from hvdtrain_bench.settings import (DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLES, DEFAULT_MODEL,
                                     DEFAULT_MODES, DEFAULT_REPEATS, DEFAULT_STEPS,
                                     DEFAULT_TIMEOUT, DEFAULT_WARMUP, LAUNCHERS, MODELS, MODES,
                                     non_negative_int, positive_float, positive_int)

BENCH_HELP = "throughput of the Trainer against hand-written Horovod and tf.distribute loops"
BENCH_DESCRIPTION = ("Trains an MLP (784-800-800-10, or 784-2048x4-10 with --model wide) on "
                     "random data with the hvdtrain Trainer and with hand-written Horovod "
                     "(grouped and per-tensor) and MultiWorkerMirrored loops, at each number of "
                     "ranks, and prints samples/s, the scaling efficiency, the Trainer's ratio "
                     "to each baseline and the host reads per step.")


class _Given(argparse.Action):
    """Stores the option's value and notes in ``given`` that it was given: ``--hosts``
    has defaults of its own for the options a user leaves out."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = set(getattr(namespace, "given", ())) | {self.dest}


def _link_rate(text: str) -> str:
    """An argparse ``type`` for ``--link``: a tc rate (``2gbit``) or ``none``."""
    from hvdtrain_bench.link_figures import parse_rate

    try:
        parse_rate(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``hvdtrain bench``; the parser runs :func:`run_bench_command`."""
    p.add_argument("--np", dest="np_list", nargs="+", type=positive_int, default=[1, 2],
                   metavar="N", action=_Given,
                   help="numbers of ranks to measure (default: 1 2; --memory: 1 2 4)")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, action=_Given,
                   help=f"timed steps per run (default: {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP,
                   help=f"untimed steps first (default: {DEFAULT_WARMUP})")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE,
                   help=f"examples per step on each rank (default: {DEFAULT_BATCH_SIZE})")
    p.add_argument("--examples", type=positive_int, default=DEFAULT_EXAMPLES,
                   help=f"size of the random dataset (default: {DEFAULT_EXAMPLES})")
    p.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS,
                   help=f"runs per size and mode; the median is reported "
                        f"(default: {DEFAULT_REPEATS})")
    p.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun", action=_Given,
                   help="how jobs of more than one rank start (default: horovodrun, Gloo, "
                        "also with --hosts)")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT,
                   help=f"seconds before a job is killed (default: {DEFAULT_TIMEOUT:g})")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (with the commands used) instead of a table")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES),
                   metavar="MODE", action=_Given, help="what to time: " + ", ".join(MODES)
                   + f" (default: {' '.join(DEFAULT_MODES)}; with --hosts: "
                   + f"{' '.join(LINK_MODES)})")
    p.add_argument("--hosts", type=positive_int, default=None, metavar="N",
                   help="emulated cluster: N network-namespace hosts, one rank each "
                        "(scripts/netns_hosts.sh; root only); needs --link")
    p.add_argument("--link", nargs="+", type=_link_rate, default=None, metavar="RATE",
                   help="with --hosts: the hosts' link rates to measure, each a tc rate "
                        "(500mbit, 2gbit, 5gbit) or none (unshaped)")
    p.add_argument("--tbf-burst", default=DEFAULT_BURST, metavar="SIZE",
                   help=f"with --hosts: the tbf bucket's burst (default: {DEFAULT_BURST})")
    p.add_argument("--tbf-latency", default=DEFAULT_LATENCY, metavar="TIME",
                   help=f"with --hosts: the tbf queue's latency (default: {DEFAULT_LATENCY})")
    p.add_argument("--model", dest="models", nargs="+", choices=tuple(MODELS),
                   default=[DEFAULT_MODEL], metavar="MODEL",
                   help="the models to train, each with rows of its own: "
                        + ", ".join(f"{name} = {spec.title}" for name, spec in MODELS.items())
                        + f" (default: {DEFAULT_MODEL})")
    p.add_argument("--fit", action="store_true",
                   help="also measure Keras model.fit with hvdtrain.keras")
    p.add_argument("--files", action="store_true",
                   help="also train the Trainer on Fashion-MNIST streamed from its files")
    p.add_argument("--memory", action="store_true",
                   help="instead: optimizer-state bytes and peak RSS per rank, Adam sharded "
                        "(shard_optimizer=True) against unsharded, at --np ranks (default "
                        "1 2 4), for an MLP of --params parameters, --steps steps (default 3)")
    p.add_argument("--params", type=positive_int, default=memory.DEFAULT_PARAMS,
                   help="--memory's MLP size in parameters (default: about 100 M)")
    p.add_argument("--no-probe", action="store_true",
                   help="skip the all-reduce probes (the cost model's inputs)")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="write performance.md (measured table, fitted cost model, predicted "
                        "efficiency for 2-512 workers), scaling.svg and bench.json to DIR")
    p.add_argument("--compression", choices=["none", "fp16", "topk", "randomk"], default=None,
                   help="gradient compression for the Trainer and fit runs")
    p.add_argument("--compression-ratio", type=positive_float, default=None,
                   help="fraction of entries sent by topk / randomk (default 0.01)")
    p.add_argument("--op", choices=["average", "sum", "adasum"], default=None,
                   help="gradient reduction (adasum needs --launcher mpirun)")
    p.add_argument("--backward-passes", type=positive_int, default=None,
                   help="local gradient accumulation steps per exchange")
    p.add_argument("--mixed-precision", choices=["float32", "mixed_float16", "mixed_bfloat16"],
                   default=None, help="dtype policy of the Trainer and fit runs")
    p.add_argument("--bucket-mb", type=positive_float, default=None,
                   help="gradient bucket size in MiB of the Trainer and fit runs "
                        "(default: hvdtrain's, 25; inf: one all-reduce)")
    p.add_argument("--steps-per-execution", type=positive_int, default=None,
                   help="steps per call of the compiled step (Trainer and fit)")
    p.add_argument("--jit", action="store_true",
                   help="XLA-compile the forward and backward pass (Trainer and fit)")
    p.add_argument("--shard-optimizer", action="store_true",
                   help="shard the optimizer state over the ranks (ZeRO-1; Trainer and fit); "
                        "with --hosts the Trainer runs both unsharded (trainer) and sharded "
                        "(trainer_sharded), back to back, and their ratio is printed")
    p.add_argument("--to-accuracy", type=positive_float, default=None, metavar="TARGET",
                   help="with --hosts: instead, the wall time each configuration takes to "
                        "reach this test accuracy on --dataset (e.g. 0.86)")
    p.add_argument("--dataset", choices=DATASETS, default="fashion_mnist",
                   help="--to-accuracy's data (default: fashion_mnist, Debian's "
                        "dataset-fashion-mnist)")
    p.add_argument("--max-epochs", type=positive_int, default=DEFAULT_MAX_EPOCHS,
                   help=f"--to-accuracy: stop after this many epochs (default: "
                        f"{DEFAULT_MAX_EPOCHS})")
    p.add_argument("--lr", type=positive_float, default=DEFAULT_LEARNING_RATE,
                   help=f"--to-accuracy: Adam's learning rate per rank, times the ranks "
                        f"(default: {DEFAULT_LEARNING_RATE:g})")
    p.add_argument("--configs", nargs="+", default=list(to_accuracy.CONFIGS), metavar="NAME",
                   help="--to-accuracy's configurations: " + ", ".join(to_accuracy.CONFIGS)
                        + " (trainer_powersgd_rN for any N; default: all)")
    p.add_argument("--wide-link", nargs="+", type=_link_rate, default=["2gbit"], metavar="RATE",
                   help="--to-accuracy: also the wide MLP at these rates ('none': not at all; "
                        "default: 2gbit)")
    p.add_argument("--wide-configs", nargs="+", default=list(to_accuracy.WIDE_CONFIGS),
                   metavar="NAME", help="--to-accuracy: the wide MLP's configurations "
                   f"(default: {' '.join(to_accuracy.WIDE_CONFIGS)})")
    p.set_defaults(func=run_bench_command, given=set())


def add_bench(sub) -> None:
    """Adds ``hvdtrain bench`` to the subcommands ``sub`` (from ``add_subparsers``)."""
    add_bench_arguments(sub.add_parser("bench", help=BENCH_HELP, description=BENCH_DESCRIPTION))


def _print_report(rep: dict, format_table, as_json: bool) -> None:
    """Prints ``rep`` as JSON, or as ``format_table(rep)`` and the commands it ran."""
    if as_json:
        print(json.dumps(rep, indent=2))
        return
    print()
    print(format_table(rep))
    print("\ncommands:")
    for name, cmd in rep["commands"].items():
        print(f"  {name}: {cmd}")


def _options(args: argparse.Namespace) -> dict:
    """The Trainer / DistributedOptimizer options the command line sets."""
    return {"compression": args.compression, "compression_ratio": args.compression_ratio,
            "op": args.op, "backward_passes_per_step": args.backward_passes,
            "mixed_precision": args.mixed_precision, "bucket_mb": args.bucket_mb,
            "steps_per_execution": args.steps_per_execution,
            "jit_compile": True if args.jit else None,
            "shard_optimizer": True if args.shard_optimizer else None}


def run_links_command(args: argparse.Namespace) -> int:
    """Runs ``hvdtrain bench --hosts N --link RATE ...``; returns the exit status."""
    if args.hosts is None or not args.link:
        print("hvdtrain bench: error: --hosts N and --link RATE... go together (e.g. "
              "--hosts 2 --link 500mbit 2gbit 5gbit)", file=sys.stderr)
        return 2
    out = sys.stderr if args.json else sys.stdout  # the progress of a long run, always
    progress = lambda line: print(line, file=out, flush=True)  # noqa: E731
    if args.to_accuracy is not None:
        return run_accuracy_command(args, progress)
    modes = args.modes if "modes" in args.given else list(LINK_MODES)
    modes = list(dict.fromkeys(modes + ["fit"] * args.fit))
    try:
        rep = links.run_link_bench(
            args.hosts, args.link, models=args.models, modes=modes, steps=args.steps,
            warmup=args.warmup, batch_size=args.batch_size, examples=args.examples,
            repeats=args.repeats, timeout=args.timeout,
            launcher=args.launcher,
            burst=args.tbf_burst, latency=args.tbf_latency, options=_options(args),
            probe=not args.no_probe, progress=progress)
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench: error: {err}", file=sys.stderr)
        return 1
    _print_report(rep, link_figures.format_table, args.json)
    return 0


def run_accuracy_command(args: argparse.Namespace, progress) -> int:
    """Runs ``hvdtrain bench --hosts N --link RATE... --to-accuracy T``."""
    try:
        rep = to_accuracy.run_accuracy_bench(
            args.hosts, args.link, target=args.to_accuracy, max_epochs=args.max_epochs,
            dataset=args.dataset, configs=args.configs, wide_links=args.wide_link,
            wide_configs=args.wide_configs, batch_size=args.batch_size,
            learning_rate=args.lr, seed=0,
            repeats=args.repeats if args.repeats != DEFAULT_REPEATS else 1,  # one by default
            launcher=args.launcher, burst=args.tbf_burst, latency=args.tbf_latency,
            timeout=args.timeout if args.timeout != DEFAULT_TIMEOUT else 1800.0,
            probe=not args.no_probe, progress=progress)
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench: error: {err}", file=sys.stderr)
        return 1
    _print_report(rep, to_accuracy.format_table, args.json)
    return 0


def run_memory_command(args: argparse.Namespace) -> int:
    """Runs ``hvdtrain bench --memory``; returns the exit status."""
    np_list = args.np_list if "np_list" in args.given else [1, 2, 4]
    steps = args.steps if "steps" in args.given else 3
    progress = None if args.json else (lambda line: print(line, flush=True))
    try:
        records = memory.run(np_list, params=args.params, steps=steps,
                             batch_size=args.batch_size, progress=progress)
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(records, indent=2) if args.json else memory.format_table(records))
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    """Runs ``hvdtrain bench`` with parsed ``args``; returns the exit status."""
    if args.hosts is not None or args.link:
        return run_links_command(args)
    if args.memory:
        return run_memory_command(args)
    progress = None if args.json else (lambda line: print(line, flush=True))
    modes = list(dict.fromkeys(args.modes + ["fit"] * args.fit + ["trainer_files"] * args.files))
    options = _options(args)
    models = list(dict.fromkeys(args.models))
    if progress:
        jobs = len(args.np_list) * len(modes) * len(models) * args.repeats
        progress(f"running {jobs} jobs (np {' '.join(map(str, args.np_list))}, "
                 f"model {' '.join(models)}, {args.repeats} repeat(s))...")
    try:
        rep = driver.run_bench(np_list=args.np_list, steps=args.steps,
                               batch_size=args.batch_size, repeats=args.repeats,
                               launcher=args.launcher, warmup=args.warmup,
                               examples=args.examples, timeout=args.timeout,
                               progress=progress, modes=modes, options=options,
                               probe=not args.no_probe, models=models)
        paths = report.write_report(rep, args.report) if args.report else {}
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench: error: {err}", file=sys.stderr)
        return 1
    _print_report(rep, report.format_table, args.json)
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``hvdtrain bench`` on its own (``python -m hvdtrain_bench ...``)."""
    p = argparse.ArgumentParser(prog="hvdtrain bench", description=BENCH_DESCRIPTION)
    add_bench_arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    return args.func(args)


def add_bench_backends(sub) -> None:
    """Adds ``hvdtrain bench-backends`` to the subcommands ``sub``."""
    p = sub.add_parser("bench-backends", help="samples/s of every backend on one model",
                       description="Trains the benchmark MLP with Trainer(strategy=...) under "
                                   "each backend, in one run, and prints samples/s.")
    p.add_argument("--np", type=positive_int, default=2, help="workers (default: 2)")
    p.add_argument("--backends", nargs="+",
                   choices=backends.BACKENDS + backends.OPTIONAL_BACKENDS,
                   default=list(backends.BACKENDS),
                   help="which to run (default: all but multihost)")
    p.add_argument("--multihost", action="store_true",
                   help="also run mpirun across network-namespace hosts (root only)")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS)
    p.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP)
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_bench_backends_command)


def run_bench_backends_command(args: argparse.Namespace) -> int:
    """Runs ``hvdtrain bench-backends`` with parsed ``args``; returns the exit status."""
    chosen = list(args.backends) + (["multihost"] if args.multihost
                                    and "multihost" not in args.backends else [])
    progress = None if args.json else (lambda line: print(line, flush=True))
    try:
        rep = backends.run_backends(chosen, args.np, steps=args.steps, warmup=args.warmup,
                                    batch_size=args.batch_size, timeout=args.timeout,
                                    progress=progress)
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench-backends: error: {err}", file=sys.stderr)
        return 1
    _print_report(rep, backends.format_table, args.json)
    return 0
