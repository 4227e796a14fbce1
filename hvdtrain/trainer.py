"""The Trainer: TensorLayer's distributed ``Trainer`` contract on TensorFlow 2 and Horovod.

The user brings a build function (or a Keras model and loss) and a ``tf.data`` dataset;
the Trainer owns the rest: sharding by rank, the distributed optimizer with learning-rate
scaling, the broadcast of the initial state from rank 0, checkpoints on rank 0, logging on
rank 0, and a loop in which every rank takes the same number of steps.
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from typing import Any, Callable, Iterable

import keras
import tensorflow as tf

from hvdtrain import building, data, dist, hybrid, optim, precision
from hvdtrain.callbacks import Callback, CallbackList, ProgressBar, TensorBoard
from hvdtrain.checkpoint import Checkpointer

logger = logging.getLogger("hvdtrain")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _make_optimizer(optimizer, optimizer_args) -> keras.optimizers.Optimizer:
    """An optimizer instance from a class + args, an instance, or a name + args."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        if optimizer_args:
            raise ValueError("optimizer_args must be empty when optimizer is an instance")
        return optimizer
    if optimizer_args is None or not isinstance(optimizer_args, dict):
        raise ValueError("optimizer_args must be a dict holding at least 'learning_rate' when "
                         f"optimizer is a class or name, got {optimizer_args!r}")
    if "learning_rate" not in optimizer_args:
        raise ValueError("optimizer_args must hold 'learning_rate', got keys "
                         f"{sorted(optimizer_args)}")
    if isinstance(optimizer, str):
        cls = type(keras.optimizers.get(optimizer))
    elif isinstance(optimizer, type) and issubclass(optimizer, keras.optimizers.Optimizer):
        cls = optimizer
    else:
        raise TypeError("optimizer must be a Keras optimizer class (e.g. keras.optimizers.Adam), "
                        f"an instance, or a name, got {optimizer!r}")
    try:
        return cls(**optimizer_args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"optimizer_args do not fit {cls.__name__}: {err}") from err


def setup_logging(rank: int) -> None:
    """``[hvdtrain] ...`` INFO logging on rank 0 (the chief), warnings only elsewhere."""
    if rank != 0:
        logger.setLevel(logging.WARNING)
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hvdtrain] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _Session:
    """The TensorLayer-style ``trainer.session``: only ``should_stop()`` is meaningful."""

    def __init__(self, trainer: "Trainer") -> None:
        self._trainer = trainer

    def should_stop(self) -> bool:
        """True once training has ended on every rank."""
        return self._trainer.should_stop()


STRATEGIES = ("horovod", "mirrored", "multi_worker_mirrored", "parameter_server")


def _strategy_trainer(strategy, args: tuple, kwargs: dict):
    """The Trainer of a non-Horovod backend (same arguments and members)."""
    if strategy == "parameter_server" or isinstance(
            strategy, tf.distribute.experimental.ParameterServerStrategy):
        from hvdtrain.ps import ParameterServerTrainer
        return ParameterServerTrainer(*args, strategy=strategy, **kwargs)
    from hvdtrain.tfdist import StrategyTrainer
    return StrategyTrainer(*args, strategy=strategy, **kwargs)


class TrainingLoop:
    """The outer loops every backend's Trainer shares, over its ``should_stop()``,
    ``train_on_batch()``, ``validation_metrics`` and ``_log_validation(metrics)``."""

    _validation_dataset = None

    def train_to_end(self) -> None:
        """Trains until ``should_stop()``."""
        while not self.should_stop():
            self.train_on_batch()

    def train_and_validate_to_end(self, validate_step_size: int = 50) -> list:
        """Trains to the end, logging validation metrics every ``validate_step_size`` steps.

        Returns:
            The final ``validation_metrics`` (empty without a validation dataset).
        """
        _positive_int(validate_step_size, "validate_step_size")
        metrics, at_step = [], None
        while not self.should_stop():
            self.train_on_batch()
            if self._validation_dataset is not None and self.global_step % validate_step_size == 0:
                metrics, at_step = self.validation_metrics, self.global_step
                self._log_validation(metrics)
        if self._validation_dataset is not None and at_step != self.global_step:
            metrics = self.validation_metrics
            self._log_validation(metrics)
        return metrics


class Trainer(TrainingLoop):
    """Data-parallel training with Horovod, mirroring ``tl.distributed.Trainer``.

    ``strategy`` chooses the backend with the same user code: ``"horovod"`` (the default,
    this class), ``"mirrored"`` and ``"multi_worker_mirrored"`` (``tf.distribute``, see
    :mod:`hvdtrain.tfdist`), ``"parameter_server"`` (see :mod:`hvdtrain.ps`), or a
    ``tf.distribute.Strategy`` instance.

    Args:
        training_dataset: a ``tf.data.Dataset`` of unbatched ``(x, y)`` pairs. It is
            sharded by rank, then batched and prefetched.
        build_training_func: ``f(x, y) -> (network, loss, log_tensors)``, called once with
            symbolic ``keras.Input`` tensors shaped like the data (see ``hvdtrain.building``).
        optimizer: a Keras optimizer class (with ``optimizer_args``), name, or instance.
        optimizer_args: keyword arguments for the class; must hold ``learning_rate``.
        batch_size: examples per step on each rank.
        prefetch_size: batches to prefetch; ``None`` lets tf.data size the buffer (AUTOTUNE).
        checkpoint_dir: rank 0 saves here and every rank resumes from its latest checkpoint.
        scaling_learning_rate: multiply the learning rate by the world size (``lr_scaling``
            chooses the rule).
        log_step_size: log the loss and log tensors every this many steps (rank 0).
        validation_dataset: unbatched ``(x, y)`` pairs for ``validation_metrics``.
        build_validation_func: ``f(x, y[, network]) -> (network, metrics)``; without it,
            validation reports the training loss and log tensors in inference mode.
        max_iteration: total steps over all workers; each rank runs
            ``max_iteration // size`` steps (TensorLayer's meaning).
        model, loss: instead of a build function, a ready Keras model and a loss.
        num_epochs: passes over the training data (each rank over its shard).
        shuffle_buffer_size, seed: shuffle each shard every pass.
        compression, op, backward_passes_per_step, sparse_as_dense: passed to
            :func:`hvdtrain.DistributedOptimizer`.
        lr_scaling: ``"linear"``, ``"sqrt"`` or ``"none"``.
        save_checkpoint_steps, save_checkpoint_secs, keep_checkpoint_max: when to save and
            how many checkpoints to keep.
        callbacks: :class:`hvdtrain.Callback` instances.
        compression_ratio: fraction of entries sent with ``compression="topk"``/``"randomk"``.
        mixed_precision: ``"mixed_float16"`` (with dynamic loss scaling), ``"mixed_bfloat16"``,
            ``"float32"``; ``None`` follows Keras's global dtype policy.
        warmup_steps, warmup_epochs: ramp the learning rate from its unscaled to its scaled
            value over this many steps or epochs (Goyal et al.).
        log_dir: rank 0 writes TensorBoard scalars here.
        progress_bar: a tqdm bar on rank 0; ``None`` shows it when stderr is a terminal.
        timeline: write Horovod's timeline (a Chrome trace) of the run to this file.
        nan_policy: when the loss is NaN or Inf on any rank, every rank skips the update
            and then ``"stop"`` raises ``FloatingPointError`` naming the step and ranks,
            ``"skip"`` logs it and goes on, ``"ignore"`` applies the update anyway.
        strategy: the backend (see above); only ``"horovod"`` is handled by this class.
        model_parallel: split ``model=`` (a ``keras.Sequential`` or a list of stages) over
            this rank's devices: a number of devices, device names, or
            :class:`hvdtrain.ModelParallel` (see :mod:`hvdtrain.hybrid`).
    """

    def __new__(cls, *args, strategy: Any = "horovod", **kwargs):
        if cls is Trainer and not (isinstance(strategy, str) and strategy == "horovod"):
            if isinstance(strategy, str) and strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} or "
                                 f"a tf.distribute.Strategy, got {strategy!r}")
            if not isinstance(strategy, (str, tf.distribute.Strategy)):
                raise TypeError("strategy must be a name or a tf.distribute.Strategy, got "
                                f"{type(strategy).__name__}")
            if kwargs.get("model_parallel") is not None:
                raise ValueError("model_parallel works with strategy='horovod' only, got "
                                 f"strategy={strategy!r}")
            return _strategy_trainer(strategy, args, kwargs)
        return super().__new__(cls)

    def __init__(self, training_dataset: tf.data.Dataset, build_training_func: Callable | None = None,
                 optimizer: Any = None, optimizer_args: dict | None = None, batch_size: int = 32,
                 prefetch_size: int | None = None, checkpoint_dir: str | None = None,
                 scaling_learning_rate: bool = True, log_step_size: int = 1,
                 validation_dataset: tf.data.Dataset | None = None,
                 build_validation_func: Callable | None = None,
                 max_iteration: float = float("inf"), *, model: keras.Model | None = None,
                 loss: Any = None, num_epochs: int = 1, shuffle_buffer_size: int | None = None,
                 seed: int | None = None, compression: Any = None, op: Any = "average",
                 backward_passes_per_step: int = 1, sparse_as_dense: bool = False,
                 lr_scaling: str = "linear", save_checkpoint_steps: int | None = None,
                 save_checkpoint_secs: float | None = 600, keep_checkpoint_max: int = 5,
                 callbacks: Iterable[Callback] | None = None, compression_ratio: float | None = None,
                 mixed_precision: str | bool | None = None, warmup_steps: int = 0,
                 warmup_epochs: float = 0, log_dir: str | None = None,
                 progress_bar: bool | None = None, timeline: str | None = None,
                 nan_policy: str = "stop", strategy: Any = "horovod",
                 model_parallel: Any = None) -> None:
        if strategy != "horovod":
            raise ValueError(f"{type(self).__name__} runs on Horovod only, got strategy={strategy!r}")
        model_parallel = hybrid.resolve(model_parallel)
        dist.init(gpus_per_rank=hybrid.gpus_per_rank(model_parallel), timeline=bool(timeline))
        if timeline:
            dist.check_timeline_possible(timeline)
        if nan_policy not in ("stop", "skip", "ignore"):
            raise ValueError(f"nan_policy must be 'stop', 'skip' or 'ignore', got {nan_policy!r}")
        self.nan_policy = nan_policy
        self.skipped_steps = 0
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.log_step_size = _positive_int(log_step_size, "log_step_size")
        self.num_epochs = _positive_int(num_epochs, "num_epochs")
        if prefetch_size is not None and (isinstance(prefetch_size, bool)
                                          or not isinstance(prefetch_size, int) or prefetch_size < 0):
            raise ValueError(f"prefetch_size must be None or an integer >= 0, got {prefetch_size!r}")
        if not isinstance(max_iteration, (int, float)) or isinstance(max_iteration, bool) \
                or max_iteration <= 0 or max_iteration != max_iteration:
            raise ValueError(f"max_iteration must be a positive number, got {max_iteration!r}")
        if save_checkpoint_steps is not None:
            _positive_int(save_checkpoint_steps, "save_checkpoint_steps")
        _positive_int(keep_checkpoint_max, "keep_checkpoint_max")
        if (build_training_func is None) == (model is None):
            raise ValueError("give exactly one of build_training_func=... or model=... (with loss=...)")
        data.check_dataset(training_dataset, "training_dataset")
        if validation_dataset is not None:
            data.check_dataset(validation_dataset, "validation_dataset")
        self.rank, self.size = dist.rank(), dist.size()
        setup_logging(self.rank)

        # --- data: shard, batch, prefetch; steps every rank can take ---
        self._source = (training_dataset, shuffle_buffer_size, seed, max_iteration)
        self._prefetch = tf.data.AUTOTUNE if prefetch_size is None else prefetch_size
        self._setup_data()

        # --- the programs: built once (under the precision policy), run every step ---
        self.mixed_precision = precision.resolve(mixed_precision)
        spec = training_dataset.element_spec
        with precision.policy_scope(self.mixed_precision):
            if model_parallel is not None:
                self._network, self._program = hybrid.model_program(
                    model, loss, spec, model_parallel, build_training_func)
            elif model is not None:
                self._network = model
                self._program = building.model_program(model, loss, spec)
            else:
                self._network, self._program = building.build_training_program(
                    build_training_func, spec)
        precision.check_model_uses(self.mixed_precision, self._network)
        self._validation_dataset = validation_dataset
        self._build_validation_func = build_validation_func
        self._validation_program = None

        # --- the optimizer: instance, scaled learning rate, loss scaling, distributed ---
        self.optimizer = _make_optimizer(optimizer, optimizer_args)
        self._lr_rule = lr_scaling if scaling_learning_rate else "none"
        self.lr_scale = optim.lr_scale_factor(self.size, self._lr_rule)
        optim.scale_learning_rate(self.optimizer, self.lr_scale,
                                  warmup_steps=self._warmup_steps(warmup_steps, warmup_epochs))
        self._loss_scaled = self.mixed_precision == "mixed_float16"
        if self._loss_scaled:
            self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
        optim.DistributedOptimizer(self.optimizer, compression=compression, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   sparse_as_dense=sparse_as_dense,
                                   compression_ratio=compression_ratio)
        self._trainable = self._program.trainable_variables
        if not self._trainable:
            raise ValueError("the network has no trainable variables")
        self.optimizer.build(self._trainable)

        # --- state, checkpoint, broadcast ---
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._rng_states = [v.value for v in self._program.variables
                            if "seed_generator_state" in v.path]
        self._checkpointer = Checkpointer(
            checkpoint_dir, keep_max=keep_checkpoint_max, every_steps=save_checkpoint_steps,
            every_secs=save_checkpoint_secs, model=self._program, optimizer=self.optimizer,
            step=self._step, rng=list(self._rng_states))
        lr_variable = getattr(self.optimizer, "inner_optimizer", self.optimizer)._learning_rate
        configured_lr = (float(lr_variable.numpy()) if isinstance(lr_variable, tf.Variable)
                         or hasattr(lr_variable, "assign") else None)
        self.restored_from = self._checkpointer.restore_latest()
        dist.broadcast_variables(self._start_variables())
        self._fold_rank_into_rng()
        self._global_step = int(self._step.numpy())  # a Python mirror: no device read per step
        if self.restored_from:
            self._after_restore(lr_variable, configured_lr)

        callbacks = list(callbacks or [])
        if log_dir is not None:
            callbacks.append(TensorBoard(log_dir))
        if progress_bar or (progress_bar is None and self.rank == 0 and sys.stderr.isatty()):
            callbacks.append(ProgressBar())
        self._timeline = timeline
        self.callbacks = CallbackList(callbacks, self)
        self._agree_stops = self.callbacks.can_stop
        self.stop_training = False
        self.session = _Session(self)
        self._train_step = tf.function(self._step_fn)
        self._iterator = None
        self._epoch = None
        self._epoch_step = 0
        self._pending = None
        self._stopped = False
        self._started = False
        self._timed = False
        self._last_logs: dict = {}
        self._log_t0 = None
        self._log_step0 = 0
        self._set_position()

    # ------------------------------------------------------------------ public API
    @property
    def global_step(self) -> int:
        """Steps taken by this rank (the same on every rank)."""
        return self._global_step

    @property
    def training_network(self) -> keras.layers.Layer:
        """The network returned by the build function (or the model given)."""
        return self._network

    @property
    def epoch(self) -> int:
        """The current pass over the data (0-based)."""
        return max(self._epoch, 0)

    def should_stop(self) -> bool:
        """True when training has ended: on every rank at the same step."""
        if self._stopped:
            return True
        stop = self.global_step >= self.max_steps
        if not stop and self._agree_stops:
            stop = dist.agree_any(self.stop_training)
        if not stop and self._pending is None:
            self._pending = self._next_batch()
            stop = self._pending is None
        if stop:
            self._finish()
        return stop

    def train_on_batch(self) -> dict:
        """Runs one synchronous step on every rank and returns its logs (tensors).

        Raises:
            RuntimeError: training has already ended.
        """
        if self.should_stop():
            raise RuntimeError("training has ended (should_stop() is True): no batch left to train on")
        x, y = self._pending
        self._pending = None
        step = self.global_step
        if self.callbacks:
            self.callbacks.call("on_train_batch_begin", step, {})
        logs, applied = self._train_step(x, y)
        self._epoch_step += 1
        step = self._global_step = step + 1
        if self.nan_policy != "ignore" and not bool(applied):
            self._non_finite(step, logs)
        if not self._timed:  # start the samples/s clock after the first (compiling) step
            self._timed = True
            self._log_t0, self._log_step0 = time.perf_counter(), step
        self._last_logs = logs
        if step % self.log_step_size == 0:
            logs = self._log(step, logs)
        if self.callbacks:
            self.callbacks.call("on_train_batch_end", step, logs)
        self._checkpointer.maybe_save(step, self._checkpoint_meta)
        return logs

    @property
    def validation_metrics(self) -> list:
        """``[(name, mean)]`` over the whole validation set, averaged over every rank.

        Each rank evaluates its shard; the per-batch means are weighted by batch size and
        the sums are all-reduced, so the result is the mean over every example.
        """
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        program = self._get_validation_program()
        if not hasattr(self, "_validation_batches"):
            self._validation_batches = data.shard_and_batch(
                self._validation_dataset, num_shards=self.size, index=self.rank,
                batch_size=self.batch_size, prefetch_size=2)
            self._eval_step = tf.function(lambda x, y: program([x, y], training=False))
        sums: dict = {}
        count = 0
        for x, y in self._validation_batches:
            n = int(tf.shape(y)[0])
            out = self._eval_step(x, y)
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + float(v) * n
            count += n
        means = {k: (sums.get(k, 0.0) / count if count else 0.0) for k in program.output_keys}
        reduced = dist.allreduce_dict(means, weight=count)
        return [(k, reduced[k]) for k in sorted(reduced)]

    def _non_finite(self, step: int, logs: dict) -> None:
        """Every rank gets here at the same step: name the ranks, then stop or skip."""
        bad = [r for r, ok in enumerate(dist.allgather_object(
            bool(math.isfinite(float(logs[building.LOSS_KEY]))))) if not ok]
        message = (f"non-finite loss at step {step} on rank(s) {bad or 'unknown'}; the update "
                   "was not applied")
        if self.nan_policy == "stop":
            raise FloatingPointError(message + " (nan_policy='stop'; use 'skip' to go on)")
        self.skipped_steps += 1
        if self.rank == 0:
            logger.warning("%s (nan_policy='skip')", message)

    def _fold_rank_into_rng(self) -> None:
        """Gives every rank its own dropout stream after the broadcast made them equal,
        deterministically, so a resumed run draws the same masks as an uninterrupted one."""
        for state in self._rng_states:
            if self.rank:
                state.assign_add(tf.constant([self.rank * 1_000_003, 0], dtype=state.dtype))

    def _after_restore(self, lr_variable, configured_lr: float | None) -> None:
        """The configured (scaled) learning rate wins over the checkpoint's; say so when
        the world size changed."""
        manifest = self._checkpointer.restored_manifest or {}
        if configured_lr is not None:
            saved_lr = float(lr_variable.numpy())
            lr_variable.assign(configured_lr)
            if manifest.get("world_size") not in (None, self.size):
                logger.info("checkpoint written by %d ranks, resuming on %d: learning rate %g -> "
                            "%g (%s scaling)", manifest["world_size"], self.size, saved_lr,
                            configured_lr, self._lr_rule)
        logger.info("resumed from %s at step %d", self.restored_from, self.global_step)

    def reshard(self) -> None:
        """Re-reads rank and world size after an elastic membership change and rebuilds
        what depends on them: the data shard and step counts, the learning-rate scale,
        the compiled step, and the position in the data (from ``global_step``)."""
        old_size = self.size
        self.rank, self.size = dist.rank(), dist.size()
        new_scale = optim.lr_scale_factor(self.size, self._lr_rule)
        if new_scale != self.lr_scale:
            inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)  # loss scaling
            optim.scale_learning_rate(inner, new_scale / self.lr_scale)
            logger.info("world size %d -> %d: learning rate scaled by %g", old_size, self.size,
                        new_scale / self.lr_scale)
            self.lr_scale = new_scale
        self._setup_data()
        self._checkpointer.rebind()
        self._train_step = tf.function(self._step_fn)  # retrace: the reduction depends on size
        if hasattr(self, "_validation_batches"):
            del self._validation_batches
        self._iterator, self._pending = None, None
        self._set_position()

    def rejoin(self) -> None:
        """After an elastic restart, on a worker that kept training: runs the collectives a
        joining worker's constructor runs, in the same order, so both meet and the new
        worker gets rank 0's state. Keep in step with ``__init__``: a collective added
        there must be added here, or a joining worker hangs the job.

        1. ``reshard()``: the shard-length agreement of ``_setup_data`` (and everything
           else that depends on the world size);
        2. the checkpoint hand-shakes (nothing is restored: the state is in memory);
        3. the broadcast of program, optimizer and step variables, then the rank fold of
           the dropout streams.
        """
        self.reshard()
        self._checkpointer.replay_start_handshake()
        dist.broadcast_variables(self._start_variables())
        self._fold_rank_into_rng()
        step = int(self._step.numpy())
        if step != self._global_step:  # rank 0 was at another step: follow it
            self._global_step = step
            self._set_position()

    def _start_variables(self) -> list:
        """What rank 0 broadcasts at start: program, optimizer and step variables."""
        return self._program.variables + list(self.optimizer.variables) + [self._step]

    # ------------------------------------------------------------------ internals
    def _setup_data(self) -> None:
        """This rank's shard, batched; the agreed steps per epoch; the step limit."""
        dataset, shuffle_buffer_size, seed, max_iteration = self._source
        self._train_ds = data.shard_and_batch(
            dataset, num_shards=self.size, index=self.rank, batch_size=self.batch_size,
            prefetch_size=0, shuffle_buffer_size=shuffle_buffer_size, seed=seed)
        self.steps_per_epoch = data.agreed_steps_per_epoch(self._train_ds)
        if self.steps_per_epoch == 0:
            raise ValueError("training_dataset is empty on at least one rank: it needs at least "
                             f"{self.size} examples for {self.size} ranks")
        self.max_steps = (max_iteration // self.size if math.isfinite(max_iteration)
                          else math.inf)
        if self.max_steps < 1:
            raise ValueError(f"max_iteration={max_iteration} gives no step on each of {self.size} "
                             "ranks (each rank runs max_iteration // size steps)")
        if self.steps_per_epoch == -1 and not math.isfinite(self.max_steps):
            logger.warning("training_dataset is infinite and max_iteration is not set: training "
                           "runs until a callback stops it")

    def _checkpoint_meta(self) -> dict:
        return {"world_size": self.size, "batch_size": self.batch_size,
                "steps_per_epoch": self.steps_per_epoch, "epoch": self.epoch,
                "learning_rate": optim.current_learning_rate(self.optimizer)}

    def _set_position(self) -> None:
        """Epoch and batches to skip, so training continues where ``global_step`` says."""
        if self.steps_per_epoch and self.steps_per_epoch > 0:
            self._epoch = self.global_step // self.steps_per_epoch - 1
            self._skip_on_resume = self.global_step % self.steps_per_epoch
        else:
            self._epoch, self._skip_on_resume = -1, 0

    def _step_fn(self, x, y):
        with hybrid.tape_for(self._program) as tape:  # staged: backward stage by stage
            outs = self._program([x, y], training=True)
            loss = tf.cast(outs[building.LOSS_KEY], tf.float32)
            if self._program.losses:
                loss = loss + tf.cast(tf.add_n(self._program.losses), tf.float32)
            if self._loss_scaled:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, self._trainable)
        local_loss = tf.cast(outs[building.LOSS_KEY], tf.float32)
        if self.nan_policy == "ignore":
            self.optimizer.apply(grads, self._trainable)
            applied = tf.constant(True)
        elif self._loss_scaled:  # the loss scaler skips overflowing gradients itself
            self.optimizer.apply(grads, self._trainable)
            applied = tf.math.is_finite(dist.allreduce_mean(local_loss))
        else:
            # If any rank's loss is NaN or Inf, every rank sees it in the mean loss and
            # skips the update. Where possible the loss rides in the gradients' fused
            # all-reduce (no extra collective); accumulation and sparsification reduce
            # inside the optimizer, so the loss goes on its own there.
            outside = optim.can_reduce_outside(self.optimizer)
            if outside:
                reduced = optim.reduce_with(self.optimizer, list(grads) + [local_loss],
                                            list(self._trainable) + [None])
                grads, mean_loss = reduced[:-1], reduced[-1]
            else:
                mean_loss = dist.allreduce_mean(local_loss)

            def apply():
                with optim.already_reduced(self.optimizer) if outside else contextlib.nullcontext():
                    self.optimizer.apply(grads, self._trainable)
                return tf.constant(True)

            applied = tf.cond(tf.math.is_finite(mean_loss), apply, lambda: tf.constant(False))
        self._step.assign_add(1)
        return outs, applied

    def _warmup_steps(self, steps: int, epochs: float) -> int:
        if epochs:
            if not isinstance(epochs, (int, float)) or isinstance(epochs, bool) or epochs < 0:
                raise ValueError(f"warmup_epochs must be a number >= 0, got {epochs!r}")
            if not self.steps_per_epoch or self.steps_per_epoch < 0:
                raise ValueError("warmup_epochs needs a training_dataset of known, finite length; "
                                 "use warmup_steps instead")
            return max(1, int(round(epochs * self.steps_per_epoch)))
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {steps!r}")
        return steps

    def _get_validation_program(self):
        if self._validation_program is None:
            spec = self._validation_dataset.element_spec
            if self._build_validation_func is not None:
                self._validation_program = building.build_validation_program(
                    self._build_validation_func, spec, self._network)
            else:
                self._validation_program = self._program
        return self._validation_program

    def _next_batch(self):
        """The next batch every rank has, moving through epochs; ``None`` at the end."""
        if not self._started:
            self._started = True
            if self._timeline:
                dist.start_timeline(self._timeline)
            self._log_t0, self._log_step0 = time.perf_counter(), self.global_step
            self.callbacks.call("on_train_begin", {})
        spe = self.steps_per_epoch
        while True:
            if self._iterator is None:
                if self._epoch + 1 >= self.num_epochs and spe != -1:
                    return None
                self._epoch += 1
                self._epoch_step = 0
                self._iterator = self._open_iterator()
                self.callbacks.call("on_epoch_begin", self._epoch, {})
            elif spe and spe > 0 and self._epoch_step >= spe:  # an epoch ends mid-iterator
                self.callbacks.call("on_epoch_end", self._epoch, self._float_logs(self._last_logs))
                if self._epoch + 1 >= self.num_epochs:
                    self._iterator = None
                    return None
                self._epoch += 1
                self._epoch_step = 0
                self.callbacks.call("on_epoch_begin", self._epoch, {})
            if spe is not None:
                return next(self._iterator)
            # unknown length: the ranks agree on the end of the data at every step
            opt = self._iterator.get_next_as_optional()
            if not dist.agree_any(not bool(opt.has_value())):
                return opt.get_value()
            self._iterator = None
            self.callbacks.call("on_epoch_end", self._epoch, self._float_logs(self._last_logs))

    def _open_iterator(self):
        """An iterator over the remaining data. With a known epoch length it spans every
        remaining epoch (``take(steps).repeat()``): re-creating a prefetching iterator each
        epoch stalls the rank that tears it down, and the others wait on it."""
        ds = self._train_ds
        spe = self.steps_per_epoch
        if spe and spe > 0 and self._source[1]:
            # shuffled: epoch e has the e-th reshuffle of the stream, so a resumed run
            # replays the stream from its start and skips the batches already trained on
            done = self._epoch * spe + self._skip_on_resume
            ds = ds.take(spe).repeat(self.num_epochs).skip(done)
            self._epoch_step, self._skip_on_resume = self._skip_on_resume, 0
        elif spe and spe > 0:
            ds = ds.take(spe).repeat(self.num_epochs - self._epoch)
            if self._skip_on_resume:
                ds = ds.skip(self._skip_on_resume)
                self._epoch_step, self._skip_on_resume = self._skip_on_resume, 0
        if self._prefetch:
            ds = ds.prefetch(self._prefetch)
        return iter(ds)

    def _finish(self) -> None:
        self._stopped = True
        if self._iterator is not None and self._started:
            self.callbacks.call("on_epoch_end", self._epoch, self._float_logs(self._last_logs))
        # Kept, not dropped: destroying a tf.data iterator in the middle of its stream
        # waits for its background threads, which took 1.2 s on a rank with one core.
        self._spent_iterator, self._iterator = self._iterator, None
        self._checkpointer.save(self.global_step, **self._checkpoint_meta())
        if self._started:
            if self._timeline:
                dist.stop_timeline()
            self.callbacks.call("on_train_end", self._float_logs(self._last_logs))

    @staticmethod
    def _float_logs(logs: dict) -> dict:
        return {k: float(v) for k, v in logs.items()}

    def _log(self, step: int, logs: dict) -> dict:
        """Logs on rank 0; returns the logs as floats plus the learning rate and, once a
        step after the compiling one was timed, samples/s."""
        now = time.perf_counter()
        timed_steps = step - self._log_step0
        record = self._float_logs(logs)
        record["learning_rate"] = optim.current_learning_rate(self.optimizer)
        rate_text = ""
        if timed_steps > 0 and now > self._log_t0:
            record["samples_per_sec"] = (timed_steps * self.batch_size * self.size
                                         / (now - self._log_t0))
            rate_text = f" ({record['samples_per_sec']:.0f} samples/s)"
        self._log_t0, self._log_step0 = now, step
        if self.rank == 0:
            parts = " ".join(f"{k}={v:.4f}" for k, v in self._float_logs(logs).items())
            logger.info("step %d: %s%s", step, parts, rate_text)
        return record

    def _log_validation(self, metrics: list) -> None:
        if self.rank == 0:
            logger.info("step %d validation: %s", self.global_step,
                        " ".join(f"{k}={v:.4f}" for k, v in metrics))
        self.callbacks.call("on_test_end", {f"val_{k}": v for k, v in metrics})
        self._log_t0 = time.perf_counter()  # keep evaluation time out of samples/s
