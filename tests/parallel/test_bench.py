"""``hvdtrain bench`` end to end: real 1- and 2-rank jobs, JSON report consistent with itself.

These are smoke tests of the bench's plumbing, so the runs are short (a few steps on a
small dataset) and each bench runs once per module: one under ``horovodrun`` (Gloo) at
1 and 2 ranks with the Fashion-MNIST files and ``--report``, one under ``mpirun`` at 2
ranks with the speed levers, Keras ``fit`` and the per-tensor baseline
(``hvd.DistributedGradientTape``); the tests read their reports. No speed is asserted:
the numbers depend on the machine and whatever else runs on it. The ``wide`` model is
checked without a job, in tests/unit/test_perf_model.py.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.parallel

MODES = ("trainer", "plain", "mwms")
#: The hand-written loops: their timed steps never read a value back to the host.
BASELINES = ("plain", "pertensor", "mwms")
#: Short runs: the figures are not what these tests check.
SHORT = ("--warmup", "2", "--steps", "4", "--examples", "1024", "--repeats", "1")
STEPS = 4


def _bench(*args, timeout=400):
    script = BIN / "hvdtrain"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hvdtrain.cli"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd + ["bench", *args, *SHORT, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """One bench under horovodrun at 1 and 2 ranks: the default modes but the per-tensor
    baseline (the mpirun bench runs it) and the Trainer on the Fashion-MNIST files, with
    the cost-model report written; (report, report dir)."""
    out = tmp_path_factory.mktemp("report")
    return _bench("--np", "1", "2", "--modes", *MODES, "--files", "--report", str(out)), out


@pytest.fixture(scope="module")
def mpi():
    """One bench under mpirun at 2 ranks with Keras fit, the per-tensor Horovod baseline
    and the speed levers (the MultiWorkerMirrored baseline starts its own workers whatever
    the launcher: the Gloo bench runs it)."""
    return _bench("--np", "2", "--launcher", "mpirun", "--modes", "trainer", "plain",
                  "pertensor", "--fit",
                  "--compression", "topk", "--compression-ratio", "0.01",
                  "--backward-passes", "2")


def _check_row(row, one_rank=None, modes=MODES):
    speed = {mode: row[mode]["samples_per_s"] for mode in modes}
    assert all(v > 0 for v in speed.values()), speed
    assert row["trainer"]["runs_samples_per_s"] == [speed["trainer"]]  # one repeat: the run
    assert row["ratio_trainer_over_plain"] == pytest.approx(speed["trainer"] / speed["plain"])
    for baseline in ("pertensor", "mwms"):
        if baseline in modes:
            assert row[f"ratio_trainer_over_{baseline}"] == pytest.approx(
                speed["trainer"] / speed[baseline])
    assert row["model"] == "mlp"
    for mode in modes:  # rank 0's reads in the timed steps, per step: the runs' figure
        run_reads = row[mode]["host_reads_per_step"]
        assert run_reads is not None and run_reads >= 0 and (run_reads * STEPS).is_integer()
        if mode in BASELINES:
            assert run_reads == 0, mode
    for mode in modes:  # launch to first step, and the peak memory of the largest rank
        assert 0 < row[mode]["startup_s"] < 120 and 100 < row[mode]["peak_rss_mb"] < 20000
    if one_rank is None:  # no one-rank run, no efficiency
        assert set(row["efficiency"]) >= set(modes)
        assert all(v is None for v in row["efficiency"].values())
    else:
        for mode in modes:
            expected = row[mode]["samples_per_s"] / (row["np"] * one_rank[mode]["samples_per_s"])
            assert row["efficiency"][mode] == pytest.approx(expected)


@pytest.mark.timeout(600)
def test_bench_one_and_two_ranks_under_horovodrun(gloo):
    report, _ = gloo
    modes = MODES + ("trainer_files",)
    assert report["config"]["np"] == [1, 2] and report["config"]["launcher"] == "horovodrun"
    assert report["config"]["modes"] == list(modes) and report["config"]["steps"] == STEPS
    assert report["config"]["models"] == ["mlp"] and report["benchmark"].startswith("MLP 784-800-800-10")
    rows = {r["np"]: r for r in report["results"]}
    assert set(rows) == {1, 2}
    _check_row(rows[1], rows[1])
    assert rows[1]["efficiency"] == dict.fromkeys(modes, pytest.approx(1.0))
    _check_row(rows[2], rows[1])
    # Every Horovod run reports the time of its slowest rank, and all ranks were timed.
    assert sorted((r["np"], r["mode"]) for r in report["runs"]) == sorted(
        (n, m) for n in (1, 2) for m in modes)
    for run in report["runs"]:
        ranks = 1 if run["mode"] == "mwms" else run["np"]  # MWMS: the chief's own clock
        assert len(run["elapsed_per_rank_s"]) == len(run["peak_rss_mb_per_rank"]) == ranks
        assert run["elapsed_s"] == max(run["elapsed_per_rank_s"])
        assert run["samples_per_s"] == pytest.approx(128 * run["np"] * STEPS / run["elapsed_s"])
        assert run["model"] == "mlp" and run["host_reads_per_step"] == run["host_reads"] / STEPS
    # Same seed, same data, same model: at one rank the loops did the same training.
    one = {run["mode"]: run for run in report["runs"] if run["np"] == 1}
    for mode in ("plain", "mwms"):
        assert one[mode]["final_loss"] == pytest.approx(one["trainer"]["final_loss"],
                                                        rel=1e-4), mode
    # Fashion-MNIST streamed from its files: all 60,000 images, less a partial batch.
    assert one["trainer_files"]["examples"] == 60000 - 60000 % 128
    # The exact commands are part of the report, also in the flat list of figures.
    cmds = report["commands"]
    assert set(cmds) == {f"np={n} {m}" for n in (1, 2) for m in modes} | {"probe"}
    assert "horovodrun -np 2 -H localhost:2 --gloo" in cmds["np=2 plain"]
    assert all("--model mlp" in cmds[key] for key in cmds if key != "probe")
    assert "-m hvdtrain_bench --worker --mode trainer" in cmds["np=2 trainer"]
    assert "horovodrun" not in cmds["np=1 trainer"]
    assert cmds["np=1 trainer"].startswith("taskset -c ")  # one rank's share of the cores
    assert cmds["np=2 mwms"].count("TF_CONFIG=") == 2 and "horovodrun" not in cmds["np=2 mwms"]
    assert "--options" not in cmds["np=2 trainer"]  # no levers asked for
    assert all(f["command"] for f in report["figures"])
    reads = [f for f in report["figures"] if f["figure"] == "host_reads_per_step"]
    assert len(reads) == 2 * len(modes) and all(
        f["value"] == rows[f["np"]][f["mode"]]["host_reads_per_step"] for f in reads)
    # The all-reduce probes: 4 sizes at 2 ranks, each timed (no ordering of times is
    # asserted: on a loaded 2-core machine the small probes can be the slower ones).
    probes = report["probes"]
    assert [p["np"] for p in probes] == [2] * 4 and probes[-1]["bytes"] == 4 * 1276810
    assert [p["bytes"] for p in probes] == sorted(p["bytes"] for p in probes)
    assert all(0 < p["seconds"] < 5 for p in probes)


@pytest.mark.timeout(600)
def test_bench_report_and_fashion_mnist_files(gloo):
    """--report writes the cost model's markdown and plot from a real run; the Trainer
    also trains on Fashion-MNIST streamed from its files."""
    report, out = gloo
    rows = {r["np"]: r for r in report["results"]}
    assert rows[2]["trainer_files"]["samples_per_s"] > 0
    assert rows[2]["ratio_trainer_files_over_trainer"] == pytest.approx(
        rows[2]["trainer_files"]["samples_per_s"] / rows[2]["trainer"]["samples_per_s"])
    text = (out / "performance.md").read_text()
    assert "Predicted" in text and "512" in text and "trainer files samples/s" in text
    assert "trainer host reads/step" in text and "MWMS host reads/step" in text
    svg, ns = ET.parse(out / "scaling.svg").getroot(), "{http://www.w3.org/2000/svg}"
    assert svg.tag == ns + "svg"  # 3 bandwidths, the measured points, Horovod's star:
    assert len([g for g in svg.iter(ns + "g") if g.get("class") == "series"]) == 5
    assert json.loads((out / "bench.json").read_text())["probes"] == report["probes"]


@pytest.mark.timeout(600)
def test_bench_two_ranks_under_mpirun(mpi):
    (row,) = mpi["results"]
    assert row["np"] == 2 and mpi["config"]["launcher"] == "mpirun"
    _check_row(row, modes=("trainer", "plain", "pertensor", "fit"))
    assert "mwms" not in row  # only the modes asked for
    cmds = mpi["commands"]
    assert set(cmds) == {"np=2 trainer", "np=2 plain", "np=2 pertensor", "np=2 fit", "probe"}
    assert all("mpirun" in c and "--bind-to none" in c for c in cmds.values())
    assert "-m hvdtrain_bench --worker --mode pertensor" in cmds["np=2 pertensor"]
    # One all-reduce per gradient or one grouped all-reduce: the same averages, so the
    # same training (a tape that did not reduce would leave rank 0 on its own gradients).
    losses = {run["mode"]: run["final_loss"] for run in mpi["runs"]}
    assert losses["pertensor"] == pytest.approx(losses["plain"], rel=1e-5)
    assert [p["np"] for p in mpi["probes"]] == [2] * 4


@pytest.mark.timeout(600)
def test_bench_levers_and_keras_fit(mpi):
    assert mpi["config"]["options"] == {"compression": "topk", "compression_ratio": 0.01,
                                        "backward_passes_per_step": 2}
    (row,) = mpi["results"]
    for mode in ("trainer", "plain", "pertensor", "fit"):
        assert row[mode]["samples_per_s"] > 0
    assert row["ratio_fit_over_trainer"] == pytest.approx(
        row["fit"]["samples_per_s"] / row["trainer"]["samples_per_s"])
    sent = row["bytes_sent_per_step"]
    sizes = [784 * 800, 800, 800 * 800, 800, 800 * 10, 10]
    assert sent["plain"] == sent["pertensor"] == sum(sizes) * 4  # the dense float32 baselines
    # Top-K 1%: index + value (8 bytes) for 1% of each tensor, exchanged every 2nd step.
    expected = sum(max(1, round(0.01 * n)) * 8 for n in sizes) / 2
    assert sent["trainer"] == sent["fit"] == pytest.approx(expected)
    assert sent["trainer"] < sent["plain"] / 50
    assert "--options" in mpi["commands"]["np=2 trainer"]
    assert "--options" in mpi["commands"]["np=2 fit"]
    assert "--options" not in mpi["commands"]["np=2 plain"]
    assert "--options" not in mpi["commands"]["np=2 pertensor"]

