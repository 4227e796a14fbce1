"""The timed loops of hvdtrain itself, on one rank of a bench job:

* ``trainer``: :class:`hvdtrain.Trainer` with a build function, timing the documented
  loop ``while not t.should_stop(): t.train_on_batch()`` (also on Fashion-MNIST streamed
  from its files, :func:`fashion_mnist_source`, for ``trainer_files``);
* ``fit``: Keras ``model.fit`` with :mod:`hvdtrain.keras`.

Each takes ``warmup`` untimed steps (``first_step`` is called once the first has run),
then times ``steps`` steps after a barrier, counting the steps' host reads; it returns a
:class:`~hvdtrain_bench.timing.Timing`.
"""
from __future__ import annotations

import time
from typing import Callable

from hvdtrain_bench.mlp import build_fn_for, mlp
from hvdtrain_bench.settings import DEFAULT_MODEL, INPUT_DIM, LEARNING_RATE
from hvdtrain_bench.timing import Timing, time_steps


def time_trainer(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
                 model: str = DEFAULT_MODEL, first_step: Callable[[], None] = lambda: None,
                 source=None) -> Timing:
    """Warm-up steps, then the Trainer's own loop timed to its end.

    ``source`` is an unbatched ``(dataset, examples)`` to train on instead of ``(x, y)``.
    """
    import keras
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.horovod import collectives as dist

    size = dist.size()
    dataset, examples = source or (tf.data.Dataset.from_tensor_slices((x, y)), len(x))
    steps_per_epoch = examples // (size * batch_size)
    total = warmup + steps
    trainer = hvdtrain.Trainer(dataset, build_fn_for(model),
                               keras.optimizers.SGD, {"learning_rate": LEARNING_RATE},
                               batch_size=batch_size,  # the default log_step_size
                               num_epochs=-(-total // steps_per_epoch) + 1,
                               max_iteration=total * size, progress_bar=False, **options)
    logs = None
    for i in range(warmup):
        logs = trainer.train_on_batch()
        if i == 0:
            float(logs["loss"])
            first_step()
    if logs is not None:
        float(logs["loss"])
    dist.barrier()

    def run():
        last = logs
        while not trainer.should_stop():
            last = trainer.train_on_batch()
        return last
    timing = time_steps(run, lambda last: float(last["loss"]))
    if trainer.global_step != total:
        raise RuntimeError(f"the Trainer took {trainer.global_step} steps, expected {total}")
    return timing


def time_fit(x, y, *, batch_size: int, steps: int, warmup: int, options: dict,
             model: str = DEFAULT_MODEL,
             first_step: Callable[[], None] = lambda: None) -> Timing:
    """Keras ``model.fit`` with ``hvdtrain.keras``: the steps after ``warmup`` are timed
    (from the end of the last warm-up step to the end of training)."""
    import keras
    import tensorflow as tf

    import hvdtrain.keras as hvk
    from hvdtrain.horovod import collectives as dist
    from hvdtrain.internals.tensorflow_private import count_host_reads

    size, rank = dist.size(), dist.rank()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(batch_size).repeat()
    compile_kwargs = {"jit_compile": options["jit_compile"]} if "jit_compile" in options else {}
    opt_kwargs = {k: v for k, v in options.items()  # steps_per_execution: the Trainer's only
                  if k not in ("mixed_precision", "jit_compile", "steps_per_execution")}
    policy = options.get("mixed_precision") or "float32"
    keras.mixed_precision.set_global_policy(policy)
    net = mlp(model)
    net.build((None, INPUT_DIM))
    optimizer = hvk.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE * size), **opt_kwargs)
    net.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), **compile_kwargs)
    clock = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                first_step()
            if batch == warmup - 1:
                dist.barrier()
                clock["start"], clock["reads"] = time.perf_counter(), reads.count

        def on_train_end(self, logs=None):
            clock["end"], clock["reads"] = time.perf_counter(), reads.count - clock["reads"]

    with count_host_reads() as reads:  # the callbacks read ``reads`` while fit runs
        if warmup == 0:
            clock["start"], clock["reads"] = time.perf_counter(), 0
        hist = net.fit(ds, steps_per_epoch=warmup + steps, epochs=1, verbose=0,
                       callbacks=[hvk.BroadcastGlobalVariablesCallback(0), Clock()])
    return Timing(clock["end"] - clock["start"], float(hist.history["loss"][-1]), clock["reads"])


def fashion_mnist_source(size: int, batch_size: int):
    """Fashion-MNIST's training files as an unbatched ``tf.data`` dataset, trimmed so each
    of ``size`` shards holds whole batches; and the number of examples."""
    from hvdtrain import datasets

    images, labels = datasets.fashion_mnist_files()[:2]
    ds = datasets.idx_tf_dataset(images, labels)
    n = int(ds.cardinality())
    n -= n % (size * batch_size)
    return ds.take(n), n
