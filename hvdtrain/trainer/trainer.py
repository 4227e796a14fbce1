"""The Trainer: TensorLayer's distributed ``Trainer`` contract on TensorFlow 2, one class
and one loop over a backend (Horovod, tf.distribute or parameter servers).

The user brings a build function (or a Keras model and loss) and a ``tf.data`` dataset;
the Trainer owns the rest: sharding by worker, learning-rate scaling, the start from the
chief's state, checkpoints and logging on the chief, callbacks, validation, and a loop in
which every worker takes the same number of steps. What differs per backend (how steps
run and gradients travel) lives behind :class:`hvdtrain.backends.base.Backend`.
"""
from __future__ import annotations

import logging
import math
import sys
from typing import Any, Callable, Iterable

import keras
import tensorflow as tf

from hvdtrain import callbacks as callbacks_lib, data, learning_rate, metrics as metrics_lib
from hvdtrain import checks, options, preemption
from hvdtrain.backends import create_backend
import hvdtrain.trainer.agreement as agreement
import hvdtrain.trainer.startup as startup
from hvdtrain.callbacks import Callback, CallbackList, ProgressBar, TensorBoard
from hvdtrain.trainer.epochs import EpochFeed
from hvdtrain.trainer.history import EpochRecord
from hvdtrain.reporting import StepReporter, setup_logging

logger = logging.getLogger("hvdtrain")
STRATEGIES = options.STRATEGIES
#: The step's flags (a non-finite loss, a preemption stop agreed) are read back from the
#: device every ``min(log_step_size, FLAG_READ_STEPS)`` steps: a stop within this many.
FLAG_READ_STEPS = 10


class Trainer:
    """Data-parallel training, mirroring ``tl.distributed.Trainer``.

    Composed of parts, each given what it needs: the backend (steps, collectives), the
    :class:`~hvdtrain.trainer.epochs.EpochFeed` (data and epochs), the checkpointer, the
    :class:`~hvdtrain.trainer.evaluation.Evaluation` (metrics, predict, save), the
    :class:`~hvdtrain.trainer.history.EpochRecord` (History), the reporter and the callbacks.

    ``strategy`` chooses the backend; the user code stays the same: ``"horovod"`` (the
    default), ``"mirrored"`` and ``"multi_worker_mirrored"`` (``tf.distribute``; call
    :func:`hvdtrain.get_strategy` first thing in the program), ``"parameter_server"``
    (see :mod:`hvdtrain.backends.ps`), or a ``tf.distribute.Strategy`` instance. Options a
    backend does not implement raise ``ValueError`` naming them.

    Args:
        training_dataset: a ``tf.data.Dataset`` of unbatched ``(x, y)`` pairs. It is
            sharded by worker, then batched and prefetched.
        build_training_func: ``f(x, y) -> (network, loss, log_tensors)``, called once with
            symbolic ``keras.Input`` tensors shaped like the data (see ``hvdtrain.program``).
        optimizer: a Keras optimizer class (with ``optimizer_args``), name, or instance.
        optimizer_args: keyword arguments for the class; must hold ``learning_rate``.
        batch_size: examples per step on each rank (replica).
        prefetch_size: batches to prefetch; ``None`` lets tf.data size the buffer (AUTOTUNE).
        checkpoint_dir: the chief saves here and every worker resumes from its latest
            checkpoint.
        scaling_learning_rate: multiply the learning rate by the world size (``lr_scaling``
            chooses the rule).
        log_step_size: log the loss and log tensors every this many steps (on the chief).
            Each logging step reads the step's values back from the device, which makes
            the Python loop wait for it (on a GPU, a stall per logging step): a small value
            costs speed. The steps' flags (non-finite loss, a preemption stop) are read
            every ``min(log_step_size, 10)`` steps: a stop takes effect within that many.
        validation_dataset: unbatched ``(x, y)`` pairs for ``validation_metrics``.
        build_validation_func: ``f(x, y[, network]) -> (network, metrics)``; without it,
            validation reports the training loss and log tensors in inference mode.
        max_iteration: total steps over all workers; each runs ``max_iteration // size``
            steps (TensorLayer's meaning).
        model, loss: instead of a build function, a ready Keras model and a loss.
        num_epochs: passes over the training data (each worker over its shard).
        shuffle_buffer_size, seed: shuffle each shard every pass.
        compression, op, backward_passes_per_step, sparse_as_dense, compression_ratio:
            Horovod's reduction (see :func:`hvdtrain.DistributedOptimizer`).
        lr_scaling: ``"linear"``, ``"sqrt"`` or ``"none"``.
        save_checkpoint_steps, save_checkpoint_secs, keep_checkpoint_max: when to save and
            how many checkpoints to keep.
        callbacks: :class:`hvdtrain.Callback` or ``keras.callbacks.Callback`` instances
            (see :class:`hvdtrain.callbacks.KerasCallback`); a ``BackupAndRestore``
            becomes the Trainer's checkpoints (``checkpoint_dir=backup_dir``).
        metrics: Keras metric objects applied to ``(y, network output)``: in the logs of
            logging steps and epochs (over the epoch so far) and in validation and
            :meth:`evaluate`, with their state summed over workers (see
            :mod:`hvdtrain.metrics`).
        mixed_precision: ``"mixed_float16"`` (with dynamic loss scaling), ``"mixed_bfloat16"``,
            ``"float32"``; ``None`` follows Keras's global dtype policy (Horovod).
        warmup_steps, warmup_epochs: ramp the learning rate from its unscaled to its scaled
            value over this many steps or epochs (Goyal et al.).
        log_dir: the chief writes TensorBoard scalars here.
        progress_bar: a tqdm bar on the chief; ``None`` shows it when stderr is a terminal.
        timeline: write Horovod's timeline (a Chrome trace) of the run to this file.
        nan_policy: when the loss is NaN or Inf on any rank, every rank skips the update
            and then ``"stop"`` raises ``FloatingPointError`` naming the step and ranks,
            ``"skip"`` logs it and goes on, ``"ignore"`` applies the update anyway.
        strategy: the backend (see above).
        model_parallel: split ``model=`` over this rank's devices (Horovod; see
            :mod:`hvdtrain.horovod.hybrid`).
        jit_compile: XLA compiles the forward and backward pass; the gradient exchange
            and the update run outside the compiled cluster (Horovod).
        bucket_mb: gradients are all-reduced in buckets of about this many MiB, the last
            layers' first, each as soon as its gradients exist, so the exchange overlaps
            the rest of the backward pass (Horovod; ``math.inf``: one all-reduce).
        steps_per_execution: steps run per call of the compiled step, as in Keras
            (Horovod); callbacks see one batch begin and end per call.
        task_spec, connect_timeout: the parameter-server task (default: from the
            environment) and how long to wait for the other tasks' servers.
    """

    def __init__(self, training_dataset: tf.data.Dataset, build_training_func: Callable | None = None,
                 optimizer: Any = None, optimizer_args: dict | None = None,
                 batch_size: int = options.DataOptions.batch_size,
                 prefetch_size: int | None = options.DataOptions.prefetch_size,
                 checkpoint_dir: str | None = options.CheckpointOptions.directory,
                 scaling_learning_rate: bool = True,
                 log_step_size: int = options.LoggingOptions.log_step_size,
                 validation_dataset: tf.data.Dataset | None = None,
                 build_validation_func: Callable | None = None,
                 max_iteration: float = options.DataOptions.max_iteration, *,
                 model: keras.Model | None = None, loss: Any = None,
                 num_epochs: int = options.DataOptions.num_epochs,
                 shuffle_buffer_size: int | None = options.DataOptions.shuffle_buffer_size,
                 seed: int | None = options.DataOptions.seed,
                 lr_scaling: str = options.LearningRateOptions.rule,
                 save_checkpoint_steps: int | None = options.CheckpointOptions.every_steps,
                 save_checkpoint_secs: float | None = options.CheckpointOptions.every_secs,
                 keep_checkpoint_max: int = options.CheckpointOptions.keep_max,
                 callbacks: Iterable[Callback] | None = None,
                 warmup_steps: int = options.LearningRateOptions.warmup_steps,
                 warmup_epochs: float = options.LearningRateOptions.warmup_epochs,
                 log_dir: str | None = options.LoggingOptions.log_dir,
                 progress_bar: bool | None = options.LoggingOptions.progress_bar,
                 strategy: Any = "horovod",
                 metrics: Iterable | None = None, **backend_options: Any) -> None:
        callbacks, backup = callbacks_lib.adopt(callbacks)
        checkpoint_dir, save_checkpoint_steps, self._save_each_epoch = \
            callbacks_lib.backup_settings(backup, checkpoint_dir, save_checkpoint_steps)
        self.options = opts = options.parse(
            strategy, batch_size=batch_size, prefetch_size=prefetch_size, num_epochs=num_epochs,
            shuffle_buffer_size=shuffle_buffer_size, seed=seed, max_iteration=max_iteration,
            checkpoint_dir=checkpoint_dir, save_checkpoint_steps=save_checkpoint_steps,
            save_checkpoint_secs=save_checkpoint_secs, keep_checkpoint_max=keep_checkpoint_max,
            log_step_size=log_step_size, log_dir=log_dir, progress_bar=progress_bar,
            scaling_learning_rate=scaling_learning_rate, lr_scaling=lr_scaling,
            warmup_steps=warmup_steps, warmup_epochs=warmup_epochs, **backend_options)
        if (build_training_func is None) == (model is None):
            raise ValueError("give exactly one of build_training_func=... or model=... (with loss=...)")
        data.check_dataset(training_dataset, "training_dataset")
        if validation_dataset is not None:
            data.check_dataset(validation_dataset, "validation_dataset")
        self._flag_steps = min(log_step_size, FLAG_READ_STEPS)
        self._backend = backend = create_backend(opts)
        self.rank, self.size = backend.rank, backend.size
        setup_logging(self.rank)
        if self.rank == 0:
            logger.info("%s", backend.describe())
        backend.stop_request = self._signals = preemption.SignalWatch(self.rank)
        # --- the ranks' settings agree before any other collective (else: error, not a hang) ---
        metric_objects = metrics_lib.check_metrics(metrics)
        self._start_description = agreement.describe(
            opts, optimizer=optimizer, optimizer_args=optimizer_args,
            element_spec=training_dataset.element_spec, model_given=model is not None,
            validation=validation_dataset is not None,
            validation_func=build_validation_func is not None,
            can_stop=any(getattr(cb, "can_stop", True) for cb in callbacks),
            mixed_precision=getattr(backend, "mixed_precision", None),
            metrics=metrics_lib.describe(metric_objects))
        self._training_dataset = training_dataset
        self._validation_dataset = validation_dataset
        # --- the start-up protocol: agreement, data, build, checkpoint hand-shakes, start state
        startup.run(self, startup.Given(build_training_func, model, loss, optimizer,
                                        optimizer_args, build_validation_func, metric_objects))

        if log_dir is not None:
            callbacks.append(TensorBoard(log_dir))
        if progress_bar or (progress_bar is None and self.rank == 0 and sys.stderr.isatty()):
            callbacks.append(ProgressBar())
        self.callbacks = CallbackList(
            callbacks, self, lambda: learning_rate.agree_configured_rate(
                self.optimizer, backend.allgather_object, self.rank))
        self._agree_stops = self._agreed.any_can_stop or backend.single_decider
        self.stop_training = False
        self.session = backend.session_for(self)
        self._train_step = backend.make_train_step(self._step_program, self.optimizer, self._step)
        self._record = EpochRecord(self._network, self._program.output_keys, backend.local_steps)
        self._feed = EpochFeed(backend, self.callbacks, num_epochs, self._close_epoch,
                               lambda: self._agree_stops and backend.agree_any(self.stop_training))
        self._feed.seek(self.steps_per_epoch, self.global_step)
        self._pending = None
        self._stop_checked_at = -1
        self._stopped = self._started = False
        self._last_logs: dict = {}
        self._reporter = StepReporter(self.rank, batch_size * self.size)

    # ------------------------------------------------------------------ public API
    @property
    def batch_size(self) -> int:
        """Examples per step on each rank (replica)."""
        return self.options.data.batch_size

    @property
    def num_epochs(self) -> int:
        """Passes over the training data."""
        return self.options.data.num_epochs

    @property
    def log_step_size(self) -> int:
        """Rank 0 logs every this many steps."""
        return self.options.logging.log_step_size

    @property
    def global_step(self) -> int:
        """Steps taken by this worker (the same on every worker)."""
        return self._global_step

    @property
    def training_network(self) -> keras.layers.Layer:
        """The network returned by the build function (or the model given)."""
        return self._network

    @property
    def epoch(self) -> int:
        """The current pass over the data (0-based)."""
        return max(self._feed.epoch, 0)

    @property
    def epoch_step(self) -> int:
        """Steps taken in the current epoch."""
        return self._feed.epoch_step

    @property
    def started(self) -> bool:
        """True once the first batch was requested (``on_train_begin`` ran)."""
        return self._started

    @property
    def total_steps(self) -> float:
        """Global steps this run takes at most (``inf`` when only the data's end or a
        callback can end it)."""
        spe = self.steps_per_epoch
        return min(self.max_steps, spe * self.num_epochs) if spe and spe > 0 else self.max_steps

    @property
    def state_variables(self) -> list:
        """What the chief's state is made of: program, optimizer and step variables."""
        return self._program.variables + list(self.optimizer.variables) + [self._step]

    def should_stop(self) -> bool:
        """True when training has ended: on every worker at the same step. A collective
        when a callback may stop training or the data's length is unknown: call it on
        every worker."""
        if self._stopped:
            return True
        stop = self.global_step >= self.max_steps
        if not stop and self._agree_stops and self._stop_checked_at != self.global_step:
            self._stop_checked_at = self.global_step  # once per step, not again in train_on_batch
            stop = self._backend.agree_any(self.stop_training)
        if not stop and self._pending is None:
            if not self._started:
                self._begin()
            self._pending = self._feed.next_batch()
            stop = self._pending is None
        if stop:
            self._finish()
        return stop

    def train_on_batch(self) -> dict:
        """Runs one synchronous step on every worker and returns its logs (tensors; on
        parameter servers, values whose ``float()`` waits for the step).

        Raises:
            RuntimeError: training has already ended.
            hvdtrain.Preempted: after a SIGTERM or SIGUSR1 to any worker, on every worker
                after the same step, once the chief saved its checkpoint (a ``SystemExit``
                with code 75; see :mod:`hvdtrain.preemption`).
        """
        if self.should_stop():
            raise RuntimeError("training has ended (should_stop() is True): no batch left to train on")
        batches, self._pending = [self._pending], None
        if self.options.steps_per_execution > 1:  # more steps in this call, within the epoch
            batches += self._feed.more_batches(
                int(min(self.options.steps_per_execution, self.max_steps - self.global_step)) - 1)
        step = self.global_step
        if self.callbacks:
            self.callbacks.call("on_train_batch_begin", step, {})
        taken = len(batches)
        logs = self._train_step(batches[0] if taken == 1 else batches, step + taken)
        for _ in batches:
            self._feed.step_taken()
        previous, step = step, step + taken
        self._global_step = step
        self._reporter.after_step(step)
        self._last_logs = logs
        self._record.add(logs, taken)
        if step // self._flag_steps > previous // self._flag_steps:
            self._backend.settle(step)  # a NaN/Inf or a stop agreed in the steps since
        if step // self.log_step_size > previous // self.log_step_size:
            train_metrics = self._evaluation.train_metrics
            if train_metrics:  # a collective, at the same steps on every rank
                logs = dict(logs, **train_metrics.results(self._backend.allgather_object))
            logs = self._reporter.log_step(step, logs,
                                           learning_rate.current_learning_rate(self.optimizer))
        if self.callbacks:
            self.callbacks.call("on_train_batch_end", step, logs)
        self._checkpointer.maybe_save(step, self._checkpoint_meta, taken)
        if self._backend.preemption_agreed():
            preemption.stop_every_worker(self._backend, self._signals, self._finish,
                                         self.global_step, self._checkpointing.directory)
        return logs

    def join(self) -> None:
        """Waits for every scheduled step (parameter servers schedule steps
        asynchronously); raises the first error a worker hit. Immediate elsewhere."""
        self._backend.join()

    def train_to_end(self) -> keras.callbacks.History:
        """Trains until ``should_stop()``; returns :attr:`history`."""
        while not self.should_stop():
            self.train_on_batch()
        return self.history

    def train_and_validate_to_end(self, validate_step_size: int = 50) -> keras.callbacks.History:
        """Trains to the end, logging validation metrics every ``validate_step_size`` steps
        and once more at the end.

        Returns:
            :attr:`history`; its ``val_*`` entries hold the latest validation at each
            epoch's end, and the final validation in the last epoch's entry.
        """
        checks.positive_int(validate_step_size, "validate_step_size")
        at_step = None
        while not self.should_stop():
            self.train_on_batch()
            if self._validation_dataset is not None and self.global_step % validate_step_size == 0:
                self._report_validation(self.validation_metrics)
                at_step = self.global_step
        if self._validation_dataset is not None:
            metrics = self.validation_metrics if at_step != self.global_step else None
            if metrics is not None:
                self._report_validation(metrics)
            self._record.final_validation(self._record.validation)
        return self.history

    @property
    def history(self) -> keras.callbacks.History:
        """Keras-style ``History``: ``history.history[name]`` has one value per epoch of
        this run (the epoch's mean over every worker's steps, metrics, ``learning_rate``
        and the latest ``val_*``); an epoch cut short by ``max_iteration`` counts."""
        return self._record.history

    # ------------------------------------------------------------------ after training
    @property
    def validation_metrics(self) -> list:
        """``[(name, value)]`` over the whole validation set, from every worker: the
        program's outputs as means over every example, then the Trainer's ``metrics``
        (see :meth:`evaluate`). A collective: read it on every worker."""
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        return self._evaluation.metrics_over(self._validation_dataset, self.batch_size)

    @property
    def metric_objects(self) -> list:
        """The Keras metric objects given as ``metrics``."""
        return self._evaluation.metric_objects

    def evaluate(self, dataset: tf.data.Dataset, batch_size: int | None = None) -> dict:
        """``{name: value}`` over every example of ``dataset``, the same on every worker (a
        collective); see :meth:`hvdtrain.trainer.evaluation.Evaluation.evaluate`."""
        return self._evaluation.evaluate(dataset, batch_size)

    def predict(self, dataset: tf.data.Dataset, batch_size: int | None = None):
        """The network's outputs for every element, in dataset order, on every worker (a
        collective); see :meth:`hvdtrain.trainer.evaluation.Evaluation.predict`."""
        return self._evaluation.predict(dataset, batch_size)

    def save(self, path: str) -> None:
        """Writes the trained network as a ``.keras`` file on the chief (a collective); see
        :meth:`hvdtrain.trainer.evaluation.Evaluation.save`."""
        self._evaluation.save(path)

    def export(self, path: str) -> None:
        """Writes the trained network as a SavedModel on the chief (a collective); see
        :meth:`hvdtrain.trainer.evaluation.Evaluation.export`."""
        self._evaluation.export(path)

    # ------------------------------------------------------------------ the backend's facts
    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        """The ``tf.distribute.Strategy`` of the backend (``None`` for Horovod)."""
        return self._backend.strategy

    @property
    def num_workers(self) -> int:
        """Processes taking part (``size`` counts replicas, which may be more)."""
        return self._backend.num_workers

    @property
    def skipped_steps(self) -> int:
        """Steps whose update was skipped for a non-finite loss (``nan_policy``)."""
        return getattr(self._backend, "skipped_steps", 0)

    @property
    def mixed_precision(self) -> str:
        """The dtype policy the network was built under."""
        return getattr(self._backend, "mixed_precision", keras.mixed_precision.global_policy().name)

    @property
    def worker_steps(self) -> int:
        """Steps applied by all workers together, read from the step counter (on parameter
        servers the workers count them as they apply their updates)."""
        return int(self._step.numpy()) * self.size // self._backend.step_units

    @property
    def variable_devices(self) -> dict:
        """``{variable path: device}`` of the model's and optimizer's variables."""
        return {v.path: v.value.device for v in
                list(self._program.variables) + list(self.optimizer.variables)}

    # ------------------------------------------------------------------ elastic membership
    # Only the Horovod backend supports these (others raise NotImplementedError naming it);
    # see hvdtrain.horovod.elastic.
    def reshard(self) -> None:
        """Re-reads rank and world size after an elastic membership change and rebuilds
        what depends on them: the data shard and step counts, the learning-rate scale,
        the compiled step, and the position in the data (from ``global_step``)."""
        old_size = self.size
        self._backend.refresh_membership()
        self.rank, self.size = self._backend.rank, self._backend.size
        self._reporter.samples_per_step = self.batch_size * self.size
        new_scale = learning_rate.lr_scale_factor(self.size, self._lr_rule)
        if new_scale != self.lr_scale:
            learning_rate.scale_learning_rate(learning_rate.inner_optimizer(self.optimizer),
                                              new_scale / self.lr_scale)
            logger.info("world size %d -> %d: learning rate scaled by %g", old_size, self.size,
                        new_scale / self.lr_scale)
            self.lr_scale = new_scale
        self._setup_data()
        self._checkpointer.rebind()
        self._train_step = self._backend.make_train_step(self._step_program, self.optimizer,
                                                         self._step)
        self._pending, self._stop_checked_at = None, -1
        self._feed.seek(self.steps_per_epoch, self.global_step)

    def rejoin(self) -> None:
        """After an elastic restart, on a worker that kept training: runs the start-up
        protocol (:data:`hvdtrain.trainer.startup.STEPS`) that a joining worker's
        constructor runs, with nothing built or read, so both meet in the same collectives
        and the new worker gets rank 0's state. The world size may have changed: the data
        step reshards (:meth:`reshard`), and the global step follows rank 0's."""
        startup.run(self, None)

    def resume_step_from_state(self) -> None:
        """Sets ``global_step`` from the step variable (after its value was put back)."""
        self._global_step = int(self._step.numpy()) // self._backend.step_units

    # ------------------------------------------------------------------ internals
    def _setup_data(self) -> None:
        """This worker's pipeline, the agreed steps per epoch, the step limit."""
        self.steps_per_epoch = self._backend.setup_data(self._training_dataset, self.options.data)
        self.max_steps = self.options.data.steps_per_worker(self.size)
        if self.max_steps < 1:
            raise ValueError(f"max_iteration={self.options.data.max_iteration} gives no step on each "
                             f"of {self.size} {self._backend.unit} (each runs max_iteration // "
                             f"{self._backend.unit} steps)")
        if self.steps_per_epoch == -1 and not math.isfinite(self.max_steps):
            logger.warning("training_dataset is infinite and max_iteration is not set: training "
                           "runs until a callback stops it")

    def _agree_on_start(self) -> agreement.Agreed:
        """Compares every rank's settings (the first collective of a start, and of an
        elastic rejoin)."""
        return agreement.agree(self._start_description, self._backend.allgather_object,
                               self.rank)

    def _after_restore(self, configured_lr: float | None) -> None:
        manifest = getattr(self._checkpointer, "restored_manifest", None) or {}
        learning_rate.keep_configured_rate(self.optimizer, configured_lr, manifest.get("world_size"),
                                           self.size, self._lr_rule)
        logger.info("resumed from %s at step %d", self.restored_from, self.global_step)

    def _checkpoint_meta(self) -> dict:
        return {"world_size": self.size, "batch_size": self.batch_size,
                "steps_per_epoch": self.steps_per_epoch, "epoch": self.epoch,
                "learning_rate": learning_rate.current_learning_rate(self.optimizer)}

    def _close_epoch(self) -> dict:
        """The ending epoch's logs for ``on_epoch_end`` (a collective), saved first when
        a ``BackupAndRestore`` asked for a save every epoch."""
        if self._save_each_epoch:
            self._checkpointer.save(self.global_step, **self._checkpoint_meta())
        return self._record.close_epoch(self.epoch, self._backend, self._evaluation.train_metrics,
                                        learning_rate.current_learning_rate(self.optimizer))

    def _report_validation(self, metrics: list) -> None:
        self._reporter.log_validation(self.global_step, metrics)
        logs = {f"val_{k}": v for k, v in metrics}
        self._record.validation = logs
        self.callbacks.call("on_test_end", logs)

    def _begin(self) -> None:
        self._started = True
        self._signals.install()
        self._backend.on_train_begin()
        self._reporter.restart_clock(self.global_step)
        self.callbacks.call("on_train_begin", {})

    def _finish(self) -> None:
        self._stopped = True
        if self._started:
            self._backend.settle(self.global_step)  # a non-finite step since the last log
        self._signals.restore()
        self._feed.close()
        self._checkpointer.save(self.global_step, **self._checkpoint_meta())
        self._checkpointer.close()
        self._backend.on_train_end(self.global_step)
        if self._started:
            self.callbacks.call("on_train_end", _floats(self._last_logs))


def _floats(logs: dict) -> dict:
    return {k: float(v) for k, v in logs.items()}


class ParameterServerTrainer(Trainer):
    """``Trainer(..., strategy="parameter_server")`` under TensorLayer's name for it."""

    def __init__(self, *args, strategy: Any = "parameter_server", **kwargs) -> None:
        super().__init__(*args, strategy=strategy, **kwargs)
