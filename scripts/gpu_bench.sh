#!/usr/bin/env bash
# GPU benchmark: the hvdtrain Trainer against two hand-written Horovod loops (plain: one
# grouped all-reduce per step; tape: hvd.DistributedGradientTape, one all-reduce per
# gradient tensor), ResNet-50 on synthetic 224x224 images, float32 and mixed_float16.
# Run on a GPU machine after `make install`:
#
#   bash scripts/gpu_bench.sh
#
# Each (precision, mode) runs as its own job (python, or horovodrun --gloo when NP > 1)
# under a timeout, and all the runs together within GPU_BENCH_BUDGET seconds (a run gets
# at most what is left of it); the results go to one summary file and a table of images/s
# and the trainer/plain and trainer/tape ratios per precision is printed. The defaults fit
# in 10 minutes on one H100/H200.
#
# Environment overrides:
#   GPU_BENCH_MODEL       resnet50 | tiny (a small conv net for CPU tests)  [resnet50]
#   GPU_BENCH_IMAGE_SIZE  image height and width                            [224]
#   GPU_BENCH_BATCH       images per step per worker                        [64]
#   GPU_BENCH_STEPS       timed steps                                       [100]
#   GPU_BENCH_WARMUP      untimed steps before timing                       [20]
#   GPU_BENCH_TIMEOUT     seconds per run before it is killed               [150]
#   GPU_BENCH_BUDGET      seconds for all the runs together                 [560]
#   GPU_BENCH_PRECISIONS  precisions to run                                 [float32 mixed_float16]
#   GPU_BENCH_MODES       modes to run (keras: one process's Keras fit, no Horovod)
#                                                                     [trainer plain tape]
#   NP                    workers                            [GPUs listed by nvidia-smi, or 1]
#   GPU_BENCH_OUT         summary file                       [runs/gpu_bench/results.json]
#   PYTHON                interpreter                        [.venv/bin/python]
set -euo pipefail

cd "$(dirname "$0")/.."
MODEL=${GPU_BENCH_MODEL:-resnet50}
IMAGE_SIZE=${GPU_BENCH_IMAGE_SIZE:-224}
BATCH=${GPU_BENCH_BATCH:-64}
STEPS=${GPU_BENCH_STEPS:-100}
WARMUP=${GPU_BENCH_WARMUP:-20}
RUN_TIMEOUT=${GPU_BENCH_TIMEOUT:-150}
BUDGET=${GPU_BENCH_BUDGET:-560}
PRECISIONS=${GPU_BENCH_PRECISIONS:-float32 mixed_float16}
MODES=${GPU_BENCH_MODES:-trainer plain tape}
OUT=${GPU_BENCH_OUT:-runs/gpu_bench/results.json}
PYTHON=${PYTHON:-.venv/bin/python}
if [[ -z "${NP:-}" ]]; then
  NP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [[ "$NP" =~ ^[1-9][0-9]*$ ]] || NP=1
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} PYTHONUNBUFFERED=1

launch=("$PYTHON")
if (( NP > 1 )); then
  HOROVODRUN=$(dirname "$PYTHON")/horovodrun
  [[ -x "$HOROVODRUN" ]] || HOROVODRUN=$(command -v horovodrun) \
    || { echo "gpu_bench: horovodrun not found next to $PYTHON or on PATH" >&2; exit 1; }
  launch=("$HOROVODRUN" -np "$NP" -H "localhost:$NP" --gloo "$PYTHON")
fi

RUN_DIR=$(dirname "$OUT")/runs
mkdir -p "$RUN_DIR"
echo "gpu_bench: $MODEL ${IMAGE_SIZE}px batch $BATCH/worker, np=$NP, $WARMUP warm-up +" \
     "$STEPS timed steps, ${RUN_TIMEOUT}s per run, ${BUDGET}s in all; logs in $RUN_DIR"
results=()
for precision in $PRECISIONS; do
  for mode in $MODES; do
    name="$mode/$precision"
    result="$RUN_DIR/$mode-$precision.json"
    log="$RUN_DIR/$mode-$precision.log"
    rm -f "$result"
    limit=$(( BUDGET - SECONDS < RUN_TIMEOUT ? BUDGET - SECONDS : RUN_TIMEOUT ))
    if (( limit < 1 )); then
      echo "gpu_bench: run $name (np=$NP) failed: no time left of the ${BUDGET}s budget" >&2
      exit 1
    fi
    rc=0
    cmd=("${launch[@]}")
    [[ "$mode" != keras ]] || cmd=("$PYTHON")  # one process's Keras fit, without Horovod
    timeout --kill-after=10 "$limit" "${cmd[@]}" scripts/gpu_bench.py \
      --model "$MODEL" --image-size "$IMAGE_SIZE" --batch-size "$BATCH" --steps "$STEPS" \
      --warmup "$WARMUP" --mode "$mode" --precision "$precision" --out "$result" \
      >"$log" 2>&1 || rc=$?
    if (( rc != 0 )) || [[ ! -s "$result" ]]; then
      tail -n 40 "$log" >&2 || true
      why="exited $rc"; (( rc == 124 || rc == 137 )) && why="timed out after ${limit}s"
      echo "gpu_bench: run $name (np=$NP) failed: $why; full log: $log" >&2
      exit 1
    fi
    echo "gpu_bench: $name done: $(cat "$result")"
    results+=("$result")
  done
done

"$PYTHON" scripts/gpu_bench.py --summarize "${results[@]}" --out "$OUT"
echo "gpu_bench: summary written to $OUT"
