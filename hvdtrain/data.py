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


def shard_and_batch(dataset: tf.data.Dataset, *, num_shards: int, index, batch_size: int,
                    prefetch_size: int | None = None, shuffle_buffer_size: int | None = None,
                    seed: int | None = None, drop_remainder: bool = False) -> tf.data.Dataset:
    """Gives worker ``index`` its shard of ``dataset``, shuffled, batched and prefetched:
    every backend's pipeline (the Horovod ranks', each ``tf.distribute`` input pipeline's,
    each parameter-server worker's).

    Args:
        dataset: unbatched ``(x, y)`` elements.
        num_shards: world size (or input pipelines).
        index: this worker; a tensor on a parameter-server worker, which learns its index
            in the graph.
        batch_size: examples per batch on this worker.
        prefetch_size: batches to prefetch (see :func:`prefetch`).
        shuffle_buffer_size: shuffle the shard with this buffer, reshuffled every pass.
        seed: shuffle seed, offset by a Python ``index`` so shards shuffle differently (a
            tensor ``index`` keeps it: each worker shuffles its own shard).
        drop_remainder: drop a last, smaller batch.
    """
    ds = shard(dataset, num_shards, index) if num_shards > 1 else dataset
    if shuffle_buffer_size:
        if seed is not None and isinstance(index, int):
            seed += index
        ds = ds.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    return prefetch(ds.batch(batch_size, drop_remainder=drop_remainder), prefetch_size)


def prefetch(dataset: tf.data.Dataset, prefetch_size: int | None) -> tf.data.Dataset:
    """``dataset`` prefetching ``prefetch_size`` batches: ``None`` lets tf.data size the
    buffer (``AUTOTUNE``), 0 turns prefetching off. (TensorLayer's default of
    ``batch_size`` batches held 128 batches of the benchmark MLP in memory, and dropping
    that buffer when training ended took 0.5 s.)"""
    size = tf.data.AUTOTUNE if prefetch_size is None else prefetch_size
    return dataset.prefetch(size) if size else dataset


def resume(batches: tf.data.Dataset, *, steps_per_epoch: int | None, num_epochs: int,
           epoch: int, skip: int, shuffled: bool, batches_per_step: int = 1) -> tf.data.Dataset:
    """The batches from ``skip`` steps into ``epoch`` to the end of the last epoch, each
    epoch cut to ``steps_per_epoch`` steps (the same count on every worker): one stream
    over every remaining epoch, since re-creating a prefetching iterator each epoch stalls
    the worker that tears it down while the others wait on it.

    Shuffled, epoch ``e`` is the ``e``-th reshuffle of the stream, so a run resumed in a
    later epoch replays the stream from its start and skips the steps already trained (a
    fresh ``repeat`` would give it the first epoch's order). Data of unknown or infinite
    length (``steps_per_epoch`` ``None`` or -1) is one pass, as it is.

    Args:
        batches: one epoch of this worker's batches (:func:`shard_and_batch`, unprefetched).
        batches_per_step: batches one step takes (a worker's replicas each take one).
    """
    if not (steps_per_epoch and steps_per_epoch > 0):
        return batches
    per = batches_per_step
    if shuffled:
        epochs, skip = num_epochs, epoch * steps_per_epoch + skip
    else:
        epochs = num_epochs - epoch
    ds = batches.take(steps_per_epoch * per).repeat(epochs)
    return ds.skip(skip * per) if skip else ds


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
