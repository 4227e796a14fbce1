"""Non-finite gradients (hvdtrain.horovod.finite) in one process: the distributed
optimizer and the tape stop, skip or ignore as ``nan_policy`` says."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.horovod import finite, optimizer as distributed, tape as tapes


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def _grads(model, bad):
    x = np.ones((4, 3), "float32")
    if bad:
        x[1, 0] = bad
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
    return tape, loss


def test_policy_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(finite.POLICY_ENV, raising=False)
    assert finite.resolve_policy(None) == "stop"
    monkeypatch.setenv(finite.POLICY_ENV, "ignore")
    assert finite.resolve_policy(None) == "ignore"
    assert finite.resolve_policy("skip") == "skip"
    monkeypatch.setenv(finite.POLICY_ENV, "off")
    with pytest.raises(ValueError, match="HVDTRAIN_NAN_POLICY must be 'stop', 'skip' or "
                                         "'ignore', got 'off'"):
        finite.resolve_policy(None)


@pytest.mark.parametrize("policy", ["stop", "skip", "ignore"])
def test_the_optimizer_applies_no_non_finite_update_unless_ignored(policy):
    model = _model()
    opt = distributed.DistributedOptimizer(keras.optimizers.SGD(0.1), nan_policy=policy)
    before = [w.copy() for w in model.get_weights()]
    tape, loss = _grads(model, np.nan)
    grads = tape.gradient(loss, model.trainable_variables)
    if policy == "stop":
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            opt.apply(grads, model.trainable_variables)
        assert finite.message_of(err.value) == (
            "hvdtrain: non-finite gradients at step 1 on rank(s) [0]; the update was not "
            "applied (nan_policy='stop'; a NaN or Inf in those ranks' batch, or a diverging "
            "model; HVDTRAIN_NAN_POLICY=skip goes on without those steps, =ignore turns the "
            "check off)")
    else:
        opt.apply(grads, model.trainable_variables)
    after = model.get_weights()
    if policy == "ignore":
        assert not np.isfinite(after[0]).all()
    else:
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b)
    tape, loss = _grads(model, 0)  # a finite step is applied as usual
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert not np.array_equal(model.get_weights()[0], after[0])


def test_the_tape_raises_on_inf_and_passes_finite_gradients(monkeypatch):
    monkeypatch.delenv(finite.POLICY_ENV, raising=False)
    model = _model()
    tape, loss = _grads(model, np.inf)
    with pytest.raises(tf.errors.InvalidArgumentError, match="hvdtrain: non-finite gradients "
                                                              r"on rank\(s\) \[0\]"):
        tapes.DistributedGradientTape(tape).gradient(
            loss, model.trainable_variables)
    tape, loss = _grads(model, np.inf)
    monkeypatch.setenv(finite.POLICY_ENV, "skip")
    grads = tapes.DistributedGradientTape(tape).gradient(
        loss, model.trainable_variables)
    assert all(not np.any(g.numpy()) for g in grads)  # zeros: nothing moves the weights
    tape, loss = _grads(model, 0)
    grads = tapes.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    assert all(np.isfinite(g.numpy()).all() and np.any(g.numpy()) for g in grads)


@pytest.mark.parametrize("make", [keras.optimizers.SGD, keras.optimizers.Adam])
def test_a_stopped_step_inside_a_tf_function_is_not_counted(make):
    # fit's step is a tf.function: Keras increments iterations after the update, and SGD's
    # update never reads the counter, so nothing but the check itself orders the two
    model = _model()
    opt = distributed.DistributedOptimizer(make(0.1), nan_policy="stop")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    x = np.ones((4, 3), "float32")
    step(x)
    bad = x.copy()
    bad[1, 0] = np.nan
    for attempt in (2, 2, 2):  # the stopped step keeps its number: it never counted
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            step(bad)
        assert f"non-finite gradients at step {attempt} on rank(s) [0]" in \
            finite.message_of(err.value)
    assert int(opt.iterations.numpy()) == 1
    step(x)
    assert int(opt.iterations.numpy()) == 2
