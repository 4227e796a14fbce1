"""The cost model's compression terms (beside :mod:`hvdtrain_bench.perf_model`, whose step
model they extend): for each compression the bytes a rank sends per step, its collectives,
and its compute cost, and from them a step time::

    step = t_compute + t_compress + exposed exchange (perf_model.exposed_after_backward)

* bytes: ``none`` 4 per entry, ``fp16`` 2; ``topk`` ``k = ratio * n`` (index, value)
  pairs of 8 bytes per tensor, all-gathered; ``powersgd`` ``r (n + m)`` floats per
  compressed ``n x m`` matrix (``P`` then ``Q``, two all-reduces per bucket), vectors
  and matrices too small to gain sent whole in the ``P`` all-reduce (the rule of
  ``hvdtrain.compression.PowerSGD.matrix_shape``, which the unit tests hold this to).
* compute: PowerSGD's three products (``P = M Q``, ``Q = Mᵀ P``, ``M̂ = P Qᵀ``: ``6 n m r``
  flops) at the flop rate the measured step implies (``6 * params * batch`` flops in
  ``t_compute``), plus :data:`POWERSGD_PASSES` element passes over each matrix (the error
  added and updated, kept or not); fp16 two casts; top-k :data:`TOPK_ENTRY_S` a gradient
  entry. The exchange's compute shares the core with the backward pass on these hosts,
  so it is added, not hidden.
* an all-gather of ``s`` bytes a rank over ``N`` ranks takes ``(N - 1) (s / bw + lat)``.

Pure Python: TensorFlow and Horovod are never imported.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from hvdtrain_bench import perf_model

#: Seconds one pass over one float32 gradient entry costs on one core (read + write at
#: about 8 GB/s; TensorFlow's single-threaded element-wise kernels).
ELEMENT_PASS_S = 1e-9
#: Element passes PowerSGD makes over each compressed matrix a step: M + E, the new error
#: M + E - M̂ / mean, and the two selects that keep Q and E on a non-finite step.
POWERSGD_PASSES = 5
#: fp16: a cast down before the all-reduce and one up after it.
FP16_PASSES = 2
#: Top-k's cost a gradient entry (``tf.math.top_k`` of |g|, the gather, the residual's
#: scatter, the dense scatter after the all-gathers): docs/performance.md measured top-k
#: at 2.3x the MLP's 11.8 ms compute step over its 1.28 M entries, 1.3 * 11.8 ms / 1.28 M.
TOPK_ENTRY_S = 12e-9
DEFAULT_TOPK_RATIO, DEFAULT_POWERSGD_RANK, DEFAULT_MIN_COMPRESSION = 0.01, 4, 2.0


def powersgd_matrix(shape: Sequence[int], rank: int,
                    min_compression: float = DEFAULT_MIN_COMPRESSION) -> tuple | None:
    """``(n, m, r)`` of a gradient of ``shape`` PowerSGD compresses, ``None`` if it is sent
    whole (a vector, or ``r (n + m)`` not ``min_compression`` times under ``n m``)."""
    if len(shape) < 2:
        return None
    n, m = math.prod(int(d) for d in shape[:-1]), int(shape[-1])
    r = min(rank, n, m)
    return None if n * m < min_compression * r * (n + m) else (n, m, r)


def _options(options: Mapping | None) -> tuple[str, Mapping]:
    options = dict(options or {})
    name = str(options.get("compression") or "none").lower()
    if name not in ("none", "fp16", "topk", "powersgd"):
        raise ValueError(f"compression must be none, fp16, topk or powersgd, got {name!r}")
    return name, options


def exchange(shapes: Sequence[Sequence[int]], options: Mapping | None = None) -> dict:
    """What one rank sends a step for gradients of ``shapes`` under ``options`` (the
    Trainer's ``compression``, ``compression_ratio``, ``compression_rank``).

    Returns:
        ``bytes`` (sent per rank), ``allreduce`` (bytes of each all-reduce, per tensor:
        the caller groups them into buckets), ``allgather`` (bytes of each all-gather)
        and ``compress_flops`` / ``compress_passes`` / ``topk_entries`` (the compute).
    """
    name, options = _options(options)
    per_tensor, gathers, flops, passes, entries = [], [], 0.0, 0.0, 0
    rank = int(options.get("compression_rank") or DEFAULT_POWERSGD_RANK)
    ratio = float(options.get("compression_ratio") or DEFAULT_TOPK_RATIO)
    for shape in shapes:
        size = math.prod(int(d) for d in shape)
        if name == "topk":
            k = max(1, min(size, int(round(ratio * size))))
            gathers += [4.0 * k, 4.0 * k]  # the indices, then the values
            entries += size
            continue
        if name == "powersgd":
            found = powersgd_matrix(shape, rank)
            if found is not None:
                n, m, r = found
                per_tensor.append((4.0 * n * r, 4.0 * m * r))  # P, then Q
                flops += 6.0 * n * m * r
                passes += POWERSGD_PASSES * n * m
                continue
        value = 2.0 if name == "fp16" else 4.0
        passes += FP16_PASSES * size if name == "fp16" else 0
        per_tensor.append((value * size, 0.0))
    total = sum(p + q for p, q in per_tensor) + sum(gathers)
    return {"compression": name, "bytes": total, "allreduce": per_tensor,
            "allgather": gathers, "compress_flops": flops, "compress_passes": passes,
            "topk_entries": entries}


def compress_seconds(ex: Mapping, flop_rate: float) -> float:
    """The compute :func:`exchange`'s compression adds to a step, at ``flop_rate``
    flops/s for the products."""
    return (ex["compress_flops"] / flop_rate + ex["compress_passes"] * ELEMENT_PASS_S
            + ex["topk_entries"] * TOPK_ENTRY_S)


def allgather_time(workers: int, nbytes: float, bandwidth_Bps: float,
                   latency_s: float) -> float:
    """Time of a ring all-gather of ``nbytes`` from each of ``workers`` ranks."""
    return (workers - 1) * (nbytes / bandwidth_Bps + latency_s)


def predict_step(shapes: Sequence[Sequence[int]], options: Mapping | None, *,
                 compute_s: float, params: int, batch_size: int, workers: int,
                 bandwidth_Bps: float, latency_s: float,
                 buckets: Sequence[Sequence[int]] | None = None) -> dict:
    """The modelled step of a loop that exchanges ``shapes``' gradients under ``options``.

    Args:
        compute_s: the step's compute without any exchange (forward and backward).
        params, batch_size: the model's parameters and the batch per rank (the flop
            rate: ``6 * params * batch_size / compute_s``).
        buckets: indices into ``shapes`` of each bucket, in the order they go (default:
            one bucket); a bucket's all-reduces (P, then Q for PowerSGD) go one after the
            other, each a ring all-reduce; top-k's all-gathers follow per tensor.

    Returns:
        ``bytes``, ``compress_s``, ``exchange_s`` (all collectives end to end),
        ``exposed_s`` (left after the backward pass), ``step_s``.
    """
    ex = exchange(shapes, options)
    flop_rate = 6.0 * params * batch_size / compute_s
    compress = compress_seconds(ex, flop_rate)
    ring = lambda n: perf_model.comm_time(workers, n, bandwidth_Bps, latency_s)  # noqa: E731
    plan = [list(b) for b in buckets] if buckets else [list(range(len(shapes)))]
    if ex["compression"] == "topk":
        sizes = [sum(ex["allgather"][2 * i:2 * i + 2]) for b in plan for i in b]
        seconds = [sum(allgather_time(workers, g, bandwidth_Bps, latency_s)
                       for g in ex["allgather"][2 * i:2 * i + 2]) for b in plan for i in b]
    else:
        sizes = [sum(sum(ex["allreduce"][i]) for i in b) for b in plan]
        seconds = [ring(sum(ex["allreduce"][i][0] for i in b))
                   + (ring(sum(ex["allreduce"][i][1] for i in b))
                      if any(ex["allreduce"][i][1] for i in b) else 0.0) for b in plan]
    cost = dict(zip(range(len(sizes)), seconds))
    index = iter(range(len(sizes)))  # exposed_after_backward asks once a bucket, in order
    exposed = perf_model.exposed_after_backward(
        [max(s, 1.0) for s in sizes], perf_model.BACKWARD_SHARE * compute_s,
        lambda _n: cost[next(index)])
    return {"compression": ex["compression"], "bytes": ex["bytes"], "compress_s": compress,
            "exchange_s": sum(seconds), "exposed_s": exposed,
            "step_s": compute_s + compress + exposed}
