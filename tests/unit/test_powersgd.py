"""PowerSGD's exchange (one process): its algebra against a NumPy reference, full rank
against the uncompressed exchange, the start phase, and the settings' checks."""
import numpy as np
import pytest
import tensorflow as tf
import keras

from hvdtrain import options
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import compression, powersgd
from hvdtrain.horovod.exchange import Exchanger, Rider
from hvdtrain.horovod.exchange_settings import ExchangeSettings


@pytest.fixture(scope="module", autouse=True)
def horovod():
    dist.init()


def _orthogonalize(p, eps=1e-8):
    p = p.copy()
    for k in range(p.shape[1]):
        p[:, k] /= np.linalg.norm(p[:, k]) + eps
        for j in range(k + 1, p.shape[1]):
            p[:, j] -= (p[:, k] @ p[:, j]) * p[:, k]
    return p


def _exchanger(variables, **kwargs):
    exchanger = Exchanger(ExchangeSettings(compression=compression.PowerSGD(**kwargs)))
    exchanger.build(variables)
    return exchanger


def test_orthogonalize_matches_gram_schmidt_and_gives_orthonormal_columns():
    p = np.random.default_rng(0).normal(size=(9, 3)).astype(np.float32)
    got = powersgd.orthogonalize(tf.constant(p)).numpy()
    np.testing.assert_allclose(got, _orthogonalize(p), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.T @ got, np.eye(3), atol=1e-5)


def test_two_steps_follow_the_numpy_reference_p_q_and_error_feedback():
    rng = np.random.default_rng(1)
    kernel = keras.Variable(np.zeros((3, 4, 6), np.float32))  # seen as 12 x 6
    bias = keras.Variable(np.zeros(6, np.float32))
    exchanger = _exchanger([kernel, bias], rank=2, min_compression=0)
    [mat] = exchanger.strategy._of.values()
    q = mat.q.numpy().copy()
    error = np.zeros((12, 6), np.float32)
    for _ in range(2):
        g = rng.normal(size=(3, 4, 6)).astype(np.float32)
        b = rng.normal(size=6).astype(np.float32)
        (out_g, out_b), _ = exchanger.reduce([tf.constant(g), tf.constant(b)], [kernel, bias])
        m = g.reshape(12, 6) + error  # one rank: the all-reduces are the identity
        p = _orthogonalize(m @ q)
        q = m.T @ p
        approx = p @ q.T
        error = m - approx
        np.testing.assert_allclose(out_g.numpy(), approx.reshape(3, 4, 6), rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(out_b.numpy(), b)  # a vector goes uncompressed
        np.testing.assert_allclose(mat.q.numpy(), q, rtol=1e-4, atol=1e-5)  # warm start
        np.testing.assert_allclose(mat.error.numpy(), error, rtol=1e-4, atol=1e-5)
    assert int(exchanger.strategy.state.steps.numpy()) == 2
    assert np.abs(error).max() > 1e-3  # rank 2 of 6 really drops something


def test_full_rank_gives_the_uncompressed_gradient_and_riders_ride():
    variables = [keras.Variable(np.zeros((8, 5), np.float32))]
    exchanger = _exchanger(variables, rank=5, min_compression=0)
    g = np.random.default_rng(2).normal(size=(8, 5)).astype(np.float32)
    (out,), sums = exchanger.reduce([tf.constant(g)], variables, [Rider(3.0)])
    np.testing.assert_allclose(out.numpy(), g, rtol=1e-4, atol=1e-5)
    assert [float(s) for s in sums] == [3.0]
    assert exchanger.carries([Rider(3.0)])


def test_the_start_phase_sends_plain_gradients_then_compresses():
    variables = [keras.Variable(np.zeros((16, 16), np.float32))]
    exchanger = _exchanger(variables, rank=1, start_step=2)
    g = tf.constant(np.random.default_rng(3).normal(size=(16, 16)).astype(np.float32))
    first = [exchanger.reduce([g], variables)[0][0].numpy() for _ in range(3)]
    np.testing.assert_array_equal(first[0], g.numpy())
    np.testing.assert_array_equal(first[1], g.numpy())
    assert np.linalg.matrix_rank(first[2], tol=1e-4) == 1


def test_small_matrices_and_vectors_go_uncompressed():
    c = compression.PowerSGD(rank=4)
    assert c.matrix_shape((784, 800)) == (784, 800, 4)
    assert c.matrix_shape((3, 3, 64, 128)) == (576, 128, 4)
    assert c.matrix_shape((800,)) is None and c.matrix_shape((4, 4)) is None
    assert c.bytes_per_step((784, 800)) == 4 * (784 + 800) * 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(compression="powersgd", compression_rank=0), "compression_rank must be a positive integer"),
    (dict(compression="fp16", compression_rank=2), "compression_rank is PowerSGD's"),
    (dict(compression="lowrank"), "compression must be one of .*'powersgd'"),
])
def test_powersgd_settings_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        options.ReductionOptions(**kwargs)


def test_the_name_and_rank_choose_the_low_rank_strategy():
    c = compression.resolve("powersgd", rank=2)
    assert isinstance(c, compression.PowerSGD) and c.rank == 2
    assert compression.resolve("PowerSGD").rank == compression.DEFAULT_RANK
    assert isinstance(Exchanger(ExchangeSettings(compression=c)).strategy, powersgd.LowRank)
    with pytest.raises(ValueError, match="powersgd rank must be a positive integer"):
        compression.PowerSGD(rank=True)


def test_a_distributed_optimizer_trains_with_powersgd_in_a_keras_fit():
    from hvdtrain.horovod import optimizer as distributed
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(4).normal(size=(256, 20)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    opt = distributed.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="powersgd",
                                           compression_rank=2)
    model.compile(opt, "binary_crossentropy")
    losses = model.fit(x, y, epochs=5, batch_size=32, verbose=0).history["loss"]
    assert isinstance(distributed.exchanger_of(opt).strategy, powersgd.LowRank)
    assert losses[-1] < 0.7 * losses[0]


def test_horovods_new_tape_every_step_keeps_one_powersgd_state_in_a_tf_function():
    """Horovod's idiom wraps a fresh tape each step: Q and the errors must live on (the
    second step's Q is the first's warm start), inside one traced step."""
    from hvdtrain.horovod import tape as tapes
    kernel = tf.Variable(np.zeros((8, 6), np.float32))
    rng = np.random.default_rng(5)
    data = [tf.constant(rng.normal(size=(8, 6)).astype(np.float32)) for _ in range(3)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(kernel * x)  # its gradient: x, of full rank
        tape = tapes.DistributedGradientTape(tape, compression=compression.PowerSGD(rank=1))
        return tape.gradient(loss, [kernel])[0]

    outs = [step(x).numpy() for x in data]
    (exchanger,) = [e for k, e in tapes._KEPT.items() if k[1] == (id(kernel),)]
    state = exchanger.strategy.state
    assert int(state.steps.numpy()) == 3  # one state for the three tapes
    assert np.linalg.matrix_rank(outs[-1], tol=1e-4) == 1  # rank 1, as asked
    assert np.abs(state.errors[0].numpy()).max() > 1e-4  # error feedback kept
    with pytest.raises(ValueError, match="compression must be one of"):
        tapes.DistributedGradientTape(tf.GradientTape(), compression="zip")


def test_a_checkpoint_holds_the_powersgd_state_and_a_resumed_exchange_continues_it(tmp_path):
    """save_objects sets the errors to the ranks' mean (one rank: themselves) and the
    Checkpointer writes them with Q and the count; a fresh exchanger restored from the
    checkpoint gives the next step the uninterrupted exchanger gives."""
    from hvdtrain.checkpoint import Checkpointer
    rng = np.random.default_rng(6)
    grads = [tf.constant(rng.normal(size=(10, 7)).astype(np.float32)) for _ in range(3)]

    def run(steps, directory, restore=False):
        kernel = keras.Variable(np.zeros((10, 7), np.float32))
        exchanger = _exchanger([kernel], rank=2, start_step=1)
        saver = Checkpointer(str(directory), collectives=dist, state=exchanger.strategy,
                             every_steps=None, every_secs=None, kernel=kernel)
        if restore:
            assert saver.restore_latest() is not None
        out = [exchanger.reduce([g], [kernel])[0][0].numpy() for g in steps]
        saver.save(len(steps))
        return out, exchanger.strategy.state

    full, _ = run(grads, tmp_path / "full")
    run(grads[:2], tmp_path / "split")
    resumed, state = run(grads[2:], tmp_path / "split", restore=True)
    assert int(state.steps.numpy()) == 3
    np.testing.assert_allclose(resumed[0], full[2], rtol=1e-5, atol=1e-6)
    # a checkpoint written without PowerSGD's state still restores the rest
    kernel = keras.Variable(np.zeros((10, 7), np.float32))
    Checkpointer(str(tmp_path / "plain"), collectives=dist, kernel=kernel).save(5)
    exchanger = _exchanger([kernel], rank=2)
    again = Checkpointer(str(tmp_path / "plain"), collectives=dist, state=exchanger.strategy,
                         kernel=kernel)
    assert again.restore_latest() is not None


@pytest.mark.parametrize("setting", ["backward_passes_per_step", "mixed_float16"])
def test_powersgd_combines_with_local_accumulation_and_mixed_precision(setting):
    from hvdtrain.horovod import optimizer as distributed
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(4).normal(size=(256, 20)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    previous = keras.mixed_precision.global_policy()
    if setting == "mixed_float16":
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid", dtype="float32")])
        opt = distributed.DistributedOptimizer(
            keras.optimizers.SGD(0.1), compression="powersgd", compression_rank=2,
            backward_passes_per_step=2 if setting == "backward_passes_per_step" else 1)
        model.compile(opt, "binary_crossentropy")
        losses = model.fit(x, y, epochs=5, batch_size=32, verbose=0).history["loss"]
    finally:
        keras.mixed_precision.set_global_policy(previous)
    state = distributed.exchanger_of(opt).strategy.state
    exchanges = int(state.steps.numpy())
    assert exchanges == (20 if setting == "backward_passes_per_step" else 40)
    assert losses[-1] < 0.8 * losses[0]
