"""The examples, run as users run them: under horovodrun, mpirun and plain python."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from _hvdtrain_startup import nvidia_gpu_files
from conftest import ROOT, run_job

pytestmark = pytest.mark.parallel

MNIST = str(ROOT / "examples" / "mnist.py")
TUTORIALS = ROOT / "examples" / "distributed_training"
MNIST_TUTORIAL = str(TUTORIALS / "tutorial_mnist_distributed_trainer.py")
CIFAR_TUTORIAL = str(TUTORIALS / "tutorial_cifar10_distributed_trainer.py")


@pytest.fixture(scope="module")
def fashion_mnist():
    """Fashion-MNIST must be installed: ``make install`` installs Debian's package."""
    from hvdtrain import datasets
    try:
        datasets.load_fashion_mnist_dataset(download=False)
    except FileNotFoundError as err:
        pytest.fail(f"Fashion-MNIST is not installed (run make install): {err}")


@pytest.fixture
def no_download(monkeypatch):
    """The loaders must not reach for the network (MNIST falls back to Fashion-MNIST)."""
    monkeypatch.setenv("HVDTRAIN_NO_DOWNLOAD", "1")


#: TensorFlow's C++ log lines: glog's ``I0000 00:00:1796559842.971900   16010 port.cc:153]``
#: and absl's notice about the lines before its initialisation.
TF_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\]"
                         r"|WARNING: All log messages before absl::InitializeLog")


def clean_tf_env() -> dict:
    """Removes (``None``) every TensorFlow log variable and hvdtrain's switch: the job runs
    as a user's would, with hvdtrain's quiet start-up as the only setting."""
    return {k: None for k in [*os.environ, "TF_CPP_MIN_LOG_LEVEL", "HVDTRAIN_TF_LOGS"]
            if k.startswith("TF_CPP_") or k == "HVDTRAIN_TF_LOGS"}


def tf_log_lines(proc) -> list[str]:
    """The lines of TensorFlow's C++ logging in a job's output."""
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if TF_LOG_LINE.search(ln)]


def run_mnist(launcher, np, out_dir, *args, timeout=420, env=None):
    """Runs ``examples/mnist.py`` on Fashion-MNIST; returns (metrics, process)."""
    metrics = out_dir / f"{launcher}-np{np}.json"
    proc = run_job(launcher, np, [MNIST, "--dataset", "fashion_mnist", "--seed", "0",
                                  "--metrics-out", str(metrics), *args], timeout=timeout, env=env)
    return json.loads(metrics.read_text()), proc


@pytest.mark.timeout(900)
def test_mnist_example_two_ranks_match_one_rank(fashion_mnist, tmp_path):
    """1 epoch of Fashion-MNIST: 2 ranks reach >= 0.84 test accuracy, within a point of 1.
    Both run without TensorFlow's log variables: on a CPU host, neither horovodrun's own
    Python nor a rank nor the single process prints a line of TensorFlow's C++ logging."""
    two, proc = run_mnist("horovodrun", 2, tmp_path, "--epochs", "1", env=clean_tf_env())
    one, one_proc = run_mnist("python", 1, tmp_path, "--epochs", "1", env=clean_tf_env())
    if not nvidia_gpu_files():
        assert tf_log_lines(proc) == [] and tf_log_lines(one_proc) == []

    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["global_batch"] == 2 * two["batch_size"] == 128
    assert one["global_batch"] == one["batch_size"] == 64
    assert two["dataset"] == one["dataset"] == "fashion_mnist"
    # 50,000 examples: 25,000 per rank in batches of 64, or 50,000 in batches of 64.
    assert two["steps"] == math.ceil(25000 / 64)
    assert one["steps"] == math.ceil(50000 / 64)
    assert two["learning_rate"] == pytest.approx(2 * one["learning_rate"])
    for m in (one, two):
        assert 0 < m["test_loss"] < 1 and m["samples_per_sec"] > 0 and m["train_seconds"] > 0
        assert m["validation"]["acc"] > 0.8
    print(f"test accuracy: np1 {one['test_accuracy']:.4f} ({one['train_seconds']:.0f} s), "
          f"np2 {two['test_accuracy']:.4f} ({two['train_seconds']:.0f} s)")
    assert two["test_accuracy"] >= 0.84
    assert abs(two["test_accuracy"] - one["test_accuracy"]) <= 0.01
    # Only rank 0 prints the summary.
    assert proc.stdout.count("test accuracy") == 1
    assert "[0]<stdout>:dataset: fashion_mnist" in proc.stdout


@pytest.mark.timeout(300)
def test_mnist_example_under_mpirun_checkpoints_and_writes_metrics(fashion_mnist, tmp_path):
    ckpt = tmp_path / "ckpt"
    metrics, proc = run_mnist("mpirun", 2, tmp_path, "--max-steps", "20", "--log-step-size", "10",
                              "--checkpoint-dir", str(ckpt), "--save", str(tmp_path / "net.keras"),
                              timeout=240, env=clean_tf_env())
    if not nvidia_gpu_files():  # a quiet start-up without TensorFlow's log variables
        assert tf_log_lines(proc) == []
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 128
    assert metrics["steps"] == metrics["global_step"] == 20
    assert 0 <= metrics["test_accuracy"] <= 1
    assert (ckpt / "ckpt-00000020" / "manifest.json").is_file()
    assert "[1,0]<stderr>:[hvdtrain] step 20:" in proc.stdout + proc.stderr
    loaded = subprocess.run(  # plain Keras reads the saved network
        [sys.executable, "-c", "import keras, numpy as np; net = keras.models.load_model("
         f"{str(tmp_path / 'net.keras')!r}); print(net(np.zeros((3, 784), 'float32')).shape)"],
        capture_output=True, text=True, timeout=120)
    assert loaded.stdout.strip().endswith("(3, 10)"), loaded.stderr[-2000:]

    # A second run resumes from the checkpoint and only takes the missing steps.
    metrics, proc = run_mnist("mpirun", 2, tmp_path, "--max-steps", "30", "--log-step-size", "10",
                              "--checkpoint-dir", str(ckpt), "--log-dir", str(tmp_path / "tb"),
                              "--horovod-timeline", str(tmp_path / "trace" / "timeline.json"),
                              timeout=240)
    assert metrics["global_step"] == 30 and metrics["steps"] == 10
    assert "resumed from" in proc.stdout + proc.stderr
    # the CLI switches: TensorBoard events from rank 0, Horovod's timeline of the run
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    assert "HorovodGroupedAllreduce" in (tmp_path / "trace" / "timeline.json").read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag,value", [("--batch-size", "0"), ("--epochs", "-1"),
                                        ("--lr", "0"), ("--max-steps", "x")])
def test_mnist_example_rejects_bad_flags(flag, value):
    proc = run_job("python", 1, [MNIST, flag, value], timeout=90, check=False)
    assert proc.returncode == 2
    assert f"argument {flag}" in proc.stderr


@pytest.mark.timeout(300)
def test_mnist_tutorial_explicit_loop(fashion_mnist, no_download, tmp_path):
    proc = run_job("horovodrun", 2, [MNIST_TUTORIAL, "--max-steps", "20", "--log-step-size", "10"],
                   timeout=240)
    assert "[0]<stdout>:training on Fashion-MNIST with 2 rank(s)" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if "after 20 steps, validation:" in ln]
    assert len(lines) == 1 and lines[0].startswith("[0]"), proc.stdout
    assert "accuracy" in lines[0] and "cost" in lines[0]


@pytest.mark.timeout(300)
def test_cifar10_tutorial_on_synthetic_data(tmp_path):
    proc = run_job("horovodrun", 2, [CIFAR_TUTORIAL, "--synthetic", "--synthetic-size", "512",
                                     "--max-steps", "10", "--validate-step-size", "5",
                                     "--log-step-size", "5"], timeout=240)
    out = proc.stdout + proc.stderr
    assert "synthetic CIFAR-10 (512 train / 128 test) with 2 rank(s)" in out
    assert "step 5 validation:" in out and "step 10 validation:" in out
    assert "after 10 steps, validation:" in proc.stdout


@pytest.mark.timeout(180)
def test_cifar10_tutorial_without_data_stops_every_rank_with_the_loaders_message(tmp_path):
    proc = run_job("horovodrun", 2, [CIFAR_TUTORIAL, "--data-dir", str(tmp_path)],
                   timeout=120, check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "CIFAR-10 not found" in out and str(tmp_path) in out
    assert "--synthetic" in out
