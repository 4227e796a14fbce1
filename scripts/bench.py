#!/usr/bin/env python
"""Runs ``hvdtrain bench`` (see ``hvdtrain bench --help``): the Trainer against a plain
Horovod loop, e.g. ``python scripts/bench.py --np 1 2 --steps 200 --repeats 3``."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hvdtrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
