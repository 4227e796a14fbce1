"""The hand-written loops hvdtrain is measured against, with stock settings:

* ``plain``: what a Horovod user writes: ``ds.shard(size, rank).batch(B).repeat()``, a
  ``tf.function`` step with ``tf.GradientTape``, one ``hvd.grouped_allreduce`` of the
  gradients, a Keras SGD update and a broadcast of the initial weights. Like the Trainer
  it skips the collective when there is only one rank.
* ``mwms``: what a tf.distribute user writes: ``MultiWorkerMirroredStrategy``, a
  ``strategy.run`` step with ``tf.GradientTape`` and a Keras SGD update (Keras sums the
  gradients over replicas), each worker reading its shard; workers find each other
  through ``TF_CONFIG``.

Both use Horovod or TensorFlow directly, as their users do.
"""
from __future__ import annotations

import time
from typing import Callable

from hvdtrain.bench.mlp import mean_xent, mlp
from hvdtrain.bench.settings import INPUT_DIM, LEARNING_RATE


def time_plain(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
               first_step: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Times ``steps`` steps of the hand-written Horovod loop after ``warmup`` ones;
    returns (seconds, final loss). ``options`` is ignored: the baseline is stock."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain.backends.horovod import collectives as dist

    size, rank = hvd.size(), hvd.rank()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(batch_size).repeat()
    model = mlp()
    model.build((None, INPUT_DIM))
    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * size)  # linear scaling
    optimizer.build(model.trainable_variables)
    if size > 1:
        hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables],
                                root_rank=0)
    variables = model.trainable_variables

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mean_xent(yb, model(xb, training=True))
        grads = tape.gradient(loss, variables)
        if size > 1:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        optimizer.apply(grads, variables)
        return loss

    batches = iter(ds)
    loss = None
    for i in range(warmup):
        loss = train_step(*next(batches))
        if i == 0:
            float(loss)
            first_step()
    if loss is not None:
        float(loss)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(*next(batches))
    loss = float(loss)
    elapsed = time.perf_counter() - start
    return elapsed, loss


def time_mwms(x, y, *, batch_size: int, steps: int, warmup: int,
              first_step: Callable[[], None] = lambda: None) -> tuple[float, float, int]:
    """Times ``steps`` MultiWorkerMirrored steps after ``warmup`` ones; returns
    (seconds, final loss, workers)."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        model = mlp()
        model.build((None, INPUT_DIM))
        optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * workers)
        optimizer.build(model.trainable_variables)

    def dataset_fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shard(context.num_input_pipelines, context.input_pipeline_id) \
            .batch(batch_size).repeat()

    batches = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = mean_xent(yb, model(xb, training=True))
                scaled = loss / workers  # Keras sums the replicas' gradients
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    loss = None
    for i in range(warmup):
        loss = train_step(batches)
        if i == 0:
            float(loss)
            first_step()
    if loss is not None:
        float(loss)
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(batches)
    loss = float(loss)
    return time.perf_counter() - start, loss, workers
