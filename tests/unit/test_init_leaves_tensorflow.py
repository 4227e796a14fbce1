"""``init()`` leaves TensorFlow's context unstarted, as Horovod's does, so the thread and
device settings a Horovod script makes after it take effect; and the channel its
start-up uses instead of a TensorFlow collective (Horovod's own rendezvous server)."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from horovod.runner.http.http_server import RendezvousServer

from hvdtrain.horovod import bootstrap

ROOT = Path(__file__).resolve().parents[2]

# Each front door, then every setting Horovod scripts make after it, in their order.
SCRIPT = """
import json, sys
import tensorflow as tf
from hvdtrain.internals import tensorflow_private
door = sys.argv[1]
if door == "hvdtrain":
    import hvdtrain as hvd
elif door == "tensorflow":
    import hvdtrain.tensorflow as hvd
else:
    import hvdtrain.tensorflow.keras as hvd
hvd.init()
started = tensorflow_private.context_started()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
tf.config.threading.set_intra_op_parallelism_threads(3)
tf.config.threading.set_inter_op_parallelism_threads(5)
tf.config.set_soft_device_placement(False)
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 3)
tf.reduce_sum(tf.ones([4]))
print(json.dumps({"started_by_init": started,
                  "started_by_op": tensorflow_private.context_started(),
                  "intra": tf.config.threading.get_intra_op_parallelism_threads(),
                  "inter": tf.config.threading.get_inter_op_parallelism_threads(),
                  "soft": tf.config.get_soft_device_placement(),
                  "cpus": len(tf.config.list_logical_devices("CPU"))}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("door", ["hvdtrain", "tensorflow", "keras"])
def test_init_leaves_tensorflow_unstarted_and_later_settings_take_effect(door):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, door], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"started_by_init": False, "started_by_op": True, "intra": 3, "inter": 5,
                   "soft": False, "cpus": 3}


@pytest.fixture
def rendezvous(monkeypatch):
    """Horovod's own rendezvous server, where ``horovodrun --gloo`` points every rank."""
    server = RendezvousServer()
    port = server.start()
    server.init([])
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))
    yield
    server.stop()


@pytest.mark.timeout(30)
def test_gloo_ranks_get_rank_0s_value_through_horovods_rendezvous_server(rendezvous):
    got = {}

    def rank(r):
        got[r] = bootstrap.broadcast(["host", 1234, 30.0] if r == 0 else None, rank=r,
                                     mpi=False, key="test")

    others = [threading.Thread(target=rank, args=(r,)) for r in (1, 2)]
    for t in others:  # they wait for rank 0's value
        t.start()
    rank(0)
    for t in others:
        t.join(10)
    assert got == {r: ["host", 1234, 30.0] for r in (0, 1, 2)}


@pytest.mark.timeout(30)
def test_gloo_without_a_rendezvous_server_is_named(monkeypatch):
    monkeypatch.delenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", raising=False)
    with pytest.raises(bootstrap.Unavailable, match="HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        bootstrap.broadcast(1, rank=0, mpi=False, key="test")
