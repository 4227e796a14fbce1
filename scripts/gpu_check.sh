#!/usr/bin/env bash
# The one prepared GPU check, run once whenever a GPU machine is lent (about 10 minutes):
#
#   1. install: `make install` (on a GPU host: tensorflow[and-cuda] and the NCCL build of
#      Horovod); a carried wheel cache is used where HVDTRAIN_WHEEL_CACHE points at one;
#   2. the build: `horovodrun --check-build` and `hvdtrain info` (CUDA, NCCL, driver);
#   3. scripts/gpu_check.py: Horovod's all-reduce, broadcast and all-gather on GPU tensors
#      against the same on the CPU; the Trainer and hvdtrain.tensorflow.keras `fit` on the
#      GPU, each with and without XLA (one rank per GPU);
#   4. scripts/gpu_bench.sh: synthetic ResNet-50 in mixed precision, the Trainer, a plain
#      hvd.DistributedGradientTape loop and single-process Keras `fit` without Horovod,
#      images/s side by side.
#
# Every figure goes to GPU_CHECK_OUT (default: $OUT where the device tool sets it, else
# runs/gpu_check): install.log, info.txt, check.json, bench.json, bench.txt. Exits non-zero
# if a step fails, after running the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT_DIR"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} PYTHONUNBUFFERED=1
say() { echo "gpu_check: $*" | tee -a "$OUT_DIR/summary.txt"; }
failed=0

nvidia-smi -L 2>&1 | tee "$OUT_DIR/gpus.txt"
NP=$(grep -c '^GPU ' "$OUT_DIR/gpus.txt" || true)
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { say "the driver lists no GPU"; NP=1; failed=1; }

if bash scripts/install.sh >"$OUT_DIR/install.log" 2>&1; then say "install: ok"
else tail -n 30 "$OUT_DIR/install.log"; say "install: FAILED"; exit 1; fi

{ .venv/bin/horovodrun --check-build; .venv/bin/hvdtrain info; } >"$OUT_DIR/info.txt" 2>&1
cat "$OUT_DIR/info.txt"
grep -q '\[X\] NCCL' "$OUT_DIR/info.txt" && say "NCCL build: ok" || { say "NCCL build: MISSING"; failed=1; }

launch=(.venv/bin/python)
(( NP == 1 )) || launch=(.venv/bin/horovodrun -np "$NP" -H "localhost:$NP" --gloo .venv/bin/python)
if timeout 300 "${launch[@]}" scripts/gpu_check.py --out "$OUT_DIR/check.json" \
    >"$OUT_DIR/check.log" 2>&1; then say "collectives, Trainer, fit (with and without XLA): ok"
else tail -n 40 "$OUT_DIR/check.log"; say "gpu_check.py: FAILED (see check.json)"; failed=1; fi
grep '^gpu_check:' "$OUT_DIR/check.log" || true

if PYTHON=.venv/bin/python NP=$NP GPU_BENCH_PRECISIONS=mixed_float16 \
    GPU_BENCH_MODES="trainer tape keras" GPU_BENCH_BUDGET=${GPU_BENCH_BUDGET:-380} \
    GPU_BENCH_OUT="$OUT_DIR/bench.json" bash scripts/gpu_bench.sh >"$OUT_DIR/bench.txt" 2>&1
then say "ResNet-50 bench: ok"; else say "ResNet-50 bench: FAILED"; failed=1; fi
tail -n 8 "$OUT_DIR/bench.txt"
exit $failed
