"""How every timed loop of ``hvdtrain bench`` is measured on its rank: the steps and the
read that waits for the last of them under one clock, and the device-to-host reads the
steps themselves made (``float()``, ``.numpy()``, ... of an eager tensor) counted."""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple


class Timing(NamedTuple):
    """One timed run on this rank."""
    elapsed_s: float
    final_loss: float
    #: Device-to-host reads during the timed steps, the final loss's read not counted.
    host_reads: int


def time_steps(run_steps: Callable[[], Any], read_loss: Callable[[Any], float]) -> Timing:
    """Times ``run_steps()`` (the steps; returns what holds the last loss) and
    ``read_loss`` of what it returned (the read that waits for the steps).

    Only the reads ``run_steps`` makes are counted: the final one is the harness's.
    """
    from hvdtrain.internals.tensorflow_private import count_host_reads

    with count_host_reads() as reads:
        start = time.perf_counter()
        last = run_steps()
        host_reads = reads.count
        loss = read_loss(last)
        elapsed = time.perf_counter() - start
    return Timing(elapsed, loss, host_reads)
