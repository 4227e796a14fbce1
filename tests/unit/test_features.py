"""Mixed precision, warmup, TensorBoard and the progress bar (one process)."""
import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import hvdtrain
from hvdtrain import learning_rate
from hvdtrain.horovod import optimizer as optim
from hvdtrain.callbacks import ProgressBar


def make(dataset, build, **kw):
    kw.setdefault("log_step_size", 1000)
    return hvdtrain.Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1}, **kw)


def test_mixed_float16_scales_the_loss_and_keeps_float32_variables(xy, build):
    x, y = xy
    t = make(tf.data.Dataset.from_tensor_slices((x, y)), build, batch_size=16,
             mixed_precision="mixed_float16")
    assert isinstance(t.optimizer, keras.optimizers.LossScaleOptimizer)
    assert all(v.dtype == "float32" for v in t.training_network.trainable_variables)
    assert all(layer.compute_dtype == "float16" for layer in t.training_network.layers)
    assert keras.mixed_precision.global_policy().name == "float32"  # left as it was
    start = float(t.optimizer.dynamic_scale)
    assert start == 2.0 ** 15
    t.train_on_batch()
    assert float(t.optimizer.dynamic_scale) == start  # finite step: scale kept, update applied
    # Inputs that overflow float16 once scaled: the step is skipped and the scale halves.
    huge = tf.data.Dataset.from_tensor_slices((x * 300, y))
    t2 = make(huge, build, batch_size=16, mixed_precision="mixed_float16")
    before = [w.copy() for w in t2.training_network.get_weights()]
    t2.train_on_batch()
    assert float(t2.optimizer.dynamic_scale) < start
    for a, b in zip(before, t2.training_network.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_mixed_bfloat16_and_the_keras_policy_switch(dataset, build):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        t = make(dataset, build, batch_size=16)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert t.mixed_precision == "mixed_bfloat16"
    assert not isinstance(t.optimizer, keras.optimizers.LossScaleOptimizer)
    assert all(layer.compute_dtype == "bfloat16" for layer in t.training_network.layers)
    assert all(v.dtype == "float32" for v in t.training_network.trainable_variables)
    t.train_to_end()
    assert np.isfinite(float(t._last_logs["loss"]))


def test_mixed_precision_refuses_a_float32_model(dataset):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no layer of the model computes in float16"):
        hvdtrain.Trainer(dataset, optimizer=keras.optimizers.SGD(0.1), model=model,
                         loss="sparse_categorical_crossentropy", mixed_precision="mixed_float16")
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        hvdtrain.Trainer(dataset, optimizer=keras.optimizers.SGD(0.1), model=model,
                         loss="sparse_categorical_crossentropy", mixed_precision="float8")


def test_warmup_ramps_from_unscaled_to_scaled():
    opt = keras.optimizers.SGD(0.1)
    learning_rate.scale_learning_rate(opt, 4.0, warmup_steps=10)
    rates = []
    for step in (0, 5, 10, 20):
        opt.iterations.assign(step)
        rates.append(learning_rate.current_learning_rate(opt))
    assert rates == pytest.approx([0.1, 0.25, 0.4, 0.4])
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        learning_rate.scale_learning_rate(keras.optimizers.SGD(0.1), 2.0, warmup_steps=-1)


def test_warmup_epochs_in_the_trainer(dataset, build):
    t = make(dataset, build, batch_size=16, warmup_epochs=0.5)
    assert isinstance(t.optimizer._learning_rate, learning_rate.WarmupSchedule)
    assert t.optimizer._learning_rate.warmup_steps == 3
    with pytest.raises(ValueError, match="warmup_epochs"):
        make(dataset.filter(lambda a, b: True), build, warmup_epochs=1)


def test_tensorboard_scalars_read_back_by_tensorboard(dataset, build, tmp_path):
    def build_val(x, y, net):
        return net, {"acc": keras.ops.mean(keras.ops.cast(keras.ops.equal(
            keras.ops.argmax(net(x), -1), keras.ops.cast(y, "int64")), "float32"))}

    t = make(dataset, build, batch_size=16, num_epochs=2, log_step_size=2, log_dir=str(tmp_path),
             validation_dataset=dataset, build_validation_func=build_val)
    t.train_and_validate_to_end(validate_step_size=6)
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {"loss", "acc", "learning_rate", "samples_per_sec", "val_acc"} <= tags
    loss_steps = [e.step for e in acc.Tensors("loss")]
    assert loss_steps == list(range(2, 13, 2))
    lr = [float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("learning_rate")]
    assert lr == pytest.approx([0.1] * 6)
    assert all(float(tf.make_ndarray(e.tensor_proto)) > 0 for e in acc.Tensors("samples_per_sec"))


def test_progress_bar_on_request(dataset, build):
    buf = io.StringIO()
    t = make(dataset, build, batch_size=16, callbacks=[ProgressBar(file=buf)], progress_bar=False)
    assert not t._agree_stops  # reporting callbacks do not cost a collective per step
    t.train_to_end()
    assert "6/6" in buf.getvalue()
    t2 = make(dataset, build, batch_size=16, progress_bar=True)
    assert any(isinstance(cb, ProgressBar) for cb in t2.callbacks.callbacks)
