"""The ``hvdtrain`` command: ``hvdtrain bench`` and ``hvdtrain info``.

Importing this module is cheap: TensorFlow and Horovod load only inside the commands
that need them (``info``), and ``bench`` runs its workers as subprocesses.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Sequence

from hvdtrain import __version__
from hvdtrain.bench import backends as _backend_bench
from hvdtrain.bench import core as _bench


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="throughput of the Trainer against a plain Horovod loop",
        description="Trains an MLP 784-800-800-10 on random data with the hvdtrain Trainer "
                    "and with a hand-written Horovod loop, at each number of ranks, and prints "
                    "samples/s, the trainer/plain ratio and the scaling efficiency.")
    p.add_argument("--np", dest="np_list", nargs="+", type=_bench._positive_int, default=[1, 2],
                   metavar="N", help="numbers of ranks to measure (default: 1 2)")
    p.add_argument("--steps", type=_bench._positive_int, default=_bench.DEFAULT_STEPS,
                   help=f"timed steps per run (default: {_bench.DEFAULT_STEPS})")
    p.add_argument("--warmup", type=_bench._non_negative_int, default=_bench.DEFAULT_WARMUP,
                   help=f"untimed steps first (default: {_bench.DEFAULT_WARMUP})")
    p.add_argument("--batch-size", type=_bench._positive_int, default=_bench.DEFAULT_BATCH_SIZE,
                   help=f"examples per step on each rank (default: {_bench.DEFAULT_BATCH_SIZE})")
    p.add_argument("--examples", type=_bench._positive_int, default=_bench.DEFAULT_EXAMPLES,
                   help=f"size of the random dataset (default: {_bench.DEFAULT_EXAMPLES})")
    p.add_argument("--repeats", type=_bench._positive_int, default=_bench.DEFAULT_REPEATS,
                   help=f"runs per size and mode; the median is reported "
                        f"(default: {_bench.DEFAULT_REPEATS})")
    p.add_argument("--launcher", choices=_bench.LAUNCHERS, default="horovodrun",
                   help="how jobs of more than one rank start (default: horovodrun, Gloo)")
    p.add_argument("--timeout", type=_bench._positive_float, default=_bench.DEFAULT_TIMEOUT,
                   help=f"seconds before a job is killed (default: {_bench.DEFAULT_TIMEOUT:g})")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (with the commands used) instead of a table")
    p.add_argument("--modes", nargs="+", choices=_bench.MODES, default=list(_bench.DEFAULT_MODES),
                   metavar="MODE", help="what to time: " + ", ".join(_bench.MODES)
                   + f" (default: {' '.join(_bench.DEFAULT_MODES)})")
    p.add_argument("--fit", action="store_true",
                   help="also measure Keras model.fit with hvdtrain.keras")
    p.add_argument("--files", action="store_true",
                   help="also train the Trainer on Fashion-MNIST streamed from its files")
    p.add_argument("--no-probe", action="store_true",
                   help="skip the all-reduce probes (the cost model's inputs)")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="write performance.md (measured table, fitted cost model, predicted "
                        "efficiency for 2-512 workers), scaling.png and bench.json to DIR")
    p.add_argument("--compression", choices=["none", "fp16", "topk", "randomk"], default=None,
                   help="gradient compression for the Trainer and fit runs")
    p.add_argument("--compression-ratio", type=_bench._positive_float, default=None,
                   help="fraction of entries sent by topk / randomk (default 0.01)")
    p.add_argument("--op", choices=["average", "sum", "adasum"], default=None,
                   help="gradient reduction (adasum needs --launcher mpirun)")
    p.add_argument("--backward-passes", type=_bench._positive_int, default=None,
                   help="local gradient accumulation steps per exchange")
    p.add_argument("--mixed-precision", choices=["float32", "mixed_float16", "mixed_bfloat16"],
                   default=None, help="dtype policy of the Trainer and fit runs")
    p.set_defaults(func=_cmd_bench)


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="versions and the Horovod build",
                       description="Prints the versions of hvdtrain, TensorFlow, Keras and "
                                   "Horovod, and which Horovod controllers were built.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_info)


def build_parser() -> argparse.ArgumentParser:
    """The ``hvdtrain`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="hvdtrain", description="Data-parallel training of TensorFlow 2 / Keras 3 models "
                                     "with Horovod.")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_bench(sub)
    _backend_bench.add_parser(sub)
    _add_info(sub)
    return parser


def _cmd_bench(args) -> int:
    progress = None if args.json else (lambda line: print(line, flush=True))
    modes = list(dict.fromkeys(args.modes + ["fit"] * args.fit + ["trainer_files"] * args.files))
    options = {"compression": args.compression, "compression_ratio": args.compression_ratio,
               "op": args.op, "backward_passes_per_step": args.backward_passes,
               "mixed_precision": args.mixed_precision}
    if progress:
        progress(f"running {len(args.np_list) * len(modes) * args.repeats} jobs "
                 f"(np {' '.join(map(str, args.np_list))}, {args.repeats} repeat(s))...")
    try:
        report = _bench.run_bench(np_list=args.np_list, steps=args.steps,
                                  batch_size=args.batch_size, repeats=args.repeats,
                                  launcher=args.launcher, warmup=args.warmup,
                                  examples=args.examples, timeout=args.timeout,
                                  progress=progress, modes=modes, options=options,
                                  probe=not args.no_probe)
        paths = _bench.write_report(report, args.report) if args.report else {}
    except (RuntimeError, ValueError) as err:
        print(f"hvdtrain bench: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print()
        print(_bench.format_table(report))
        print("\ncommands:")
        for name, cmd in report["commands"].items():
            print(f"  {name}: {cmd}")
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def collect_info() -> dict:
    """Versions of the stack and the controllers Horovod was built with."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    info = {"hvdtrain": __version__, "python": platform.python_version(),
            "tensorflow": tf.__version__, "keras": keras.__version__}
    try:
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as err:  # a broken or missing build: say so instead of a traceback
        info.update(horovod=None, horovod_error=str(err))
        return info
    info["horovod"] = horovod.__version__
    for name in ("mpi", "gloo", "nccl"):
        built = getattr(hvd, f"{name}_built", None)
        info[f"{name}_built"] = bool(built()) if built else None
    return info


def _cmd_info(args) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(map(len, info))
    for key, value in info.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{key:<{width}}  {'-' if value is None else value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvdtrain`` console script; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
