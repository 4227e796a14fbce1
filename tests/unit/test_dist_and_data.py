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
