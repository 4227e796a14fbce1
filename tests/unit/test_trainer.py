"""Trainer in one process: contract, stopping, checkpoints, callbacks, bad input."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain import Callback, Trainer


def make(dataset, build, **kw):
    kw.setdefault("log_step_size", 1000)
    return Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1}, **kw)


def test_trains_and_counts_steps(dataset, build):
    t = make(dataset, build, batch_size=16, num_epochs=3, validation_dataset=dataset)
    assert t.steps_per_epoch == 6
    before = dict(t.validation_metrics)
    assert set(before) == {"loss", "acc"}
    logs = t.train_on_batch()
    assert set(logs) == {"loss", "acc"} and t.global_step == 1
    t.train_to_end()
    assert t.global_step == 18 and t.should_stop() and t.session.should_stop()
    assert dict(t.validation_metrics)["loss"] < before["loss"]
    with pytest.raises(RuntimeError, match="training has ended"):
        t.train_on_batch()


def test_max_iteration_counts_over_all_workers(dataset, build):
    t = make(dataset, build, batch_size=8, max_iteration=5, num_epochs=10)
    t.train_to_end()
    assert t.global_step == 5 // hvdtrain.size()


def test_network_is_built_once_and_reused(dataset, build):
    calls = []

    def counting_build(x, y):
        calls.append(1)
        return build(x, y)

    t = make(dataset, counting_build, batch_size=16)
    t.train_to_end()
    assert len(calls) == 1
    assert t.training_network.built and len(t.training_network.trainable_variables) == 4


def test_optimizer_forms_and_lr(dataset, build):
    t = Trainer(dataset, build, keras.optimizers.Adam(0.01), batch_size=16)
    assert isinstance(t.optimizer, keras.optimizers.Adam)
    t = Trainer(dataset, build, "adam", {"learning_rate": 0.02}, batch_size=16)
    assert float(t.optimizer.learning_rate) == pytest.approx(0.02 * hvdtrain.size())
    assert hvdtrain.horovod.optimizer.is_distributed(t.optimizer)


def test_keras_model_and_loss(dataset):
    model = keras.Sequential([keras.layers.Dense(2)])
    t = Trainer(dataset, optimizer=keras.optimizers.SGD(0.1), model=model, batch_size=16,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                validation_dataset=dataset, log_step_size=1000)
    before = float(dict(t.validation_metrics)["loss"])
    t.train_to_end()
    assert t.training_network is model
    assert float(dict(t.validation_metrics)["loss"]) < before


def test_validation_metrics_match_numpy(dataset, xy, build):
    def build_val(x, y, net):
        logits = net(x)
        return net, {"pred_mean": keras.ops.mean(logits[:, 0]), "y_mean": keras.ops.mean(
            keras.ops.cast(y, "float32"))}

    t = make(dataset, build, batch_size=10, validation_dataset=dataset, build_validation_func=build_val)
    history = t.train_and_validate_to_end(validate_step_size=3)
    metrics = {k[len("val_"):]: v[-1] for k, v in history.history.items() if k.startswith("val_")}
    assert metrics == dict(t.validation_metrics)  # the final validation is the last epoch's
    x, y = xy
    assert metrics["y_mean"] == pytest.approx(y.mean(), rel=1e-6)
    logits = t.training_network(x, training=False).numpy()
    assert metrics["pred_mean"] == pytest.approx(logits[:, 0].mean(), rel=1e-5, abs=1e-6)


def test_resume_from_checkpoint(dataset, build, tmp_path):
    t = make(dataset, build, batch_size=16, max_iteration=4, checkpoint_dir=str(tmp_path))
    t.train_to_end()
    saved = [w.copy() for w in t.training_network.get_weights()]
    t2 = make(dataset, build, batch_size=16, max_iteration=10, checkpoint_dir=str(tmp_path))
    assert t2.restored_from and t2.global_step == 4
    for a, b in zip(saved, t2.training_network.get_weights()):
        np.testing.assert_array_equal(a, b)
    t2.train_to_end()
    assert t2.global_step == 6  # one epoch = 6 steps; the resumed run skips the first 4
    assert (tmp_path / "latest").read_text().strip() == "ckpt-00000006"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004", "ckpt-00000006",
                                                          "latest"]


def test_checkpoint_from_a_different_model_is_refused(dataset, build, tmp_path):
    make(dataset, build, batch_size=16, max_iteration=2, checkpoint_dir=str(tmp_path)).train_to_end()

    def other(x, y):
        net = keras.Sequential([keras.layers.Dense(3, activation="relu"), keras.layers.Dense(2)])
        logits = net(x)
        return net, keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True)), {}

    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="does not match this model"):
        make(dataset, other, batch_size=16, checkpoint_dir=str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_callbacks_see_hooks_and_can_stop(dataset, build):
    events = []

    class Recorder(Callback):
        def on_train_begin(self, logs=None):
            events.append("train_begin")

        def on_epoch_begin(self, epoch, logs=None):
            events.append(f"epoch_begin{epoch}")

        def on_epoch_end(self, epoch, logs=None):
            events.append(f"epoch_end{epoch}")

        def on_train_batch_end(self, batch, logs=None):
            if batch == 8:
                self.trainer.stop_training = True

        def on_train_end(self, logs=None):
            events.append("train_end")

    t = make(dataset, build, batch_size=16, num_epochs=5, callbacks=[Recorder()])
    t.train_to_end()
    assert t.global_step == 8
    assert events == ["train_begin", "epoch_begin0", "epoch_end0", "epoch_begin1", "epoch_end1",
                      "train_end"]


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"batch_size": -3}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"log_step_size": 0}, "log_step_size"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"prefetch_size": -1}, "prefetch_size"),
    ({"max_iteration": 0}, "max_iteration"),
    ({"max_iteration": 1, "batch_size": 8}, None),  # fine on one rank
    ({"op": "max"}, "op must be one of"),
    ({"compression": "zip"}, "compression must be one of"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
    ({"lr_scaling": "cubic"}, "lr scaling rule"),
    ({"keep_checkpoint_max": 0}, "keep_checkpoint_max"),
])
def test_bad_arguments_are_named(dataset, build, kwargs, match):
    if match is None:
        make(dataset, build, **kwargs)
        return
    with pytest.raises(ValueError, match=match):
        make(dataset, build, **kwargs)


def test_optimizer_args_must_hold_learning_rate(dataset, build):
    with pytest.raises(ValueError, match="must hold 'learning_rate'"):
        Trainer(dataset, build, keras.optimizers.SGD, {"momentum": 0.9})
    with pytest.raises(ValueError, match="optimizer_args must be a dict"):
        Trainer(dataset, build, keras.optimizers.SGD, None)
    with pytest.raises(TypeError, match="optimizer must be a Keras optimizer class"):
        Trainer(dataset, build, object, {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="do not fit SGD"):
        Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1, "bogus": 1})


def test_dataset_must_be_pairs(xy, build):
    x, y = xy
    with pytest.raises(TypeError, match=r"training_dataset must yield \(x, y\) pairs"):
        make(tf.data.Dataset.from_tensor_slices(x), build)
    with pytest.raises(TypeError, match="training_dataset must be a tf.data.Dataset"):
        make([(x, y)], build)
    with pytest.raises(TypeError, match="validation_dataset must yield"):
        make(tf.data.Dataset.from_tensor_slices((x, y)), build,
             validation_dataset=tf.data.Dataset.from_tensor_slices((x, y, y)))


def test_empty_dataset_is_refused(xy, build):
    x, y = xy
    empty = tf.data.Dataset.from_tensor_slices((x[:0], y[:0]))
    with pytest.raises(ValueError, match="training_dataset is empty"):
        make(empty, build)


@pytest.mark.parametrize("bad_build, err, match", [
    (lambda x, y: None, TypeError, r"must return \(network, loss, log_tensors\)"),
    (lambda x, y: (1, 2), TypeError, r"must return \(network, loss, log_tensors\)"),
    (lambda x, y: ("net", keras.ops.mean(x), {}), TypeError, "network"),
    (lambda x, y: (keras.layers.Dense(1), 0.5, {}), TypeError, "loss as a tensor"),
    (lambda x, y: (keras.layers.Dense(2), keras.layers.Dense(2)(x), {}), ValueError, "scalar"),
    (lambda x, y: (keras.layers.Dense(2), keras.ops.mean(keras.layers.Dense(2)(x)),
                   {"loss": keras.ops.mean(x)}), ValueError, "reserved"),
    (lambda x, y: (keras.layers.Dense(2), keras.ops.mean(keras.layers.Dense(2)(x)),
                   "acc"), TypeError, "log_tensors must be a dict"),
    (lambda x, y: (keras.layers.Dense(2), tf.reduce_mean(x), {}), TypeError, "keras.ops"),
])
def test_bad_build_function_is_explained(dataset, bad_build, err, match):
    with pytest.raises(err, match=match):
        make(dataset, bad_build)


def test_needs_a_build_function_or_model(dataset, build):
    with pytest.raises(ValueError, match="exactly one of build_training_func"):
        Trainer(dataset, None, keras.optimizers.SGD, {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="loss"):
        Trainer(dataset, optimizer="sgd", optimizer_args={"learning_rate": 0.1},
                model=keras.Sequential([keras.layers.Dense(2)]), loss="not-a-loss")


def test_unwritable_checkpoint_dir(dataset, build, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    with pytest.raises(ValueError, match="not a writable directory"):
        make(dataset, build, checkpoint_dir=str(blocker / "sub"))
    assert blocker.read_text() == "keep me"


def test_horovod_settings_object_trains_as_the_flat_keywords(dataset, build):
    keras.utils.set_random_seed(0)
    grouped = make(dataset, build, batch_size=16, strategy=hvdtrain.Horovod(
        bucket_mb=0.01, steps_per_execution=2))
    grouped.train_to_end()
    keras.utils.set_random_seed(0)
    flat = make(dataset, build, batch_size=16, bucket_mb=0.01, steps_per_execution=2)
    flat.train_to_end()
    assert grouped.options == flat.options and grouped.global_step == flat.global_step == 6
    for a, b in zip(grouped.training_network.weights, flat.training_network.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
