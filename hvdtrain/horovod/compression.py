"""Gradient compression: Horovod's casts, Top-K / random-K sparsification, and PowerSGD's
settings.

Sparsifiers send only ``ratio`` of each gradient's entries, as ``(index, value)`` pairs
exchanged with ``allgather``; what was not sent stays in a local residual and is added to
the next step's gradient (error feedback), so no gradient mass is lost, only delayed.
PowerSGD sends each matrix as two thin factors of rank ``r`` (its exchange is
``powersgd.py``).
"""
from __future__ import annotations

import math

import tensorflow as tf

from hvdtrain import checks
from hvdtrain.horovod import collectives as dist

NAMES = ("none", "fp16", "topk", "randomk", "powersgd")
#: PowerSGD's rank unless one is given: the lowest whose test accuracy after the
#: uncompressed run's epochs is within 0.5 points of it (docs/performance.md, "Compression
#: on slow links": rank 4 missed by 0.53 points, rank 8 was 0.34 points short).
DEFAULT_RANK = 8


class Sparsifier:
    """Keeps ``ratio`` of a gradient's entries per step, with error feedback.

    Args:
        ratio: fraction of entries sent, in (0, 1].
    """

    name = "sparsifier"

    def __init__(self, ratio: float = 0.01) -> None:
        if not checks.is_number(ratio) or not 0 < ratio <= 1:
            raise ValueError(f"{self.name} compression ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ratio={self.ratio})"

    def count(self, n: int) -> int:
        """How many of ``n`` entries are sent."""
        return max(1, min(n, int(round(self.ratio * n))))

    def select(self, flat: tf.Tensor, k: int, seed: tf.Tensor) -> tf.Tensor:
        """Indices (int32, shape ``[k]``) of the entries of ``flat`` to send."""
        raise NotImplementedError

    def exchange(self, grad: tf.Tensor, residual: tf.Variable, seed: tf.Tensor, *,
                 average: bool) -> tf.Tensor:
        """Sends this rank's selected entries of ``grad + residual`` and returns the reduced
        dense gradient (sum, or mean over ranks when ``average``); updates ``residual``."""
        full = grad + tf.cast(residual, grad.dtype)
        flat = tf.reshape(full, [-1])
        n = int(flat.shape[0])
        k = self.count(n)
        idx = self.select(flat, k, seed)
        values = tf.gather(flat, idx)
        kept = tf.tensor_scatter_nd_update(flat, idx[:, None], tf.zeros_like(values))
        residual.assign(tf.reshape(kept, tf.shape(residual)))
        all_idx = dist.allgather(idx)
        all_values = dist.allgather(values)
        dense = tf.scatter_nd(all_idx[:, None], all_values, [n])  # duplicates add up
        if average:
            dense = dense / tf.cast(dist.size(), dense.dtype)
        return tf.reshape(dense, tf.shape(grad))

    def bytes_per_step(self, n: int, value_bytes: int = 4) -> int:
        """Bytes this rank sends for a gradient of ``n`` entries (index + value)."""
        return self.count(n) * (4 + value_bytes)


class TopK(Sparsifier):
    """Sends the ``ratio`` largest-magnitude entries of each gradient."""

    name = "topk"

    def select(self, flat, k, seed):
        return tf.math.top_k(tf.abs(flat), k=k, sorted=False).indices


class RandomK(Sparsifier):
    """Sends ``ratio`` of the entries chosen at random (the same choice on every rank)."""

    name = "randomk"

    def select(self, flat, k, seed):
        n = int(flat.shape[0])
        positions = tf.range(k, dtype=tf.int64)
        seeds = tf.stack([tf.cast(seed, tf.int64), tf.constant(0x5EED, tf.int64)])
        return tf.cast(tf.random.experimental.index_shuffle(positions, seeds, n - 1), tf.int32)


class PowerSGD:
    """PowerSGD's settings, the ``compression`` of a distributed optimizer or Trainer.

    Args:
        rank: the rank ``r`` of each gradient's approximation (higher: closer, more bytes).
        start_step: this many exchanges are plain all-reduces before compression starts.
        min_compression: a matrix is compressed only when that shrinks it at least this
            many times (``0``: every matrix).
    """

    name = "powersgd"

    def __init__(self, rank: int = DEFAULT_RANK, start_step: int = 0,
                 min_compression: float = 2.0) -> None:
        self.rank = checks.positive_int(rank, "powersgd rank")
        self.start_step = checks.integer(start_step, "powersgd start_step", minimum=0)
        if not checks.is_number(min_compression) or min_compression < 0:
            raise ValueError(f"powersgd min_compression must be a number >= 0, got "
                             f"{min_compression!r}")
        self.min_compression = float(min_compression)

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, start_step={self.start_step}, "
                f"min_compression={self.min_compression})")

    def matrix_shape(self, shape) -> tuple[int, int, int] | None:
        """``(n, m, r)``: the 2-D view of a gradient of ``shape`` and its rank, or ``None``
        when it is sent uncompressed (a vector, or too small to gain)."""
        dims = [int(d) for d in shape]
        if len(dims) < 2:
            return None
        n, m = math.prod(dims[:-1]), dims[-1]
        r = min(self.rank, n, m)
        if n * m < self.min_compression * r * (n + m):
            return None
        return n, m, r

    def bytes_per_step(self, shape, value_bytes: int = 4) -> int:
        """Bytes this rank sends for one gradient of ``shape``."""
        found = self.matrix_shape(shape)
        if found is None:
            return math.prod(int(d) for d in shape) * value_bytes
        n, m, r = found
        return r * (n + m) * value_bytes


def resolve(compression, ratio: float | None = None, rank: int | None = None):
    """A Horovod compressor, a :class:`Sparsifier` or :class:`PowerSGD` from a name or an
    instance.

    Args:
        compression: ``None``, ``"none"``, ``"fp16"``, ``"topk"``, ``"randomk"``,
            ``"powersgd"``, a Horovod compressor, a :class:`Sparsifier` or a
            :class:`PowerSGD`.
        ratio: fraction kept by ``"topk"`` / ``"randomk"`` (default 0.01).
        rank: the rank of ``"powersgd"``'s approximation (default :data:`DEFAULT_RANK`).

    Raises:
        ValueError: an unknown name, a ratio outside (0, 1] or a rank below 1.
    """
    if isinstance(compression, (Sparsifier, PowerSGD)):
        return compression
    name = compression.lower() if isinstance(compression, str) else None
    if name in ("topk", "randomk"):
        cls = TopK if name == "topk" else RandomK
        return cls(0.01 if ratio is None else ratio)
    if name == "powersgd":
        return PowerSGD(DEFAULT_RANK if rank is None else rank)
    try:
        return dist.resolve_compression(compression)
    except ValueError:
        raise ValueError(f"compression must be one of {list(NAMES)} (or a Horovod compressor / "
                         "hvdtrain.compression.TopK(ratio) / hvdtrain.compression.PowerSGD(rank)), "
                         f"got {compression!r}") from None
