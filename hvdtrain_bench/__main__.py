"""``python -m hvdtrain_bench``: one worker of a benchmark job, or ``hvdtrain bench``.

* ``--worker --mode M ...``: one rank of a ``hvdtrain bench`` job
  (:mod:`hvdtrain_bench.worker`);
* ``--worker --strategy S ...``: one task of a ``hvdtrain bench-backends`` job
  (:mod:`hvdtrain_bench.strategy_worker`);
* anything else: ``hvdtrain bench`` with those options (:mod:`hvdtrain_bench.commands`).
"""
from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Runs what the arguments ask for; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" not in argv:
        from hvdtrain_bench.commands import bench_main

        return bench_main(argv)
    if "--strategy" in argv:
        from hvdtrain_bench.strategy_worker import main as strategy_main

        return strategy_main(argv)
    from hvdtrain_bench.worker import main as worker_main

    return worker_main(argv)


if __name__ == "__main__":
    sys.exit(main())
