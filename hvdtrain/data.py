"""Input pipelines: shard by rank, shuffle, batch, prefetch, and equal step counts."""
from __future__ import annotations

import operator
from typing import Callable

import tensorflow as tf

SHARD_HOOK = "_hvdtrain_shard"


def shardable(dataset: tf.data.Dataset,
              shard_fn: Callable[[int, int], tf.data.Dataset]) -> tf.data.Dataset:
    """Marks ``dataset`` as able to shard itself cheaply (e.g. before decoding).

    ``shard_fn(num_shards, index)`` must give exactly the elements, in order, of
    ``dataset.shard(num_shards, index)``. Any transformation gives a plain dataset without
    the hook, except ``take(count)`` with a Python ``count``, whose result keeps a hook of
    its own. Returns ``dataset``.
    """
    setattr(dataset, SHARD_HOOK, shard_fn)
    plain_take = dataset.take

    def take(count, name=None):
        taken = plain_take(count, name=name)
        try:
            count = operator.index(count)
        except TypeError:  # a tensor: the taken dataset shards the plain way
            return taken
        if count < 0:
            return shardable(taken, shard_fn)
        return shardable(taken, lambda n, i: shard_fn(n, i).take(max(0, -(-(count - i) // n))))

    dataset.take = take
    return dataset


def shard(dataset: tf.data.Dataset, num_shards: int, index: int) -> tf.data.Dataset:
    """``dataset.shard(num_shards, index)``, through the dataset's own cheaper way of
    sharding when :func:`shardable` gave it one."""
    hook = getattr(dataset, SHARD_HOOK, None)
    return hook(num_shards, index) if hook is not None else dataset.shard(num_shards, index)


def check_dataset(dataset, name: str = "training_dataset") -> None:
    """Checks that ``dataset`` is a ``tf.data.Dataset`` of ``(x, y)`` pairs.

    Raises:
        TypeError: naming ``name`` and what its elements look like.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"{name} must be a tf.data.Dataset of (x, y) pairs, got "
                        f"{type(dataset).__name__}")
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise TypeError(f"{name} must yield (x, y) pairs (a 2-tuple per element), but its "
                        f"elements are {spec}")


def shard_and_batch(dataset: tf.data.Dataset, *, num_shards: int, index: int, batch_size: int,
                    prefetch_size: int | None = None, shuffle_buffer_size: int | None = None,
                    seed: int | None = None) -> tf.data.Dataset:
    """Gives rank ``index`` its shard of ``dataset``, shuffled, batched and prefetched.

    Args:
        dataset: unbatched ``(x, y)`` elements.
        num_shards: world size.
        index: this rank.
        batch_size: examples per batch on this rank.
        prefetch_size: batches to prefetch; ``None`` lets tf.data size the buffer
            (``AUTOTUNE``), 0 turns prefetching off. (TensorLayer's default of
            ``batch_size`` batches held 128 batches of the benchmark MLP in memory, and
            dropping that buffer when training ended took 0.5 s.)
        shuffle_buffer_size: shuffle the shard with this buffer, reshuffled every pass.
        seed: shuffle seed (offset by ``index`` so shards shuffle differently).
    """
    ds = shard(dataset, num_shards, index) if num_shards > 1 else dataset
    if shuffle_buffer_size:
        ds = ds.shuffle(shuffle_buffer_size, seed=None if seed is None else seed + index,
                        reshuffle_each_iteration=True)
    ds = ds.batch(batch_size)
    prefetch = tf.data.AUTOTUNE if prefetch_size is None else prefetch_size
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds


def known_steps(dataset: tf.data.Dataset) -> int | None:
    """The number of batches in ``dataset`` when TensorFlow knows it, else ``None``."""
    n = int(dataset.cardinality().numpy())
    if n == tf.data.INFINITE_CARDINALITY:
        return -1
    if n == tf.data.UNKNOWN_CARDINALITY:
        return None
    return n


def smallest_steps(counts: list) -> int | None:
    """Steps every worker can take in one pass, from each worker's :func:`known_steps`:
    the smallest shard's count; ``-1`` when every shard is infinite, ``None`` when some
    worker cannot tell (then the end of the data is agreed step by step)."""
    if any(c is None for c in counts):
        return None
    finite = [c for c in counts if c >= 0]
    return min(finite) if finite else -1
