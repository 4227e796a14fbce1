"""DistributedOptimizer on Keras 3 and the learning-rate rules (one process)."""
import math

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain import learning_rate
from hvdtrain.horovod import optimizer as optim


def test_wraps_in_place_and_keeps_a_keras_optimizer():
    opt = keras.optimizers.Adam(0.01)
    wrapped = hvdtrain.DistributedOptimizer(opt)
    assert wrapped is opt and isinstance(opt, keras.optimizers.Adam)
    assert type(opt).__name__ == "Adam" and optim.is_distributed(opt)
    with pytest.raises(ValueError, match="already"):
        hvdtrain.DistributedOptimizer(opt)


def test_model_fit_with_distributed_optimizer():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.5)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]


def _sgd_run(batches, steps_per_update):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                        backward_passes_per_step=steps_per_update)
    for x, y in batches:
        with __import__("tensorflow").GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
    return [w for w in model.get_weights()]


def test_backward_passes_equal_one_step_with_a_bigger_batch():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(24, 3)).astype("float32")
    y = rng.normal(size=(24, 1)).astype("float32")
    small = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    accumulated = _sgd_run(small, 3)
    big = _sgd_run([(x, y)], 1)
    for a, b in zip(accumulated, big):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # and differs from three separate updates
    separate = _sgd_run(small, 1)
    assert not np.allclose(separate[0], big[0])


@pytest.mark.parametrize("kwargs, err, match", [
    ({"op": "median"}, ValueError, "op must be one of"),
    ({"compression": "gzip"}, ValueError, "compression must be one of"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step"),
    ({"backward_passes_per_step": 1.5}, ValueError, "backward_passes_per_step"),
])
def test_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="Keras 3 optimizer instance"):
        hvdtrain.DistributedOptimizer(keras.optimizers.SGD)


def test_ops_and_compression_names_resolve():
    from hvdtrain.horovod import collectives as dist
    assert dist.resolve_op("SUM") is hvdtrain.Sum
    assert dist.resolve_op(hvdtrain.Average) is hvdtrain.Average
    assert dist.resolve_compression("fp16") is hvdtrain.Compression.fp16
    assert dist.resolve_compression(None) is hvdtrain.Compression.none


def test_scaling_rules():
    assert learning_rate.lr_scale_factor(4, "linear") == 4.0
    assert learning_rate.lr_scale_factor(4, "sqrt") == 2.0
    assert learning_rate.lr_scale_factor(4, "none") == 1.0
    with pytest.raises(ValueError, match="lr scaling rule"):
        learning_rate.lr_scale_factor(4, "log")


def test_scale_learning_rate_number_and_schedule():
    opt = keras.optimizers.SGD(0.1)
    learning_rate.scale_learning_rate(opt, 3.0)
    assert learning_rate.current_learning_rate(opt) == pytest.approx(0.3)
    sched = keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=10, decay_rate=0.5)
    opt = keras.optimizers.SGD(sched)
    learning_rate.scale_learning_rate(opt, 2.0)
    assert learning_rate.current_learning_rate(opt) == pytest.approx(2.0)
    opt.iterations.assign(10)
    assert learning_rate.current_learning_rate(opt) == pytest.approx(1.0)
    restored = learning_rate.ScaledSchedule.from_config(opt._learning_rate.get_config())
    assert float(restored(10)) == pytest.approx(1.0) and restored.factor == 2.0
    assert math.isclose(float(restored(0)), 2.0)


def test_mixed_float16_policy_gets_loss_scaling_around_the_reduction():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2),
                                  keras.layers.Activation("linear", dtype="float32")])
        opt = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer=opt, loss="mse")
        model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and optim.is_distributed(opt)
    assert model.optimizer is opt
    assert all(v.dtype == "float32" for v in model.trainable_variables)


def test_applying_does_not_add_model_variables_to_the_optimizer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.Adam(0.1))
    opt.build(model.trainable_variables)
    before = len(opt.variables)
    opt.apply([np.ones((3, 2), "float32"), np.ones(2, "float32")], model.trainable_variables)
    assert len(opt.variables) == before
