"""Build, cache, install and check a patched Horovod wheel in a Python environment.

:func:`install_horovod` is the one way Horovod gets installed: ``scripts/install.sh``
(``make install``) and ``hvdtrain install-horovod`` both call it. It

1. chooses the flavour: ``cpu``, or ``nccl`` (GPU-to-GPU all-reduce) where the driver
   lists a GPU, or when forced;
2. for ``nccl``, finds a system CUDA toolkit and NCCL, else fetches pinned wheels from
   PyPI into the cache (:mod:`~hvdtrain.horovod_build.toolchain`);
3. builds Horovod's sdist with hvdtrain's patches (:mod:`~hvdtrain.horovod_build.patching`)
   against the environment's TensorFlow, once per cache key (Horovod, TensorFlow and
   Python versions, flavour, toolchain, patches);
4. installs the wheel and imports it in a fresh process with ``LD_BIND_NOW=1``, so a
   missing symbol shows at install time, not in a training job.

An auto-detected NCCL build that fails falls back to the CPU build with a warning; a
forced one fails.
"""
from __future__ import annotations

import json
import os
import pprint
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvdtrain.horovod_build import patching, toolchain

HOROVOD_VERSION = "0.28.1"
FLAVOURS = ("auto", "cpu", "nccl")
#: ``auto``: a system CUDA toolkit where one is found, else PyPI's; ``pypi``: PyPI's.
TOOLKITS = ("auto", "pypi")
#: Module written into the wheel: what was built, with what (read by ``hvdtrain info``).
RECORD_MODULE = "hvdtrain_build"
CPU_COST = ("gradients of GPU tensors then travel GPU -> host -> Gloo/MPI -> host -> GPU, "
            "which on a multi-GPU node makes every all-reduce several times slower than NCCL")


class BuildError(RuntimeError):
    """Horovod could not be built, installed or loaded as asked."""


@dataclass
class Environment:
    """The Python environment Horovod is installed into, as that interpreter reports it."""

    python: str
    tensorflow: str
    py_tag: str
    site_packages: list[Path]
    installed_key: str | None  # the cache key of the installed hvdtrain-built Horovod


@dataclass
class Plan:
    """One build: its flavour, toolchain and cache key."""

    flavour: str
    cc_list: str = toolchain.DEFAULT_CC_LIST
    toolkit: toolchain.CudaToolkit | None = None
    nccl: toolchain.Nccl | None = None
    env: dict = field(default_factory=dict)

    def key(self, environment: Environment) -> str:
        """The wheel cache key: everything that changes what the build produces."""
        key = (f"horovod-{HOROVOD_VERSION}-tf{environment.tensorflow}-{environment.py_tag}"
               f"-{self.flavour}{'-mpi' if self.env.get('HOROVOD_WITH_MPI') else ''}")
        if self.flavour == "nccl":
            cc = self.cc_list.replace(",", ".")
            key += (f"-cuda{self.toolkit.version}{'' if self.toolkit.source == 'system' else 'pypi'}"
                    f"-nccl{self.nccl.version}-sm{cc}")
        return f"{key}-p{patching.patch_id()}"

    def record(self, environment: Environment) -> dict:
        """What the build record module in the wheel says."""
        record = {"key": self.key(environment), "flavour": self.flavour,
                  "horovod": HOROVOD_VERSION, "tensorflow": environment.tensorflow,
                  "patches": [p.name for p in patching.patch_files()],
                  "mpi": bool(self.env.get("HOROVOD_WITH_MPI")),
                  "cuda": None, "nccl": None, "cuda_cc_list": None, "driver": None}
        if self.flavour == "nccl":
            record.update(cuda=self.toolkit.describe(), nccl=self.nccl.describe(),
                          cuda_cc_list=self.cc_list,
                          driver=("r580 or newer (CUDA 13 device code)"
                                  if self.toolkit.version.startswith("13") else
                                  f"one that supports CUDA {self.toolkit.version}"))
        return record


def default_cache() -> Path:
    """``$HVDTRAIN_CACHE``, else ``$XDG_CACHE_HOME/hvdtrain`` or ``~/.cache/hvdtrain``."""
    if os.environ.get("HVDTRAIN_CACHE"):
        return Path(os.environ["HVDTRAIN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdtrain"


def wheel_cache(cache: Path) -> Path:
    """Where built wheels are kept: ``$HVDTRAIN_WHEEL_CACHE`` or ``<cache>/wheels``."""
    return Path(os.environ.get("HVDTRAIN_WHEEL_CACHE") or cache / "wheels")


_PROBE = """
import importlib.metadata as m, json, sys, sysconfig
try:
    import horovod.hvdtrain_build as record
    key = record.RECORD["key"]
except Exception:
    key = None
try:
    tf = m.version("tensorflow")
except m.PackageNotFoundError:
    tf = None
paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
print(json.dumps({"tensorflow": tf, "py_tag": f"cp{sys.version_info[0]}{sys.version_info[1]}",
                  "site_packages": list(dict.fromkeys(paths)), "installed_key": key}))
"""


def probe_environment(python: str) -> Environment:
    """Ask ``python`` for its TensorFlow, Python tag, site-packages and installed build."""
    proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"could not run {python}: {proc.stderr.strip()[-500:]}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    if not facts["tensorflow"]:
        raise BuildError(f"TensorFlow is not installed in {python}'s environment: Horovod is "
                         "built against it, so install it first (pip install tensorflow==2.21.0)")
    return Environment(python, facts["tensorflow"], facts["py_tag"],
                       [Path(p) for p in facts["site_packages"]], facts["installed_key"])


def plan_build(flavour: str, environment: Environment, cache: Path,
               log: Callable[[str], None], toolkit: str = "auto") -> Plan:
    """The build of ``flavour`` (``cpu`` or ``nccl``); for ``nccl``, with the system's
    CUDA toolkit (unless ``toolkit="pypi"``) and NCCL where found, else with pinned wheels
    fetched from PyPI."""
    if toolkit not in TOOLKITS:
        raise BuildError(f"CUDA toolkit {toolkit!r}: expected one of {', '.join(TOOLKITS)}")
    plan = Plan(flavour)
    if flavour == "nccl":
        plan.cc_list = os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or toolchain.DEFAULT_CC_LIST
        plan.toolkit = toolchain.find_system_toolkit() if toolkit == "auto" else None
        if plan.toolkit is None:
            why = ("asked for" if toolkit == "pypi" else
                   "no system CUDA toolkit (nvcc with cuda_runtime.h)")
            log(f"{why}: CUDA {toolchain.CUDA_WHEEL_VERSION}'s compiler from PyPI, kept in "
                f"{cache / 'toolchains'}")
            plan.toolkit = toolchain.fetch_pypi_toolkit(cache, sys.executable)
        plan.nccl = (toolchain.find_system_nccl()
                     or toolchain.find_environment_nccl(environment.site_packages))
        if plan.nccl is None:
            log(f"no NCCL found: {'=='.join(toolchain.NCCL_WHEEL)} from PyPI, kept in "
                f"{cache / 'toolchains'} and installed beside Horovod")
            plan.nccl = toolchain.fetch_pypi_nccl(cache, sys.executable)
    plan.env = _build_env(plan)
    return plan


def _build_env(plan: Plan) -> dict:
    """The environment variables that steer Horovod's setup.py and CMake."""
    env = {"CMAKE_POLICY_VERSION_MINIMUM": "3.5", "HOROVOD_WITH_TENSORFLOW": "1",
           "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_PYTORCH": "1",
           "HOROVOD_WITHOUT_MXNET": "1", "MAKEFLAGS": f"-j{os.cpu_count() or 2}"}
    if shutil.which("mpicxx"):
        env["HOROVOD_WITH_MPI"] = "1"
    else:
        env["HOROVOD_WITHOUT_MPI"] = "1"
    if plan.flavour == "nccl":
        env.update(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(plan.toolkit.home),
                   HOROVOD_NCCL_INCLUDE=str(plan.nccl.include),
                   HOROVOD_NCCL_LIB=str(plan.nccl.lib), HOROVOD_NCCL_LINK="SHARED",
                   HOROVOD_BUILD_CUDA_CC_LIST=plan.cc_list)
    return env


def _cmake(cache: Path, log: Callable[[str], None]) -> str:
    """A CMake of at least 3.13: the one on PATH, else PyPI's ``cmake`` in the cache."""
    found = shutil.which("cmake")
    if found:
        out = subprocess.run([found, "--version"], capture_output=True, text=True).stdout.split()
        version = tuple(int(p) for p in out[2].split(".")[:2]) if len(out) > 2 else (0, 0)
        if version >= (3, 13):
            return found
    tools = cache / "toolchains" / "cmake"
    binary = tools / "cmake" / "data" / "bin" / "cmake"  # the wheel's binary, not its wrapper
    if not binary.exists():
        log("no CMake >= 3.13 on PATH: fetching cmake from PyPI")
        shutil.rmtree(tools, ignore_errors=True)
        tools.parent.mkdir(parents=True, exist_ok=True)
        toolchain.pip_target(["cmake<5"], tools, sys.executable)
        if not binary.exists():
            raise BuildError(f"PyPI's cmake holds no {binary.relative_to(tools)}")
    return str(binary)


def _horovod_sdist(cache: Path) -> Path:
    """Horovod's source distribution, downloaded once into the cache."""
    folder = cache / "sdist"
    found = sorted(folder.glob(f"horovod-{HOROVOD_VERSION}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "download",
                           "-q", "--no-deps", "--no-binary", ":all:",
                           f"horovod=={HOROVOD_VERSION}", "-d", str(folder)],
                          capture_output=True, text=True)
    found = sorted(folder.glob(f"horovod-{HOROVOD_VERSION}.tar.gz"))
    if proc.returncode != 0 or not found:
        raise BuildError(f"could not download the Horovod {HOROVOD_VERSION} source: "
                         + proc.stderr.strip()[-500:])
    return found[0]


def build_wheel(plan: Plan, environment: Environment, cache: Path,
                log: Callable[[str], None]) -> Path:
    """The wheel for ``plan``: from the cache, or built (patched) and cached."""
    key = plan.key(environment)
    wheel_dir = wheel_cache(cache) / key
    wheels = sorted(wheel_dir.glob("horovod-*.whl"))
    if wheels:
        log(f"reusing the cached wheel {wheels[0]}")
        return wheels[0]
    sdist = _horovod_sdist(cache)
    cmake = _cmake(cache, log)
    log(f"building Horovod {HOROVOD_VERSION} ({plan.flavour}) against TensorFlow "
        f"{environment.tensorflow} (a few minutes); cache key {key}")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-horovod-") as work:
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        src = Path(work) / f"horovod-{HOROVOD_VERSION}"
        patching.apply_all(src)
        (src / "horovod" / f"{RECORD_MODULE}.py").write_text(
            '"""Written by hvdtrain\'s installer: how this Horovod was built."""\n'
            f"RECORD = {pprint.pformat(plan.record(environment))}\n")
        env = dict(os.environ)
        for name in list(env):  # the user's own build switches would fight the plan's
            if name.startswith(("HOROVOD_GPU", "HOROVOD_NCCL", "HOROVOD_WITH", "HOROVOD_CUDA")):
                del env[name]
        env.update(plan.env, HOROVOD_CMAKE=cmake,
                   PATH=f"{Path(environment.python).parent}{os.pathsep}{env.get('PATH', '')}")
        partial = wheel_dir.with_name(key + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        log_file = cache / "logs" / f"{key}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "w") as out:
            proc = subprocess.run([environment.python, "-m", "pip", "--disable-pip-version-check",
                                   "wheel", "--no-deps", "--no-build-isolation", "-w",
                                   str(partial), str(src)], cwd=work, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            lines = log_file.read_text(errors="replace").splitlines()
            errors = [line for line in lines if len(line) < 400 and
                      ("error:" in line.lower() or "Error " in line)][:15] or lines[-15:]
            raise BuildError(f"the Horovod build ({plan.flavour}) failed; its errors:\n"
                             + "\n".join(errors) + f"\nthe whole log: {log_file}")
        shutil.rmtree(wheel_dir, ignore_errors=True)
        partial.rename(wheel_dir)
    return sorted(wheel_dir.glob("horovod-*.whl"))[0]


_CHECK = """
import json, horovod, horovod.tensorflow as hvd
from horovod import hvdtrain_build
print(json.dumps({"version": horovod.__version__, "mpi": bool(hvd.mpi_built()),
                  "gloo": bool(hvd.gloo_built()), "nccl": bool(hvd.nccl_built()),
                  "key": hvdtrain_build.RECORD["key"]}))
"""


def check_installed(python: str, prefix: Path | None = None) -> dict:
    """Import the installed Horovod in a fresh process with every symbol bound at load
    (``LD_BIND_NOW=1``); returns what it was built with.

    Args:
        python: the interpreter of the environment.
        prefix: a folder holding an unpacked wheel to import instead (put first on
            ``PYTHONPATH``): the check before the environment is touched.

    Raises:
        BuildError: the import failed (its last line names the cause, such as an
            undefined symbol or a missing ``libnccl.so.2``).
    """
    env = dict(os.environ, LD_BIND_NOW="1", TF_CPP_MIN_LOG_LEVEL="2")
    if prefix is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(prefix), env.get("PYTHONPATH")]))
    proc = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"the installed Horovod does not load: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _pip_install(python: str, *args: str) -> None:
    proc = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "install", "-q",
                           *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"pip install {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")


def _install_and_check(plan: Plan, environment: Environment, cache: Path,
                       log: Callable[[str], None]) -> dict:
    key = plan.key(environment)
    if environment.installed_key == key:
        try:
            return check_installed(environment.python)
        except BuildError as err:
            log(f"the installed Horovod ({key}) does not load ({err}): reinstalling it")
    wheel = build_wheel(plan, environment, cache, log)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-wheel-check-") as unpacked:
        # loaded from a side folder first: a wheel that does not load never replaces the
        # environment's Horovod
        _pip_install(environment.python, "--no-deps", "--target", unpacked, str(wheel))
        check_installed(environment.python, Path(unpacked))
    if plan.flavour == "nccl" and plan.nccl.source == "pypi":
        _pip_install(environment.python, "--no-deps", "==".join(toolchain.NCCL_WHEEL))
    _pip_install(environment.python, "--no-deps", "--force-reinstall", str(wheel))
    built = check_installed(environment.python)
    if plan.flavour == "nccl" and not built["nccl"]:
        raise BuildError("the wheel loads but hvd.nccl_built() is false: NCCL was not found "
                         "by Horovod's CMake")
    return built


def install_horovod(gpu: str = "auto", python: str | None = None, cache: Path | None = None,
                    log: Callable[[str], None] = print, toolkit: str = "auto") -> dict:
    """Build (or reuse) hvdtrain's patched Horovod wheel and install it into ``python``'s
    environment, checking that it loads.

    Args:
        gpu: ``"auto"`` (NCCL where the driver lists a GPU, else CPU-only), ``"nccl"`` or
            ``"cpu"``.
        python: the interpreter whose environment gets Horovod (default: this one).
        cache: where wheels and toolchains are kept (default :func:`default_cache`).
        log: receives one line per step.
        toolkit: ``"auto"`` (a system CUDA toolkit where found, else PyPI's wheels) or
            ``"pypi"`` (the wheels even where a system toolkit exists).

    Returns:
        The build record (``key``, ``flavour``, ``cuda``, ``nccl``, ...) merged with what the
        loaded Horovod reports (``mpi``, ``gloo``, ``nccl_built``).

    Raises:
        BuildError: the build, install or load check failed; for ``auto`` only when the
            CPU build it falls back to fails too.
    """
    if gpu not in FLAVOURS:
        raise BuildError(f"GPU build {gpu!r}: expected one of {', '.join(FLAVOURS)}")
    python = python or sys.executable
    cache = cache or default_cache()
    environment = probe_environment(python)
    flavour = gpu if gpu != "auto" else ("nccl" if toolchain.gpu_listed() else "cpu")
    try:
        plan = plan_build(flavour, environment, cache, log, toolkit)
        built = _install_and_check(plan, environment, cache, log)
    except (BuildError, toolchain.ToolchainError) as err:
        if gpu != "auto" or flavour == "cpu":
            raise BuildError(f"Horovod {flavour} build: {err}") from err
        log(f"WARNING: the NCCL build failed ({err}); installing the CPU-only build instead: "
            f"{CPU_COST}. Fix the cause and run `hvdtrain install-horovod --gpu nccl`.")
        plan = plan_build("cpu", environment, cache, log)
        built = _install_and_check(plan, environment, cache, log)
    record = plan.record(environment)
    record.update(mpi_built=built["mpi"], gloo_built=built["gloo"], nccl_built=built["nccl"])
    return record
