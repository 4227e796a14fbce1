"""The sharded update's algebra on one process: the layout of the flat, padded buffers,
the refusals, and a sharded optimizer that trains like the plain one."""
from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.horovod import optimizer as distributed
from hvdtrain.horovod import exchange_strategies as strategies
from hvdtrain.horovod import sharded, sharded_state, sharded_update
from sharded_runs import sharded_on_one_rank, small_run  # noqa: F401 - a fixture

on_one_rank = pytest.mark.usefixtures("sharded_on_one_rank")


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
        owns = [lay.own_slices(vals)[b].numpy() for lay in layouts]
        np.testing.assert_array_equal(np.concatenate(owns), flat.numpy())
    assert all(lay.slice_size == layouts[0].slice_size for lay in layouts)


def test_gathered_buffers_go_back_into_their_variables():
    vals = values(SHAPES, seed=1)
    lay = sharded.Layout(SHAPES, BUCKETS, 0, 3)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    for b, flat in enumerate(lay.flat_buckets(vals)):
        lay.assign_bucket(b, flat, variables)
    for v, want in zip(variables, vals):
        np.testing.assert_array_equal(v.numpy(), want)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_large_variable_is_cut_by_rows_into_buckets_of_their_own(size):
    vals = values(SHAPES, seed=2)
    layouts = [sharded.Layout(SHAPES, BUCKETS, r, size, max_entries=8) for r in range(size)]
    lay = layouts[0]
    # (3, 4) has 12 entries: rows 0-1 and row 2, each a bucket of its own; the rest whole
    assert lay.buckets == [[(3, 0, 1), (2, 0, 4)], [(1, 0, 4)], [(0, 0, 8)], [(0, 8, 12)]]
    for b, flat in enumerate(lay.flat_buckets(vals)):
        owns = [other.own_slices(vals)[b].numpy() for other in layouts]
        np.testing.assert_array_equal(np.concatenate(owns), flat.numpy())
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]

    @tf.function
    def assign():
        for b, flat in enumerate(lay.flat_buckets(vals)):
            lay.assign_bucket(b, flat, variables)

    assign()
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
    (dict(compression="topk"), "compression 'none' or 'fp16'"),
    (dict(compression="powersgd"), "compression 'none' or 'fp16'"),
    (dict(op="sum"), "op='average'"),
    (dict(num_groups=2), "no groups"),
])
def test_unsupported_combinations_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvdtrain.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer=True,
                                      **kwargs)


def test_a_loss_scaled_whole_tensor_optimizer_is_refused_by_its_inner_name():
    with pytest.raises(ValueError, match="cannot shard Lamb"):
        hvdtrain.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Lamb(0.01)), shard_optimizer=True)


def test_shard_optimizer_must_be_a_bool():
    with pytest.raises(ValueError, match="shard_optimizer must be True or False"):
        hvdtrain.Horovod(shard_optimizer="yes")


@on_one_rank
@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.RMSprop(0.01),
    lambda: keras.optimizers.Adagrad(0.05),
    lambda: keras.optimizers.Lion(0.001, weight_decay=0.01),
])
def test_a_sharded_optimizer_trains_like_the_plain_one(make):
    plain, _ = small_run(make, False, 20)
    shard, opt = small_run(make, True, 20)
    assert isinstance(distributed.exchanger_of(opt).strategy, sharded.ReduceScatter)
    assert int(opt.iterations.numpy()) == 20
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    assert distributed.reduces_before_apply(opt)  # the Trainer's riders ride along


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("how", [dict(clipnorm=0.3), dict(global_clipnorm=0.3)])
def test_the_ranks_slices_clip_as_the_whole_gradient_is_clipped(size, how):
    """Each rank's runs' squares, summed over the ranks, are each variable's squared norm,
    and each rank's clipped slice is its share of Keras's clipped gradient (variables
    split between the ranks' slices included)."""
    grads = values(SHAPES, seed=2)
    opt = keras.optimizers.SGD(0.1, **how)
    want = ([tf.clip_by_norm(g, 0.3) for g in grads] if "clipnorm" in how
            else tf.clip_by_global_norm(grads, 0.3)[0])
    layouts = [sharded.Layout(SHAPES, BUCKETS, r, size) for r in range(size)]
    squares = sum(sharded_update.run_squares(lay, lay.own_slices(grads)) for lay in layouts)
    np.testing.assert_allclose(squares, [np.sum(g * g) for g in grads], rtol=1e-6)
    clipped = [sharded_update.clip_with(opt, lay, lay.own_slices(grads), squares)
               for lay in layouts]
    for b, flat in enumerate(layouts[0].flat_buckets(want)):
        np.testing.assert_allclose(np.concatenate([c[b] for c in clipped]), flat, rtol=1e-6)
    assert not np.allclose(want[0], grads[0])  # the threshold is binding


@on_one_rank
@pytest.mark.parametrize("make, kwargs", [
    (lambda: keras.optimizers.Adam(0.01, clipnorm=0.05), {}),
    (lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05), {}),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=0.05), {}),
    (lambda: keras.optimizers.SGD(0.05, momentum=0.5), dict(backward_passes_per_step=2)),
    (lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
     dict(backward_passes_per_step=3, average_aggregated_gradients=False)),
])
def test_clipping_and_local_accumulation_train_like_the_plain_optimizer(make, kwargs):
    plain, plain_opt = small_run(make, False, 12, varying=True, **kwargs)
    shard, opt = small_run(make, True, 12, varying=True, **kwargs)
    assert int(opt.iterations.numpy()) == int(plain_opt.iterations.numpy())
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    config = dict(make().get_config(), clipnorm=None, global_clipnorm=None)
    without, _ = small_run(lambda: type(make()).from_config(config), False, 12, varying=True)
    assert not np.allclose(without.get_weights()[0], plain.get_weights()[0])  # it matters


@on_one_rank
def test_a_loss_scaler_skips_a_step_as_the_plain_one_does():
    """The step whose gradients are not finite is skipped and the scale halved, as by
    the unsharded loss scaler; the state per rank is the slice's."""
    def make():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))

    plain, plain_opt = small_run(make, False, 10, varying=True, inf_at=4)
    shard, opt = small_run(make, True, 10, varying=True, inf_at=4)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert float(opt.dynamic_scale.numpy()) == float(plain_opt.dynamic_scale.numpy()) == 2.0**14
    assert int(opt.iterations.numpy()) == int(plain_opt.iterations.numpy()) == 9
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    strategy = distributed.exchanger_of(opt).strategy
    assert strategy.optimizer is opt  # checkpoints hold the scaler, as unsharded ones do
    assert sorted(int(v.shape[0]) for v in opt.inner_optimizer.variables if v.shape.rank) == \
        sorted(strategy.layout.chunks * 2)  # Adam's two moments of each bucket's share


def test_on_one_rank_the_optimizer_keeps_its_whole_state(caplog):
    """Alone there is nothing to shard over: a slice would be a second full copy of the
    weights, so the optimizer is left unsharded and says so (refusals still apply)."""
    with caplog.at_level("INFO", logger="hvdtrain"):
        _, opt = small_run(lambda: keras.optimizers.Adam(0.01), True, 2)
    assert isinstance(distributed.exchanger_of(opt).strategy, strategies.AllReduce)
    assert {tuple(v.shape) for v in opt.variables if v.shape.rank} == {(7, 5), (5,), (5, 3),
                                                                         (3,)}
    assert "nothing to shard over" in caplog.text
    assert sharded_state.describe_state(opt).endswith("(not sharded)")


@on_one_rank
@pytest.mark.parametrize("names, bucket_mb", [(["bias"], 1e-4), (["bias"], math.inf),
                                               (["kernel"], math.inf)])
def test_variables_excluded_from_weight_decay_stay_excluded(names, bucket_mb):
    """``exclude_from_weight_decay`` names the model's variables; each rank's slice decays
    their runs as unsharded does (a bucket per variable, or one bucket where excluded
    runs sit beside decayed ones)."""
    def make():
        opt = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        opt.exclude_from_weight_decay(var_names=names)
        return opt

    plain, _ = small_run(make, False, 10, varying=True, bucket_mb=bucket_mb)
    shard, _ = small_run(make, True, 10, varying=True, bucket_mb=bucket_mb)
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    every, _ = small_run(lambda: keras.optimizers.AdamW(0.01, weight_decay=0.5), False, 10,
                         varying=True)
    assert not all(np.allclose(p, q) for p, q in zip(every.get_weights(),
                                                       plain.get_weights()))  # it matters


@on_one_rank
def test_use_ema_overwrites_and_finalizes_as_the_plain_optimizer():
    """Keras's moving average of the weights: overwritten every few steps and put into the
    model by ``finalize_variable_values`` (as ``fit`` does at its end), as unsharded."""
    def make():
        return keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9,
                                     ema_overwrite_frequency=4)

    plain, plain_opt = small_run(make, False, 10, varying=True)
    shard, opt = small_run(make, True, 10, varying=True)
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    before = [w.copy() for w in plain.get_weights()]
    plain_opt.finalize_variable_values(plain.trainable_variables)
    opt.finalize_variable_values(shard.trainable_variables)
    assert not np.allclose(before[0], plain.get_weights()[0])  # the average differs
    for p, q in zip(plain.get_weights(), shard.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)


def test_buckets_wait_only_for_the_room_of_the_in_flight_window():
    """Buckets within the window start together (one Horovod cycle); a bucket beyond it
    waits for the earliest one whose leaving makes room; a bucket larger than the window
    waits for the one before it."""
    mib = 2**20 // 4  # float32 entries in a MiB
    lay = sharded.Layout([(mib * 25,), (mib * 25,), (mib * 25,), (mib * 100,), (mib,)],
                         [[0], [1], [2], [3], [4]], 0, 2)
    assert lay.waits(64) == [None, None, 0, 2, 3]
    assert lay.waits(float("inf")) == [None] * 5
    assert lay.waits(0) == [None, 0, 1, 2, 3]


@on_one_rank
def test_riders_ride_in_the_first_buckets_reduce_scatter():
    """The exchanger's reduce returns this rank's share of each bucket, then the riders'
    sums, and apply(reduced=True) takes the shares: the same update as apply alone."""
    from hvdtrain.horovod import exchange
    plain, _ = small_run(lambda: keras.optimizers.Adam(0.01), True, 3)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer=True,
                                        bucket_mb=1e-4)
    opt.build(model.trainable_variables)
    exchanger = distributed.exchanger_of(opt)
    x = tf.random.stateless_normal((16, 7), tf.stack([1, 0]))
    y = tf.random.stateless_normal((16, 3), tf.stack([3, 0]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        shares, sums = exchanger.reduce(grads, model.trainable_variables,
                                        [exchange.Rider(loss), exchange.Rider(2.0, exact=True)])
        distributed.apply(opt, shares, model.trainable_variables, reduced=True)
        return len(shares), loss, sums

    for _ in range(3):
        count, loss, (loss_sum, two) = step()
    buckets = len(exchanger.strategy.slices)
    assert count == buckets
    assert float(loss_sum) == float(loss) and float(two) == 2.0
    for p, q in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_allclose(q, p, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=f"each of its {buckets} buckets; got {buckets + 1}"):
        distributed.apply(opt, [tf.zeros([1])] * (buckets + 1), model.trainable_variables,
                          reduced=True)
