"""``scripts/gpu_bench.sh`` end to end on the CPU: the tiny model, real processes, no mocks.

No speed is asserted: the numbers depend on the machine and whatever else runs on it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.parallel


def _gpu_bench(out: Path, timeout: float = 240, **env) -> subprocess.CompletedProcess:
    """Runs the script with a tiny, quick configuration plus ``env``."""
    full = dict(os.environ, PYTHON=sys.executable, GPU_BENCH_MODEL="tiny",
                GPU_BENCH_IMAGE_SIZE="32", GPU_BENCH_BATCH="8", GPU_BENCH_STEPS="3",
                GPU_BENCH_WARMUP="1", GPU_BENCH_TIMEOUT="120", GPU_BENCH_OUT=str(out), NP="1")
    full.update(env)
    return subprocess.run(["bash", "scripts/gpu_bench.sh"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


def _check(proc: subprocess.CompletedProcess, out: Path, np: int, pairs: set) -> dict:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(out.read_text())
    runs = {(r["mode"], r["precision"]): r for r in summary["results"]}
    assert set(runs) == pairs and len(summary["results"]) == len(pairs)
    for r in runs.values():
        assert r["images_per_s"] > 0 and r["np"] == np and r["device"] == "CPU"
        assert r["batch"] == 8 and r["global_batch"] == 8 * np and r["steps"] == 3
        assert r["images_per_s"] == pytest.approx(8 * np * 3 / r["elapsed_s"])
    return summary


@pytest.mark.timeout(300)
def test_gpu_bench_script_all_modes_and_precisions(tmp_path):
    out = tmp_path / "results.json"
    proc = _gpu_bench(out)
    pairs = {(m, p) for m in ("trainer", "plain") for p in ("float32", "mixed_float16")}
    summary = _check(proc, out, 1, pairs)
    speed = {(r["mode"], r["precision"]): r["images_per_s"] for r in summary["results"]}
    for prec in ("float32", "mixed_float16"):
        ratio = summary["ratios"][prec]
        assert ratio == pytest.approx(speed["trainer", prec] / speed["plain", prec])
        row = next(line for line in proc.stdout.splitlines() if line.startswith(prec + " "))
        assert row.rstrip().endswith(f"{ratio:.3f}")  # the table prints both ratios
    assert "trainer/plain" in proc.stdout


@pytest.mark.timeout(300)
def test_gpu_bench_script_two_workers_under_horovodrun(tmp_path):
    out = tmp_path / "results.json"
    proc = _gpu_bench(out, NP="2", GPU_BENCH_MODES="plain", GPU_BENCH_PRECISIONS="float32")
    summary = _check(proc, out, 2, {("plain", "float32")})
    assert summary["ratios"] == {"float32": None}  # no trainer run: no ratio, and no crash


@pytest.mark.timeout(120)
def test_gpu_bench_script_names_a_failing_run(tmp_path):
    out = tmp_path / "results.json"
    proc = _gpu_bench(out, GPU_BENCH_IMAGE_SIZE="0")
    assert proc.returncode != 0
    assert "run trainer/float32 (np=1) failed" in proc.stderr
    assert not out.exists()
