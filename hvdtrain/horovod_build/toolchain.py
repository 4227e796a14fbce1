"""What an NCCL build of Horovod compiles with: a CUDA toolkit and NCCL.

A system toolkit (``nvcc`` with ``cuda_runtime.h``) and a system NCCL are preferred;
where there are none, pinned NVIDIA wheels from PyPI are unpacked into a cache and
arranged as a toolkit (CUDA 13's compiler, front end, ``crt`` headers and runtime) and an
NCCL home (the ``nvidia-nccl-cu12`` wheel, as TensorFlow's ``and-cuda`` extra installs it).
No module here imports TensorFlow or Horovod.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: CUDA 13 toolchain wheels, pinned together (``nvidia-cuda-nvcc``'s own dependencies are
#: unpinned): the compiler, its front end (``cicc``), the ``crt`` headers, the runtime and
#: CCCL (``cuda_fp16.h`` includes ``nv/target``). Device code they build needs an r580+
#: driver and compute capability >= 7.5.
CUDA_WHEELS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88",
               "nvidia-cuda-crt": "13.0.88", "nvidia-cuda-runtime": "13.0.96",
               "nvidia-cuda-cccl": "13.0.85"}
CUDA_WHEEL_VERSION = "13.0"
#: NCCL for CUDA 12, inside TensorFlow 2.21's ``and-cuda`` pin (>= 2.27.7, < 3).
NCCL_WHEEL = ("nvidia-nccl-cu12", "2.32.3")
#: Compute capabilities compiled for when HOROVOD_BUILD_CUDA_CC_LIST is not set: Turing
#: to Hopper (CUDA 13 no longer targets anything older than 7.5).
DEFAULT_CC_LIST = "75,80,86,89,90"
CUDA_PREFIX_DEFAULT = "/usr/local/cuda"


class ToolchainError(RuntimeError):
    """No CUDA toolkit or NCCL could be found or fetched."""


@dataclass(frozen=True)
class CudaToolkit:
    """A CUDA toolkit Horovod's CMake can use as ``HOROVOD_CUDA_HOME``."""

    home: Path
    version: str   # "12.4" from nvcc, or the wheels' "13.0.88"
    source: str    # "system" or "pypi"

    def describe(self) -> str:
        """One phrase naming the toolkit, its version and where it came from."""
        where = (f"the system toolkit in {self.home}" if self.source == "system" else
                 "PyPI wheels " + ", ".join(f"{n}=={v}" for n, v in CUDA_WHEELS.items()))
        return f"CUDA {self.version} ({where})"


@dataclass(frozen=True)
class Nccl:
    """An NCCL to build against: its headers, its ``libnccl.so`` and its version."""

    include: Path
    lib: Path       # the folder holding libnccl.so (a link made for the wheel's .so.2)
    version: str
    source: str     # "system", "environment" (a wheel already installed) or "pypi"

    def describe(self) -> str:
        """One phrase naming NCCL's version and where it came from."""
        where = {"system": f"the system's, in {self.lib}",
                 "environment": "the nvidia-nccl wheel already in this environment",
                 "pypi": f"PyPI wheel {NCCL_WHEEL[0]}=={NCCL_WHEEL[1]}"}[self.source]
        return f"NCCL {self.version} ({where})"


def gpu_listed() -> bool:
    """True when the NVIDIA driver lists at least one GPU (``nvidia-smi -L``)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(line.startswith("GPU ") for line in out.stdout.splitlines())


def _nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+\.\d+)", out.stdout)
    return found.group(1) if out.returncode == 0 and found else None


def find_system_toolkit(env: dict | None = None) -> CudaToolkit | None:
    """The system's CUDA toolkit: HOROVOD_CUDA_HOME, CUDA_HOME, ``nvcc`` on PATH, then
    ``$HVDTRAIN_CUDA_PREFIX`` (default ``/usr/local/cuda``); one with a working ``nvcc``
    and ``cuda_runtime.h``, or None."""
    env = os.environ if env is None else env
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    candidates = [env.get("HOROVOD_CUDA_HOME"), env.get("CUDA_HOME"),
                  str(Path(nvcc).resolve().parent.parent) if nvcc else None,
                  env.get("HVDTRAIN_CUDA_PREFIX") or CUDA_PREFIX_DEFAULT]
    for home in filter(None, candidates):
        home_path = Path(home)
        if (home_path / "bin" / "nvcc").is_file() and \
                (home_path / "include" / "cuda_runtime.h").is_file():
            version = _nvcc_version(home_path / "bin" / "nvcc")
            if version:
                return CudaToolkit(home_path.resolve(), version, "system")
    return None


def _nccl_version(header: Path) -> str:
    text = header.read_text(errors="replace")
    parts = [re.search(rf"#define NCCL_{key}\s+(\d+)", text) for key in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else "unknown"


def find_system_nccl(env: dict | None = None) -> Nccl | None:
    """A system NCCL with headers: HOROVOD_NCCL_HOME, NCCL_HOME, the system library
    folder, then the toolkit prefix; or None."""
    env = os.environ if env is None else env
    prefix = env.get("HVDTRAIN_CUDA_PREFIX") or CUDA_PREFIX_DEFAULT
    homes = [env.get("HOROVOD_NCCL_HOME"), env.get("NCCL_HOME")]
    pairs = [(Path(h) / "include", Path(h) / lib) for h in filter(None, homes)
             for lib in ("lib", "lib64")]
    pairs += [(Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu")),
              (Path(prefix) / "include", Path(prefix) / "lib64")]
    for include, lib in pairs:
        if (include / "nccl.h").is_file() and (lib / "libnccl.so").exists():
            return Nccl(include, lib, _nccl_version(include / "nccl.h"), "system")
    return None


def pip_target(requirements: list[str], target: Path, python: str) -> None:
    """Unpack wheels (no dependencies) into ``target``, atomically.

    Raises:
        ToolchainError: pip failed; names the requirements and pip's last line.
    """
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    proc = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "install", "-q",
                           "--no-deps", "--only-binary", ":all:", "--target", str(partial),
                           *requirements], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise ToolchainError(f"could not fetch {', '.join(requirements)} from PyPI: "
                             + (proc.stderr.strip().splitlines() or ["no output"])[-1])
    partial.rename(target)


def _pins(packages: dict[str, str]) -> list[str]:
    return [f"{name}=={version}" for name, version in packages.items()]


def _link(link: Path, to: str) -> None:
    if not link.is_symlink() and not link.exists():
        link.symlink_to(to)


def fetch_pypi_toolkit(cache: Path, python: str = sys.executable) -> CudaToolkit:
    """The CUDA 13 toolchain wheels, unpacked once into ``cache`` and arranged as a
    toolkit: ``lib64 -> lib`` and ``libcudart.so`` for CMake's FindCUDAToolkit."""
    key = "cuda-" + "-".join(f"{n.replace('nvidia-', '')}{v}" for n, v in CUDA_WHEELS.items())
    target = cache / "toolchains" / key
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        pip_target(_pins(CUDA_WHEELS), target, python)
    home = target / "nvidia" / "cu13"
    if not (home / "bin" / "nvcc").is_file():
        raise ToolchainError(f"{target} holds no bin/nvcc: remove it and try again")
    _link(home / "lib64", "lib")
    _link(home / "lib" / "libcudart.so", "libcudart.so.13")
    return CudaToolkit(home, CUDA_WHEELS["nvidia-cuda-nvcc"], "pypi")


def _nccl_from_wheel_folder(folder: Path, source: str) -> Nccl | None:
    """An Nccl for an unpacked nvidia-nccl wheel (``folder/nvidia/nccl``), with the
    ``libnccl.so`` link the linker looks for; None when it is not there."""
    home = folder / "nvidia" / "nccl"
    if not (home / "include" / "nccl.h").is_file() or not (home / "lib" / "libnccl.so.2").exists():
        return None
    link = home / "lib" / "libnccl.so"
    if not link.exists():
        try:
            _link(link, "libnccl.so.2")
        except OSError:  # a read-only environment: link it from a folder of our own
            return None
    return Nccl(home / "include", home / "lib", _nccl_version(home / "include" / "nccl.h"), source)


def find_environment_nccl(site_packages: list[Path]) -> Nccl | None:
    """An nvidia-nccl wheel already installed in the target environment (for example by
    ``tensorflow[and-cuda]``), or None."""
    for folder in site_packages:
        found = _nccl_from_wheel_folder(folder, "environment")
        if found:
            return found
    return None


def fetch_pypi_nccl(cache: Path, python: str = sys.executable) -> Nccl:
    """The pinned NCCL wheel, unpacked once into ``cache``."""
    name, version = NCCL_WHEEL
    target = cache / "toolchains" / f"{name}-{version}"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        pip_target(_pins({name: version}), target, python)
    found = _nccl_from_wheel_folder(target, "pypi")
    if not found:
        raise ToolchainError(f"{target} holds no nvidia/nccl headers and library: remove it "
                             "and try again")
    return found
