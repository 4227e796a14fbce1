"""The one small training run that the sharded optimizer's one-process tests compare
(tests/unit/test_sharded.py, tests/unit/test_sharded_checkpoint.py)."""
from __future__ import annotations

import keras
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.horovod import optimizer as distributed


@pytest.fixture
def sharded_on_one_rank(monkeypatch):
    """The sharded update on this one process, whose collectives are identities (on one
    rank ``shard_optimizer=True`` otherwise leaves the optimizer unsharded)."""
    monkeypatch.setattr(distributed, "alone", lambda: False)


def small_run(make, shard: bool, steps: int, *, before=None, varying: bool = False,
              inf_at: int | None = None, **distributed):
    """A small two-layer model trained ``steps`` steps of a custom loop by ``make()``
    wrapped in ``DistributedOptimizer(shard_optimizer=shard, bucket_mb=1e-4 (unless given),
    **distributed)`` (so a bucket per variable), from the same seed every time.

    Args:
        before: called with ``(model, optimizer)`` once the optimizer is built, before
            the first step (a restore).
        varying: a different batch every step (else the same one).
        inf_at: the step whose loss is multiplied by Inf (its gradients not finite).

    Returns:
        ``(model, optimizer)``.
    """
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    distributed.setdefault("bucket_mb", 1e-4)
    opt = hvdtrain.DistributedOptimizer(make(), shard_optimizer=shard, **distributed)
    opt.build(model.trainable_variables)
    if before is not None:
        before(model, opt)

    @tf.function
    def step(i):
        seed = i if varying else 0
        x = tf.random.stateless_normal((16, 7), tf.stack([1, seed]))
        y = tf.random.stateless_normal((16, 3), tf.stack([3, seed]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
            if inf_at is not None:
                loss = loss * tf.where(tf.equal(i, inf_at), float("inf"), 1.0)
            if isinstance(opt, keras.optimizers.LossScaleOptimizer):
                loss = opt.scale_loss(loss)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for i in range(steps):
        step(tf.constant(i))
    return model, opt
