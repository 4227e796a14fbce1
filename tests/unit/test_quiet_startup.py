"""hvdtrain's quiet TensorFlow start-up (``_hvdtrain_startup``, run by hvdtrain-startup.pth)
and its one line about GPUs TensorFlow cannot use (``hvdtrain.gpu_visibility``)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import _hvdtrain_startup as startup
from hvdtrain import gpu_visibility

GLOG_I = b"I0000 00:00:1796559842.971900   16010 port.cc:153] oneDNN custom operations are on."
GLOG_W = b"W0000 00:00:1796559842.971900   16010 local_rendezvous.cc:412] aborting"
CUINIT = (b"E0000 00:00:1796560636.987222   18371 cuda_platform.cc:52] failed call to cuInit: "
          b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
ABSL = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
TF_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\]"
                         r"|WARNING: All log messages before absl::InitializeLog")
IMPORT_TF = ("import sys, tensorflow as tf; tf.config.list_physical_devices(); "
             "import os; print('user line', os.environ['TF_CPP_MIN_LOG_LEVEL'], file=sys.stderr)")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TF_CPP_") and k != startup.SWITCH}
    return {**env, **extra}


def test_the_environment_starts_quiet_and_the_switch_brings_tensorflows_logs_back():
    """One ``import tensorflow`` pair: without any variable nothing of TensorFlow's C++ log
    shows (the user's own stderr line does); ``HVDTRAIN_TF_LOGS=1`` brings it all back."""
    runs = {name: subprocess.Popen([sys.executable, "-c", IMPORT_TF], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for name, env in (("quiet", _clean_env()),
                              ("logs", _clean_env(**{startup.SWITCH: "1"})))}
    out = {name: proc.communicate(timeout=120)[1] for name, proc in runs.items()}
    quiet, logs = out["quiet"].splitlines(), out["logs"].splitlines()
    assert quiet[-1] == "user line 1", out["quiet"][-3000:]
    shown = [ln for ln in quiet if TF_LOG_LINE.search(ln)]
    if startup.nvidia_gpu_files():  # a GPU host: only warnings and errors
        assert not [ln for ln in shown if ln.startswith(("I", "WARNING: All"))], shown
    else:
        assert shown == [], out["quiet"][-3000:]
    assert logs[-1] == "user line 0" and ABSL.decode() in logs
    assert any(" port.cc:" in ln for ln in logs) and any("cpu_feature_guard" in ln for ln in logs)


def test_a_level_the_user_set_wins(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(startup.SWITCH, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    startup.install()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    drop = startup.make_filter(startup.min_level(), gpus_present=False)
    assert not any(drop(line) for line in (ABSL, GLOG_I, GLOG_W, CUINIT))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # the user's 2 hides warnings too
    drop = startup.make_filter(startup.min_level(), gpus_present=False)
    assert drop(GLOG_I) and drop(GLOG_W) and drop(ABSL)
    monkeypatch.setenv(startup.SWITCH, "1")  # the switch never overrides the user's level
    startup.install()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_the_default_level_hides_info_and_keeps_warnings_and_real_errors():
    drop = startup.make_filter(1, gpus_present=False)
    assert drop(ABSL) and drop(GLOG_I) and drop(CUINIT)
    assert not drop(GLOG_W) and not drop(b"E0000 00:00:1.2   1 op_kernel.cc:1] OP failed")
    assert not drop(b"[hvdtrain] step 20: loss=0.5") and not drop(b"Traceback (most recent")
    # Where the machine has NVIDIA GPUs, a failed cuInit is a real error: it shows.
    assert not startup.make_filter(1, gpus_present=True)(CUINIT)


def test_the_filter_passes_every_other_line_of_the_process(capfd):
    drop = startup.make_filter(1, gpus_present=False)
    with startup.FilteredStderr(drop):
        os.write(2, ABSL + b"\n" + GLOG_I + b"\nkept 1\n")
        os.write(2, b"kept")
        os.write(2, b" 2\n" + CUINIT + b"\n")
        os.write(2, b"kept 3, no newline")
    os.write(2, b"\n" + GLOG_I + b"\n")  # after it: as written
    assert capfd.readouterr().err.splitlines() == [
        "kept 1", "kept 2", "kept 3, no newline", GLOG_I.decode()]


def test_install_waits_for_tensorflows_import(monkeypatch):
    """TensorFlow is imported here already: install() only sets the level."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(startup.SWITCH, raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    startup.install()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == startup.DEFAULT_LEVEL
    assert not any(isinstance(f, startup._TensorFlowImport) for f in sys.meta_path)


@pytest.fixture
def dev(tmp_path):
    """A ``/dev`` with two NVIDIA GPUs."""
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (tmp_path / name).touch()
    return tmp_path


def test_gpus_tensorflow_does_not_list_are_reported_in_one_line(dev, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert startup.nvidia_gpu_files(str(dev)) == [str(dev / "nvidia0"), str(dev / "nvidia1")]
    warning = gpu_visibility.unusable_gpus_warning(0, dev=str(dev))
    assert warning and "\n" not in warning and str(dev / "nvidia1") in warning
    assert "TensorFlow lists none" in warning


def test_no_report_with_gpus_listed_none_on_the_machine_or_gpus_hidden(dev, tmp_path_factory,
                                                                      monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_visibility.unusable_gpus_warning(2, dev=str(dev)) is None
    assert gpu_visibility.unusable_gpus_warning(0, dev=str(tmp_path_factory.mktemp("e"))) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_visibility.unusable_gpus_warning(0, dev=str(dev)) is None
