"""hvdtrain's Horovod installer: the patches against the real Horovod source, the cache
key, the toolchain search, the choice of flavour and its fallback, and the installed
build itself (loaded with every symbol bound).

The real builds (CPU and NCCL) run in ``make install`` and in ``scripts/check_gpu_build.sh``
(CI); the flavour decisions here fake only the slow build step or the GPU driver's answer.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hvdtrain.horovod_build import builder, patching, toolchain

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def horovod_source(tmp_path_factory) -> Path:
    """A fresh, unpatched copy of Horovod's sdist (downloaded into the cache if missing)."""
    sdist = builder._horovod_sdist(builder.default_cache())
    work = tmp_path_factory.mktemp("horovod-src")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    return work / f"horovod-{builder.HOROVOD_VERSION}"


@pytest.fixture
def source_copy(horovod_source, tmp_path) -> Path:
    """The files the patches touch, copied so each test patches its own."""
    root = tmp_path / "src"
    for relative in ("horovod/tensorflow/mpi_ops.cc", "horovod/tensorflow/CMakeLists.txt",
                     "horovod/runner/common/util/safe_shell_exec.py"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(horovod_source / relative, root / relative)
    return root


@pytest.mark.timeout(120)
def test_patches_apply_to_the_real_source_and_do_what_they_say(source_copy):
    before = (source_copy / "horovod/tensorflow/mpi_ops.cc").read_text()
    assert "GpuStreamHandle AsGpuStreamValue(Stream* stream);" in before
    assert before.count("stream_executor::gpu::AsGpuStreamValue(") == 12

    applied = patching.apply_all(source_copy)
    assert applied == [p.name for p in patching.patch_files()] and len(applied) == 4

    mpi_ops = (source_copy / "horovod/tensorflow/mpi_ops.cc").read_text()
    inline = "inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {"
    assert inline in mpi_ops and "platform_specific_handle().stream" in mpi_ops
    # the definition comes after stream.h (it needs the complete Stream type), and every
    # call site is left as it was
    assert mpi_ops.index('stream_executor/stream.h"') < mpi_ops.index(inline)
    assert mpi_ops.count("stream_executor::gpu::AsGpuStreamValue(") == 12
    cmake = (source_copy / "horovod/tensorflow/CMakeLists.txt").read_text()
    assert "xla_mpi_ops.cc\")" not in cmake and "mpi_ops.cc\")" in cmake
    assert "$ORIGIN/../../nvidia/nccl/lib" in cmake
    runner = (source_copy / "horovod/runner/common/util/safe_shell_exec.py").read_text()
    assert "return middleman.exitcode" not in runner and "return exit_code" in runner


@pytest.mark.timeout(120)
def test_a_patch_that_does_not_match_stops_naming_patch_file_and_hunk(source_copy):
    patching.apply_all(source_copy)
    with pytest.raises(patching.PatchError, match=r"0001-build-without-xla-ops.patch: hunk 1 "
                                                  r"of horovod/tensorflow/CMakeLists.txt not "
                                                  r"found \(expected once\)"):
        patching.apply_all(source_copy)  # already applied: the old lines are gone
    (source_copy / "horovod/tensorflow/mpi_ops.cc").unlink()
    with pytest.raises(patching.PatchError, match="mpi_ops.cc does not exist"):
        patching.apply_patch(patching.patch_files()[1], source_copy)


def test_the_cache_key_names_the_patches_flavour_and_toolchain(tmp_path, monkeypatch):
    env = builder.Environment(sys.executable, "2.21.0", "cp311", [], None)
    cpu = builder.Plan("cpu").key(env)
    assert cpu == f"horovod-{builder.HOROVOD_VERSION}-tf2.21.0-cp311-cpu-p{patching.patch_id()}"
    with_mpi = builder.Plan("cpu", env={"HOROVOD_WITH_MPI": "1"}).key(env)
    assert with_mpi == cpu.replace("-cpu-", "-cpu-mpi-")  # a Gloo-only wheel is another one
    nccl = builder.Plan("nccl", toolkit=toolchain.CudaToolkit(Path("/x"), "12.4", "system"),
                        nccl=toolchain.Nccl(Path("/i"), Path("/l"), "2.27.7", "system"))
    assert nccl.key(env).startswith(
        f"horovod-{builder.HOROVOD_VERSION}-tf2.21.0-cp311-nccl-cuda12.4-nccl2.27.7-sm75.80")

    # a changed patch changes the key: an old (broken) wheel is never reused
    copies = tmp_path / "patches"
    shutil.copytree(patching.PATCH_DIR, copies)
    monkeypatch.setattr(patching, "PATCH_DIR", copies)
    assert patching.patch_id() in cpu
    first = sorted(copies.glob("*.patch"))[0]
    first.write_text(first.read_text() + "\n")
    assert patching.patch_id() not in cpu


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text + "\n")
    path.chmod(0o755)


@pytest.mark.timeout(60)
def test_a_system_toolkit_is_found_with_its_version(tmp_path):
    cuda = tmp_path / "cuda-12.4"
    _executable(cuda / "bin" / "nvcc", "echo 'Cuda compilation tools, release 12.4, V12.4.131'")
    (cuda / "include").mkdir()
    (cuda / "include" / "cuda_runtime.h").write_text("")
    empty = tmp_path / "empty"
    empty.mkdir()
    found = toolchain.find_system_toolkit({"PATH": str(empty), "CUDA_HOME": str(cuda)})
    assert found == toolchain.CudaToolkit(cuda.resolve(), "12.4", "system")
    assert "system toolkit" in found.describe() and "CUDA 12.4" in found.describe()
    found = toolchain.find_system_toolkit({"PATH": f"{cuda / 'bin'}",
                                           "HVDTRAIN_CUDA_PREFIX": str(empty)})
    assert found is not None and found.home == cuda.resolve()
    # nvcc without headers (PyPI's cu12 nvcc wheel ships only ptxas) is not a toolkit
    (cuda / "include" / "cuda_runtime.h").unlink()
    assert toolchain.find_system_toolkit({"PATH": str(empty), "CUDA_HOME": str(cuda),
                                          "HVDTRAIN_CUDA_PREFIX": str(empty)}) is None


def test_nccl_is_found_in_a_home_or_an_installed_wheel(tmp_path):
    home = tmp_path / "nccl"
    (home / "include").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n")
    (home / "lib" / "libnccl.so").write_text("")
    found = toolchain.find_system_nccl({"NCCL_HOME": str(home), "HVDTRAIN_CUDA_PREFIX": "/nx"})
    assert (found.version, found.lib, found.source) == ("2.27.7", home / "lib", "system")

    site = tmp_path / "site-packages"
    wheel = site / "nvidia" / "nccl"
    shutil.copytree(home / "include", wheel / "include")
    (wheel / "lib").mkdir()
    (wheel / "lib" / "libnccl.so.2").write_text("")
    found = toolchain.find_environment_nccl([tmp_path / "nothing", site])
    assert found.source == "environment" and found.version == "2.27.7"
    assert os.readlink(wheel / "lib" / "libnccl.so") == "libnccl.so.2"  # for the linker


@pytest.mark.timeout(60)
def test_gpu_listed_reads_the_drivers_list(tmp_path, monkeypatch):
    _executable(tmp_path / "gpu" / "nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1)'")
    _executable(tmp_path / "none" / "nvidia-smi", "echo 'No devices were found'; exit 6")
    for folder, expected in (("gpu", True), ("none", False), ("missing", False)):
        monkeypatch.setenv("PATH", f"{tmp_path / folder}{os.pathsep}/usr/bin:/bin")
        assert toolchain.gpu_listed() is expected, folder


@pytest.fixture
def fake_builds(monkeypatch):
    """install_horovod with a GPU listed and the build step replaced: the NCCL build fails
    (as at a missing symbol), the CPU build succeeds. Returns the flavours tried."""
    tried = []

    def install_and_check(plan, environment, cache, log):
        tried.append(plan.flavour)
        if plan.flavour == "nccl":
            raise builder.BuildError("the installed Horovod does not load: undefined symbol: X")
        return {"mpi": True, "gloo": True, "nccl": False}

    monkeypatch.setattr(builder, "probe_environment", lambda python: builder.Environment(
        python, "2.21.0", "cp311", [], None))
    monkeypatch.setattr(toolchain, "gpu_listed", lambda: True)
    monkeypatch.setattr(builder, "plan_build", lambda flavour, *a, **k: builder.Plan(flavour))
    monkeypatch.setattr(builder, "_install_and_check", install_and_check)
    return tried


def test_auto_falls_back_to_the_cpu_build_with_a_warning_naming_the_cost(fake_builds, tmp_path):
    lines = []
    record = builder.install_horovod("auto", sys.executable, tmp_path, lines.append)
    assert fake_builds == ["nccl", "cpu"] and record["flavour"] == "cpu"
    warning = [line for line in lines if line.startswith("WARNING")]
    assert len(warning) == 1 and "undefined symbol: X" in warning[0]
    assert "GPU -> host" in warning[0] and "--gpu nccl" in warning[0]


def test_a_forced_nccl_build_fails_instead(fake_builds, tmp_path):
    with pytest.raises(builder.BuildError, match="nccl build: .*undefined symbol: X"):
        builder.install_horovod("nccl", sys.executable, tmp_path, lambda line: None)
    assert fake_builds == ["nccl"]
    with pytest.raises(builder.BuildError, match="expected one of auto, cpu, nccl"):
        builder.install_horovod("gpu", sys.executable, tmp_path, lambda line: None)


@pytest.mark.timeout(120)
def test_the_installed_horovod_is_the_patched_build_and_loads_with_every_symbol_bound():
    from hvdtrain.horovod import runtime

    record = runtime.build_record()
    assert record is not None, "this Horovod was not built by hvdtrain's installer"
    assert record["key"].endswith(f"-p{patching.patch_id()}")
    assert record["patches"] == [p.name for p in patching.patch_files()]
    loaded = builder.check_installed(sys.executable)  # a fresh process, LD_BIND_NOW=1
    assert loaded["key"] == record["key"] and loaded["gloo"]
    assert loaded["nccl"] == (record["flavour"] == "nccl")
    if loaded["nccl"]:
        version = record["nccl"].split()[1]
        assert runtime.nccl_runtime_version() == version  # the NCCL it was built against
    else:
        assert runtime.nccl_runtime_version() is None


def test_tensorflow_still_offers_the_stream_handle_the_patch_uses():
    """The GPU patch calls ``Stream::platform_specific_handle().stream`` from TensorFlow's
    C++ headers: this fails loudly when an upgrade renames or removes it."""
    import tensorflow as tf

    header = Path(tf.sysconfig.get_include()) / "xla" / "stream_executor" / "stream.h"
    text = header.read_text()
    assert "virtual PlatformSpecificHandle platform_specific_handle() const" in text
    struct = text[text.index("struct PlatformSpecificHandle"):]
    assert "void* stream" in struct[:struct.index("};")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env, expected", [
    ({"HVDTRAIN_GPU_BUILD": "cpu", "GPU": "1"}, "cpu"),
    ({"HVDTRAIN_GPU_BUILD": "nccl"}, "nccl"),   # a GPU-less build host
    ({"GPU": "1"}, "nccl"),
    ({}, "cpu"),
])
def test_install_sh_detects_the_flavour(tmp_path, env, expected):
    _executable(tmp_path / "nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1)'" if
                env.pop("GPU", None) else "echo 'No devices were found'; exit 6")
    run_env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_GPU_BUILD"}
    run_env.update(env, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--detect-gpu-build"],
                          env=run_env, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, expected + "\n"), proc.stderr


@pytest.mark.timeout(60)
def test_install_sh_refuses_an_unknown_flavour():
    env = dict(os.environ, HVDTRAIN_GPU_BUILD="gpu")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--detect-gpu-build"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "expected nccl or cpu" in proc.stderr and not proc.stdout


@pytest.mark.timeout(60)
def test_a_wheel_that_does_not_load_is_caught_before_it_is_installed(tmp_path):
    """The check imports from a side folder first (PYTHONPATH), as the installer does with
    a new wheel before it touches the environment; the error's last line is named."""
    broken = tmp_path / "horovod"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('mpi_lib.so: undefined symbol: "
        "_ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE')\n")
    with pytest.raises(builder.BuildError, match=r"does not load: ImportError: .*undefined "
                                                 r"symbol: _ZN15stream_executor3gpu16"):
        builder.check_installed(sys.executable, tmp_path)


def test_install_horovod_command_takes_its_defaults_from_the_environment(monkeypatch):
    from hvdtrain import cli
    from hvdtrain.horovod_build import command

    monkeypatch.setenv("HVDTRAIN_GPU_BUILD", "nccl")
    monkeypatch.setenv("HVDTRAIN_CUDA_TOOLKIT", "pypi")
    args = cli.build_parser().parse_args(["install-horovod"])
    assert (args.gpu, args.cuda_toolkit, args.python) == ("nccl", "pypi", sys.executable)
    assert args.func is command.run
    args = cli.build_parser().parse_args(["install-horovod", "--gpu", "cpu"])
    assert args.gpu == "cpu"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["install-horovod", "--gpu", "rocm"])


@pytest.mark.timeout(180)
def test_cmake_comes_from_pypi_where_the_system_has_none(tmp_path, monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda name, *a, **k: None if name == "cmake" else real_which(name, *a, **k))
    lines = []
    cmake = builder._cmake(tmp_path, lines.append)
    assert lines == ["no CMake >= 3.13 on PATH: fetching cmake from PyPI"]
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("cmake version ")
    assert builder._cmake(tmp_path, lines.append) == cmake and len(lines) == 1  # cached
