"""``hvdtrain bench --hosts 2 --link 2gbit``: the emulated-cluster bench runs end to end
with real processes (one-rank jobs on one core, alone and two at once, ``horovodrun
--gloo`` across two namespace hosts with shaped links, each host pinned to a core,
MultiWorkerMirrored workers on the hosts' addresses) and reports
every figure, each consistent with the others. A few steps only: no speed is asserted.
Needs root (network namespaces and tc); shares the namespace hosts with the other
``netns`` tests (see conftest.py), so never runs beside them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain_bench import link_figures, links, netns, perf_model
from hvdtrain_bench.settings import param_counts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.parallel
STEPS, WARMUP, BATCH = 3, 1, 32
MODES = ["trainer", "mwms"]
MLP_BYTES = 4.0 * sum(param_counts("mlp"))


def _leftovers() -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in ns.stdout.splitlines() if line.startswith(netns.PREFIX)] \
        + [p.name for p in Path("/sys/class/net").iterdir()
           if p.name == netns.IFACE or p.name.startswith(netns.VETH)]


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hvdtrain.cli", "bench", "--hosts", "2", "--link", "2gbit",
         "--steps", str(STEPS), "--warmup", str(WARMUP), "--batch-size", str(BATCH),
         "--repeats", "1", "--modes", *MODES, "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(300)
def test_the_limit_comes_from_the_rate_the_bytes_and_the_measured_compute(report):
    assert _leftovers() == [], "the bench left namespace hosts behind"
    (section,) = report["sections"]
    assert (section["link"], section["rate_bps"], section["model"]) == ("2gbit", 2e9, "mlp")
    assert section["bytes_per_step"] == MLP_BYTES
    assert section["wire_s"] == pytest.approx(MLP_BYTES * 8 / 2e9)
    compute = report["compute"]["mlp"]
    assert sorted(compute) == sorted(MODES)
    for c in compute.values():
        assert c["step_s"] == pytest.approx(BATCH / c["samples_per_s"])
        assert c["together_step_s"] == pytest.approx(BATCH / c["together_samples_per_s"])
        assert "taskset -c" in c["command"] and "-m hvdtrain_bench --worker" in c["command"]
        # Two one-rank jobs at once, on two different cores.
        together = c["together_command"]
        assert together.count("-m hvdtrain_bench --worker") == 2
        cores = sorted(os.sched_getaffinity(0))
        assert f"taskset -c {cores[0]} " in together
        assert f"taskset -c {cores[1 % len(cores)]} " in together
    assert section["compute_s"] == pytest.approx(min(c["step_s"] for c in compute.values()))
    global_batch = 2 * BATCH
    assert section["global_batch"] == global_batch
    assert section["limit_samples_per_s"] == pytest.approx(
        global_batch / max(section["compute_s"], section["wire_s"]))
    assert section["bound"] == ("wire" if section["wire_s"] > section["compute_s"] else "compute")
    assert section["sync_limit_samples_per_s"] == pytest.approx(global_batch / max(
        section["compute_s"], section["compute_s"] / 3 + section["wire_s"]))


@pytest.mark.timeout(300)
def test_every_loop_is_reported_against_the_limit_the_trainer_and_the_model(report):
    (section,) = report["sections"]
    loops = section["loops"]
    assert list(loops) == MODES
    trainer = loops["trainer"]["samples_per_s"]
    probe = section["probe"]
    assert [p["bytes"] for p in probe["probes"]][-1] == 4 * 1276810
    assert section["latency_s"] == probe["fit"]["latency_s"] > 0
    for mode, row in loops.items():
        sps = row["samples_per_s"]
        assert sps > 0 and row["runs"] == [sps], mode
        assert row["ratio_to_limit"] == pytest.approx(sps / section["limit_samples_per_s"])
        assert row["ratio_to_trainer"] == pytest.approx(sps / trainer)
        # No loop can beat the wire and the compute together (a 3-step run: far under).
        assert row["ratio_to_limit"] < 1.0, (mode, row)
        pred = row["predicted"]
        compute_s = report["compute"]["mlp"][mode]["together_step_s"]
        exposed = perf_model.exposed_after_backward(
            link_figures.bucket_bytes(mode, "mlp", report["config"]["bucket_mb"]),
            compute_s * 2 / 3, lambda n: perf_model.probed_seconds(probe["probes"], n))
        assert pred["exposed_s"] == pytest.approx(exposed)
        assert pred["samples_per_s"] == pytest.approx(2 * BATCH / (compute_s + exposed))
        assert row["measured_over_predicted"] == pytest.approx(sps / pred["samples_per_s"])
        # Every step sends at least the gradient's bytes out of host 1, all over the veth.
        assert row["wire_bytes_per_step"] >= MLP_BYTES, (mode, row["wire_bytes_per_step"])
        assert row["final_loss"] == row["final_loss"], f"{mode}: NaN loss"
    # MultiWorkerMirrored sends one all-reduce after the backward pass: the model exposes
    # all of it; the Trainer's first bucket (1 MiB) goes during the backward pass.
    assert loops["mwms"]["predicted"]["exposed_s"] == pytest.approx(
        perf_model.probed_seconds(probe["probes"], MLP_BYTES))
    assert loops["trainer"]["predicted"]["buckets"] == 2


@pytest.mark.timeout(300)
def test_every_figure_keeps_its_command_and_the_table_shows_them(report):
    cmds = report["commands"]
    cmd = cmds["2gbit mlp trainer"]
    assert "horovodrun --gloo -np 2 -H hvdtn1:1,hvdtn2:1 --network-interface hvdt0" in cmd
    assert "--mode trainer" in cmd and "HVDTRAIN_THREADS=1" in cmd
    assert "HVDT_NETNS_PIN=1" in cmd
    # Rerunnable anywhere: no path of this machine's, the ssh stand-in named.
    assert "PATH=<ssh=scripts/netns_rsh.sh>:$PATH" in cmd and "hvdtrain-links-" not in cmd, cmd
    mwms = cmds["2gbit mlp mwms"]
    assert mwms.count("TF_CONFIG=") == 2 and "netns_rsh.sh hvdtn1" in mwms \
        and "netns_rsh.sh hvdtn2" in mwms and "10.213.7.12:" in mwms
    assert "--mode probe" in cmds["2gbit probe"]
    figures = report["figures"]
    assert all(f["command"] for f in figures)
    names = {(f["figure"], f.get("mode")) for f in figures}
    for mode in MODES:
        for name in ("samples_per_s", "ratio_to_limit", "ratio_to_trainer",
                     "predicted_samples_per_s", "measured_over_predicted",
                     "wire_bytes_per_step", "one_rank_samples_per_s"):
            assert (name, mode) in names, (name, mode)
    for name in ("wire_s", "compute_s", "limit_samples_per_s", "sync_limit_samples_per_s",
                 "allreduce_probes"):
        assert (name, None) in names, name
    table = link_figures.format_table(report)
    assert "== 2gbit, mlp" in table and f"({report['sections'][0]['bound']}-bound)" in table
    for mode in MODES:
        row = report["sections"][0]["loops"][mode]
        assert f"{row['samples_per_s']:,.0f}" in table, mode


# --------------------------------------------------------------------------- --to-accuracy
ACC_CONFIGS = ["trainer_powersgd_r2", "plain"]


@pytest.fixture(scope="module")
def accuracy_report() -> dict:
    """One real, tiny time-to-accuracy run: one rate, a low target, one epoch at most."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hvdtrain.cli", "bench", "--hosts", "2", "--link", "2gbit",
         "--to-accuracy", "0.5", "--max-epochs", "1", "--dataset", "fashion_mnist",
         "--configs", *ACC_CONFIGS, "--wide-link", "none", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(450)
def test_to_accuracy_reports_time_epochs_accuracy_and_the_model(accuracy_report):
    from hvdtrain_bench import compression_model, to_accuracy

    assert _leftovers() == [], "the bench left namespace hosts behind"
    rep = accuracy_report
    assert rep["config"]["accuracy"] == {"target": 0.5, "max_epochs": 1,
                                         "dataset": "fashion_mnist", "learning_rate": 5e-4}
    (section,) = rep["sections"]
    assert (section["link"], section["model"]) == ("2gbit", "mlp")
    rows = section["rows"]
    assert list(rows) == ACC_CONFIGS
    for name, row in rows.items():
        # 0.5 is reached in the first epoch of 234 steps (60000 // 256) by every loop
        assert row["epochs_to_target"] == row["epochs"] == 1, (name, row["per_epoch"])
        assert 0.5 <= row["final_accuracy"] <= 1, name
        assert row["time_to_target_s"] == row["train_s"] == row["per_epoch"][0]["train_s"] > 0
        assert row["step_s"] == pytest.approx(row["train_s"] / 234)
        assert row["predicted_time_to_target_s"] == pytest.approx(
            row["predicted"]["step_s"] * 234)
        assert row["measured_over_predicted_step"] == pytest.approx(
            row["step_s"] / row["predicted"]["step_s"])
        assert f"--mode {to_accuracy.config(name)[0]} --to-accuracy 0.5" in row["command"]
    best = rows["plain"]["time_to_target_s"]
    assert section["best_horovod_s"] == best and rows["plain"]["ratio_to_best_horovod"] == 1.0
    assert rows["trainer_powersgd_r2"]["ratio_to_best_horovod"] == pytest.approx(
        rows["trainer_powersgd_r2"]["time_to_target_s"] / best)
    # PowerSGD at rank 2 sends r(n+m) a matrix: the model's bytes, and the wire shows it
    ps = compression_model.exchange(to_accuracy.shapes("mlp"), rows["trainer_powersgd_r2"]
                                    ["options"])
    assert rows["trainer_powersgd_r2"]["predicted"]["bytes"] == ps["bytes"] < MLP_BYTES / 30
    assert rows["trainer_powersgd_r2"]["wire_bytes_per_step"] < MLP_BYTES / 4 \
        < rows["plain"]["wire_bytes_per_step"]
    table = to_accuracy.format_table(rep)
    assert "== 2gbit, mlp" in table and "trainer_powersgd_r2" in table
