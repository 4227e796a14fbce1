"""Parameter-server cluster specs: TensorLayer's ``TaskSpecDef`` / ``TaskSpec`` in TF2 terms.

A cluster is ``ps_hosts``, ``worker_hosts`` and an optional ``master``, given as lists or
comma-separated ``host:port`` strings, from ``TF_CONFIG`` or from TensorPort's
``JOB_NAME`` / ``TASK_INDEX`` / ``PS_HOSTS`` / ``WORKER_HOSTS`` / ``MASTER_HOST``.

TensorLayer's numbers are kept: with a master, the master is a worker too
(``num_workers = len(worker_hosts) + 1``, the master has ``shard_index`` 0 and worker ``i``
has ``i + 1``); without one, worker 0 is the master and worker ``i`` has ``shard_index`` i.

TF2's ``ParameterServerStrategy`` needs a coordinator that schedules steps on worker
servers. hvdtrain maps TensorLayer's master onto it the same way in both cases: **the
master's process is the coordinator and also hosts one worker server in-process**, so the
TF2 worker list is ``[master] + worker_hosts`` (or ``worker_hosts`` when worker 0 is the
master), the TF2 worker index of every task is its ``shard_index``, and
``num_workers`` is the number of TF2 workers. The coordinator's own ``chief`` address is a
free port picked on the master's host when it starts. ``ps`` tasks and the other workers
only serve (:meth:`TaskSpecDef.serve` blocks). An evaluator (see
:meth:`TaskSpecDef.use_last_worker_as_evaluator`) is left out of the TF2 cluster.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

TYPES = ("master", "worker", "ps", "evaluator")
_ALIASES = {"chief": "master"}  # TF2's name for the task TensorLayer calls master


def parse_hosts(hosts: Any, name: str) -> list[str]:
    """``host:port`` entries from a list or a comma-separated string (``None``: empty).

    Raises:
        ValueError: naming ``name`` and the entry that is not ``host:port``.
    """
    if hosts is None:
        return []
    if isinstance(hosts, str):
        items = [h.strip() for h in hosts.split(",") if h.strip()]
    elif isinstance(hosts, (list, tuple)):
        items = list(hosts)
    else:
        raise ValueError(f"{name} must be a list of 'host:port' strings or one comma-separated "
                         f"string, got {type(hosts).__name__}")
    for h in items:
        host, sep, port = h.rpartition(":") if isinstance(h, str) else ("", "", "")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{name} entries must be 'host:port' with a port in 1..65535, "
                             f"got {h!r}")
    return items


class TaskSpecDef:
    """One task of a parameter-server cluster, with TensorLayer's meaning.

    Args:
        task_type: ``"master"`` (or TF2's ``"chief"``), ``"worker"``, ``"ps"`` or
            ``"evaluator"``.
        index: the zero-based index of the task within its type.
        trial: an identifier of the trial being run (kept, not used).
        ps_hosts, worker_hosts: ``host:port`` lists or comma-separated strings.
        master: the master's ``host:port`` (a string or a one-element list), or ``None``.
        evaluator: the ``host:port`` of a worker set aside for evaluation (see
            :meth:`use_last_worker_as_evaluator`).

    Raises:
        ValueError: a bad type or index, no workers, no parameter servers, a duplicate
            host, or a malformed ``host:port``; the message names the argument.
    """

    def __init__(self, task_type: str = "master", index: int = 0, trial: Any = None,
                 ps_hosts: Any = None, worker_hosts: Any = None, master: Any = None, *,
                 evaluator: str | None = None) -> None:
        if not isinstance(task_type, str) or _ALIASES.get(task_type, task_type) not in TYPES:
            raise ValueError(f"task_type must be one of {', '.join(TYPES)} (or 'chief'), got "
                             f"{task_type!r}")
        self.type = _ALIASES.get(task_type, task_type)
        try:
            self._index = int(index)
        except (TypeError, ValueError):
            raise ValueError(f"index must be an integer >= 0, got {index!r}") from None
        if self._index < 0 or isinstance(index, bool) or (isinstance(index, float)
                                                          and index != self._index):
            raise ValueError(f"index must be an integer >= 0, got {index!r}")
        self.trial = trial
        self.ps_hosts = parse_hosts(ps_hosts, "ps_hosts")
        self.worker_hosts = parse_hosts(worker_hosts, "worker_hosts")
        masters = parse_hosts([master] if isinstance(master, str) else master, "master")
        if len(masters) > 1:
            raise ValueError(f"master must be one 'host:port', got {len(masters)}: {masters}")
        self.master = masters[0] if masters else None
        self.evaluator = parse_hosts([evaluator], "evaluator")[0] if evaluator else None
        self._distributed = bool(self.ps_hosts or self.worker_hosts or self.master)
        if self._distributed:
            self._check_cluster()
        self._check_index()

    def _check_cluster(self) -> None:
        if not self.worker_hosts and not self.master:
            raise ValueError("worker_hosts is empty and there is no master: a cluster needs at "
                             "least one worker")
        if not self.ps_hosts:
            raise ValueError("ps_hosts is empty: a parameter-server cluster needs at least one "
                             "ps host")
        seen: dict[str, str] = {}
        named = ([(h, f"ps_hosts[{i}]") for i, h in enumerate(self.ps_hosts)]
                 + [(h, f"worker_hosts[{i}]") for i, h in enumerate(self.worker_hosts)]
                 + ([(self.master, "master")] if self.master else [])
                 + ([(self.evaluator, "evaluator")] if self.evaluator else []))
        for host, where in named:
            if host in seen:
                raise ValueError(f"duplicate host {host!r}: it is both {seen[host]} and {where}; "
                                 "every task needs its own host:port")
            seen[host] = where

    def _check_index(self) -> None:
        counts = {"ps": len(self.ps_hosts), "worker": len(self.worker_hosts),
                  "master": 1, "evaluator": 1}
        n = counts[self.type]
        if self.type == "worker" and self.evaluator:
            n += 1  # the worker set aside as evaluator keeps its index
        if self._distributed and self._index >= n:
            hosts = {"ps": "ps_hosts", "worker": "worker_hosts"}.get(self.type, self.type)
            raise ValueError(f"index {self._index} is out of range for task type {self.type!r}: "
                             f"{hosts} has {n} task(s), so index must be in 0..{n - 1}")
        if not self._distributed and self.type != "master":
            raise ValueError(f"task_type {self.type!r} needs ps_hosts and worker_hosts; without "
                             "a cluster only a 'master' task makes sense")

    # ------------------------------------------------------------- TensorLayer's meaning
    @property
    def index(self) -> int:
        """The zero-based index of this task within its type."""
        return self._index

    @property
    def num_ps(self) -> int:
        """The number of parameter servers."""
        return len(self.ps_hosts)

    @property
    def num_workers(self) -> int:
        """Workers that train: ``worker_hosts``, plus the master when there is one."""
        if not self._distributed:
            return 1
        return len(self.worker_hosts) + (1 if self.master else 0)

    @property
    def shard_index(self) -> int:
        """This task's data shard: 0 for the master, ``index + 1`` for workers with a
        master, ``index`` without one (also its TF2 worker index)."""
        if self.type == "worker" and self.master:
            return self._index + 1
        return self._index if self.type in ("worker", "ps") else 0

    def is_master(self) -> bool:
        """True on the master (TF2's coordinator): the master, or worker 0 without one."""
        if not self._distributed:
            return True
        if self.master:
            return self.type == "master"
        return self.type == "worker" and self._index == 0

    def is_ps(self) -> bool:
        """True on a parameter server."""
        return self.type == "ps"

    def is_worker(self) -> bool:
        """True on a worker task (the evaluator is a worker set aside)."""
        return self.type == "worker"

    def is_evaluator(self) -> bool:
        """True on the evaluator: the worker set aside by :meth:`use_last_worker_as_evaluator`
        (its index is ``len(worker_hosts)``) or a task of type ``"evaluator"``."""
        return self.type == "evaluator" or (self.type == "worker"
                                            and self._index == len(self.worker_hosts))

    def use_last_worker_as_evaluator(self) -> "TaskSpecDef":
        """A new spec without the last worker, which becomes the evaluator.

        Raises:
            ValueError: with fewer than two training workers, none can be spared.
        """
        if self.num_workers <= 1 or not self.worker_hosts:
            raise ValueError(f"use_last_worker_as_evaluator needs at least 2 training workers, "
                             f"the cluster has {self.num_workers}")
        return TaskSpecDef(self.type, self._index, self.trial, self.ps_hosts,
                           self.worker_hosts[:-1], self.master, evaluator=self.worker_hosts[-1])

    user_last_worker_as_evaluator = use_last_worker_as_evaluator  # TensorLayer's spelling

    def device_fn(self):
        """TensorLayer's device function: variables on ``/job:ps`` (round robin), other ops
        on this task. It is for ``tf.device`` in graph code (``tf.Graph().as_default()``);
        in TF2 the ``ParameterServerStrategy`` places variables itself."""
        import tensorflow as tf
        if not self._distributed:
            return None
        return tf.compat.v1.train.replica_device_setter(
            ps_device="/job:ps", worker_device=f"/job:{self.type}/task:{self._index}",
            cluster=self.cluster_spec())

    def cluster_spec(self):
        """TensorLayer's ``tf.train.ClusterSpec``: ``ps``, ``worker`` and ``master`` jobs."""
        import tensorflow as tf
        jobs = {"ps": self.ps_hosts, "worker": self.worker_hosts}
        if self.master:
            jobs["master"] = [self.master]
        return tf.train.ClusterSpec(jobs)

    # ------------------------------------------------------------- the TF2 mapping
    @property
    def distributed(self) -> bool:
        """False for the single-process spec (no hosts)."""
        return self._distributed

    def tf2_workers(self) -> list[str]:
        """TF2 worker hosts; position ``i`` is the task with ``shard_index`` i."""
        return ([self.master] if self.master else []) + list(self.worker_hosts)

    def tf2_cluster(self) -> dict:
        """The TF2 cluster of the servers: ``{"ps": [...], "worker": [...]}``."""
        return {"ps": list(self.ps_hosts), "worker": self.tf2_workers()}

    def tf2_task(self) -> tuple[str, int] | None:
        """The TF2 server this task hosts, as ``(job, index)``; ``None`` for the evaluator."""
        if self.is_evaluator():
            return None
        if self.is_ps():
            return "ps", self._index
        return "worker", self.shard_index

    def tf_config(self) -> dict:
        """This task as a ``TF_CONFIG`` dict (TensorLayer's form, which :func:`TaskSpec`
        reads back)."""
        cluster = {"ps": self.ps_hosts, "worker": self.worker_hosts}
        if self.master:
            cluster["master"] = [self.master]
        task: dict = {"type": self.type, "index": self._index}
        if self.trial is not None:
            task["trial"] = self.trial
        return {"cluster": cluster, "task": task}

    def create_server(self, protocol: str = "grpc"):
        """Starts this task's ``tf.distribute.Server`` (``None`` for the evaluator)."""
        import tensorflow as tf
        task = self.tf2_task()
        if task is None or not self._distributed:
            return None
        return tf.distribute.Server(tf.train.ClusterSpec(self.tf2_cluster()), job_name=task[0],
                                    task_index=task[1], protocol=protocol, start=True)

    def serve(self) -> None:
        """On a ``ps`` or non-master worker task: starts the server and blocks forever
        (the launcher ends the process when the master is done)."""
        if self.is_master() or self.is_evaluator():
            raise ValueError(f"serve() is for ps and worker tasks; this is the "
                             f"{'master' if self.is_master() else 'evaluator'}")
        self.create_server().join()

    def cluster_resolver(self, coordinator_port: int | None = None):
        """The coordinator's ``SimpleClusterResolver``: the TF2 cluster plus a ``chief`` job
        on the master's host at ``coordinator_port`` (a free one by default)."""
        import tensorflow as tf
        if not self.is_master() or not self._distributed:
            raise ValueError("cluster_resolver() is for the master task of a cluster")
        host = (self.master or self.worker_hosts[0]).rpartition(":")[0]
        port = coordinator_port or free_port(host)
        cluster = dict(self.tf2_cluster(), chief=[f"{host}:{port}"])
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")

    def wait_for_servers(self, timeout: float = 300.0) -> None:
        """Blocks until every other task's server accepts connections.

        Raises:
            TimeoutError: naming the tasks that did not come up within ``timeout`` seconds.
        """
        own = self.tf2_task()
        pending = {f"{job} {i} at {h}": h for job in ("ps", "worker")
                   for i, h in enumerate(self.tf2_cluster()[job]) if (job, i) != own}
        deadline = time.monotonic() + timeout
        while pending:
            for name, host in list(pending.items()):
                address, _, port = host.rpartition(":")
                try:
                    with socket.create_connection((address.strip("[]"), int(port)), timeout=1):
                        del pending[name]
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"parameter-server tasks not reachable after {timeout:g} s: "
                                   f"{', '.join(sorted(pending))}")
            if pending:
                time.sleep(0.2)

    def __repr__(self) -> str:
        return (f"TaskSpecDef(task_type={self.type!r}, index={self._index}, ps_hosts="
                f"{self.ps_hosts}, worker_hosts={self.worker_hosts}, master={self.master!r})")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` now (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now."""
    return free_ports(1, host)[0]


def _from_tf_config(text: str) -> TaskSpecDef:
    try:
        env = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON ({err}): {text[:200]!r}") from None
    if not isinstance(env, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got "
                         f"{type(env).__name__}")
    task = env.get("task") or {"type": "master", "index": 0}
    cluster = env.get("cluster") or {}
    if not isinstance(task, dict) or "type" not in task:
        raise ValueError(f"TF_CONFIG 'task' must be an object with 'type' and 'index', got "
                         f"{task!r}")
    if not isinstance(cluster, dict):
        raise ValueError(f"TF_CONFIG 'cluster' must be an object of job -> hosts, got {cluster!r}")
    unknown = sorted(set(cluster) - {"ps", "worker", "master", "chief", "evaluator"})
    if unknown:
        raise ValueError(f"TF_CONFIG 'cluster' has unknown job(s) {unknown}; expected ps, worker "
                         "and master (or chief)")
    if "master" in cluster and "chief" in cluster:
        raise ValueError("TF_CONFIG 'cluster' has both 'master' and 'chief': give one")
    master = cluster.get("master", cluster.get("chief"))
    try:
        return TaskSpecDef(task["type"], task.get("index", 0), task.get("trial"),
                           cluster.get("ps"), cluster.get("worker"), master)
    except ValueError as err:
        raise ValueError(f"TF_CONFIG: {err}") from None


def TaskSpec() -> TaskSpecDef | None:  # noqa: N802 - TensorLayer's name
    """This task's :class:`TaskSpecDef` from the environment, or ``None`` when unset.

    ``TF_CONFIG`` (``{"cluster": {"ps": [...], "worker": [...], "master": [...]},
    "task": {"type": ..., "index": ...}}``; ``chief`` may stand for ``master``) is read
    first, then TensorPort's ``JOB_NAME``, ``TASK_INDEX``, ``PS_HOSTS``, ``WORKER_HOSTS``,
    ``MASTER_HOST``.

    Raises:
        ValueError: a malformed ``TF_CONFIG`` or variable, naming it.
    """
    if os.environ.get("TF_CONFIG", "").strip():
        return _from_tf_config(os.environ["TF_CONFIG"])
    if "JOB_NAME" in os.environ:
        index = os.environ.get("TASK_INDEX", "0")
        if not index.strip().isdigit():
            raise ValueError(f"TASK_INDEX must be an integer >= 0, got {index!r}")
        try:
            return TaskSpecDef(os.environ["JOB_NAME"], int(index), None,
                               os.environ.get("PS_HOSTS"), os.environ.get("WORKER_HOSTS"),
                               os.environ.get("MASTER_HOST") or None)
        except ValueError as err:
            raise ValueError(f"JOB_NAME/TASK_INDEX/PS_HOSTS/WORKER_HOSTS/MASTER_HOST: {err}") \
                from None
    return None
