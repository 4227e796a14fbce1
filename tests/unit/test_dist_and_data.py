"""The collective helpers and input pipeline in one process (world size 1)."""
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain import data
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import runtime


@pytest.fixture(autouse=True)
def _init():
    dist.init()


def test_world_of_one():
    assert (dist.rank(), dist.size(), dist.local_rank(), dist.local_size()) == (0, 1, 0, 1)
    assert dist.is_root()


def test_start_up_names_are_one_set_of_functions():
    # collectives re-exports runtime's start-up names, and hvdtrain's lazy names are the same
    for name in ("init", "rank", "size", "local_rank", "local_size", "is_root", "mpi_enabled"):
        assert getattr(dist, name) is getattr(runtime, name), name
    for name in ("init", "rank", "size", "local_rank", "is_root"):
        assert getattr(hvdtrain, name) is getattr(runtime, name), name
    assert hvdtrain.Average is dist.Average and hvdtrain.Compression is dist.Compression
    assert runtime.is_initialized()


def test_timeline_needs_run_time_timelines_once_started(monkeypatch):
    monkeypatch.delenv("HOROVOD_TIMELINE", raising=False)
    with pytest.raises(ValueError, match="started without run-time timelines"):
        dist.check_timeline_possible("t.json")


def test_reductions_in_a_world_of_one():
    assert dist.allreduce_dict({"b": 2.0, "a": 1.0}, weight=3) == {"a": 1.0, "b": 2.0}
    assert dist.allreduce_dict({"b": 2.0, "a": 1.0}, weight=None) == {"a": 1.0, "b": 2.0}
    assert dist.agree_any(True) and not dist.agree_any(False)
    assert dist.broadcast_object({"k": 1}) == {"k": 1}
    np.testing.assert_array_equal(dist.allreduce_sum([1, 2]), [1.0, 2.0])
    g = [tf.ones(2), None]
    out = dist.reduce_gradients(g)
    assert out[1] is None and np.allclose(out[0], 1.0)
    dist.barrier()


def test_check_dataset_names_the_problem():
    with pytest.raises(TypeError, match="my_ds must be a tf.data.Dataset"):
        data.check_dataset(np.zeros(3), "my_ds")
    with pytest.raises(TypeError, match=r"\(x, y\) pairs"):
        data.check_dataset(tf.data.Dataset.range(3), "my_ds")
    data.check_dataset(tf.data.Dataset.from_tensor_slices((np.zeros(3), np.zeros(3))))


def test_shard_and_batch_and_step_counts():
    ds = tf.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10)))
    b = data.shard_and_batch(ds, num_shards=2, index=1, batch_size=2, prefetch_size=0)
    assert [x.numpy().tolist() for x, _ in b] == [[1, 3], [5, 7], [9]]
    assert data.known_steps(b) == 3
    assert data.known_steps(ds.repeat().batch(2)) == -1
    assert data.known_steps(ds.filter(lambda x, y: x > 3).batch(2)) is None
    assert data.smallest_steps([3, 2, 4]) == 2
    assert data.smallest_steps([3, -1]) == 3 and data.smallest_steps([-1, -1]) == -1
    assert data.smallest_steps([3, None]) is None


def test_shuffle_is_per_shard_and_seeded():
    ds = tf.data.Dataset.from_tensor_slices((np.arange(20), np.arange(20)))
    a = data.shard_and_batch(ds, num_shards=2, index=0, batch_size=10, shuffle_buffer_size=10, seed=1)
    first = next(iter(a))[0].numpy()
    assert sorted(first.tolist()) == list(range(0, 20, 2)) and first.tolist() != list(range(0, 20, 2))


def test_resume_skips_into_the_epoch_and_keeps_the_shuffled_streams_order():
    batches = data.shard_and_batch(tf.data.Dataset.range(12), num_shards=1, index=0,
                                   batch_size=2, prefetch_size=0)  # 6 batches an epoch
    firsts = lambda ds: [int(b[0]) for b in ds]  # noqa: E731
    # 4 steps an epoch (the agreed count), 3 epochs, resumed 1 step into epoch 1
    plain = data.resume(batches, steps_per_epoch=4, num_epochs=3, epoch=1, skip=1,
                        shuffled=False)
    assert firsts(plain) == [2, 4, 6] + [0, 2, 4, 6]
    # shuffled: the stream replayed from its start, less the steps trained, so epoch 1
    # is the stream's second pass (a fresh repeat would give it the first pass's order);
    # here each pass over the data yields other values: 100 * pass + position
    passes = []

    def each_pass():
        passes.append(None)
        yield from (100 * (len(passes) - 1) + i for i in range(6))

    stream = tf.data.Dataset.from_generator(each_pass, output_signature=tf.TensorSpec((), tf.int64))
    shuffled = data.resume(stream.batch(1), steps_per_epoch=4, num_epochs=3, epoch=1, skip=1,
                           shuffled=True)
    assert firsts(shuffled) == [101, 102, 103] + [200, 201, 202, 203]
    # two replicas a step: counts in steps, batches two at a time
    per_replica = data.resume(batches, steps_per_epoch=2, num_epochs=2, epoch=0, skip=1,
                              shuffled=False, batches_per_step=2)
    assert firsts(per_replica) == [4, 6] + [0, 2, 4, 6]
    # unknown length: one pass, as it is
    assert firsts(data.resume(batches, steps_per_epoch=None, num_epochs=3, epoch=0, skip=0,
                              shuffled=False)) == [0, 2, 4, 6, 8, 10]
    assert int(next(iter(data.prefetch(batches, None)))[0]) == 0
