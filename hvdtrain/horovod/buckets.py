"""Gradient buckets: the Trainer's exchange split so it overlaps the backward pass.

Backprop produces the last layer's gradients first. Inside the compiled step each bucket
is its own fused all-reduce whose inputs are only that bucket's gradients, so
TensorFlow's executor hands it to Horovod's background thread as soon as those gradients
exist, while the earlier layers' gradients are still being computed. Buckets are
consecutive variables taken from the end of the forward pass, each closed once it holds
``bucket_mb`` MiB; the mathematics is that of one fused all-reduce (each gradient is
averaged exactly once).
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


def plan(variables: Sequence, bucket_mb: float) -> list[list[int]]:
    """Positions of ``variables`` (in forward order) grouped into buckets, the bucket of
    the last layers first; every position appears exactly once."""
    limit = bucket_mb * 2 ** 20
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(variables))):
        current.append(i)
        size += tensor_bytes(variables[i])
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def describe(variables: Sequence, buckets: list[list[int]]) -> str:
    """One line for the log: how many buckets and their sizes in MiB."""
    sizes = [sum(tensor_bytes(variables[i]) for i in b) for b in buckets]
    return (f"{len(buckets)} gradient bucket(s), last layers first: "
            + ", ".join(f"{s / 2 ** 20:.2f} MiB" if s >= 2 ** 14 else f"{s} bytes" for s in sizes))
