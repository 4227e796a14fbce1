"""Gradient compression: Horovod's casts, and Top-K / random-K sparsification.

Sparsifiers send only ``ratio`` of each gradient's entries, as ``(index, value)`` pairs
exchanged with ``allgather``; what was not sent stays in a local residual and is added to
the next step's gradient (error feedback), so no gradient mass is lost, only delayed.
"""
from __future__ import annotations

import tensorflow as tf

from hvdtrain import checks
from hvdtrain.horovod import collectives as dist

NAMES = ("none", "fp16", "topk", "randomk")


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


def resolve(compression, ratio: float | None = None):
    """A Horovod compressor or a :class:`Sparsifier` from a name or an instance.

    Args:
        compression: ``None``, ``"none"``, ``"fp16"``, ``"topk"``, ``"randomk"``, a
            Horovod compressor, or a :class:`Sparsifier`.
        ratio: fraction kept by ``"topk"`` / ``"randomk"`` (default 0.01).

    Raises:
        ValueError: an unknown name or a ratio outside (0, 1].
    """
    if isinstance(compression, Sparsifier):
        return compression
    if isinstance(compression, str) and compression.lower() in ("topk", "randomk"):
        cls = TopK if compression.lower() == "topk" else RandomK
        return cls(0.01 if ratio is None else ratio)
    try:
        return dist.resolve_compression(compression)
    except ValueError:
        raise ValueError(f"compression must be one of {list(NAMES)} (or a Horovod compressor / "
                         f"hvdtrain.compression.TopK(ratio)), got {compression!r}") from None
