"""TaskSpecDef / TaskSpec: TensorLayer's meaning, the TF2 mapping, and bad cluster specs."""
import json

import pytest
import tensorflow as tf

from hvdtrain import TaskSpec, TaskSpecDef
from hvdtrain import ParameterServerTrainer, StopAtTimeHook

PS = ["10.0.0.1:2222", "10.0.0.2:2222"]
WORKERS = ["10.0.0.3:2222", "10.0.0.4:2222", "10.0.0.5:2222"]
MASTER = "10.0.0.9:2222"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in ("TF_CONFIG", "JOB_NAME", "TASK_INDEX", "PS_HOSTS", "WORKER_HOSTS", "MASTER_HOST"):
        monkeypatch.delenv(key, raising=False)


# ------------------------------------------------------------------ TensorLayer's meaning
def test_without_master_worker0_is_the_master():
    specs = [TaskSpecDef("worker", i, None, PS, WORKERS) for i in range(3)]
    assert [s.is_master() for s in specs] == [True, False, False]
    assert [s.shard_index for s in specs] == [0, 1, 2]
    assert all(s.num_workers == 3 and s.num_ps == 2 for s in specs)
    assert all(s.is_worker() and not s.is_ps() and not s.is_evaluator() for s in specs)
    # TF2: the same three workers; worker 0's process also coordinates.
    assert specs[0].tf2_cluster() == {"ps": PS, "worker": WORKERS}
    assert [s.tf2_task() for s in specs] == [("worker", 0), ("worker", 1), ("worker", 2)]


def test_a_master_is_a_worker_too():
    master = TaskSpecDef("master", 0, None, PS, WORKERS, MASTER)
    workers = [TaskSpecDef("worker", i, None, PS, WORKERS, MASTER) for i in range(3)]
    assert master.is_master() and not any(w.is_master() for w in workers)
    assert master.num_workers == 4 and master.shard_index == 0
    assert [w.shard_index for w in workers] == [1, 2, 3]
    assert master.tf2_cluster()["worker"] == [MASTER] + WORKERS
    assert master.tf2_task() == ("worker", 0)
    assert [w.tf2_task() for w in workers] == [("worker", 1), ("worker", 2), ("worker", 3)]


def test_ps_tasks():
    ps = TaskSpecDef("ps", 1, "trial-7", ",".join(PS), ",".join(WORKERS))
    assert ps.is_ps() and not ps.is_worker() and not ps.is_master()
    assert ps.ps_hosts == PS and ps.worker_hosts == WORKERS  # comma-separated strings
    assert ps.tf2_task() == ("ps", 1) and ps.trial == "trial-7"


def test_single_process_spec():
    spec = TaskSpecDef()
    assert spec.is_master() and spec.num_workers == 1 and spec.shard_index == 0
    assert not spec.distributed and spec.device_fn() is None


def test_chief_is_an_alias_of_master():
    spec = TaskSpecDef("chief", 0, None, PS, WORKERS, [MASTER])
    assert spec.type == "master" and spec.is_master() and spec.master == MASTER


def test_last_worker_as_evaluator():
    specs = [TaskSpecDef("worker", i, None, PS, WORKERS).use_last_worker_as_evaluator()
             for i in range(3)]
    assert [s.is_evaluator() for s in specs] == [False, False, True]
    assert all(s.num_workers == 2 for s in specs)
    assert specs[2].tf2_task() is None  # the evaluator is left out of the TF2 cluster
    assert specs[0].tf2_cluster()["worker"] == WORKERS[:2]
    with_master = TaskSpecDef("worker", 2, None, PS, WORKERS, MASTER)
    assert with_master.use_last_worker_as_evaluator().is_evaluator()
    assert with_master.user_last_worker_as_evaluator().num_workers == 3  # TL's spelling
    with pytest.raises(ValueError, match="at least 2 training workers, the cluster has 1"):
        TaskSpecDef("worker", 0, None, PS, WORKERS[:1]).use_last_worker_as_evaluator()


def test_device_fn_puts_variables_on_ps_and_ops_on_the_task():
    spec = TaskSpecDef("worker", 1, None, PS, WORKERS)
    with tf.Graph().as_default():
        with tf.compat.v1.device(spec.device_fn()):
            v1 = tf.compat.v1.Variable(1.0, name="a")
            v2 = tf.compat.v1.Variable(2.0, name="b")
            op = tf.add(v1, v2)
    assert {v1.device, v2.device} == {"/job:ps/task:0", "/job:ps/task:1"}  # round robin
    assert op.device == "/job:worker/task:1"


def test_cluster_spec_has_tensorlayers_jobs():
    spec = TaskSpecDef("master", 0, None, PS, WORKERS, MASTER).cluster_spec().as_dict()
    assert spec == {"ps": PS, "worker": WORKERS, "master": [MASTER]}


def test_cluster_resolver_adds_a_coordinator_on_the_master_host():
    spec = TaskSpecDef("worker", 0, None, ["127.0.0.1:2001"], ["127.0.0.1:2002", "127.0.0.1:2003"])
    resolver = spec.cluster_resolver(coordinator_port=2999)
    assert resolver.task_type == "chief" and resolver.task_id == 0
    assert resolver.cluster_spec().as_dict() == {
        "chief": ["127.0.0.1:2999"], "ps": ["127.0.0.1:2001"],
        "worker": ["127.0.0.1:2002", "127.0.0.1:2003"]}
    with pytest.raises(ValueError, match="for the master task"):
        TaskSpecDef("worker", 1, None, PS, WORKERS).cluster_resolver()


def test_wait_for_servers_names_the_missing_tasks():
    spec = TaskSpecDef("master", 0, None, ["127.0.0.1:9"], ["127.0.0.1:10"], "127.0.0.1:11")
    with pytest.raises(TimeoutError, match=r"ps 0 at 127.0.0.1:9, worker 1 at 127.0.0.1:10"):
        spec.wait_for_servers(timeout=0.5)


# ------------------------------------------------------------------ from the environment
def test_taskspec_is_none_without_environment():
    assert TaskSpec() is None


def test_taskspec_from_tf_config_round_trips(monkeypatch):
    original = TaskSpecDef("worker", 2, "t1", PS, WORKERS, MASTER)
    monkeypatch.setenv("TF_CONFIG", json.dumps(original.tf_config()))
    spec = TaskSpec()
    assert (spec.type, spec.index, spec.trial, spec.ps_hosts, spec.worker_hosts, spec.master) == \
        ("worker", 2, "t1", PS, WORKERS, MASTER)
    assert spec.shard_index == 3 and spec.num_workers == 4


def test_taskspec_from_tf2_style_tf_config_with_chief(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": [MASTER], "ps": PS, "worker": WORKERS},
        "task": {"type": "chief", "index": 0}}))
    spec = TaskSpec()
    assert spec.is_master() and spec.master == MASTER and spec.num_workers == 4


def test_taskspec_from_tensorport_variables(monkeypatch):
    monkeypatch.setenv("JOB_NAME", "worker")
    monkeypatch.setenv("TASK_INDEX", "1")
    monkeypatch.setenv("PS_HOSTS", ",".join(PS))
    monkeypatch.setenv("WORKER_HOSTS", ",".join(WORKERS))
    spec = TaskSpec()
    assert spec.is_worker() and spec.index == 1 and spec.shard_index == 1
    assert spec.master is None and not spec.is_master()
    monkeypatch.setenv("MASTER_HOST", MASTER)
    assert TaskSpec().shard_index == 2


@pytest.mark.parametrize("tf_config, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "TF_CONFIG must be a JSON object"),
    ('{"task": {"index": 0}, "cluster": {}}', "'task' must be an object with 'type'"),
    ('{"task": {"type": "worker"}, "cluster": ["a:1"]}', "'cluster' must be an object"),
    ('{"task": {"type": "worker"}, "cluster": {"ps": ["a:1"], "wrker": ["b:1"]}}',
     r"unknown job\(s\) \['wrker'\]"),
    ('{"task": {"type": "master"}, "cluster": {"ps": ["a:1"], "master": ["b:1"], '
     '"chief": ["c:1"]}}', "both 'master' and 'chief'"),
    ('{"task": {"type": "worker", "index": 5}, "cluster": {"ps": ["a:1"], "worker": ["b:1"]}}',
     "TF_CONFIG: index 5 is out of range for task type 'worker'"),
    ('{"task": {"type": "boss", "index": 0}, "cluster": {"ps": ["a:1"], "worker": ["b:1"]}}',
     "TF_CONFIG: task_type must be one of"),
])
def test_malformed_tf_config(monkeypatch, tf_config, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=message):
        TaskSpec()


def test_bad_task_index_variable(monkeypatch):
    monkeypatch.setenv("JOB_NAME", "worker")
    monkeypatch.setenv("TASK_INDEX", "one")
    with pytest.raises(ValueError, match="TASK_INDEX must be an integer >= 0, got 'one'"):
        TaskSpec()


# ------------------------------------------------------------------ bad cluster specs
@pytest.mark.parametrize("kwargs, message", [
    (dict(task_type="ps", index=0, ps_hosts=PS, worker_hosts=None),
     "worker_hosts is empty and there is no master: a cluster needs at least one worker"),
    (dict(task_type="worker", index=0, ps_hosts=None, worker_hosts=WORKERS),
     "ps_hosts is empty: a parameter-server cluster needs at least one ps host"),
    (dict(task_type="worker", index=0, ps_hosts=PS, worker_hosts=[WORKERS[0], WORKERS[0]]),
     r"duplicate host '10.0.0.3:2222': it is both worker_hosts\[0\] and worker_hosts\[1\]"),
    (dict(task_type="worker", index=0, ps_hosts=PS, worker_hosts=WORKERS, master=PS[1]),
     r"duplicate host '10.0.0.2:2222': it is both ps_hosts\[1\] and master"),
    (dict(task_type="worker", index=3, ps_hosts=PS, worker_hosts=WORKERS),
     r"index 3 is out of range for task type 'worker': worker_hosts has 3 task\(s\), so "
     r"index must be in 0..2"),
    (dict(task_type="ps", index=2, ps_hosts=PS, worker_hosts=WORKERS),
     r"index 2 is out of range for task type 'ps': ps_hosts has 2"),
    (dict(task_type="master", index=1, ps_hosts=PS, worker_hosts=WORKERS, master=MASTER),
     r"index 1 is out of range for task type 'master'"),
    (dict(task_type="worker", index=-1, ps_hosts=PS, worker_hosts=WORKERS),
     "index must be an integer >= 0, got -1"),
    (dict(task_type="driver", index=0), "task_type must be one of master, worker, ps, evaluator"),
    (dict(task_type="worker", index=0, ps_hosts=["10.0.0.1"], worker_hosts=WORKERS),
     "ps_hosts entries must be 'host:port' with a port in 1..65535, got '10.0.0.1'"),
    (dict(task_type="worker", index=0, ps_hosts=PS, worker_hosts=["w:99999"]),
     "worker_hosts entries must be 'host:port'.*got 'w:99999'"),
    (dict(task_type="worker", index=0, ps_hosts=PS, worker_hosts=7),
     "worker_hosts must be a list of 'host:port' strings or one comma-separated string"),
    (dict(task_type="master", index=0, ps_hosts=PS, worker_hosts=WORKERS,
          master=["10.0.0.8:1", "10.0.0.9:1"]), "master must be one 'host:port', got 2"),
    (dict(task_type="worker", index=0), "task_type 'worker' needs ps_hosts and worker_hosts"),
])
def test_bad_cluster_specs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskSpecDef(**kwargs)


# ------------------------------------------------------------------ the trainer's checks
def test_horovod_only_arguments_are_named(dataset, build):
    with pytest.raises(ValueError, match="compression, timeline only work.*Horovod backend"):
        ParameterServerTrainer(dataset, build, "sgd", {"learning_rate": 0.1},
                               compression="fp16", timeline="t.json")
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['colour'\]"):
        ParameterServerTrainer(dataset, build, "sgd", {"learning_rate": 0.1}, colour=1)


def test_trainer_without_a_cluster_says_how_to_start_one(dataset, build):
    with pytest.raises(ValueError, match="needs a cluster: set TF_CONFIG.*scripts/launch_ps.py"):
        ParameterServerTrainer(dataset, build, "sgd", {"learning_rate": 0.1})


def test_trainer_dispatch_and_argument_checks(dataset, build):
    import hvdtrain
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        hvdtrain.Trainer(dataset, build, "sgd", {"learning_rate": 0.1}, batch_size=0,
                         strategy="parameter_server")


def test_stop_at_time_hook_rejects_bad_time():
    with pytest.raises(ValueError, match="time_running must be a positive number"):
        StopAtTimeHook(0)
