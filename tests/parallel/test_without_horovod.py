"""The tf.distribute and parameter-server backends never need Horovod: each trains in
processes where ``import horovod`` fails (a stub package first on ``PYTHONPATH`` raises
``ImportError``, in every process the launchers start)."""
import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, WORKERS
from test_tfdist_parallel import run_workers

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(400)]
BLOCKED = "horovod is blocked in this test: the backend must not import it"


@pytest.fixture
def no_horovod(tmp_path):
    """Environment variables that make ``import horovod`` raise in child processes."""
    stub = tmp_path / "blocked" / "horovod"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError({BLOCKED!r})\n")
    env = {"PYTHONPATH": os.pathsep.join([str(stub.parent), str(ROOT)]),
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    probe = subprocess.run([sys.executable, "-c", "import horovod"], env=dict(os.environ, **env),
                           capture_output=True, text=True)
    assert probe.returncode != 0 and BLOCKED in probe.stderr  # the block works
    return env


def _run(argv, env, timeout=300):
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_horovod_backend_says_what_is_missing(no_horovod):
    code = ("import json, hvdtrain, tensorflow as tf\n"
            "from hvdtrain import cli\n"
            "print(json.dumps(cli.collect_info()), flush=True)\n"  # what `hvdtrain info` shows
            "ds = tf.data.Dataset.from_tensor_slices(([[0.0]], [0.0]))\n"
            "hvdtrain.Trainer(ds, model=None)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=dict(os.environ, **no_horovod), capture_output=True, text=True,
                          timeout=120)
    info = json.loads(proc.stdout.splitlines()[0])
    assert info["horovod"] is None and BLOCKED in info["horovod_error"], info
    assert "hvdtrain install-horovod" in info["horovod_fix"]
    assert info["tensorflow"] and "mpi_built" not in info
    # the choice between build function and model is checked before any backend loads
    assert "give exactly one of build_training_func" in proc.stderr
    code = ("import hvdtrain, keras, tensorflow as tf\n"
            "ds = tf.data.Dataset.from_tensor_slices(([[0.0]], [0.0]))\n"
            "m = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])\n"
            "hvdtrain.Trainer(ds, model=m, loss='mse', optimizer='sgd',\n"
            "                 optimizer_args={'learning_rate': 0.1})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=dict(os.environ, **no_horovod), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and BLOCKED in proc.stderr
    assert "strategy='horovod' needs Horovod" in proc.stderr
    assert "hvdtrain install-horovod" in proc.stderr and "make install" in proc.stderr


def test_mirrored_and_multi_worker_mirrored_train_without_horovod(no_horovod, tmp_path):
    worker = str(WORKERS / "tfdist_worker.py")
    _run([worker, "parity", str(tmp_path / "mirrored"), "--batch-size", "16", "--devices", "2"],
         no_horovod)
    mirrored = json.loads((tmp_path / "mirrored" / "rank0.json").read_text())
    assert mirrored["strategy"] == "MirroredStrategy" and mirrored["size"] == 2
    assert mirrored["global_step"] == 16 and mirrored["losses"][-1] < mirrored["losses"][0]

    codes, outputs, _ = run_workers([worker, "parity", str(tmp_path / "mw"), "--batch-size", "16",
                                     "--strategy", "multi_worker_mirrored"], env=no_horovod)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    chief = json.loads((tmp_path / "mw" / "rank0.json").read_text())
    assert chief["num_workers"] == 2 and chief["global_step"] == 16


def test_parameter_servers_train_without_horovod(no_horovod, tmp_path):
    proc = _run([str(ROOT / "scripts" / "launch_ps.py"), "--ps", "1", "--workers", "2",
                 "--timeout", "240", "--", sys.executable, str(WORKERS / "ps_mnist.py"),
                 str(tmp_path), "--examples", "2048", "--epochs", "2",
                 "--log-dir", str(tmp_path / "tb")], no_horovod)
    result = json.loads((tmp_path / "result.json").read_text())
    # 2,048 examples / 2 workers / 64 per batch = 16 rounds an epoch, one step per worker each
    assert result["global_step"] == 32 and result["worker_steps"] == 64
    # the one loop runs callbacks and TensorBoard on parameter servers too
    assert result["callback"] == {"train_begin": 1, "batch_end": 32, "epoch_end": 2,
                                  "train_end": 1}
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert {"val_acc", "val_loss"} <= set(events.Tags()["tensors"])  # the final validation
    assert [e.step for e in events.Tensors("val_acc")] == [32]
    assert "[ps0] [hvdtrain] ps 0: serving" in proc.stdout
