"""The bench's extra timed workers: tf.distribute's MultiWorkerMirrored loop, the Trainer
fed from the Fashion-MNIST files, and an all-reduce probe for the cost model.

* ``mwms``: what a tf.distribute user writes by hand: ``MultiWorkerMirroredStrategy``,
  a ``strategy.run`` step with ``tf.GradientTape`` and a Keras SGD update (Keras sums the
  gradients over replicas), each worker reading its shard. Workers find each other
  through ``TF_CONFIG``; stock TensorFlow thread settings.
* ``trainer_files``: the bench's Trainer run on Fashion-MNIST streamed by ``tf.data`` from
  the IDX files (:func:`hvdtrain.datasets.idx_tf_dataset`), against ``trainer`` on the
  same shapes held in memory.
* ``probe``: ``hvd.allreduce`` timed at several sizes, the inputs of
  :func:`hvdtrain.perf_model.fit_link`.
"""
from __future__ import annotations

import time

PROBE_BYTES = (4 * 1024, 256 * 1024, 1024 * 1024, 4 * 1276810)
PROBE_REPEATS = 30


def time_mwms(x, y, *, batch_size: int, steps: int, warmup: int,
              first_step=lambda: None) -> tuple[float, float, int]:
    """Times ``steps`` MultiWorkerMirrored steps after ``warmup`` ones (``first_step`` is
    called once the first has run); returns (seconds, final loss, workers)."""
    import keras
    import tensorflow as tf

    from hvdtrain.bench import core as bench

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        model = bench._mlp()
        model.build((None, bench.INPUT_DIM))
        optimizer = keras.optimizers.SGD(learning_rate=bench.LEARNING_RATE * workers)
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
                loss = bench._mean_xent(yb, model(xb, training=True))
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


def fashion_mnist_source(size: int, batch_size: int):
    """Fashion-MNIST's training files as an unbatched ``tf.data`` dataset, trimmed so each
    of ``size`` shards holds whole batches; and the number of examples."""
    from hvdtrain import datasets

    images, labels = datasets.fashion_mnist_files()[:2]
    ds = datasets.idx_tf_dataset(images, labels)
    n = int(ds.cardinality())
    n -= n % (size * batch_size)
    return ds.take(n), n


def probe_allreduce(sizes=PROBE_BYTES, repeats: int = PROBE_REPEATS) -> list[dict]:
    """Seconds per ``hvd.allreduce`` of float32 tensors of each size in bytes (the median
    of ``repeats``), with the world size: the all-reduce probes of the cost model."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdtrain.backends.horovod import collectives as dist

    dist.init()
    probes = []
    for nbytes in sizes:
        tensor = tf.ones([nbytes // 4], tf.float32)
        reduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Average, name=f"probe{nbytes}"))
        reduce(tensor).numpy()
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            reduce(tensor).numpy()
            times.append(time.perf_counter() - start)
        slowest = [max(t) for t in zip(*dist.allgather_object(times))]
        probes.append({"np": dist.size(), "bytes": nbytes,
                       "seconds": sorted(slowest)[len(slowest) // 2]})
    return probes
