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
def test_gpu_bench_script_all_modes_at_one_rank(tmp_path):
    out = tmp_path / "results.json"
    modes = ("trainer", "plain", "tape", "keras")
    proc = _gpu_bench(out, GPU_BENCH_PRECISIONS="mixed_float16", GPU_BENCH_MODES=" ".join(modes))
    summary = _check(proc, out, 1, {(m, "mixed_float16") for m in modes})
    speed = {r["mode"]: r["images_per_s"] for r in summary["results"]}
    ratios = [summary[key]["mixed_float16"] for key in ("ratios", "ratios_tape", "ratios_keras")]
    for ratio, baseline in zip(ratios, ("plain", "tape", "keras")):
        assert ratio == pytest.approx(speed["trainer"] / speed[baseline])
    row = next(line for line in proc.stdout.splitlines() if line.startswith("mixed_float16 "))
    cells = [c.strip() for c in row.split("|")]  # precision, 4 x img/s, the 3 ratios
    assert cells[1:] == [f"{speed[m]:,.1f}" for m in modes] \
        + [f"{ratio:.3f}" for ratio in ratios], row
    assert "trainer/plain" in proc.stdout and "trainer/keras" in proc.stdout


@pytest.mark.timeout(300)
def test_gpu_bench_script_two_workers_under_horovodrun(tmp_path):
    """The per-tensor tape with a real all-reduce (the plain loop differs from it only in
    using one grouped all-reduce; it runs at two ranks in tests/parallel/test_bench.py)."""
    out = tmp_path / "results.json"
    proc = _gpu_bench(out, NP="2", GPU_BENCH_MODES="tape", GPU_BENCH_PRECISIONS="float32")
    summary = _check(proc, out, 2, {("tape", "float32")})
    # no trainer run: no ratio, and no crash
    assert summary["ratios"] == summary["ratios_tape"] == {"float32": None}
    assert summary["results"][0]["final_loss"] > 0


@pytest.mark.timeout(30)
def test_summary_table_has_a_row_per_precision_and_both_ratios(tmp_path):
    """``--summarize`` alone (no TensorFlow): two precisions, one of them missing a mode."""
    runs = {("trainer", "float32"): 300.0, ("plain", "float32"): 200.0,
            ("tape", "float32"): 150.0, ("trainer", "mixed_float16"): 600.0,
            ("plain", "mixed_float16"): 400.0}
    paths = []
    for (mode, precision), speed in runs.items():
        path = tmp_path / f"{mode}-{precision}.json"
        path.write_text(json.dumps({"mode": mode, "precision": precision, "images_per_s": speed,
                                    "model": "tiny", "image_size": 32, "batch": 8, "np": 1,
                                    "steps": 3, "warmup": 1, "device": "CPU"}))
        paths.append(str(path))
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_bench.py", "--summarize", *paths,
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["ratios"] == {"float32": 1.5, "mixed_float16": 1.5}
    assert summary["ratios_tape"] == {"float32": 2.0, "mixed_float16": None}
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]]
            for line in proc.stdout.splitlines() if line.count("|") == 7}
    assert rows["float32"] == ["300.0", "200.0", "150.0", "-", "1.500", "2.000", "-"]
    assert rows["mixed_float16"] == ["600.0", "400.0", "-", "-", "1.500", "-", "-"]


@pytest.mark.timeout(120)
def test_gpu_bench_script_names_a_failing_run(tmp_path):
    out = tmp_path / "results.json"
    proc = _gpu_bench(out, GPU_BENCH_IMAGE_SIZE="0")
    assert proc.returncode != 0
    assert "run trainer/float32 (np=1) failed" in proc.stderr
    assert not out.exists()
    # The runs share one time budget: none starts once it is spent.
    proc = _gpu_bench(out, GPU_BENCH_BUDGET="0")
    assert proc.returncode != 0 and not out.exists()
    assert "run trainer/float32 (np=1) failed: no time left of the 0s budget" in proc.stderr
