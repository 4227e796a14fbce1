"""The sharded update's algebra on one process: the layout of the flat, padded buffers,
the refusals, and a sharded optimizer that trains like the plain one."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.horovod import optimizer as distributed
from hvdtrain.horovod import sharded


def values(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype("float32") for s in shapes]


SHAPES = [(3, 4), (4,), (4, 1), (1,)]  # 12 + 4 + 4 + 1 entries
BUCKETS = [[3, 2], [1, 0]]  # 5 entries, 16 entries


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_the_ranks_slices_cover_every_bucket_once(size):
    vals = values(SHAPES)
    layouts = [sharded.Layout(SHAPES, BUCKETS, r, size) for r in range(size)]
    flats = layouts[0].flat_buckets(vals)
    for b, (bucket, flat) in enumerate(zip(BUCKETS, flats)):
        expected = np.concatenate([vals[i].ravel() for i in bucket])
        assert flat.shape[0] % size == 0 and flat.shape[0] - len(expected) < size
        np.testing.assert_array_equal(flat.numpy()[:len(expected)], expected)
        np.testing.assert_array_equal(flat.numpy()[len(expected):], 0)
        # each rank's slice is its equal share of each bucket, as reduce-scatter gives it
        owns = [lay.split_slice(lay.own_slice(vals))[b].numpy() for lay in layouts]
        np.testing.assert_array_equal(np.concatenate(owns), flat.numpy())
    assert all(lay.slice_size == layouts[0].slice_size for lay in layouts)


def test_gathered_buffers_go_back_into_their_variables():
    vals = values(SHAPES, seed=1)
    lay = sharded.Layout(SHAPES, BUCKETS, 0, 3)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    lay.assign_gathered(lay.flat_buckets(vals), variables)
    for v, want in zip(variables, vals):
        np.testing.assert_array_equal(v.numpy(), want)


@pytest.mark.parametrize("make, why", [
    (lambda: keras.optimizers.Lamb(0.01), "trust ratio"),
    (lambda: keras.optimizers.Adafactor(0.01), "factored"),
])
def test_whole_tensor_optimizers_are_refused(make, why):
    opt = make()
    with pytest.raises(ValueError, match=f"cannot shard {type(opt).__name__}: .*{why}"):
        hvdtrain.DistributedOptimizer(opt, shard_optimizer=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(compression="topk"), "no compression"),
    (dict(compression="fp16"), "no compression"),
    (dict(op="sum"), "op='average'"),
    (dict(num_groups=2), "no groups"),
    (dict(backward_passes_per_step=2), "gradient accumulation"),
])
def test_unsupported_combinations_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvdtrain.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer=True,
                                      **kwargs)


def test_global_clipnorm_is_refused():
    with pytest.raises(ValueError, match="global_clipnorm"):
        hvdtrain.DistributedOptimizer(keras.optimizers.Adam(0.01, global_clipnorm=1.0),
                                      shard_optimizer=True)


def test_shard_optimizer_must_be_a_bool():
    with pytest.raises(ValueError, match="shard_optimizer must be True or False"):
        hvdtrain.Horovod(shard_optimizer="yes")


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.RMSprop(0.01),
    lambda: keras.optimizers.Adagrad(0.05),
    lambda: keras.optimizers.Lion(0.001, weight_decay=0.01),
])
def test_a_sharded_optimizer_trains_like_the_plain_one(make):
    def run(shard):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5),
                                  keras.layers.Dense(3)])
        opt = hvdtrain.DistributedOptimizer(make(), shard_optimizer=shard, bucket_mb=1e-4)
        x = tf.random.stateless_normal((16, 7), (1, 2))
        y = tf.random.stateless_normal((16, 3), (3, 4))

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        for _ in range(20):
            step()
        return model.get_weights(), opt

    plain, _ = run(False)
    shard, opt = run(True)
    assert isinstance(distributed.exchanger_of(opt).strategy, sharded.ReduceScatter)
    assert int(opt.iterations.numpy()) == 20
    for p, q in zip(plain, shard):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    assert not distributed.reduces_before_apply(opt)
