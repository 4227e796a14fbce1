"""After training in one process: evaluate, predict, save, export, metrics, Keras
callbacks and History; the bad inputs each refuses."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain import Trainer
from hvdtrain.trainer.evaluation import _interleave
from hvdtrain.metrics import MetricSet


def make(dataset, build, **kw):
    kw.setdefault("log_step_size", 1000)
    return Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1}, **kw)


def one_hot_model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


@pytest.fixture
def one_hot(xy):
    x, y = xy
    return tf.data.Dataset.from_tensor_slices((x, np.eye(2, dtype="float32")[y]))


def test_evaluate_reports_means_and_metrics_over_the_whole_set(one_hot, xy):
    network = one_hot_model()
    t = Trainer(one_hot, model=network, loss="categorical_crossentropy", optimizer="sgd",
                optimizer_args={"learning_rate": 0.1}, batch_size=16, num_epochs=2,
                metrics=[keras.metrics.AUC(name="auc"), keras.metrics.CategoricalAccuracy()])
    history = t.train_to_end()
    assert history.epoch == [0, 1] and set(history.history) == {
        "loss", "auc", "categorical_accuracy", "learning_rate"}
    x, y = xy
    results = t.evaluate(one_hot, batch_size=7)  # batches that do not divide the set
    probs = network(x, training=False).numpy()
    auc = keras.metrics.AUC()
    auc.update_state(np.eye(2)[y], probs)
    assert results["auc"] == pytest.approx(float(auc.result()), abs=1e-6)
    assert results["categorical_accuracy"] == pytest.approx(np.mean(probs.argmax(-1) == y))
    assert results["loss"] == pytest.approx(float(np.mean(
        keras.losses.categorical_crossentropy(np.eye(2)[y], probs))), rel=1e-5)


def test_evaluate_on_another_dataset_is_not_the_validation_set(dataset, build, xy):
    x, y = xy
    half = tf.data.Dataset.from_tensor_slices((x[:10], y[:10]))
    t = make(dataset, build, batch_size=16, validation_dataset=dataset)
    whole = dict(t.validation_metrics)
    part = t.evaluate(half)
    assert part["acc"] != whole["acc"] or part["loss"] != whole["loss"]
    assert dict(t.validation_metrics) == whole  # the validation pipeline is still its own


def test_predict_keeps_the_dataset_order_and_accepts_x_only(dataset, build, xy):
    x, _ = xy
    t = make(dataset, build, batch_size=16, max_iteration=3)
    t.train_to_end()
    expected = t.training_network(x, training=False).numpy()
    np.testing.assert_allclose(t.predict(dataset, batch_size=5), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.predict(tf.data.Dataset.from_tensor_slices(x)), expected,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="dataset must be a tf.data.Dataset"):
        t.predict(x)


def test_interleave_restores_order_from_uneven_shards():
    rows = np.arange(7)[:, None]
    parts = [rows[r::3] for r in range(3)]
    np.testing.assert_array_equal(_interleave(parts), rows)
    nested = _interleave([{"a": rows[0::2]}, {"a": rows[1::2]}])
    np.testing.assert_array_equal(nested["a"], rows)
    one = _interleave([rows[:1], None])  # a worker with no element
    np.testing.assert_array_equal(one, rows[:1])
    with pytest.raises(ValueError, match="empty dataset"):
        _interleave([None, None])


def test_save_and_export_load_without_hvdtrain(dataset, build, xy, tmp_path):
    x, _ = xy
    t = make(dataset, build, batch_size=16, max_iteration=3)
    t.train_to_end()
    t.save(str(tmp_path / "sub" / "net.keras"))
    t.export(str(tmp_path / "served"))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", t.training_network(x, training=False).numpy())
    script = (
        "import numpy as np, keras, tensorflow as tf, sys, json\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r}); e = np.load({str(tmp_path / 'expected.npy')!r})\n"
        f"net = keras.models.load_model({str(tmp_path / 'sub' / 'net.keras')!r})\n"
        f"served = tf.saved_model.load({str(tmp_path / 'served')!r})\n"
        "print(json.dumps([float(np.abs(net(x) - e).max()), float(np.abs(served.serve(x) - e).max()),"
        " 'hvdtrain' in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    keras_diff, served_diff, imported = json.loads(proc.stdout.splitlines()[-1])
    assert keras_diff < 1e-5 and served_diff < 1e-5 and not imported
    with pytest.raises(ValueError, match=r"writes a \.keras file; got '.*net\.h5'"):
        t.save(str(tmp_path / "net.h5"))


def test_a_failed_save_raises_on_every_worker_with_the_chiefs_error(dataset, build, tmp_path):
    t = make(dataset, build, batch_size=16, max_iteration=1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match=r"saving .* failed on the chief \(rank 0\)"):
        t.save(str(blocker / "net.keras"))


def test_keras_callbacks_stop_schedule_and_see_the_network(one_hot):
    network = one_hot_model()
    seen = []
    callbacks = [
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.5 / (epoch + 1)),
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=1),
        keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: seen.append((epoch, logs["loss"])),
            on_train_begin=lambda logs: seen.append(network.optimizer is not None)),
    ]
    t = Trainer(one_hot, model=network, loss="categorical_crossentropy", optimizer="sgd",
                optimizer_args={"learning_rate": 0.1}, batch_size=16, num_epochs=5,
                callbacks=callbacks)
    history = t.train_to_end()
    assert seen[0] is True  # model.optimizer is the Trainer's while training
    assert history.epoch == [0, 1] and t.global_step == 2 * t.steps_per_epoch
    assert history.history["learning_rate"] == pytest.approx([0.5, 0.25])
    assert [loss for _, loss in seen[1:]] == history.history["loss"]


def test_terminate_on_nan_stops_training(dataset):
    def build(x, y):
        net = keras.Sequential([keras.layers.Dense(1)])
        return net, keras.ops.mean(net(x)) * np.float32("inf"), {}
    t = Trainer(dataset, build, "sgd", {"learning_rate": 0.1}, batch_size=16, num_epochs=3,
                nan_policy="skip", callbacks=[keras.callbacks.TerminateOnNaN()])
    t.train_to_end()
    assert t.global_step == 1 and t.skipped_steps == 1


def test_history_counts_a_partial_last_epoch(dataset, build):
    t = make(dataset, build, batch_size=16, num_epochs=3, max_iteration=8)  # 6 steps per epoch
    history = t.train_to_end()
    assert history.epoch == [0, 1] and len(history.history["loss"]) == 2


def test_metrics_in_training_logs_at_logging_steps(dataset, build):
    logged = []

    class Record(hvdtrain.Callback):
        def on_train_batch_end(self, step, logs=None):
            logged.append(sorted(logs))

    t = Trainer(dataset, build, "sgd", {"learning_rate": 0.1}, batch_size=16, max_iteration=4,
                log_step_size=2, callbacks=[Record()],
                metrics=[keras.metrics.SparseCategoricalAccuracy(name="sca")])
    t.train_to_end()
    assert "sca" in logged[1] and "sca" not in logged[0]


def test_metric_set_results_sum_the_states_of_every_worker():
    metrics = MetricSet([keras.metrics.MeanSquaredError(name="m")])
    metrics.update(tf.zeros((2, 1)), tf.constant([[1.0], [3.0]]))  # total 10, count 2
    other = [[np.array(30.0, "float32"), np.array(2.0, "float32")]]  # another worker's
    assert metrics.results(lambda mine: [mine, other]) == {"m": pytest.approx(40 / 4)}
    assert metrics.results(lambda mine: [mine]) == {"m": pytest.approx(5.0)}  # own state kept


@pytest.mark.parametrize("metrics,error,match", [
    (["auc"], TypeError, "must be keras.metrics.Metric instances"),
    ([keras.metrics.AUC(name="a"), keras.metrics.Precision(name="a")], ValueError, "used twice"),
    ([keras.metrics.Mean(name="loss")], ValueError, "used twice \\(or is 'loss'\\)"),
])
def test_bad_metrics(dataset, build, metrics, error, match):
    with pytest.raises(error, match=match):
        make(dataset, build, metrics=metrics)


def test_metrics_need_the_networks_output(dataset):
    def build(x, y):
        scorer = keras.layers.Dense(1)  # the loss does not come from the network returned
        return keras.Sequential([keras.layers.Dense(2)]), keras.ops.mean(scorer(x)), {}
    with pytest.raises(ValueError, match="metrics=... needs the network's output"):
        make(dataset, build, metrics=[keras.metrics.Mean()])


def test_backup_and_restore_next_to_another_checkpoint_dir_is_refused(dataset, build, tmp_path):
    with pytest.raises(ValueError, match="disagree: give one folder"):
        make(dataset, build, checkpoint_dir=str(tmp_path / "a"),
             callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "b"))])


def test_mirrored_model_built_outside_the_scope_is_refused_with_the_fix():
    script = (
        "import numpy as np, keras, tensorflow as tf, hvdtrain\n"
        "hvdtrain.get_strategy('mirrored')\n"
        "net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])\n"
        "ds = tf.data.Dataset.from_tensor_slices((np.ones((8, 3), 'float32'), np.ones((8, 1), 'float32')))\n"
        "hvdtrain.Trainer(ds, model=net, loss='mse', optimizer='sgd', batch_size=4,\n"
        "                 optimizer_args={'learning_rate': 0.1}, strategy='mirrored')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode != 0
    assert ("ValueError: model= was built outside the mirrored strategy's scope (2 variables, "
            "e.g. 'sequential/dense/kernel')") in proc.stderr
    assert "with hvdtrain.get_strategy('mirrored').scope():" in proc.stderr


def test_monitoring_a_metric_in_auto_mode_knows_its_direction(one_hot):
    stop = keras.callbacks.EarlyStopping(monitor="auc", min_delta=10, patience=0)
    t = Trainer(one_hot, model=one_hot_model(), loss="categorical_crossentropy", optimizer="sgd",
                optimizer_args={"learning_rate": 0.1}, batch_size=16, num_epochs=4,
                metrics=[keras.metrics.AUC(name="auc")], callbacks=[stop])
    assert stop.mode == "max"  # Keras alone raises: the network has no compiled metrics
    assert t.train_to_end().epoch == [0, 1]
