"""Sharded optimizer state in checkpoints of the unsharded format (one process; the
two-rank runs are in tests/parallel/test_trainer_parallel.py's resume job)."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.checkpoint import Checkpointer
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import optimizer as distributed
from sharded_runs import sharded_on_one_rank, small_run  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("sharded_on_one_rank")


def _trained(shard: bool, steps: int, directory=None, restore=False):
    """:func:`sharded_runs.small_run` with Adam, sharded or not, after an optional
    restore from ``directory``; saved there at the end."""
    savers = []

    def before(model, opt):
        if directory:
            savers.append(Checkpointer(str(directory), collectives=dist, model=model,
                                       optimizer=opt,
                                       state=distributed.exchanger_of(opt).strategy))
        if restore:
            assert savers[0].restore_latest() is not None

    model, opt = small_run(lambda: keras.optimizers.Adam(0.01), shard, steps, before=before)
    if savers:
        savers[0].save(int(opt.iterations.numpy()))
    return model, opt


@pytest.mark.parametrize("first, second", [(True, True), (True, False), (False, True)])
def test_a_resumed_run_equals_the_uninterrupted_one_across_formats(tmp_path, first, second):
    """Sharded to sharded, sharded to unsharded, unsharded to sharded: the checkpoint is in
    one format, so each resumes to the uninterrupted run's weights and moments."""
    full_model, full_opt = _trained(False, 12)
    _trained(first, 7, tmp_path)
    model, opt = _trained(second, 5, tmp_path, restore=True)
    assert int(opt.iterations.numpy()) == 12
    for a, b in zip(model.get_weights(), full_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_checkpoint_holds_one_full_slot_per_variable_and_kind(tmp_path):
    model, opt = _trained(True, 3, tmp_path)
    names = dict(tf.train.list_variables(str(tmp_path / "ckpt-00000003" / "state")))
    slots = sorted(tuple(s) for n, s in names.items() if n.startswith("optimizer/_variables/")
                   and s)
    shapes = sorted(tuple(v.shape) for v in model.trainable_variables)
    assert slots == sorted(shapes * 2)  # Adam: a momentum and a velocity, full size
    assert "hvd_shard" not in " ".join(names)


def test_an_optimizer_with_a_slot_not_per_variable_is_refused_with_its_name(tmp_path):
    from hvdtrain.horovod import sharded_state
    model, opt = _trained(True, 1)
    strategy = distributed.exchanger_of(opt).strategy
    with pytest.raises(ValueError, match="Adam does not make one 'extra' slot per variable"):
        sharded_state.full_view(opt, strategy.variables, ["extra"])


def test_elastic_training_refuses_a_sharded_optimizer_by_name():
    from hvdtrain.horovod import elastic
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)

    def build(x, y):
        net = keras.Sequential([keras.layers.Dense(1)])
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}

    trainer = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, x[:, :1])), build,
                               keras.optimizers.Adam, {"learning_rate": 0.01}, batch_size=8,
                               num_epochs=1, shard_optimizer=True, log_step_size=10**6)
    with pytest.raises(ValueError, match="shard_optimizer=True does not work with elastic"):
        elastic.TrainerState(trainer)
