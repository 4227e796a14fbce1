"""Parameter-server training: TensorLayer's ``DistributedSession`` and ``Trainer`` on TF2.

Built on ``tf.distribute.experimental.ParameterServerStrategy`` and a ``ClusterCoordinator``
over real ``tf.distribute.Server`` processes (see :mod:`hvdtrain.cluster` for how a
TensorLayer cluster maps onto TF2). The same user script runs on every task: on ``ps``
tasks and workers, :class:`DistributedSession` (and so
``Trainer(..., strategy="parameter_server")``) starts the task's server and blocks serving;
on the master it connects to the cluster, and the steps it schedules run asynchronously on
the workers against variables that live on the parameter servers.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from hvdtrain import building, data, optim
from hvdtrain.cluster import TaskSpec, TaskSpecDef
from hvdtrain.trainer import TrainingLoop, _make_optimizer, _positive_int, setup_logging

logger = logging.getLogger("hvdtrain")

# Trainer arguments that only the Horovod backend implements, with their defaults.
HOROVOD_ONLY = {"compression": None, "op": "average", "backward_passes_per_step": 1,
                "sparse_as_dense": False, "compression_ratio": None, "timeline": None,
                "mixed_precision": None, "warmup_steps": 0, "warmup_epochs": 0,
                "nan_policy": "stop", "callbacks": None, "log_dir": None, "progress_bar": None}


class StopAtTimeHook:
    """Asks the session to stop once ``time_running`` seconds have passed since ``begin``."""

    def __init__(self, time_running: float) -> None:
        if isinstance(time_running, bool) or not isinstance(time_running, (int, float)) \
                or not time_running > 0:
            raise ValueError(f"time_running must be a positive number of seconds, got "
                             f"{time_running!r}")
        self._time_running = float(time_running)
        self._end_time = math.inf

    def begin(self) -> None:
        """Starts the clock."""
        self._end_time = time.monotonic() + self._time_running

    def after_run(self, session: "DistributedSession", result: Any) -> None:
        """Requests a stop when the time is up."""
        if time.monotonic() > self._end_time:
            session.request_stop()


class DistributedSession:
    """TensorLayer's ``DistributedSession`` in TF2: connect, schedule, stop, checkpoint.

    ``with DistributedSession(task_spec) as session:`` blocks serving on ``ps`` and worker
    tasks; on the master it yields a session whose ``run(fn, *args)`` schedules ``fn`` on
    a worker, ``scope()`` creates variables on the parameter servers, and ``should_stop()``
    turns True once a hook asks for it or ``max_steps`` steps were scheduled.

    Args:
        task_spec: the task; ``None`` reads :func:`hvdtrain.cluster.TaskSpec` from the
            environment.
        checkpoint_dir: the master restores what :meth:`track` names from here and saves
            it every ``save_checkpoint_secs`` / ``save_checkpoint_steps`` and at the end.
        hooks, chief_only_hooks: objects with optional ``begin()`` and
            ``after_run(session, result)`` (e.g. :class:`StopAtTimeHook`); only the master
            runs steps, so both lists run there.
        max_steps: stop after this many scheduled steps.
        strategy: a ready ``ParameterServerStrategy`` (this process is its coordinator)
            instead of a task spec.
        connect_timeout: seconds to wait for the other tasks' servers.
        stop_condition: an extra ``() -> bool`` that ``should_stop()`` consults.
    """

    def __init__(self, task_spec: TaskSpecDef | None = None, checkpoint_dir: str | None = None,
                 hooks: list | None = None, chief_only_hooks: list | None = None,
                 save_checkpoint_secs: float | None = 600,
                 save_checkpoint_steps: int | None = None, max_steps: int | None = None, *,
                 keep_checkpoint_max: int = 5, strategy: Any = None,
                 connect_timeout: float = 300.0,
                 stop_condition: Callable[[], bool] | None = None) -> None:
        if task_spec is not None and not isinstance(task_spec, TaskSpecDef):
            raise TypeError(f"task_spec must be a TaskSpecDef or None, got "
                            f"{type(task_spec).__name__}")
        if strategy is not None and not isinstance(
                strategy, tf.distribute.experimental.ParameterServerStrategy):
            raise TypeError("strategy must be a tf.distribute.experimental.ParameterServerStrategy,"
                            f" got {type(strategy).__name__}")
        for name, value in (("save_checkpoint_steps", save_checkpoint_steps),
                            ("max_steps", max_steps)):
            if value is not None:
                _positive_int(value, name)
        _positive_int(keep_checkpoint_max, "keep_checkpoint_max")
        if save_checkpoint_secs is not None and not (
                isinstance(save_checkpoint_secs, (int, float)) and save_checkpoint_secs > 0):
            raise ValueError(f"save_checkpoint_secs must be None or a positive number, got "
                             f"{save_checkpoint_secs!r}")
        if not (isinstance(connect_timeout, (int, float)) and connect_timeout > 0):
            raise ValueError(f"connect_timeout must be a positive number, got {connect_timeout!r}")
        self.task_spec = task_spec
        self.checkpoint_dir = checkpoint_dir
        self.hooks = list(hooks or []) + list(chief_only_hooks or [])
        self._save_secs, self._save_steps = save_checkpoint_secs, save_checkpoint_steps
        self._keep = keep_checkpoint_max
        self.max_steps = max_steps
        self.strategy = strategy
        self._connect_timeout = connect_timeout
        self._stop_condition = stop_condition
        self.coordinator = None
        self._server = None
        self._stop = False
        self.step = 0
        self._manager = None
        self._last_save = time.monotonic()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "DistributedSession":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()

    def start(self) -> None:
        """Serves forever on ``ps``/worker tasks; connects to the cluster on the master."""
        if self.coordinator is not None:
            return
        if self.strategy is None:
            spec = self.task_spec if self.task_spec is not None else TaskSpec()
            if spec is None or not spec.distributed:
                raise ValueError("parameter-server training needs a cluster: set TF_CONFIG (or "
                                 "JOB_NAME, TASK_INDEX, PS_HOSTS, WORKER_HOSTS, MASTER_HOST), "
                                 "pass task_spec=TaskSpecDef(...), or start the job with "
                                 "scripts/launch_ps.py")
            if spec.is_evaluator():
                raise ValueError("this task is the evaluator: it takes no part in training; "
                                 "run an evaluation loop on it instead")
            self.task_spec = spec
            if not spec.is_master():
                logger.info("%s %d: serving", spec.type, spec.index)
                spec.serve()  # never returns
            self._server = spec.create_server()  # the master is TF2 worker 0 as well
            spec.wait_for_servers(self._connect_timeout)
            self.strategy = tf.distribute.experimental.ParameterServerStrategy(
                spec.cluster_resolver())
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        for hook in self.hooks:
            getattr(hook, "begin", lambda: None)()

    @property
    def num_workers(self) -> int:
        """Workers the coordinator schedules steps on."""
        return int(self.strategy.extended._num_workers)  # set from the cluster spec

    def scope(self):
        """The strategy's scope: variables created in it live on the parameter servers."""
        return self.strategy.scope()

    # ------------------------------------------------------------------ steps
    def schedule(self, fn: Callable, args: tuple = (), kwargs: dict | None = None):
        """Schedules ``fn`` (a ``tf.function``) on a free worker; returns its ``RemoteValue``."""
        return self.coordinator.schedule(fn, args=args, kwargs=kwargs)

    def run(self, fn: Callable, *args, **kwargs):
        """Schedules one step, runs the hooks, saves when due; returns the ``RemoteValue``."""
        if not isinstance(fn, tf.types.experimental.GenericFunction):
            fn = tf.function(fn)
        result = self.schedule(fn, args, kwargs)
        self.step += 1
        for hook in self.hooks:
            getattr(hook, "after_run", lambda s, r: None)(self, result)
        self.maybe_save(self.step)
        return result

    def join(self) -> None:
        """Waits for every scheduled step; raises the first error a step raised."""
        self.coordinator.join()

    def should_stop(self) -> bool:
        """True once a stop was requested or ``max_steps`` steps were scheduled."""
        return bool(self._stop or (self.max_steps is not None and self.step >= self.max_steps)
                    or (self._stop_condition is not None and self._stop_condition()))

    def request_stop(self) -> None:
        """Makes ``should_stop()`` True."""
        self._stop = True

    # ------------------------------------------------------------------ checkpoints
    def track(self, **trackables) -> str | None:
        """Checkpoints ``trackables`` in ``checkpoint_dir`` (on the master); restores the
        latest checkpoint into them. Returns its path, or ``None``."""
        if not self.checkpoint_dir:
            return None
        checkpoint = tf.train.Checkpoint(**trackables)
        self._manager = tf.train.CheckpointManager(checkpoint, self.checkpoint_dir,
                                                   max_to_keep=self._keep)
        latest = self._manager.latest_checkpoint
        if latest:
            checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def maybe_save(self, step: int) -> str | None:
        """Saves when ``save_checkpoint_steps`` or ``save_checkpoint_secs`` says so."""
        if self._manager is None:
            return None
        due = (self._save_steps and step % self._save_steps == 0) or (
            self._save_secs and time.monotonic() - self._last_save >= self._save_secs)
        return self.save(step) if due else None

    def save(self, step: int | None = None) -> str | None:
        """Waits for the scheduled steps, then saves (a consistent snapshot)."""
        if self._manager is None:
            return None
        self.join()
        self._last_save = time.monotonic()
        return self._manager.save(checkpoint_number=self.step if step is None else step)

    def close(self) -> None:
        """Waits for the scheduled steps and saves a last checkpoint."""
        if self.coordinator is not None:
            self.join()
            self.save()


class _RemoteScalar:
    """One entry of a step's logs; ``fetch()`` waits for that step and returns a float."""

    def __init__(self, remote, key: str) -> None:
        self._remote, self._key = remote, key

    def fetch(self) -> float:
        return float(self._remote.fetch()[self._key])

    def __float__(self) -> float:
        return self.fetch()

    def __repr__(self) -> str:
        return f"<remote {self._key}>"



def _atomic_iterations(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes ``optimizer.iterations`` count every asynchronous step.

    Keras 3 (3.15) increments it with ``Variable.assign_add``, which is ``assign(self +
    value)``: a read and a write, so two workers stepping at once lose a count (measured:
    ~290 of 376 steps counted with 2 workers). The weights and slots are updated through
    the ``tf.Variable``'s own atomic ``assign_add``/``assign_sub`` and do not race. Here the
    counter's increment goes to its ``tf.Variable`` the same way."""
    counter = optimizer.iterations
    counter.assign_add = lambda value: counter.value.assign_add(
        tf.cast(value, counter.value.dtype))


class ParameterServerTrainer(TrainingLoop):
    """``Trainer(..., strategy="parameter_server")``: asynchronous parameter-server training.

    Takes the Horovod :class:`hvdtrain.Trainer`'s arguments where they make sense. Every
    worker reads its own shard of ``training_dataset`` (sharded by TF2 worker index, which
    is TensorLayer's ``shard_index``), shuffled, batched and repeated. One "global step"
    (``train_on_batch()``) schedules ``size`` steps of ``batch_size`` examples, one per
    worker on average; each worker applies its gradients to the variables on the parameter
    servers as soon as it has them (asynchronous SGD), so ``global_step`` counts these
    rounds and each worker runs ``max_iteration // size`` steps (TensorLayer's meaning).
    Logging, validation and checkpoints happen on the master.

    Extra args:
        strategy: ``"parameter_server"`` or a ready ``ParameterServerStrategy``.
        task_spec: the cluster task (default: :func:`hvdtrain.cluster.TaskSpec`).
        connect_timeout: seconds to wait for the other tasks' servers.

    Raises:
        ValueError: a Horovod-only argument with a non-default value (named), or a bad
            argument as in the Horovod Trainer.
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
                 keep_checkpoint_max: int = 5, strategy: Any = "parameter_server",
                 task_spec: TaskSpecDef | None = None, connect_timeout: float = 300.0,
                 **horovod_only) -> None:
        self._check_horovod_only(horovod_only)
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.log_step_size = _positive_int(log_step_size, "log_step_size")
        self.num_epochs = _positive_int(num_epochs, "num_epochs")
        if prefetch_size is not None and (isinstance(prefetch_size, bool)
                                          or not isinstance(prefetch_size, int) or prefetch_size < 0):
            raise ValueError(f"prefetch_size must be None or an integer >= 0, got {prefetch_size!r}")
        if not isinstance(max_iteration, (int, float)) or isinstance(max_iteration, bool) \
                or not max_iteration > 0:
            raise ValueError(f"max_iteration must be a positive number, got {max_iteration!r}")
        if (build_training_func is None) == (model is None):
            raise ValueError("give exactly one of build_training_func=... or model=... (with loss=...)")
        data.check_dataset(training_dataset, "training_dataset")
        if validation_dataset is not None:
            data.check_dataset(validation_dataset, "validation_dataset")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be None or an integer, got {seed!r}")
        setup_logging(0)  # only the master gets here: the other tasks serve

        # --- the cluster: serve forever on ps/worker tasks, connect on the master ---
        self.session = DistributedSession(
            task_spec, checkpoint_dir, save_checkpoint_secs=save_checkpoint_secs,
            save_checkpoint_steps=save_checkpoint_steps, keep_checkpoint_max=keep_checkpoint_max,
            strategy=None if isinstance(strategy, str) else strategy,
            connect_timeout=connect_timeout, stop_condition=self.should_stop)
        self.session.start()
        self.strategy = self.session.strategy
        self.rank, self.size = 0, self.session.num_workers

        self.steps_per_epoch = self._steps_per_epoch(training_dataset)
        self.max_steps = max_iteration // self.size if math.isfinite(max_iteration) else math.inf
        if self.max_steps < 1:
            raise ValueError(f"max_iteration={max_iteration} gives no step on each of {self.size} "
                             "workers (each worker runs max_iteration // size steps)")
        if self.steps_per_epoch is None and not math.isfinite(self.max_steps):
            raise ValueError("training_dataset has an unknown or infinite length: set "
                             "max_iteration (workers repeat their shard and cannot signal its end)")
        self.total_steps = (min(self.max_steps, self.steps_per_epoch * self.num_epochs)
                            if self.steps_per_epoch else self.max_steps)

        # --- variables on the parameter servers ---
        with self.session.scope():
            if model is not None:
                self._network, self._program = model, building.model_program(
                    model, loss, training_dataset.element_spec)
            else:
                self._network, self._program = building.build_training_program(
                    build_training_func, training_dataset.element_spec)
            self.optimizer = self._optimizer_in_scope(optimizer, optimizer_args)
            self._trainable = self._program.trainable_variables
            if not self._trainable:
                raise ValueError("the network has no trainable variables")
            self.optimizer.build(self._trainable)
            _atomic_iterations(self.optimizer)
            self._applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="worker_steps")
        self._check_placement()
        self._lr_rule = lr_scaling if scaling_learning_rate else "none"
        self.lr_scale = optim.lr_scale_factor(self.size, self._lr_rule)
        optim.scale_learning_rate(self.optimizer, self.lr_scale)
        lr = self.optimizer._learning_rate
        configured_lr = float(lr.numpy()) if hasattr(lr, "assign") else None
        self.restored_from = self.session.track(program=self._program, optimizer=self.optimizer,
                                                worker_steps=self._applied)
        if self.restored_from and configured_lr is not None:
            lr.assign(configured_lr)  # the configured (scaled) learning rate wins
        self._global_step = int(self._applied.numpy()) // self.size

        self._validation_dataset = validation_dataset
        self._build_validation_func = build_validation_func
        self._validation_program = None
        self._iterator = iter(self.session.coordinator.create_per_worker_dataset(
            self._per_worker_dataset_fn(training_dataset, shuffle_buffer_size, seed,
                                        self.batch_size if prefetch_size is None else prefetch_size)))
        self._step_fn = tf.function(self._worker_step)
        self.stop_training = False
        self._stopped = False
        self._last = None
        self._log_t0 = self._log_step0 = None
        if self.restored_from:
            logger.info("resumed from %s at step %d", self.restored_from, self._global_step)

    # ------------------------------------------------------------------ public API
    @property
    def global_step(self) -> int:
        """Rounds scheduled so far (each is ``size`` worker steps)."""
        return self._global_step

    @property
    def training_network(self) -> keras.layers.Layer:
        """The network returned by the build function (or the model given)."""
        return self._network

    @property
    def epoch(self) -> int:
        """The current pass over the data (0-based)."""
        if not self.steps_per_epoch:
            return 0
        return min(self._global_step // self.steps_per_epoch, self.num_epochs - 1)

    @property
    def variable_devices(self) -> dict:
        """``{variable path: device}`` of the model's and optimizer's variables."""
        return {v.path: v.value.device for v in
                list(self._program.variables) + list(self.optimizer.variables)}

    def should_stop(self) -> bool:
        """True when every round was scheduled or ``stop_training`` was set."""
        if self._stopped:
            return True
        if self._global_step >= self.total_steps or self.stop_training or self.session._stop:
            self._finish()
        return self._stopped

    def train_on_batch(self) -> dict:
        """Schedules one round (``size`` worker steps) and returns the logs of its last
        step, as values with ``fetch()`` (which waits for that step).

        Raises:
            RuntimeError: training has already ended.
        """
        if self.should_stop():
            raise RuntimeError("training has ended (should_stop() is True): no batch left to train on")
        if self._log_t0 is None:
            self._log_t0, self._log_step0 = time.perf_counter(), self._global_step
        for _ in range(self.size):
            self._last = self.session.schedule(self._step_fn, args=(self._iterator,))
        self._global_step += 1
        if self._global_step % self.log_step_size == 0:
            self._log(self._global_step)
        self.session.maybe_save(self._global_step)
        return {k: _RemoteScalar(self._last, k) for k in self._program.output_keys}

    def join(self) -> None:
        """Waits for every scheduled step; raises the first error a worker hit."""
        self.session.join()

    @property
    def validation_metrics(self) -> list:
        """``[(name, mean)]`` over the whole validation set, computed on the master after
        the scheduled steps are done, with the variables read from the parameter servers."""
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        self.join()
        if self._validation_program is None:
            spec = self._validation_dataset.element_spec
            self._validation_program = (building.build_validation_program(
                self._build_validation_func, spec, self._network)
                if self._build_validation_func is not None else self._program)
            program = self._validation_program
            self._eval_step = tf.function(lambda x, y: program([x, y], training=False))
        sums: dict = {}
        count = 0
        for x, y in self._validation_dataset.batch(max(self.batch_size, 256)):
            n = int(tf.shape(y)[0])
            for k, v in self._eval_step(x, y).items():
                sums[k] = sums.get(k, 0.0) + float(v) * n
            count += n
        return [(k, sums.get(k, 0.0) / count if count else 0.0)
                for k in sorted(self._validation_program.output_keys)]

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _check_horovod_only(options: dict) -> None:
        unknown = sorted(set(options) - set(HOROVOD_ONLY))
        if unknown:
            raise TypeError(f"ParameterServerTrainer got unexpected argument(s) {unknown}")
        bad = sorted(k for k, v in options.items()
                     if v != HOROVOD_ONLY[k] and not (k == "progress_bar" and v is False)
                     and not (k == "callbacks" and v == []))
        if bad:
            raise ValueError(f"{', '.join(bad)} only work(s) with the Horovod backend; "
                             "strategy='parameter_server' does not support them: leave them at "
                             "their defaults")

    def _steps_per_epoch(self, dataset: tf.data.Dataset) -> int | None:
        n = data.known_steps(dataset)  # unbatched: examples
        if n is None or n < 0:
            return None
        per_worker = n // self.size  # the smallest shard
        if per_worker == 0:
            raise ValueError(f"training_dataset has {n} examples: it needs at least {self.size} "
                             f"for {self.size} workers")
        return math.ceil(per_worker / self.batch_size)

    def _optimizer_in_scope(self, optimizer, optimizer_args) -> keras.optimizers.Optimizer:
        """An optimizer whose variables live on the parameter servers: an instance made
        outside the scope is re-created from its config inside it."""
        opt = _make_optimizer(optimizer, optimizer_args)
        if isinstance(optimizer, keras.optimizers.Optimizer):
            if opt.built:
                raise ValueError("optimizer is an instance that is already built (it has slot "
                                 "variables off the parameter servers); pass an unbuilt "
                                 "instance, or a class with optimizer_args")
            opt = type(opt).from_config(opt.get_config())
        return opt

    def _check_placement(self) -> None:
        off = [p for p, d in self.variable_devices.items() if "/job:ps" not in d]
        if off:
            raise ValueError(f"{len(off)} variable(s) are not on the parameter servers (e.g. "
                             f"{off[0]!r}): create the model inside the trainer (pass an unbuilt "
                             "model or a build function), not before it")

    def _per_worker_dataset_fn(self, dataset, shuffle_buffer_size, seed, prefetch):
        """The dataset each worker builds: the user's pipeline (serialized once here),
        its shard by worker index, shuffled, batched, repeated."""
        graph = tf.raw_ops.DatasetToGraphV2(
            input_dataset=tf.data.experimental.to_variant(dataset),
            external_state_policy=0, strip_device_assignment=True)  # 0: warn on state
        spec, size, batch = dataset.element_spec, self.size, self.batch_size

        def dataset_fn(_context):
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            ds = tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph),
                                                   spec)
            if size > 1:
                ds = ds.shard(size, index)
            if shuffle_buffer_size:
                # the same seed on every worker is fine: each shuffles its own shard
                ds = ds.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
            ds = ds.batch(batch).repeat()
            return ds.prefetch(prefetch) if prefetch else ds

        return tf.function(lambda: self.strategy.distribute_datasets_from_function(dataset_fn))

    def _worker_step(self, iterator):
        def step(x, y):
            with tf.GradientTape() as tape:
                outs = self._program([x, y], training=True)
                loss = tf.cast(outs[building.LOSS_KEY], tf.float32)
                if self._program.losses:
                    loss = loss + tf.cast(tf.add_n(self._program.losses), tf.float32)
            self.optimizer.apply(tape.gradient(loss, self._trainable), self._trainable)
            self._applied.assign_add(1)
            return {k: tf.cast(v, tf.float32) for k, v in outs.items()}

        x, y = next(iterator)
        return self.strategy.run(step, args=(x, y))

    def _finish(self) -> None:
        self._stopped = True
        self.session.join()
        self.session.save(self._global_step)
        logger.info("finished at step %d (%d worker steps applied)", self._global_step,
                    int(self._applied.numpy()))

    def _log(self, step: int) -> dict:
        logs = {k: float(v) for k, v in self._last.fetch().items()}
        now = time.perf_counter()
        text = " ".join(f"{k}={v:.4f}" for k, v in logs.items())
        if step > self._log_step0 and now > self._log_t0:
            logs["samples_per_sec"] = ((step - self._log_step0) * self.batch_size * self.size
                                       / (now - self._log_t0))
            text += f" ({logs['samples_per_sec']:.0f} samples/s)"
        self._log_t0, self._log_step0 = now, step
        logger.info("step %d: %s", step, text)
        return logs

    def _log_validation(self, metrics: list) -> None:
        logger.info("step %d validation: %s", self.global_step,
                    " ".join(f"{k}={v:.4f}" for k, v in metrics))
        self._log_t0, self._log_step0 = time.perf_counter(), self.global_step
