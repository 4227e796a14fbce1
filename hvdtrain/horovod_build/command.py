"""The ``hvdtrain install-horovod`` command (also ``python -m hvdtrain.horovod_build``)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from hvdtrain.horovod_build.builder import (FLAVOURS, HOROVOD_VERSION, TOOLKITS, BuildError,
                                            install_horovod)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options, shared by ``hvdtrain install-horovod`` and ``-m``."""
    parser.add_argument("--gpu", choices=FLAVOURS,
                        default=os.environ.get("HVDTRAIN_GPU_BUILD") or "auto",
                        help="nccl: GPU-to-GPU all-reduce with NCCL; cpu: CPU-only; auto "
                             "(default, or $HVDTRAIN_GPU_BUILD): nccl where the driver lists "
                             "a GPU, falling back to cpu with a warning if that build fails")
    parser.add_argument("--cuda-toolkit", choices=TOOLKITS,
                        default=os.environ.get("HVDTRAIN_CUDA_TOOLKIT") or "auto",
                        help="auto: a system CUDA toolkit where found (nvcc in "
                             "$HOROVOD_CUDA_HOME, $CUDA_HOME, on PATH or in "
                             "$HVDTRAIN_CUDA_PREFIX, default /usr/local/cuda), else pinned "
                             "CUDA 13 wheels from PyPI; pypi: the wheels")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose environment gets Horovod "
                             "(default: this one)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="wheels, sources and toolchains (default $HVDTRAIN_CACHE or "
                             "~/.cache/hvdtrain; wheels in $HVDTRAIN_WHEEL_CACHE if set)")


def run(args: argparse.Namespace) -> int:
    """Install Horovod as ``args`` say; prints one line per step and the result."""
    def log(line: str) -> None:
        print(f"[install-horovod] {line}", flush=True)

    try:
        record = install_horovod(args.gpu, args.python, args.cache, log, args.cuda_toolkit)
    except BuildError as err:
        print(f"[install-horovod] FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    controllers = ", ".join(n for n in ("mpi", "gloo") if record[f"{n}_built"])
    log(f"installed Horovod {HOROVOD_VERSION} ({record['flavour']}, controllers {controllers}"
        f"{', GPU operations NCCL' if record['nccl_built'] else ''}) into {args.python}")
    if record["flavour"] == "nccl":
        log(f"compiled with {record['cuda']}, {record['nccl']}, for compute capabilities "
            f"{record['cuda_cc_list']}; the GPU driver must be {record['driver']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hvdtrain.horovod_build``."""
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrain.horovod_build",
        description=f"Build hvdtrain's patched Horovod {HOROVOD_VERSION} against this "
                    "environment's TensorFlow (cached) and install it.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
