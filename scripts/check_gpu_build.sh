#!/usr/bin/env bash
# The GPU build and the user's-own-environment install, checked on a host without a GPU
# (CI runs it after `make test`; `make check-gpu-build` runs it by hand):
#
#   1. HVDTRAIN_GPU_BUILD=nccl make install, with the CUDA 13 compiler and NCCL fetched from
#      PyPI (HVDTRAIN_CUDA_TOOLKIT=pypi: the path of a GPU host without nvcc); the wheel is
#      cached like the CPU one;
#   2. that install imported with every symbol bound (LD_BIND_NOW=1): hvd.init() and
#      hvd.nccl_built();
#   3. the unit tests and 2-rank training-parity jobs (horovodrun and mpirun) on it: a GPU
#      build must still train where there is no GPU (a login node, CPU-only CI);
#   4. `pip install .` into a fresh virtual environment, then `hvdtrain install-horovod`:
#      a working Horovod there, shown by a 2-rank all-reduce under horovodrun;
#   5. `make install` again, so .venv is back on this host's own (CPU) build.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[check-gpu-build] $*"; }
PY=${PYTHON:-python3.11}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

say "1. the NCCL build, toolchain from PyPI"
HVDTRAIN_GPU_BUILD=nccl HVDTRAIN_CUDA_TOOLKIT=pypi bash scripts/install.sh

say "2. load check: every symbol bound, NCCL built"
LD_BIND_NOW=1 .venv/bin/python -c "
import horovod.tensorflow as hvd
hvd.init()
assert hvd.nccl_built(), 'hvd.nccl_built() is false'
print('horovod', hvd.size(), 'rank(s); nccl_built', hvd.nccl_built())"
.venv/bin/hvdtrain info

say "3. unit tests and 2-rank parity on the NCCL build"
.venv/bin/python -m pytest tests/unit -n 2 -q -p no:cacheprovider
.venv/bin/python -m pytest tests/parallel/test_trainer_parallel.py -q -p no:cacheprovider \
  -k "two_ranks_match_one_rank or buckets_and_steps"

say "4. pip install . in a fresh virtual environment, then hvdtrain install-horovod"
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
"$PY" -m venv "$fresh/venv"
"$fresh/venv/bin/python" -m pip install -q --disable-pip-version-check .
if "$fresh/venv/bin/python" -c "import horovod" 2>/dev/null; then
  echo "pip install . installed Horovod (the unpatched sdist)" >&2; exit 1
fi
"$fresh/venv/bin/hvdtrain" install-horovod
cat > "$fresh/allreduce.py" <<'EOF'
import hvdtrain.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
assert float(total[0]) == hvd.size() * (hvd.size() + 1) / 2, total
print(f"rank {hvd.rank()}: all-reduce ok")
EOF
(cd "$fresh" && timeout 300 venv/bin/horovodrun -np 2 -H localhost:2 --gloo \
  venv/bin/python allreduce.py)

say "5. back to this host's own build"
bash scripts/install.sh
say "all checks passed"
