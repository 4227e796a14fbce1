#!/usr/bin/env bash
# Idempotent set-up of hvdtrain: system packages, .venv, pinned Python packages, hvdtrain
# in editable mode, then hvdtrain's patched Horovod wheel built against the pinned
# TensorFlow (cached outside the repo, see hvdtrain/horovod_build/), checked by importing it
# with every symbol bound and by `horovodrun --check-build`.
#
# Horovod is built with NCCL (GPU-to-GPU all-reduce) where the driver lists a GPU, else
# CPU-only; HVDTRAIN_GPU_BUILD=nccl|cpu forces one (nccl works on a GPU-less host too).
# An NCCL build uses the system's CUDA toolkit and NCCL where found, else pinned wheels
# from PyPI (HVDTRAIN_CUDA_TOOLKIT=pypi takes the wheels even where a toolkit exists).
# `--detect-gpu-build` only prints the flavour this machine gets (cpu or nccl) and exits.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3.11}

say() { echo "[install] $*"; }
die() { echo "[install] FAILED: $*" >&2; exit 1; }

# --- 0. Which Horovod build: CPU-only, or NCCL for GPU operations ----------------------
has_gpu() {  # an NVIDIA GPU the driver lists (a build host without one sets HVDTRAIN_GPU_BUILD)
  nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# Prints the flavour asked for, "cpu" or "nccl": HVDTRAIN_GPU_BUILD if set, else "nccl"
# where the driver lists a GPU (the build falls back to cpu, with a warning, if it fails).
detect_gpu_build() {
  case "${HVDTRAIN_GPU_BUILD:-}" in
    cpu|nccl) echo "$HVDTRAIN_GPU_BUILD" ;;
    "") if has_gpu; then echo nccl; else echo cpu; fi ;;
    *) die "HVDTRAIN_GPU_BUILD=$HVDTRAIN_GPU_BUILD: expected nccl or cpu" ;;
  esac
}

if [ "${1:-}" = "--detect-gpu-build" ]; then
  detect_gpu_build
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument: $1 (the only one is --detect-gpu-build)"
GPU_BUILD=$(detect_gpu_build) || exit 1
if [ -n "${HVDTRAIN_GPU_BUILD:-}" ]; then say "Horovod build: $GPU_BUILD (HVDTRAIN_GPU_BUILD)"
else say "Horovod build: $GPU_BUILD (auto-detected; an NCCL build that fails falls back to cpu)"; fi

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
# TensorFlow's CUDA libraries, to see the GPU: where the driver lists one, or asked for
# (HVDTRAIN_TF_AND_CUDA=1: an image built without a GPU for GPU nodes)
and_cuda=${HVDTRAIN_TF_AND_CUDA:-}
[ -n "$and_cuda" ] || { has_gpu && and_cuda=1 || and_cuda=0; }
if [ "$and_cuda" = 1 ]; then want="$want+and-cuda"; fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned Python packages (requirements.txt)"
  "${PIP[@]}" install -r "$ROOT/requirements.txt" || die "pip install -r requirements.txt failed"
  if [ "$and_cuda" = 1 ]; then
    tf=$(grep -o '^tensorflow==[0-9.]*' "$ROOT/requirements.txt" | cut -d= -f3)
    say "installing tensorflow[and-cuda]==$tf (TensorFlow's CUDA libraries)"
    "${PIP[@]}" install "tensorflow[and-cuda]==$tf" || die "pip install tensorflow[and-cuda] failed"
  fi
  echo "$want" > "$stamp"
fi

# --- 3. hvdtrain itself (its installer builds Horovod) --------------------------------
# The wheel carries hvdtrain-startup.pth: every Python of the venv starts with hvdtrain's
# quiet TensorFlow start-up (_hvdtrain_startup.py; HVDTRAIN_TF_LOGS=1 turns it off).
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT" >/dev/null \
  || die "pip install -e . failed"
"$VENV/bin/python" -c 'import sys; sys.exit("_hvdtrain_startup" not in sys.modules)' \
  || die "hvdtrain's start-up hook (hvdtrain-startup.pth) is not active in $VENV"

# --- 4. Horovod: the cached wheel or a patched build, installed and load-checked --------
"$VENV/bin/python" -m hvdtrain.horovod_build --gpu "${HVDTRAIN_GPU_BUILD:-auto}" \
  || die "Horovod could not be installed (see above)"

# --- 5. Check the Horovod build ---------------------------------------------------------
# (once more on failure: its forked probe processes now and then die without an answer)
check=$("$VENV/bin/horovodrun" --check-build) || check=$("$VENV/bin/horovodrun" --check-build) \
  || die "horovodrun --check-build failed"
echo "$check"
flavour=$("$VENV/bin/python" -c 'import horovod.hvdtrain_build as b; print(b.RECORD["flavour"])')
parts=(TensorFlow MPI Gloo)
[ "$flavour" = cpu ] || parts+=(NCCL)
for part in "${parts[@]}"; do
  echo "$check" | grep -q "\[X\] $part" || die "Horovod was built without $part"
done
say "ready: $VENV (Horovod: $flavour build)"
