"""The Trainer on TensorFlow's own synchronous strategies: Mirrored and MultiWorkerMirrored.

``Trainer(..., strategy="mirrored")`` trains on every local device of one process (its
GPUs, or logical CPU devices); ``strategy="multi_worker_mirrored"`` trains on several
processes or hosts described by ``TF_CONFIG``. The user code is the Horovod Trainer's.
What differs is TensorFlow's rule for collective ops, which must be configured before
TensorFlow's runtime starts: call :func:`hvdtrain.get_strategy` first thing in the
program (before creating any dataset or tensor); the Trainer then reuses that strategy.

Every replica (device) plays the part of a Horovod rank: ``batch_size`` is per replica,
the learning rate is scaled by the number of replicas, ``max_iteration // replicas``
steps are taken, and validation metrics are means over the whole validation set.
"""
from __future__ import annotations

import logging
import os
import pickle
import socket
import tempfile

import numpy as np
import tensorflow as tf

from hvdtrain import data
from hvdtrain import program as programs
from hvdtrain.backends.base import Backend, recreated_in_scope, weighted_outputs
from hvdtrain.backends.tfdist.strategies import resolve, strategy_name, worker_index
from hvdtrain.checkpoint import SaveCadence
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")


class StrategyBackend(Backend):
    """Replicas of a ``tf.distribute`` Mirrored or MultiWorkerMirrored strategy.

    Checkpoints are written by the chief (worker 0); the other workers write to a
    throwaway folder, as TensorFlow requires every worker to save.
    """

    unit = "replicas"

    def __init__(self, options) -> None:
        self.strategy = resolve(options.strategy)
        self.name = strategy_name(self.strategy)
        self.size = self.strategy.num_replicas_in_sync
        self.rank, self.num_workers = worker_index(self.strategy)
        self._local_replicas = max(1, self.size // self.num_workers)

    # ------------------------------------------------------------------ collectives
    def agree_any(self, flag: bool) -> bool:
        if self.num_workers == 1:
            return bool(flag)
        value = self.strategy.run(lambda: tf.constant(float(bool(flag))))
        return bool(self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) > 0)

    def allgather_object(self, obj) -> list:
        """Every worker's picklable ``obj``: its bytes travel in two summed vectors (the
        lengths, then the payloads), each worker filling its own slot."""
        if self.num_workers == 1:
            return [obj]
        payload = np.frombuffer(pickle.dumps(obj), np.uint8)
        n, me = self.num_workers, self.rank
        lengths = np.zeros(n, np.float32)
        lengths[me] = len(payload)
        lengths = self._sum_per_worker(lengths).astype(np.int64)
        table = np.zeros((n, int(lengths.max())), np.float32)
        table[me, :len(payload)] = payload
        table = self._sum_per_worker(table.ravel()).reshape(table.shape)
        return [pickle.loads(table[k, :lengths[k]].round().astype(np.uint8).tobytes())
                for k in range(n)]

    def _sum_per_worker(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` summed over workers (each worker's replicas give it once)."""
        value = self.strategy.run(lambda: tf.constant(vector))
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy()
        return total / self._local_replicas

    # ------------------------------------------------------------------ building
    def scope(self):
        return self.strategy.scope()

    def build_program(self, build_training_func, model, loss, element_spec) -> tuple:
        network, program = super().build_program(build_training_func, model, loss, element_spec)
        outside = [v.path for v in network.variables
                   if not self.strategy.extended.variable_created_in_scope(v.value)]
        if outside:
            raise ValueError(f"model= was built outside the {self.name} strategy's scope "
                             f"({len(outside)} variables, e.g. {outside[0]!r}), so its replicas "
                             "cannot share them: build it under `with hvdtrain.get_strategy("
                             f"{self.name!r}).scope():`, or pass a build function")
        return network, program

    def adopt_optimizer(self, optimizer, given_instance: bool):
        return recreated_in_scope(optimizer) if given_instance else optimizer

    # ------------------------------------------------------------------ data
    def setup_data(self, dataset, options) -> int:
        """Steps every worker can take in one pass: its smallest shard over its replicas'
        batches. Needs a dataset of known, finite length."""
        n = data.known_steps(dataset)
        if n is None or n < 0:
            raise ValueError(f"strategy={self.name!r} needs a training_dataset of known, "
                             "finite length (no filter(), no repeat()); use the Horovod backend "
                             "for data of unknown length")
        smallest_shard = n // self.num_workers  # shard w has ceil((n - w) / workers) >= this
        steps = smallest_shard // (options.batch_size * self._local_replicas)
        if steps == 0:
            raise ValueError(f"training_dataset has {n} examples: too few for one step of "
                             f"{options.batch_size} per replica on {self.size} replicas")
        self._dataset, self._data, self._steps_per_epoch = dataset, options, steps
        return steps

    def _distribute(self, dataset, *, training: bool, epoch: int = 0, skip: int = 0,
                    num_epochs: int = 1):
        """Every worker's pipeline (:mod:`hvdtrain.data`), batched per replica: for
        training its shuffled shard, the same number of steps per epoch on every worker,
        from ``skip`` steps into ``epoch`` (:func:`hvdtrain.data.resume`); else one pass."""
        o, local = self._data, self._local_replicas

        def dataset_fn(context: tf.distribute.InputContext):
            ds = data.shard_and_batch(
                dataset, num_shards=context.num_input_pipelines,
                index=context.input_pipeline_id, batch_size=o.batch_size, prefetch_size=0,
                shuffle_buffer_size=o.shuffle_buffer_size if training else None, seed=o.seed,
                drop_remainder=training)
            if training:
                ds = data.resume(ds, steps_per_epoch=self._steps_per_epoch, epoch=epoch,
                                 skip=skip, num_epochs=num_epochs, batches_per_step=local,
                                 shuffled=bool(o.shuffle_buffer_size))
            return data.prefetch(ds, o.prefetch_size)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def open_iterator(self, epoch: int, skip: int, num_epochs: int):
        """One iterator over the remaining epochs (see :func:`hvdtrain.data.resume`)."""
        return iter(self._distribute(self._dataset, training=True, epoch=epoch, skip=skip,
                                     num_epochs=num_epochs))

    # ------------------------------------------------------------------ steps
    def make_train_step(self, program, optimizer, step):
        trainable, replicas, strategy = program.trainable_variables, float(self.size), self.strategy

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                outs = program([x, y], training=True)
                scaled = programs.total_loss(program, outs) / replicas  # summed over replicas
            optimizer.apply(tape.gradient(scaled, trainable), trainable)
            return {k: tf.cast(v, tf.float32) for k, v in outs.items()}

        @tf.function
        def train_step(batch):
            per_replica = strategy.run(replica_step, args=batch)
            step.assign_add(1)
            return {k: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None)
                    for k, v in per_replica.items()}

        def run(batch, global_step: int) -> dict:
            try:
                return train_step(batch)
            except tf.errors.OpError as err:
                self._name_lost_workers(err, global_step)
                raise

        return run

    def _name_lost_workers(self, err: tf.errors.OpError, global_step: int) -> None:
        """Turns a failed collective into an error that names the workers that no longer
        answer (TensorFlow's own message often says only "Connection reset by peer")."""
        if self.num_workers == 1:
            return
        lost = [f"worker {i} at {address}" for i, address in enumerate(self._worker_addresses())
                if i != self.rank and not _answers(address)]
        if lost:
            raise RuntimeError(f"step {global_step} failed on worker {self.rank}: "
                               f"{', '.join(lost)} no longer answer(s) (failed or exited: its own "
                               f"output names the cause); TensorFlow said: "
                               f"{str(err).strip().splitlines()[0]}") from err

    def _worker_addresses(self) -> list[str]:
        """Every worker's ``host:port`` in worker-index order (the chief first)."""
        spec = self.strategy.cluster_resolver.cluster_spec().as_dict()
        return list(spec.get("chief", [])) + list(spec.get("worker", []))

    def evaluation_batches(self, dataset, batch_size):
        """Each worker's shard, batched per replica (``batch_size`` is the Trainer's)."""
        return self._distribute(dataset, training=False)

    def evaluation_step(self, program):
        strategy = self.strategy

        def evaluate(batch):
            weighted, n = strategy.run(lambda x, y: weighted_outputs(program, x, y), args=batch)
            total = lambda v: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)  # noqa: E731
            return {k: total(v) for k, v in weighted.items()}, total(n)

        return evaluate

    def evaluation_totals(self, sums):
        """The step's reduce summed over every replica already."""
        return sums

    # ------------------------------------------------------------------ state
    def checkpointer(self, options, **objects) -> "ChiefCheckpoints":
        # Keras's seed generators (dropout and the like) are no trackables of the model:
        # saved beside it, a resumed run draws the masks an uninterrupted one would.
        rng = keras_private.seed_generator_states(objects["model"])
        return ChiefCheckpoints(self, options, tf.train.Checkpoint(**objects, rng=rng))


def _answers(address: str, timeout: float = 2.0) -> bool:
    """True when something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class ChiefCheckpoints:
    """TensorFlow's checkpoints under a strategy: every worker saves (the collective
    variables need it), only the chief's folder is kept."""

    restored_manifest = None

    def __init__(self, backend: StrategyBackend, options, checkpoint: tf.train.Checkpoint) -> None:
        self._backend, self._options, self._checkpoint = backend, options, checkpoint
        self._manager = None
        self._cadence = SaveCadence(options.every_steps, options.every_secs)
        if options.directory is not None:
            directory = options.directory
            if backend.rank != 0:  # TensorFlow's rule: every worker saves, the chief keeps it
                directory = tempfile.mkdtemp(prefix=f"hvdtrain-worker{backend.rank}-ckpt-")
            self._manager = tf.train.CheckpointManager(checkpoint, directory,
                                                       max_to_keep=options.keep_max,
                                                       checkpoint_name="ckpt")

    def restore_latest(self) -> str | None:
        """Restores the chief's newest checkpoint on every worker; returns its path."""
        if self._manager is None:
            return None
        latest = tf.train.latest_checkpoint(self._options.directory)
        if latest:
            self._checkpoint.restore(latest)
        return latest

    def maybe_save(self, step: int, meta=None, taken: int = 1) -> None:
        """Saves every ``every_steps`` steps, or once ``every_secs`` passed (agreed across
        workers every ``checkpoint.SECS_CHECK_STEPS`` steps)."""
        if self._manager is None:
            return
        if self._cadence.agreed_due(step, self._backend.agree_any, taken):
            self._save(step)

    def save(self, step: int, **meta) -> None:
        """The final save (skipped when this step is already saved)."""
        if self._manager is not None and self._manager.latest_checkpoint != os.path.join(
                self._manager.directory, f"ckpt-{step}"):
            self._save(step)

    def _save(self, step: int) -> None:
        path = self._manager.save(checkpoint_number=step)
        self._cadence.saved()
        if self._backend.rank == 0:
            logger.info("saved %s", path)

    def close(self) -> None:
        """Removes a non-chief worker's throwaway folder."""
        if self._backend.rank != 0 and self._manager is not None:
            tf.io.gfile.rmtree(self._manager.directory)
