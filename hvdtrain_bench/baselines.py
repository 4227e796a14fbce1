"""The hand-written loops hvdtrain is measured against, with stock settings:

* ``plain``: what a Horovod user writes: ``ds.shard(size, rank).batch(B).repeat()``, a
  ``tf.function`` step with ``tf.GradientTape``, one ``hvd.grouped_allreduce`` of the
  gradients, a Keras SGD update and a broadcast of the initial weights. Like the Trainer
  it skips the collective when there is only one rank.
* ``pertensor``: the same loop as ``hvd.DistributedGradientTape`` users write it: the
  tape wrapped inside the ``tf.function`` step, one all-reduce op per gradient (Horovod's
  tensor fusion may still merge them at run time, as it does for its users).
* ``mwms``: what a tf.distribute user writes: ``MultiWorkerMirroredStrategy``, a
  ``strategy.run`` step with ``tf.GradientTape`` and a Keras SGD update (Keras sums the
  gradients over replicas), each worker reading its shard; workers find each other
  through ``TF_CONFIG``.

All use Horovod or TensorFlow directly, as their users do. Each takes ``warmup`` untimed
steps (``first_step`` is called once the first has run), then times ``steps`` steps
(:func:`hvdtrain_bench.timing.time_steps`).
"""
from __future__ import annotations

from typing import Callable

from hvdtrain_bench.mlp import mean_xent, mlp
from hvdtrain_bench.settings import DEFAULT_MODEL, INPUT_DIM, LEARNING_RATE
from hvdtrain_bench.timing import Timing, time_steps


def _grouped_step(hvd, size: int, model, optimizer) -> Callable:
    """The ``plain`` step: one grouped all-reduce of every gradient."""
    import tensorflow as tf

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
    return train_step


def _per_tensor_step(hvd, size: int, model, optimizer) -> Callable:
    """The ``pertensor`` step: ``hvd.DistributedGradientTape``, one all-reduce per
    gradient. The tape differentiates with respect to the ``tf.Variable`` behind each
    Keras variable (``v.value``): Horovod 0.28's tape keys gradients by
    ``Variable.ref()``, which Keras 3 variables lack."""
    import tensorflow as tf

    variables = model.trainable_variables
    sources = [v.value for v in variables]

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mean_xent(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, sources)
        optimizer.apply(grads, variables)
        return loss
    return train_step


def _warm_up(step: Callable[[], object], warmup: int, first_step: Callable[[], None]) -> None:
    """Runs ``warmup`` steps, calls ``first_step`` after the first, waits for the last."""
    loss = None
    for i in range(warmup):
        loss = step()
        if i == 0:
            float(loss)
            first_step()
    if loss is not None:
        float(loss)


def _repeat(step: Callable[[], object], steps: int) -> Callable[[], object]:
    """A function that runs ``step`` ``steps`` times and returns the last loss."""
    def run():
        loss = None
        for _ in range(steps):
            loss = step()
        return loss
    return run


def horovod_loop(make_step: Callable, model: str, optimizer) -> tuple:
    """The stock Horovod set-up of a loop: a fresh ``model`` MLP and ``optimizer`` built,
    both broadcast from rank 0; returns the network and the step ``make_step(hvd, size,
    network, optimizer)`` builds (:data:`STEPS`)."""
    import horovod.tensorflow as hvd

    size = hvd.size()
    net = mlp(model)
    net.build((None, INPUT_DIM))
    optimizer.build(net.trainable_variables)
    if size > 1:
        hvd.broadcast_variables([v.value for v in net.variables + optimizer.variables],
                                root_rank=0)
    return net, make_step(hvd, size, net, optimizer)


def _time_horovod_loop(make_step: Callable, x, y, *, model: str, batch_size: int, steps: int,
                       warmup: int, first_step: Callable[[], None]) -> Timing:
    """The stock Horovod loop around the step ``make_step(hvd, size, model, optimizer)``
    builds."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain.horovod import collectives as dist

    size, rank = hvd.size(), hvd.rank()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(batch_size).repeat()
    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * size)  # linear scaling
    _, train_step = horovod_loop(make_step, model, optimizer)
    batches = iter(ds)
    _warm_up(lambda: train_step(*next(batches)), warmup, first_step)
    dist.barrier()
    return time_steps(_repeat(lambda: train_step(*next(batches)), steps), float)


#: The step of each Horovod baseline, for :func:`horovod_loop`.
STEPS = {"plain": _grouped_step, "pertensor": _per_tensor_step}


def time_plain(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
               model: str = DEFAULT_MODEL,
               first_step: Callable[[], None] = lambda: None) -> Timing:
    """Times the hand-written grouped Horovod loop. ``options`` is ignored: the baseline
    is stock."""
    return _time_horovod_loop(_grouped_step, x, y, model=model, batch_size=batch_size,
                              steps=steps, warmup=warmup, first_step=first_step)


def time_pertensor(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
                   model: str = DEFAULT_MODEL,
                   first_step: Callable[[], None] = lambda: None) -> Timing:
    """Times the ``hvd.DistributedGradientTape`` loop. ``options`` is ignored: the
    baseline is stock."""
    return _time_horovod_loop(_per_tensor_step, x, y, model=model, batch_size=batch_size,
                              steps=steps, warmup=warmup, first_step=first_step)


def time_mwms(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
              model: str = DEFAULT_MODEL,
              first_step: Callable[[], None] = lambda: None) -> Timing:
    """Times the MultiWorkerMirrored loop. ``options`` is ignored: the baseline is stock."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        net = mlp(model)
        net.build((None, INPUT_DIM))
        optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE * workers)
        optimizer.build(net.trainable_variables)

    def dataset_fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shard(context.num_input_pipelines, context.input_pipeline_id) \
            .batch(batch_size).repeat()

    batches = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = mean_xent(yb, net(xb, training=True))
                scaled = loss / workers  # Keras sums the replicas' gradients
            grads = tape.gradient(scaled, net.trainable_variables)
            optimizer.apply(grads, net.trainable_variables)
            return loss
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    _warm_up(lambda: train_step(batches), warmup, first_step)
    return time_steps(_repeat(lambda: train_step(batches), steps), float)
