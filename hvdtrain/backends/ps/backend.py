"""Parameter-server training: ``Trainer(..., strategy="parameter_server")`` on TF2.

Built on ``tf.distribute.experimental.ParameterServerStrategy`` and a ``ClusterCoordinator``
over real ``tf.distribute.Server`` processes (see :mod:`hvdtrain.backends.ps.cluster` for
how a TensorLayer cluster maps onto TF2). The same user script runs on every task: on
``ps`` tasks and workers, :class:`~hvdtrain.backends.ps.session.DistributedSession` (and so
the Trainer) starts the task's server and blocks serving; on the master it connects to the
cluster, and the steps it schedules run asynchronously on the workers against variables
that live on the parameter servers.

Every worker reads its own shard of ``training_dataset`` (sharded by TF2 worker index,
which is TensorLayer's ``shard_index``), shuffled, batched and repeated. One global step
(``train_on_batch()``) schedules ``size`` steps of ``batch_size`` examples, one per worker
on average; each worker applies its gradients as soon as it has them (asynchronous SGD),
so each worker runs ``max_iteration // size`` steps (TensorLayer's meaning). Logging,
validation and checkpoints happen on the master.
"""
from __future__ import annotations

import itertools
import logging
import math

import tensorflow as tf

from hvdtrain import data
from hvdtrain import program as programs
from hvdtrain.backends.base import Backend, recreated_in_scope
from hvdtrain.backends.ps.session import DistributedSession
from hvdtrain.internals import keras_private, tensorflow_private
from hvdtrain.reporting import setup_logging

logger = logging.getLogger("hvdtrain")


class RemoteScalar:
    """One entry of a step's logs; ``fetch()`` (or ``float()``) waits for that step."""

    def __init__(self, remote, key: str) -> None:
        self._remote, self._key = remote, key

    def fetch(self) -> float:
        """Waits for the step and returns the value."""
        return float(self._remote.fetch()[self._key])

    def __float__(self) -> float:
        return self.fetch()

    def __repr__(self) -> str:
        return f"<remote {self._key}>"


class ParameterServerBackend(Backend):
    """Asynchronous training on workers against variables on parameter servers.

    Constructing it on a ``ps`` or worker task serves forever; on the master it connects
    to the cluster (``options.cluster``: task spec and connect timeout).
    """

    name = "parameter_server"
    unit = "workers"
    single_decider = True  # only the master runs the loop
    local_steps = False  # the steps run on remote workers: metrics in evaluation only

    def __init__(self, options) -> None:
        # Every task logs like a chief: ps and worker tasks say that they serve. Set up
        # before the servers start (TensorFlow adds its own root handler then).
        setup_logging(0)
        given = options.strategy
        c = options.checkpoint
        self.session = DistributedSession(
            options.cluster.task_spec, c.directory, save_checkpoint_secs=c.every_secs,
            save_checkpoint_steps=c.every_steps, keep_checkpoint_max=c.keep_max,
            strategy=None if isinstance(given, str) else given,
            connect_timeout=options.cluster.connect_timeout)
        self.session.start()  # serves forever on ps and worker tasks
        self.strategy = self.session.strategy
        self.rank, self.size = 0, self.session.num_workers
        self.num_workers = self.size
        self.step_units = self.size  # the step counter counts worker steps

    def agree_any(self, flag: bool) -> bool:
        return bool(flag) or self.session.stop_requested

    def session_for(self, trainer) -> DistributedSession:
        """``trainer.session`` is the master's session; its ``should_stop()`` is the
        Trainer's."""
        self.session.stop_condition = trainer.should_stop
        return self.session

    # ------------------------------------------------------------------ building
    def scope(self):
        return self.session.scope()

    def adopt_optimizer(self, optimizer, given_instance: bool):
        """An optimizer whose variables live on the parameter servers: an instance made
        outside the scope is re-created from its config inside it."""
        if given_instance:
            if optimizer.built:
                raise ValueError("optimizer is an instance that is already built (it has slot "
                                 "variables off the parameter servers); pass an unbuilt "
                                 "instance, or a class with optimizer_args")
            return recreated_in_scope(optimizer)
        return optimizer

    def after_build(self, program, optimizer) -> None:
        keras_private.make_iterations_atomic(optimizer)
        off = [v.path for v in list(program.variables) + list(optimizer.variables)
               if "/job:ps" not in v.value.device]
        if off:
            raise ValueError(f"{len(off)} variable(s) are not on the parameter servers (e.g. "
                             f"{off[0]!r}): create the model inside the trainer (pass an unbuilt "
                             "model or a build function), not before it")

    # ------------------------------------------------------------------ data
    def setup_data(self, dataset, options) -> int:
        n = data.known_steps(dataset)  # unbatched: examples
        steps = -1  # unknown or infinite: workers repeat their shard, max_iteration ends it
        if n is not None and n >= 0:
            per_worker = n // self.size  # the smallest shard
            if per_worker == 0:
                raise ValueError(f"training_dataset has {n} examples: it needs at least "
                                 f"{self.size} for {self.size} workers")
            steps = math.ceil(per_worker / options.batch_size)
        elif not math.isfinite(options.steps_per_worker(self.size)):
            raise ValueError("training_dataset has an unknown or infinite length: set "
                             "max_iteration (workers repeat their shard and cannot signal its end)")
        prefetch = options.batch_size if options.prefetch_size is None else options.prefetch_size
        self._iterator = iter(self.session.coordinator.create_per_worker_dataset(
            self._per_worker_dataset_fn(dataset, options, prefetch)))
        return steps

    def _per_worker_dataset_fn(self, dataset, options, prefetch: int):
        """The dataset each worker builds: the user's pipeline (serialized once here),
        its shard by worker index (:func:`hvdtrain.data.shard_and_batch`), repeated."""
        graph = tensorflow_private.dataset_to_graph(dataset)
        spec, size = dataset.element_spec, self.size

        def dataset_fn(_context):
            ds = data.shard_and_batch(
                tensorflow_private.dataset_from_graph(graph, spec), num_shards=size,
                index=tf.distribute.coordinator.experimental_get_current_worker_index(),
                batch_size=options.batch_size, prefetch_size=0,
                shuffle_buffer_size=options.shuffle_buffer_size, seed=options.seed)
            return data.prefetch(ds.repeat(), prefetch)

        return tf.function(lambda: self.strategy.distribute_datasets_from_function(dataset_fn))

    def open_iterator(self, epoch: int, skip: int, num_epochs: int):
        """Every "batch" is the per-worker iterator: each scheduled step takes its own."""
        return itertools.repeat(self._iterator)

    # ------------------------------------------------------------------ steps
    def make_train_step(self, program, optimizer, step):
        trainable, strategy = program.trainable_variables, self.strategy
        self._step_variable = step
        order = list(program.output_keys)  # replaced by the step's own order when traced

        def worker_step(x, y):
            with tf.GradientTape() as tape:
                outs = program([x, y], training=True)
                loss = programs.total_loss(program, outs)
            optimizer.apply(tape.gradient(loss, trainable), trainable)
            step.assign_add(1)
            order[:] = list(outs)
            return {k: tf.cast(v, tf.float32) for k, v in outs.items()}

        scheduled = tf.function(lambda iterator: strategy.run(worker_step, args=next(iterator)))

        def run(iterator, global_step: int) -> dict:
            """Schedules one round (``size`` worker steps); returns the logs of its last."""
            for _ in range(self.size):
                last = self.session.schedule(scheduled, args=(iterator,))
            self.session.step = global_step
            return {k: RemoteScalar(last, k) for k in order}

        return run

    def join(self) -> None:
        self.session.join()

    def evaluation_shard(self) -> tuple[int, int]:
        return 1, 0  # the master evaluates everything itself

    def evaluate(self, program, dataset, batch_size):
        """On the master, after the scheduled steps are done, with the variables read
        from the parameter servers."""
        self.session.join()
        return super().evaluate(program, dataset, batch_size)

    def evaluation_batches(self, dataset, batch_size):
        return super().evaluation_batches(dataset, max(batch_size, 256))

    # ------------------------------------------------------------------ state
    def checkpointer(self, options, **objects) -> "SessionCheckpoints":
        return SessionCheckpoints(self.session, objects)

    def on_train_end(self, global_step: int) -> None:
        logger.info("finished at step %d (%d worker steps applied)", global_step,
                    int(self._step_variable.numpy()))


class SessionCheckpoints:
    """Checkpoints kept by the master's :class:`DistributedSession` (each save waits for
    the scheduled steps, so it is a consistent snapshot)."""

    restored_manifest = None

    def __init__(self, session: DistributedSession, objects: dict) -> None:
        self._session, self._objects = session, objects

    def restore_latest(self) -> str | None:
        o = self._objects
        return self._session.track(program=o["model"], optimizer=o["optimizer"],
                                   worker_steps=o["step"])

    def maybe_save(self, step: int, meta=None, taken: int = 1) -> None:
        self._session.maybe_save(step)

    def save(self, step: int, **meta) -> None:
        self._session.join()
        self._session.save(step)

    def close(self) -> None:
        """Nothing to release."""
