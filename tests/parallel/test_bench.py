"""``hvdtrain bench`` end to end: real 1- and 2-rank jobs, JSON report consistent with itself.

No speed is asserted: the numbers depend on the machine and whatever else runs on it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.parallel


def _bench(*args, timeout=300):
    script = BIN / "hvdtrain"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hvdtrain.cli"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd + ["bench", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)


def _check_row(row, one_rank=None):
    t, p = row["trainer"]["samples_per_s"], row["plain"]["samples_per_s"]
    assert t > 0 and p > 0
    assert row["trainer"]["runs_samples_per_s"] == [t]  # one repeat: the median is the run
    assert row["ratio_trainer_over_plain"] == pytest.approx(t / p)
    if one_rank is None:
        assert row["efficiency"] == {"trainer": None, "plain": None}
    else:
        for mode in ("trainer", "plain"):
            expected = row[mode]["samples_per_s"] / (row["np"] * one_rank[mode]["samples_per_s"])
            assert row["efficiency"][mode] == pytest.approx(expected)


@pytest.mark.timeout(300)
def test_bench_one_and_two_ranks_under_horovodrun():
    report = _bench("--np", "1", "2", "--steps", "20", "--repeats", "1")
    assert report["config"]["np"] == [1, 2] and report["config"]["launcher"] == "horovodrun"
    rows = {r["np"]: r for r in report["results"]}
    assert set(rows) == {1, 2}
    _check_row(rows[1], rows[1])
    assert rows[1]["efficiency"] == {"trainer": pytest.approx(1.0), "plain": pytest.approx(1.0)}
    _check_row(rows[2], rows[1])
    # Every run reports the time of its slowest rank, and all ranks were timed.
    assert len(report["runs"]) == 4
    for run in report["runs"]:
        assert len(run["elapsed_per_rank_s"]) == run["np"]
        assert run["elapsed_s"] == max(run["elapsed_per_rank_s"])
        assert run["samples_per_s"] == pytest.approx(128 * run["np"] * 20 / run["elapsed_s"])
    # The exact commands are part of the report.
    cmds = report["commands"]
    assert set(cmds) == {"np=1 trainer", "np=1 plain", "np=2 trainer", "np=2 plain"}
    assert "horovodrun -np 2 -H localhost:2 --gloo" in cmds["np=2 plain"]
    assert "--mode trainer" in cmds["np=2 trainer"] and "horovodrun" not in cmds["np=1 trainer"]


@pytest.mark.timeout(300)
def test_bench_two_ranks_under_mpirun():
    report = _bench("--np", "2", "--steps", "20", "--repeats", "1", "--launcher", "mpirun")
    (row,) = report["results"]
    assert row["np"] == 2
    _check_row(row)
    assert all("mpirun" in c and "--bind-to none" in c for c in report["commands"].values())


@pytest.mark.timeout(400)
def test_bench_levers_and_keras_fit():
    report = _bench("--np", "2", "--steps", "10", "--repeats", "1", "--fit",
                    "--compression", "topk", "--compression-ratio", "0.01",
                    "--backward-passes", "2")
    assert report["config"]["options"] == {"compression": "topk", "compression_ratio": 0.01,
                                           "backward_passes_per_step": 2}
    (row,) = report["results"]
    for mode in ("trainer", "plain", "fit"):
        assert row[mode]["samples_per_s"] > 0
    assert row["ratio_fit_over_trainer"] == pytest.approx(
        row["fit"]["samples_per_s"] / row["trainer"]["samples_per_s"])
    sent = row["bytes_sent_per_step"]
    sizes = [784 * 800, 800, 800 * 800, 800, 800 * 10, 10]
    assert sent["plain"] == sum(sizes) * 4  # the dense float32 baseline
    # Top-K 1%: index + value (8 bytes) for 1% of each tensor, exchanged every 2nd step.
    expected = sum(max(1, round(0.01 * n)) * 8 for n in sizes) / 2
    assert sent["trainer"] == sent["fit"] == pytest.approx(expected)
    assert sent["trainer"] < sent["plain"] / 50
    assert "--options" in report["commands"]["np=2 trainer"]
    assert "--options" not in report["commands"]["np=2 plain"]
