"""Gradient buckets: the Trainer's exchange split so it overlaps the backward pass.

Backprop produces the last layer's gradients first. Inside the compiled step each bucket
is its own fused all-reduce whose inputs are only that bucket's gradients, so
TensorFlow's executor hands it to Horovod's background thread as soon as those gradients
exist, while the earlier layers' gradients are still being computed. Buckets are
consecutive variables taken from the end of the forward pass, each closed once it holds
``bucket_mb`` MiB; the mathematics is that of one fused all-reduce (each gradient is
averaged exactly once).

The first bucket is closed sooner, at :data:`FIRST_BUCKET_MB` (as PyTorch DDP does), so the
exchange starts early in the backward pass even where the whole model fits one bucket:
on emulated 0.5 and 2 Gbit/s links (docs/performance.md, "Emulated links") the MLP's
Trainer ran 3-5% faster with it, and the cost model moves ResNet-101 by under 0.2 points
from 8 to 512 workers (one more message, hidden behind the backward pass).
"""
from __future__ import annotations

import math
from typing import Sequence


def tensor_bytes(variable) -> int:
    """Bytes of ``variable``'s gradient (its shape times its dtype's size)."""
    count = math.prod(int(d) for d in variable.shape)
    dtype = getattr(variable.dtype, "name", variable.dtype)
    return count * _DTYPE_BYTES.get(str(dtype), 4)


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
#: MiB at which the first bucket (the last layers' gradients) closes, if ``bucket_mb`` is
#: larger.
FIRST_BUCKET_MB = 1.0


def plan(variables: Sequence, bucket_mb: float,
         first_bucket_mb: float = FIRST_BUCKET_MB) -> list[list[int]]:
    """Positions of ``variables`` (in forward order) grouped into buckets, the bucket of
    the last layers first; every position appears exactly once.

    Args:
        variables: anything with ``shape`` and ``dtype``, in forward order.
        bucket_mb: a bucket closes once it holds this many MiB.
        first_bucket_mb: the first bucket closes at this many MiB, if less (not with
            ``bucket_mb=math.inf``: that is one all-reduce).
    """
    limit = (min(bucket_mb, first_bucket_mb) if math.isfinite(bucket_mb) else bucket_mb) * 2 ** 20
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(variables))):
        current.append(i)
        size += tensor_bytes(variables[i])
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, bucket_mb * 2 ** 20
    if current:
        buckets.append(current)
    return buckets


def describe(variables: Sequence, buckets: list[list[int]]) -> str:
    """One line for the log: how many buckets and their sizes in MiB."""
    sizes = [sum(tensor_bytes(variables[i]) for i in b) for b in buckets]
    return (f"{len(buckets)} gradient bucket(s), last layers first: "
            + ", ".join(f"{s / 2 ** 20:.2f} MiB" if s >= 2 ** 14 else f"{s} bytes" for s in sizes))
