"""The Horovod build flavour: its summary line, the no-NCCL warning, GPU pinning in
``init`` and ``hvdtrain info`` (the installer itself: test_horovod_build.py).

TensorFlow's GPU list and its device setters are faked here: this is one process checking
what ``init`` does with each answer, not distributed behaviour.
"""
import logging

import horovod
import horovod.tensorflow as hvd
import pytest
import tensorflow as tf

from hvdtrain.horovod import runtime

FIX = "call hvdtrain.init() before any TensorFlow op touches a GPU"


@pytest.mark.timeout(30)
def test_build_summary_names_version_controllers_and_gpu_operations():
    line = runtime.build_summary()
    assert line.startswith(f"Horovod {horovod.__version__}: controllers ")
    assert "\n" not in line and "GPU operations: " in line
    gpu_ops = line.split("GPU operations: ", 1)[1]
    assert gpu_ops.startswith("NCCL") == bool(hvd.nccl_built())
    if not hvd.nccl_built():
        assert gpu_ops == "none (CPU-only build)"
    for name in ("mpi", "gloo"):
        assert (name in line.split(";")[0]) == bool(getattr(hvd, f"{name}_built")())


@pytest.mark.timeout(30)
def test_check_gpu_build_warns_only_for_gpus_without_nccl(monkeypatch):
    assert runtime.check_gpu_build(0) is None
    if hvd.nccl_built():
        assert runtime.check_gpu_build(2) is None
    else:
        warning = runtime.check_gpu_build(2)
        assert "2 GPU" in warning and "without NCCL" in warning
        assert "GPU -> host -> Gloo/MPI" in warning and "HVDTRAIN_GPU_BUILD=nccl" in warning
    built = dict(runtime.build_info(), nccl_built=True)
    monkeypatch.setattr(runtime, "build_info", lambda: built)
    assert runtime.check_gpu_build(8) is None
    assert runtime.build_summary().split("GPU operations: ")[1].startswith("NCCL")


@pytest.fixture
def fake_node(monkeypatch):
    """``init`` on local rank 1 (rank 3) of a node whose TensorFlow lists two GPUs.

    Returns the calls made to TensorFlow's device setters; a test makes them fail by
    putting an exception under the setter's name in ``fail``.
    """
    calls = {"visible": [], "growth": [], "fail": {}}

    def setter(name):
        def call(*args):
            calls[name].append(args[0])
            if name in calls["fail"]:
                raise calls["fail"][name]
        return call

    monkeypatch.setattr(runtime, "_initialized", False)
    monkeypatch.setattr(runtime, "_install_failure_hook", lambda: None)
    monkeypatch.setattr(runtime.watchdog, "start", lambda *a, **k: None)  # a fake world
    for name, value in {"init": lambda **kw: None, "rank": lambda: 3, "size": lambda: 4,
                        "local_rank": lambda: 1, "local_size": lambda: 2}.items():
        monkeypatch.setattr(runtime.hvd, name, value)
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["gpu0", "gpu1"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices", setter("visible"))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", setter("growth"))
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", lambda n: None)
    monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads", lambda n: None)
    return calls


@pytest.mark.timeout(30)
def test_init_pins_the_local_ranks_gpu(fake_node):
    runtime.init()
    assert fake_node["visible"] == [["gpu1"]] and fake_node["growth"] == ["gpu1"]


@pytest.mark.timeout(30)
def test_pinning_after_tensorflow_started_is_a_warning_naming_rank_gpu_and_fix(fake_node,
                                                                                caplog):
    fake_node["fail"]["visible"] = RuntimeError(
        "Visible devices cannot be modified after being initialized")
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        runtime.init()
    text = caplog.text
    assert "rank 3 (local rank 1) could not pin GPU 1" in text and FIX in text
    assert "after being initialized" in text
    assert runtime.is_initialized()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("setter, error", [
    ("visible", ValueError("Unrecognized device: gpu1")),
    ("growth", RuntimeError("CUDA driver failure")),
])
def test_other_pinning_failures_raise_naming_rank_gpu_and_cause(fake_node, setter, error):
    fake_node["fail"][setter] = error
    with pytest.raises(RuntimeError, match=r"rank 3 \(local rank 1\) could not pin GPU 1: "
                                           + type(error).__name__) as exc:
        runtime.init()
    assert str(error) in str(exc.value) and exc.value.__cause__ is error


@pytest.mark.timeout(30)
@pytest.mark.parametrize("local_rank", [0, 1])
def test_init_warns_on_local_rank_0_when_gpus_meet_a_build_without_nccl(
        fake_node, monkeypatch, caplog, local_rank):
    monkeypatch.setattr(runtime.hvd, "local_rank", lambda: local_rank)
    monkeypatch.setattr(runtime, "build_info", lambda: {
        "horovod": horovod.__version__, "mpi_built": True, "gloo_built": True,
        "nccl_built": False})
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        runtime.init()
    warned = [r for r in caplog.records if "HVDTRAIN_GPU_BUILD=nccl" in r.getMessage()]
    assert len(warned) == (1 if local_rank == 0 else 0)
    if warned:
        assert warned[0].levelno == logging.WARNING and "sees 2 GPU(s)" in warned[0].getMessage()


@pytest.mark.timeout(30)
def test_info_prints_the_build_line_gpus_and_the_warning(monkeypatch, capsys):
    from hvdtrain import cli

    info = cli.collect_info()
    assert info["horovod_build"] == runtime.build_summary()
    assert info["nccl_built"] == bool(hvd.nccl_built())
    assert info["gpus"] == len(tf.config.list_physical_devices("GPU"))
    assert info["horovod_flavour"] == runtime.build_record()["flavour"]
    if info["nccl_built"]:  # what it was compiled with, and the NCCL this process loaded
        assert info["horovod_cuda"].startswith("CUDA ") and info["horovod_nccl"].startswith("NCCL ")
        assert info["nccl_loaded"] == info["horovod_nccl"].split()[1]

    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["gpu0", "gpu1"] if kind == "GPU" else [])
    monkeypatch.setattr(runtime, "build_info", lambda: {
        "horovod": horovod.__version__, "mpi_built": True, "gloo_built": True,
        "nccl_built": False})
    assert cli.main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["gpus", "2"] for line in lines), lines
    assert any(line.startswith("horovod_build") and "GPU operations: none (CPU-only build)"
               in line for line in lines), lines
    assert lines[-1].startswith("WARNING: this process sees 2 GPU(s)")
    assert "HVDTRAIN_GPU_BUILD=nccl make install" in lines[-1]


@pytest.mark.timeout(30)
def test_init_pins_gpus_shares_threads_and_starts_the_watchdog(fake_node, monkeypatch):
    events = []
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda *a: events.append("pin"))
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads",
                        lambda n: events.append("threads"))
    monkeypatch.setattr(runtime.watchdog, "start", lambda *a, **k: events.append("watchdog"))
    runtime.init()
    assert events == ["pin", "threads", "watchdog"]
