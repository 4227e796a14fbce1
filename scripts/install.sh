#!/usr/bin/env bash
# Idempotent set-up of hvdtrain: system packages, .venv, pinned Python packages,
# a Horovod wheel built against the pinned TensorFlow (cached outside the repo),
# hvdtrain in editable mode, and a final `horovodrun --check-build`.
set -euo pipefail

HOROVOD_VERSION=0.28.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3.11}
CACHE_DIR=${HVDTRAIN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdtrain/wheels}

say() { echo "[install] $*"; }
die() { echo "[install] FAILED: $*" >&2; exit 1; }

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
KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG"
WHEEL_DIR="$CACHE_DIR/$KEY"
have_hvd=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$have_hvd" != "$HOROVOD_VERSION" ] || [ ! -f "$VENV/.horovod-$KEY" ]; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (a few minutes)"
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
      "$VENV/bin/python" -m pip --disable-pip-version-check wheel --no-deps --no-build-isolation \
        -w "$WHEEL_DIR" . > "$work/build.log" 2>&1 ) \
      || { tail -40 "$work/build.log" >&2; rm -rf "$WHEEL_DIR"; die "Horovod build failed (log above)"; }
  else
    say "reusing cached Horovod wheel in $WHEEL_DIR"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl \
    || die "could not install the Horovod wheel"
  touch "$VENV/.horovod-$KEY"
fi

# --- 4. hvdtrain itself ----------------------------------------------------------------
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT" >/dev/null \
  || die "pip install -e . failed"

# --- 5. Check the Horovod build ---------------------------------------------------------
check=$("$VENV/bin/horovodrun" --check-build) || die "horovodrun --check-build failed"
echo "$check"
for part in TensorFlow MPI Gloo; do
  echo "$check" | grep -q "\[X\] $part" || die "Horovod was built without $part"
done
say "ready: $VENV"
