"""TensorLayer's ``DistributedSession`` and ``StopAtTimeHook`` on TF2's parameter-server
strategy: start or serve a task, schedule steps on workers, stop, checkpoint."""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import tensorflow as tf

from hvdtrain.backends.ps.cluster import TaskSpec, TaskSpecDef
from hvdtrain.internals import tensorflow_private
from hvdtrain.checks import positive_int, positive_number
from hvdtrain.checkpoint import SaveCadence
from hvdtrain.options import CheckpointOptions, ClusterOptions

logger = logging.getLogger("hvdtrain")


class StopAtTimeHook:
    """Asks the session to stop once ``time_running`` seconds have passed since ``begin``."""

    def __init__(self, time_running: float) -> None:
        self._time_running = positive_number(time_running, "time_running", of="seconds")
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
                 save_checkpoint_secs: float | None = CheckpointOptions.every_secs,
                 save_checkpoint_steps: int | None = None, max_steps: int | None = None, *,
                 keep_checkpoint_max: int = CheckpointOptions.keep_max, strategy: Any = None,
                 connect_timeout: float = ClusterOptions.connect_timeout,
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
                positive_int(value, name)
        positive_int(keep_checkpoint_max, "keep_checkpoint_max")
        positive_number(save_checkpoint_secs, "save_checkpoint_secs", optional=True)
        positive_number(connect_timeout, "connect_timeout")
        self.task_spec = task_spec
        self.checkpoint_dir = checkpoint_dir
        self.hooks = list(hooks or []) + list(chief_only_hooks or [])
        self._cadence = SaveCadence(save_checkpoint_steps, save_checkpoint_secs)
        self._keep = keep_checkpoint_max
        self.max_steps = max_steps
        self.strategy = strategy
        self._connect_timeout = connect_timeout
        self.stop_condition = stop_condition
        self.coordinator = None
        self._server = None
        self._stop = False
        self.step = 0
        self._manager = None

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
        return tensorflow_private.num_workers(self.strategy)

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
                    or (self.stop_condition is not None and self.stop_condition()))

    @property
    def stop_requested(self) -> bool:
        """True once a hook called :meth:`request_stop`."""
        return self._stop

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
        return self.save(step) if self._cadence.due(step) else None

    def save(self, step: int | None = None) -> str | None:
        """Waits for the scheduled steps, then saves (a consistent snapshot)."""
        if self._manager is None:
            return None
        self.join()
        self._cadence.saved()
        return self._manager.save(checkpoint_number=self.step if step is None else step)

    def close(self) -> None:
        """Waits for the scheduled steps and saves a last checkpoint."""
        if self.coordinator is not None:
            self.join()
            self.save()
