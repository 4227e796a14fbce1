"""The Trainer on TensorFlow's own synchronous strategies: Mirrored and MultiWorkerMirrored.

``Trainer(..., strategy="mirrored")`` trains on every local device of one process (its
GPUs, or logical CPU devices); ``strategy="multi_worker_mirrored"`` trains on several
processes or hosts described by ``TF_CONFIG``. The user code is the Horovod Trainer's:
the same build function, dataset and arguments. What differs is TensorFlow's rule for
collective ops, which must be configured before TensorFlow's runtime starts: call
:func:`get_strategy` first thing in the program (before creating any dataset or
tensor); the Trainer then reuses that strategy.

Every replica (device) plays the part of a Horovod rank: ``batch_size`` is per replica,
the learning rate is scaled by the number of replicas, ``max_iteration // replicas``
steps are taken, and validation metrics are means over the whole validation set.
"""
from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from typing import Any, Callable, Iterable

import keras
import tensorflow as tf

from hvdtrain import building, data, optim
from hvdtrain.callbacks import Callback, CallbackList, ProgressBar, TensorBoard
from hvdtrain.tfdist_setup import (HOROVOD_ONLY, NAMES, _strategies, check_horovod_only,  # noqa: F401
                                    get_strategy, resolve, worker_index)
from hvdtrain.trainer import TrainingLoop, _make_optimizer, _positive_int, setup_logging

logger = logging.getLogger("hvdtrain")
__all__ = ["StrategyTrainer", "get_strategy", "NAMES", "HOROVOD_ONLY"]
# save_checkpoint_secs is agreed across workers (a small all-reduce) every this many steps.
SECS_CHECK_STEPS = 10


class _Session:
    def __init__(self, trainer: "StrategyTrainer") -> None:
        self._trainer = trainer

    def should_stop(self) -> bool:
        """True once training has ended on every worker."""
        return self._trainer.should_stop()


class StrategyTrainer(TrainingLoop):
    """``Trainer(..., strategy="mirrored" | "multi_worker_mirrored" | a Strategy)``.

    Takes the Horovod :class:`hvdtrain.Trainer`'s arguments and members; the
    Horovod-only ones (compression, op, gradient accumulation, mixed precision, timeline,
    nan_policy, model_parallel) raise ``ValueError`` when set. Checkpoints are written by
    the chief (worker 0); the other workers write to a throwaway folder, as TensorFlow
    requires every worker to save.
    """

    def __init__(self, training_dataset: tf.data.Dataset, build_training_func: Callable | None = None,
                 optimizer: Any = None, optimizer_args: dict | None = None, batch_size: int = 32,
                 prefetch_size: int | None = None, checkpoint_dir: str | None = None,
                 scaling_learning_rate: bool = True, log_step_size: int = 1,
                 validation_dataset: tf.data.Dataset | None = None,
                 build_validation_func: Callable | None = None,
                 max_iteration: float = float("inf"), *, model: keras.Model | None = None,
                 loss: Any = None, num_epochs: int = 1, shuffle_buffer_size: int | None = None,
                 seed: int | None = None, lr_scaling: str = "linear",
                 save_checkpoint_steps: int | None = None, save_checkpoint_secs: float | None = 600,
                 keep_checkpoint_max: int = 5, callbacks: Iterable[Callback] | None = None,
                 warmup_steps: int = 0, warmup_epochs: float = 0, log_dir: str | None = None,
                 progress_bar: bool | None = None, strategy: Any = "mirrored",
                 **horovod_only) -> None:
        check_horovod_only(horovod_only)
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.log_step_size = _positive_int(log_step_size, "log_step_size")
        self.num_epochs = _positive_int(num_epochs, "num_epochs")
        _positive_int(keep_checkpoint_max, "keep_checkpoint_max")
        if save_checkpoint_steps is not None:
            _positive_int(save_checkpoint_steps, "save_checkpoint_steps")
        if prefetch_size is not None and (isinstance(prefetch_size, bool)
                                          or not isinstance(prefetch_size, int) or prefetch_size < 0):
            raise ValueError(f"prefetch_size must be None or an integer >= 0, got {prefetch_size!r}")
        if not isinstance(max_iteration, (int, float)) or isinstance(max_iteration, bool) \
                or max_iteration <= 0 or max_iteration != max_iteration:
            raise ValueError(f"max_iteration must be a positive number, got {max_iteration!r}")
        if (build_training_func is None) == (model is None):
            raise ValueError("give exactly one of build_training_func=... or model=... (with loss=...)")
        data.check_dataset(training_dataset, "training_dataset")
        if validation_dataset is not None:
            data.check_dataset(validation_dataset, "validation_dataset")
        self.strategy = resolve(strategy)
        self.size = self.strategy.num_replicas_in_sync
        self.rank, self.num_workers = worker_index(self.strategy)
        self._local_replicas = max(1, self.size // self.num_workers)
        setup_logging(self.rank)

        # --- data: this worker's shard, per-replica batches, equal steps everywhere ---
        self._prefetch = tf.data.AUTOTUNE if prefetch_size is None else prefetch_size
        self.steps_per_epoch = self._steps_per_epoch(training_dataset)
        self.max_steps = (max_iteration // self.size if math.isfinite(max_iteration)
                          else math.inf)
        if self.max_steps < 1:
            raise ValueError(f"max_iteration={max_iteration} gives no step on each of {self.size} "
                             "replicas (each replica runs max_iteration // replicas steps)")
        self._train_source = (training_dataset, shuffle_buffer_size, seed)

        # --- program, optimizer and step counter, all created under the strategy ---
        with self.strategy.scope():
            if model is not None:
                self._network = model
                self._program = building.model_program(model, loss, training_dataset.element_spec)
            else:
                self._network, self._program = building.build_training_program(
                    build_training_func, training_dataset.element_spec)
            self.optimizer = _make_optimizer(optimizer, optimizer_args)
            if isinstance(optimizer, keras.optimizers.Optimizer):  # made outside the scope
                self.optimizer = type(optimizer).from_config(optimizer.get_config())
            self._lr_rule = lr_scaling if scaling_learning_rate else "none"
            self.lr_scale = optim.lr_scale_factor(self.size, self._lr_rule)
            optim.scale_learning_rate(self.optimizer, self.lr_scale,
                                      warmup_steps=self._warmup(warmup_steps, warmup_epochs))
            self._trainable = self._program.trainable_variables
            if not self._trainable:
                raise ValueError("the network has no trainable variables")
            self.optimizer.build(self._trainable)
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._validation_dataset = validation_dataset
        self._build_validation_func = build_validation_func
        self._validation = None

        # --- checkpoints: the chief keeps them, the others write to a temp folder ---
        self._checkpoint = tf.train.Checkpoint(model=self._program, optimizer=self.optimizer,
                                               step=self._step)
        self._manager = None
        self.restored_from = None
        if checkpoint_dir is not None:
            self._manager = self._checkpoint_manager(checkpoint_dir, keep_checkpoint_max)
            latest = tf.train.latest_checkpoint(checkpoint_dir)
            if latest:
                self._checkpoint.restore(latest)
                self.restored_from = latest
        self._save_steps, self._save_secs = save_checkpoint_steps, save_checkpoint_secs
        self._last_save = time.monotonic()
        self._global_step = int(self._step.numpy())
        if self.restored_from:
            logger.info("resumed from %s at step %d", self.restored_from, self._global_step)

        callbacks = list(callbacks or [])
        if log_dir is not None:
            callbacks.append(TensorBoard(log_dir))
        if progress_bar:
            callbacks.append(ProgressBar())
        self.callbacks = CallbackList(callbacks, self)
        self.stop_training = False
        self.session = _Session(self)
        self._train_step = tf.function(self._step_fn)
        self._iterator = None
        self._stopped = self._started = False
        self._last_logs: dict = {}
        self._log_t0, self._log_step0 = time.perf_counter(), self._global_step

    # ------------------------------------------------------------------ public API
    @property
    def global_step(self) -> int:
        """Steps taken (the same on every worker)."""
        return self._global_step

    @property
    def training_network(self) -> keras.layers.Layer:
        """The network returned by the build function (or the model given)."""
        return self._network

    @property
    def epoch(self) -> int:
        """The current pass over the data (0-based)."""
        if self.steps_per_epoch:
            return min(self.num_epochs - 1, self.global_step // self.steps_per_epoch)
        return 0

    def should_stop(self) -> bool:
        """True when training has ended: on every worker at the same step."""
        if self._stopped:
            return True
        stop = self.global_step >= self.max_steps or (
            self.global_step >= self.steps_per_epoch * self.num_epochs)
        if not stop and self.callbacks.can_stop:
            stop = self._agree(self.stop_training)
        if stop:
            self._finish()
        return stop

    def train_on_batch(self) -> dict:
        """Runs one synchronous step on every replica and returns its logs (tensors).

        Raises:
            RuntimeError: training has already ended.
        """
        if self.should_stop():
            raise RuntimeError("training has ended (should_stop() is True): no batch left to train on")
        if not self._started:
            self._started = True
            self._iterator = iter(self._train_ds_for_run())
            self._log_t0, self._log_step0 = time.perf_counter(), self.global_step
            self.callbacks.call("on_train_begin", {})
        step = self.global_step
        if self.steps_per_epoch and step % self.steps_per_epoch == 0:
            self.callbacks.call("on_epoch_begin", step // self.steps_per_epoch, {})
        self.callbacks.call("on_train_batch_begin", step, {})
        logs = self._train_step(self._iterator)
        step = self._global_step = step + 1
        if step == self._log_step0 + 1:  # time from after the compiling step
            self._log_t0 = time.perf_counter()
        self._last_logs = logs
        if step % self.log_step_size == 0:
            logs = self._log(step, logs)
        self.callbacks.call("on_train_batch_end", step, logs)
        if self.steps_per_epoch and step % self.steps_per_epoch == 0:
            self.callbacks.call("on_epoch_end", step // self.steps_per_epoch - 1,
                                _floats(self._last_logs))
        self._maybe_save(step)
        return logs

    @property
    def validation_metrics(self) -> list:
        """``[(name, mean)]`` over the whole validation set, from every replica."""
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        if self._validation is None:
            spec = self._validation_dataset.element_spec
            program = (building.build_validation_program(self._build_validation_func, spec,
                                                          self._network)
                       if self._build_validation_func is not None else self._program)
            batches = self._distribute(self._validation_dataset, None, None,
                                       drop_remainder=False, take=None)
            self._validation = (program, batches, tf.function(self._eval_fn(program)))
        program, batches, evaluate = self._validation
        sums = {k: 0.0 for k in program.output_keys}
        count = 0.0
        for batch in batches:
            weighted, n = evaluate(batch)
            for k in sums:
                sums[k] += float(weighted[k])
            count += float(n)
        return [(k, sums[k] / count if count else 0.0) for k in sorted(sums)]

    # ------------------------------------------------------------------ internals
    def _steps_per_epoch(self, dataset: tf.data.Dataset) -> int:
        """Steps every worker can take in one pass: its smallest shard over its replicas'
        batches. Needs a dataset of known, finite length."""
        n = data.known_steps(dataset)
        if n is None or n < 0:
            raise ValueError(f"strategy={self._name()!r} needs a training_dataset of known, "
                             "finite length (no filter(), no repeat()); use the Horovod backend "
                             "for data of unknown length")
        smallest_shard = n // self.num_workers  # shard w has ceil((n - w) / workers) >= this
        steps = smallest_shard // (self.batch_size * self._local_replicas)
        if steps == 0:
            raise ValueError(f"training_dataset has {n} examples: too few for one step of "
                             f"{self.batch_size} per replica on {self.size} replicas")
        return steps

    def _distribute(self, dataset, shuffle_buffer_size, seed, *, drop_remainder: bool,
                    take: int | None, epochs: int = 1, skip: int = 0):
        """Every worker's pipeline: its shard, shuffled, batched per replica; with
        ``take`` the same number of steps per epoch on every worker, repeated ``epochs``
        times, less the first ``skip`` steps."""
        batch_size, prefetch, local = self.batch_size, self._prefetch, self._local_replicas

        def dataset_fn(context: tf.distribute.InputContext):
            ds = dataset.shard(context.num_input_pipelines, context.input_pipeline_id) \
                if context.num_input_pipelines > 1 else dataset
            if shuffle_buffer_size:
                ds = ds.shuffle(shuffle_buffer_size, reshuffle_each_iteration=True,
                                seed=None if seed is None else seed + context.input_pipeline_id)
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
            if take is not None:
                ds = ds.take(take * local)
            if epochs != 1:
                ds = ds.repeat(epochs)
            if skip:
                ds = ds.skip(skip * local)
            return ds.prefetch(prefetch) if prefetch else ds

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _train_ds_for_run(self):
        """The remaining epochs, from where ``global_step`` says (resume included)."""
        skip = self.global_step % self.steps_per_epoch
        epochs = self.num_epochs - self.global_step // self.steps_per_epoch
        dataset, shuffle_buffer_size, seed = self._train_source
        return self._distribute(dataset, shuffle_buffer_size, seed, drop_remainder=True,
                                take=self.steps_per_epoch, epochs=epochs, skip=skip)

    def _step_fn(self, iterator):
        replicas = float(self.size)

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                outs = self._program([x, y], training=True)
                loss = tf.cast(outs[building.LOSS_KEY], tf.float32)
                if self._program.losses:
                    loss = loss + tf.cast(tf.add_n(self._program.losses), tf.float32)
                scaled = loss / replicas  # the optimizer sums gradients over replicas
            grads = tape.gradient(scaled, self._trainable)
            self.optimizer.apply(grads, self._trainable)
            return {k: tf.cast(v, tf.float32) for k, v in outs.items()}

        per_replica = self.strategy.run(replica_step, args=next(iterator))
        self._step.assign_add(1)
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None)
                for k, v in per_replica.items()}

    def _eval_fn(self, program):
        def replica_eval(x, y):
            out = program([x, y], training=False)
            n = tf.cast(tf.shape(y)[0], tf.float32)
            return {k: tf.where(n > 0, tf.cast(v, tf.float32) * n, 0.0)
                    for k, v in out.items()}, n

        def evaluate(batch):
            weighted, n = self.strategy.run(replica_eval, args=batch)
            total = lambda v: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
            return {k: total(v) for k, v in weighted.items()}, total(n)

        return evaluate

    def _agree(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is True on any."""
        if self.num_workers == 1:
            return bool(flag)
        value = self.strategy.run(lambda: tf.constant(float(bool(flag))))
        return bool(self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) > 0)

    def _warmup(self, steps: int, epochs: float) -> int:
        if epochs:
            if not isinstance(epochs, (int, float)) or isinstance(epochs, bool) or epochs < 0:
                raise ValueError(f"warmup_epochs must be a number >= 0, got {epochs!r}")
            return max(1, int(round(epochs * self.steps_per_epoch)))
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {steps!r}")
        return steps

    def _checkpoint_manager(self, directory: str, keep: int):
        if self.rank != 0:  # TensorFlow's rule: every worker saves, only the chief keeps it
            directory = tempfile.mkdtemp(prefix=f"hvdtrain-worker{self.rank}-ckpt-")
        return tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=keep,
                                          checkpoint_name="ckpt")

    def _maybe_save(self, step: int) -> None:
        if self._manager is None:
            return
        due = bool(self._save_steps) and step % self._save_steps == 0
        if not due and self._save_secs and step % SECS_CHECK_STEPS == 0:
            due = self._agree(time.monotonic() - self._last_save >= self._save_secs)
        if due:
            self._save(step)

    def _save(self, step: int) -> None:
        path = self._manager.save(checkpoint_number=step)
        self._last_save = time.monotonic()
        if self.rank == 0:
            logger.info("saved %s", path)

    def _finish(self) -> None:
        self._stopped = True
        if self._manager is not None and self._manager.latest_checkpoint != os.path.join(
                self._manager.directory, f"ckpt-{self.global_step}"):
            self._save(self.global_step)
        if self.rank != 0 and self._manager is not None:
            tf.io.gfile.rmtree(self._manager.directory)
        if self._started:
            self.callbacks.call("on_train_end", _floats(self._last_logs))

    def _name(self) -> str:
        return next((n for n, s in _strategies.items() if s is self.strategy),
                    type(self.strategy).__name__)

    def _log(self, step: int, logs: dict) -> dict:
        now = time.perf_counter()
        record = _floats(logs)
        record["learning_rate"] = optim.current_learning_rate(self.optimizer)
        rate = ""
        timed = step - max(self._log_step0, 1)
        if timed > 0 and now > self._log_t0:
            record["samples_per_sec"] = timed * self.batch_size * self.size / (now - self._log_t0)
            rate = f" ({record['samples_per_sec']:.0f} samples/s)"
        self._log_t0, self._log_step0 = now, step
        if self.rank == 0:
            logger.info("step %d: %s%s", step,
                        " ".join(f"{k}={v:.4f}" for k, v in _floats(logs).items()), rate)
        return record

    def _log_validation(self, metrics: list) -> None:
        if self.rank == 0:
            logger.info("step %d validation: %s", self.global_step,
                        " ".join(f"{k}={v:.4f}" for k, v in metrics))
        self.callbacks.call("on_test_end", {f"val_{k}": v for k, v in metrics})
        self._log_t0 = time.perf_counter()


def _floats(logs: dict) -> dict:
    return {k: float(v) for k, v in logs.items()}
