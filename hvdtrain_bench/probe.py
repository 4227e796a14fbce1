"""The all-reduce probe of a bench job: ``hvd.allreduce`` timed at several sizes between
the ranks, the inputs of :func:`hvdtrain_bench.perf_model.fit_link`."""
from __future__ import annotations

import time
from typing import Sequence

PROBE_BYTES = (4 * 1024, 256 * 1024, 1024 * 1024, 4 * 1276810)
PROBE_REPEATS = 30


def probe_allreduce(sizes: Sequence[int] = PROBE_BYTES,
                    repeats: int = PROBE_REPEATS) -> list[dict]:
    """Seconds per ``hvd.allreduce`` of float32 tensors of each size in bytes.

    Returns:
        One dict per size: ``np`` (the world size), ``bytes`` and ``seconds`` (the median
        over ``repeats`` of the slowest rank's time).
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdtrain.horovod import collectives as dist

    dist.init()
    probes = []
    for nbytes in sizes:
        tensor = tf.ones([nbytes // 4], tf.float32)
        reduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Average, name=f"probe{nbytes}"))
        reduce(tensor).numpy()
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            reduce(tensor).numpy()
            times.append(time.perf_counter() - start)
        slowest = [max(t) for t in zip(*dist.allgather_object(times))]
        probes.append({"np": dist.size(), "bytes": nbytes,
                       "seconds": sorted(slowest)[len(slowest) // 2]})
    return probes
