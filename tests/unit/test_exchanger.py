"""The Exchanger, the one owner of the gradient path (one process; the 2-rank results of
every strategy and front door are in tests/parallel/)."""
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression, exchange_strategies
from hvdtrain.horovod import optimizer as distributed
from hvdtrain.horovod.exchange import Exchanger, Rider
from hvdtrain.horovod.exchange_settings import ExchangeSettings


@pytest.fixture(autouse=True)
def _horovod():
    dist.init()


class _Var:
    def __init__(self, *shape, dtype="float32"):
        self.shape, self.dtype = shape, dtype


class _TwoRanks(exchange_strategies.Strategy):
    """A strategy standing for two ranks holding the same values: every entry summed
    (times two), then scaled as the settings say; it records the buckets it was given."""

    carries_riders = True

    def __init__(self, settings):
        super().__init__(settings)
        self.calls = []

    def reduce(self, grads, variables, buckets, seed):
        self.calls.append((len(grads), buckets))
        s = self.settings
        scale = s.prescale * s.postscale / (2.0 if s.op is dist.Average else 1.0)
        return [None if g is None else tf.cast(g, tf.float32) * 2.0 * scale for g in grads]


def _with(strategy_cls, **settings):
    exchanger = Exchanger(ExchangeSettings(**settings))
    exchanger.strategy = strategy_cls(exchanger.settings)
    return exchanger


def test_the_settings_choose_the_strategy():
    assert isinstance(Exchanger(ExchangeSettings()).strategy, exchange_strategies.AllReduce)
    sparse = Exchanger(ExchangeSettings(compression=compression.TopK(0.5)))
    assert isinstance(sparse.strategy, exchange_strategies.Sparsified)


def test_the_plan_is_the_fusion_groups_else_buckets_of_bucket_mb():
    variables = [_Var(784, 800), _Var(800), _Var(800, 800), _Var(800), _Var(800, 10), _Var(10)]
    assert Exchanger(ExchangeSettings()).plan(variables) is None  # one fused call
    assert Exchanger(ExchangeSettings(bucket_mb=25.0)).plan(variables) == [[5, 4, 3, 2], [1, 0]]
    assert Exchanger(ExchangeSettings(groups=2, bucket_mb=25.0)).plan(variables) == [
        [0, 1, 2], [3, 4, 5]]  # Horovod's groups win
    assert Exchanger(ExchangeSettings(bucket_mb=25.0)).plan(None, 6) is None


def test_riders_ride_in_the_first_bucket_and_come_back_as_sums():
    exchanger = _with(_TwoRanks, op=dist.Sum, bucket_mb=1.0)
    variables = [_Var(800, 800), _Var(800, 800)]
    grads = [tf.ones(v.shape) for v in variables]
    reduced, sums = exchanger.reduce(grads, variables, [Rider(3.0), Rider(1.0, exact=True)])
    [(count, buckets)] = exchanger.strategy.calls  # one call: no collective of their own
    assert count == 4 and buckets == [[1, 2, 3], [0]]  # in the last layer's bucket
    assert len(reduced) == 2 and np.allclose(reduced[0].numpy(), 2.0)
    assert [float(s) for s in sums] == [6.0, 2.0]  # summed over the (two) ranks


def test_the_scaling_is_undone_for_the_riders():
    exchanger = _with(_TwoRanks, op=dist.Sum, prescale=0.25, postscale=3.0)
    reduced, sums = exchanger.reduce([tf.ones([2])], [_Var(2)], [Rider(1.0, exact=True)])
    assert np.allclose(reduced[0].numpy(), 1.5) and float(sums[0]) == 2.0


@pytest.mark.parametrize("settings, exact, carried", [
    (dict(), False, True),
    (dict(op=dist.Adasum), True, False),  # Adasum's result for scalars may change sign
    (dict(compression=dist.Compression.fp16), True, True),  # a 0/1 flag survives fp16
    (dict(compression=dist.Compression.fp16), False, False),  # a large loss would not
    (dict(compression=compression.RandomK(0.5)), True, False),  # allgathered one by one
])
def test_which_riders_can_ride(settings, exact, carried):
    assert Exchanger(ExchangeSettings(**settings)).carries([Rider(1.0, exact=exact)]) is carried


def test_riders_that_cannot_ride_go_in_one_small_allreduce_after_the_gradients():
    exchanger = Exchanger(ExchangeSettings(op=dist.Adasum))
    reduced, sums = exchanger.reduce([tf.ones([2])], [_Var(2)], [2.0, Rider(1.0, exact=True)])
    assert np.allclose(reduced[0].numpy(), 1.0) and [float(s) for s in sums] == [2.0, 1.0]
    only, sums = Exchanger(ExchangeSettings()).reduce([], None, [Rider(5.0)])
    assert only == [] and float(sums[0]) == 5.0


def test_one_rank_gets_its_own_gradients_back_and_none_stays_none():
    exchanger = Exchanger(ExchangeSettings(bucket_mb=25.0))
    g = tf.constant([1.0, 2.0])
    reduced, sums = exchanger.reduce([g, None], [_Var(2), _Var(3)])
    assert np.allclose(reduced[0].numpy(), [1.0, 2.0]) and reduced[1] is None and sums == []


def test_the_sparsified_strategy_keeps_its_error_feedback_state():
    exchanger = Exchanger(ExchangeSettings(compression=compression.TopK(0.5)))
    v = keras.Variable(np.zeros(4, "float32"))
    exchanger.build([v])
    [sent], _ = exchanger.reduce([tf.constant([4.0, -1.0, 3.0, 0.5])], [v])
    assert np.allclose(sent.numpy(), [4.0, 0.0, 3.0, 0.0])  # the two largest
    assert np.allclose(exchanger.strategy.residuals[0].numpy(), [0.0, -1.0, 0.0, 0.5])


def test_the_optimizer_holds_an_exchanger_and_reduced_is_an_argument():
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(1.0))
    exchanger = distributed.exchanger_of(opt)
    exchanger.strategy = _TwoRanks(exchanger.settings)
    v = keras.Variable([1.0, 1.0])
    distributed.apply(opt, [tf.constant([0.5, 0.5])], [v], reduced=True)
    assert exchanger.strategy.calls == [] and np.allclose(v.numpy(), 0.5)
    opt.apply([tf.constant([0.5, 0.5])], [v])  # Keras's own call: the optimizer reduces
    assert len(exchanger.strategy.calls) == 1 and np.allclose(v.numpy(), 0.0)


def test_fits_riders_ride_in_the_optimizers_exchange_or_go_alone():
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(1.0), op="sum")
    exchanger = distributed.exchanger_of(opt)
    exchanger.strategy = _TwoRanks(exchanger.settings)
    v, got = keras.Variable([1.0]), []
    with distributed.riding(opt, [Rider(1.0, exact=True)], got.extend):
        opt.apply([tf.constant([0.5])], [v])
    [(count, _)] = exchanger.strategy.calls
    # the gradient, fit's rider and the optimizer's own non-finite-gradients flag
    assert count == 3 and [float(s) for s in got] == [2.0]
    got.clear()
    with distributed.riding(opt, [Rider(1.0, exact=True)], got.extend):
        pass  # no apply took them
    assert [float(s) for s in got] == [1.0]  # one rank, on their own


def test_hvdtrain_sets_one_attribute_on_keras_objects():
    package = Path(hvdtrain.__file__).parent
    names = {m for path in package.rglob("*.py")
             for m in re.findall(r"_hvd_\w+", path.read_text())}
    assert names == {"_hvd_distributed"}, sorted(names)


def test_the_reduction_options_know_horovods_constants():
    from hvdtrain import options, reduction
    assert reduction.GRADIENT_OPS == {"average": dist.Average, "sum": dist.Sum,
                                      "adasum": dist.Adasum}
    for op in (dist.Average, dist.Sum, dist.Adasum, "Sum"):
        options.ReductionOptions(op=op)
    for compression_ in (dist.Compression.none, dist.Compression.fp16, compression.TopK(0.1),
                         "randomk", None):
        options.ReductionOptions(compression=compression_)


@pytest.mark.parametrize("kwargs, match", [
    (dict(op=dist.Max), "op must be one of 'average', 'sum', 'adasum'"),
    (dict(op=True), "op must be one of"),
    (dict(compression="gzip"), "compression must be one of"),
    (dict(compression="topk", compression_ratio=2), r"topk compression ratio must be in \(0, 1\]"),
    (dict(backward_passes_per_step=0), "backward_passes_per_step must be a positive integer"),
])
def test_every_reduction_setting_is_checked_in_its_options_group(kwargs, match):
    from hvdtrain import options
    with pytest.raises(ValueError, match=match):
        options.ReductionOptions(**kwargs)
    with pytest.raises(ValueError, match=match):  # the same check for fit's optimizer
        hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)
