"""hvdtrain.keras callbacks inside a real Keras 3 model.fit (one process)."""
import keras
import numpy as np
import pytest

import hvdtrain.keras as hvk


@pytest.fixture
def model_and_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.4)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model, x, y


def test_schedule_broadcast_average_and_checkpoint(model_and_data, tmp_path):
    model, x, y = model_and_data
    path = str(tmp_path / "model-{epoch}.keras")
    bcast = hvk.BroadcastGlobalVariablesCallback(0)
    hist = model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[
        bcast, hvk.MetricAverageCallback(),
        hvk.LearningRateScheduleCallback(0.4, lambda epoch: 0.5 ** epoch),
        hvk.ModelCheckpoint(path)])
    assert bcast.broadcast_done
    assert hist.history["learning_rate"] == pytest.approx([0.4, 0.2, 0.1])
    assert set(hist.history) >= {"loss", "accuracy"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"model-{e}.keras" for e in (1, 2, 3)]


def test_warmup_reaches_the_target_rate(model_and_data):
    model, x, y = model_and_data
    hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                     callbacks=[hvk.LearningRateWarmupCallback(0.4, warmup_epochs=1)])
    # one worker: the ramp starts and ends at the target rate
    assert hist.history["learning_rate"] == pytest.approx([0.4, 0.4])


def test_bad_callback_arguments():
    with pytest.raises(ValueError, match="warmup_epochs"):
        hvk.LearningRateWarmupCallback(0.1, warmup_epochs=0)
    with pytest.raises(ValueError, match="initial_lr"):
        hvk.LearningRateScheduleCallback(-1.0, 0.5)
