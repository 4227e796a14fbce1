"""Runs ``examples/mnist.py`` unchanged after recording which host this rank runs on.

Usage: ``multihost_mnist.py OUT_DIR SUBNET_PREFIX [mnist.py flags...]``. Before the
example starts, the rank (from the launcher's environment, so Horovod is not needed yet)
writes ``OUT_DIR/host<R>.json`` with its hostname, network namespace and address; then
the example runs in this process with the remaining flags, exactly as ``python
examples/mnist.py FLAGS`` would.
"""
from __future__ import annotations

import json
import os
import runpy
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from multihost_probe import address_towards, namespace_id  # noqa: E402

MNIST = HERE.parents[2] / "examples" / "mnist.py"
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK")


def launcher_rank() -> int:
    """This process's rank as the launcher set it in the environment."""
    for key in RANK_VARIABLES:
        if key in os.environ:
            return int(os.environ[key])
    raise SystemExit(f"multihost_mnist.py: no rank in the environment (looked for {RANK_VARIABLES})")


def main() -> None:
    out_dir, prefix, flags = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    rank = launcher_rank()
    where = {"rank": rank, "hostname": socket.gethostname(), "netns": namespace_id(),
             "address": address_towards(prefix)}
    (out_dir / f"host{rank}.json").write_text(json.dumps(where))
    sys.argv = [str(MNIST), *flags]
    sys.path.insert(0, str(MNIST.parent))
    runpy.run_path(str(MNIST), run_name="__main__")


if __name__ == "__main__":
    main()
