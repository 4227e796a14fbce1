"""The ``hvdtrain`` command: ``hvdtrain bench``, ``hvdtrain bench-backends``,
``hvdtrain info``, ``hvdtrain install-horovod`` and ``hvdtrain upgrade``.

The two benchmarks are a tool shipped beside the library, the top-level package
``hvdtrain_bench``; their options and output live in :mod:`hvdtrain_bench.commands`, and
this module puts them together with ``info``. Importing it is cheap: TensorFlow and Horovod
load only inside the commands that need them (``info``), and the benchmarks run their
workers as subprocesses.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Sequence

from hvdtrain import __version__
from hvdtrain_bench.commands import add_bench, add_bench_backends


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="versions and the Horovod build",
                       description="Prints the versions of hvdtrain, TensorFlow, Keras and "
                                   "Horovod, the GPUs TensorFlow sees, which Horovod "
                                   "controllers and GPU operations (NCCL) were built, and a "
                                   "warning when GPUs are seen without NCCL.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_info)


def _add_install_horovod(sub) -> None:
    from hvdtrain.horovod_build.command import add_arguments, run

    p = sub.add_parser("install-horovod", help="build and install the patched Horovod",
                       description="Builds hvdtrain's patched Horovod against this "
                                   "environment's TensorFlow (CPU-only or with NCCL; the "
                                   "wheel is cached), installs it and checks that it loads.")
    add_arguments(p)
    p.set_defaults(func=run)


def _add_upgrade(sub) -> None:
    from hvdtrain.upgrade.command import DESCRIPTION, add_arguments, run

    p = sub.add_parser("upgrade", help="rewrite a Horovod TF2 script for hvdtrain on Keras 3",
                       description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    """The ``hvdtrain`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="hvdtrain", description="Data-parallel training of TensorFlow 2 / Keras 3 models "
                                     "with Horovod.")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_bench(sub)
    add_bench_backends(sub)
    _add_info(sub)
    _add_install_horovod(sub)
    _add_upgrade(sub)
    return parser


def collect_info() -> dict:
    """Versions of the stack, the GPUs TensorFlow sees and how Horovod was built.

    ``horovod_build`` is :func:`~hvdtrain.horovod.runtime.build_summary`'s line;
    ``gpu_warning`` says when GPUs are seen but Horovod has no NCCL (else ``None``).
    """
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    info = {"hvdtrain": __version__, "python": platform.python_version(),
            "tensorflow": tf.__version__, "keras": keras.__version__,
            "gpus": len(tf.config.list_physical_devices("GPU"))}
    try:
        from hvdtrain.horovod import runtime
    except ImportError as err:  # a broken or missing build: say so instead of a traceback
        info.update(horovod=None, horovod_error=str(err),
                    horovod_fix="`hvdtrain install-horovod` (in this environment; "
                                "`make install` in a checkout)")
        return info
    info.update(runtime.build_info())
    info["horovod_build"] = runtime.build_summary()
    info["gpu_warning"] = runtime.check_gpu_build(info["gpus"])
    return info


def _cmd_info(args) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    warning = info.pop("gpu_warning", None)
    width = max(map(len, info))
    for key, value in info.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{key:<{width}}  {'-' if value is None else value}")
    if warning:
        print(f"WARNING: {warning}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvdtrain`` console script; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
