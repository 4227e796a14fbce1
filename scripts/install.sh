#!/usr/bin/env bash
# Idempotent set-up of hvdtrain: system packages, .venv, pinned Python packages,
# a Horovod wheel built against the pinned TensorFlow (cached outside the repo),
# hvdtrain in editable mode, and a final `horovodrun --check-build`.
#
# Horovod is built with NCCL (GPU-to-GPU all-reduce) where a GPU, a CUDA toolkit and NCCL
# are found, else CPU-only; HVDTRAIN_GPU_BUILD=nccl|cpu forces one. `--detect-gpu-build` only
# prints the flavour this machine gets (cpu or nccl) and exits, installing nothing.
set -euo pipefail

HOROVOD_VERSION=0.28.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3.11}
CACHE_DIR=${HVDTRAIN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdtrain/wheels}

say() { echo "[install] $*"; }
die() { echo "[install] FAILED: $*" >&2; exit 1; }

# --- 0. Which Horovod build: CPU-only, or NCCL for GPU operations ----------------------
# Where a CUDA toolkit is looked for when none is named (HVDTRAIN_CUDA_PREFIX changes it).
CUDA_PREFIX=${HVDTRAIN_CUDA_PREFIX:-/usr/local/cuda}

find_cuda_home() {  # the CUDA toolkit: HOROVOD_CUDA_HOME, CUDA_HOME, nvcc's, $CUDA_PREFIX
  local home nvcc
  nvcc=$(command -v nvcc 2>/dev/null || true)
  for home in "${HOROVOD_CUDA_HOME:-}" "${CUDA_HOME:-}" "${nvcc:+$(dirname "$nvcc")/..}" \
              "$CUDA_PREFIX"; do  # nvcc on PATH may be a wrapper: its toolkit has headers
    if [ -n "$home" ] && [ -x "$home/bin/nvcc" ] && [ -f "$home/include/cuda_runtime.h" ]; then
      (cd "$home" && pwd); return 0
    fi
  done
  [ -n "$nvcc" ] || return 1
  (cd "$(dirname "$nvcc")/.." && pwd)  # no headers anywhere: Horovod's build will say so
}

find_nccl() {  # prints where libnccl.so is (a home for HOROVOD_NCCL_HOME, or a library path)
  if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then echo "$HOROVOD_NCCL_HOME"; return 0; fi
  if [ -n "${NCCL_HOME:-}" ] && ls "$NCCL_HOME"/lib/libnccl.so* >/dev/null 2>&1; then
    echo "$NCCL_HOME"; return 0
  fi
  local dir
  for dir in /usr/lib/x86_64-linux-gnu "$CUDA_PREFIX/lib64"; do
    ls "$dir"/libnccl.so* >/dev/null 2>&1 && { echo "$dir"; return 0; }
  done
  local lib
  lib=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*/libnccl\.so[^ ]*' | head -n 1 || true)
  [ -n "$lib" ] && { dirname "$lib"; return 0; }
  return 1
}

has_gpu() {  # an NVIDIA GPU the driver lists (a build host without one sets HVDTRAIN_GPU_BUILD)
  nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# Prints the build flavour, "cpu" or "nccl": HVDTRAIN_GPU_BUILD if set, else "nccl" when a
# GPU, a CUDA toolkit and NCCL are all found (a toolkit alone, as on CPU-only CI machines
# with CUDA installed, keeps the CPU build). Fails when nccl is forced without a toolkit.
detect_gpu_build() {
  case "${HVDTRAIN_GPU_BUILD:-}" in
    cpu) echo cpu ;;
    nccl) find_cuda_home >/dev/null || die "HVDTRAIN_GPU_BUILD=nccl, but no CUDA toolkit" \
            "was found (nvcc on PATH or in $CUDA_PREFIX/bin): install it, or unset" \
            "HVDTRAIN_GPU_BUILD for a CPU-only build"
          echo nccl ;;
    "") if has_gpu && find_cuda_home >/dev/null && find_nccl >/dev/null; then echo nccl
        else echo cpu; fi ;;
    *) die "HVDTRAIN_GPU_BUILD=$HVDTRAIN_GPU_BUILD: expected nccl or cpu" ;;
  esac
}

if [ "${1:-}" = "--detect-gpu-build" ]; then
  detect_gpu_build
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument: $1 (the only one is --detect-gpu-build)"
GPU_BUILD=$(detect_gpu_build) || exit 1

# --- 1. System packages (Open MPI before the Horovod build; Fashion-MNIST data) ------
need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -n "$(command -v mpicxx || true)" ] || need_apt+=(libopenmpi-dev)
[ -d /usr/share/datasets/fashion-mnist ] || need_apt+=(dataset-fashion-mnist)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" \
    || die "apt-get install ${need_apt[*]} failed"
fi

# --- 2. Virtual environment and pinned packages --------------------------------------
command -v "$PY" >/dev/null || die "$PY not found (hvdtrain needs Python 3.11; set PYTHON=...)"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV" || die "could not create the virtual environment"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.requirements.sha"
want=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned Python packages (requirements.txt)"
  "${PIP[@]}" install -r "$ROOT/requirements.txt" || die "pip install -r requirements.txt failed"
  echo "$want" > "$stamp"
fi

# --- 3. Horovod wheel: reuse the cached one or build it --------------------------------
TF_VERSION=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))')
PY_TAG=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-$GPU_BUILD"
WHEEL_DIR="$CACHE_DIR/$KEY"
OLD_KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG"  # earlier installs: CPU-only wheels
if [ "$GPU_BUILD" = cpu ]; then
  if [ ! -e "$WHEEL_DIR" ] && ls "$CACHE_DIR/$OLD_KEY"/horovod-*.whl >/dev/null 2>&1; then
    mv "$CACHE_DIR/$OLD_KEY" "$WHEEL_DIR"
  fi
  [ ! -f "$VENV/.horovod-$OLD_KEY" ] || mv "$VENV/.horovod-$OLD_KEY" "$VENV/.horovod-$KEY"
fi
gpu_env=()
if [ "$GPU_BUILD" = nccl ]; then
  cuda_home=$(find_cuda_home)
  nccl_at=$(find_nccl || true)
  gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$cuda_home"
           "HOROVOD_NCCL_LINK=${HOROVOD_NCCL_LINK:-SHARED}"
           "HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,89,90}")
  nccl_home=${nccl_at%/lib64}; nccl_home=${nccl_home%/lib}  # the folder above lib/, include/
  case "$nccl_home" in  # the system's library folder is searched anyway
    ""|/usr/lib/x86_64-linux-gnu) ;;
    *) gpu_env+=("HOROVOD_NCCL_HOME=$nccl_home") ;;
  esac
  say "Horovod build: with NCCL (CUDA toolkit in $cuda_home, NCCL in ${nccl_at:-the default search paths}): gradients are all-reduced GPU to GPU"
else
  say "Horovod build: CPU-only (no CUDA toolkit/NCCL found: gradients travel through host memory)"
fi
have_hvd=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$have_hvd" != "$HOROVOD_VERSION" ] || [ ! -f "$VENV/.horovod-$KEY" ]; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION ($GPU_BUILD) against TensorFlow $TF_VERSION (a few minutes)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
      || die "could not download the Horovod $HOROVOD_VERSION source"
    tar -xzf "$work"/horovod-*.tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # TF 2.21's XLA headers need highwayhash/farmhash headers its wheel lacks; the XLA ops
    # are optional (HOROVOD_ENABLE_XLA_OPS), so leave that one source out of the build.
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    mkdir -p "$WHEEL_DIR"
    ( cd "$src" && \
      PATH="$VENV/bin:$PATH" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      MAKEFLAGS="-j$(nproc)" \
      env ${gpu_env[@]+"${gpu_env[@]}"} \
      "$VENV/bin/python" -m pip --disable-pip-version-check wheel --no-deps --no-build-isolation \
        -w "$WHEEL_DIR" . > "$work/build.log" 2>&1 ) \
      || { tail -40 "$work/build.log" >&2; rm -rf "$WHEEL_DIR"; die "Horovod build failed (log above)"; }
  else
    say "reusing cached Horovod wheel in $WHEEL_DIR"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl \
    || die "could not install the Horovod wheel"
  rm -f "$VENV"/.horovod-horovod-*  # the stamp of the other flavour, if any
  touch "$VENV/.horovod-$KEY"
fi

# --- 4. hvdtrain itself ----------------------------------------------------------------
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT" >/dev/null \
  || die "pip install -e . failed"

# --- 5. Check the Horovod build ---------------------------------------------------------
check=$("$VENV/bin/horovodrun" --check-build) || die "horovodrun --check-build failed"
echo "$check"
parts=(TensorFlow MPI Gloo)
[ "$GPU_BUILD" = cpu ] || parts+=(NCCL)
for part in "${parts[@]}"; do
  echo "$check" | grep -q "\[X\] $part" || die "Horovod was built without $part"
done
say "ready: $VENV"
