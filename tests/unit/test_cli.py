"""The ``hvdtrain`` command line and the benchmark's worker and report (one process)."""
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hvdtrain import cli
from hvdtrain_bench import driver, jobs, launch, report, settings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


def _run(cmd, timeout=120):
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, named", [
    (["bench", "--np", "0"], "--np"),
    (["bench", "--np", "1", "-2"], "--np"),
    (["bench", "--np", "two"], "--np"),
    (["bench", "--batch-size", "-1"], "--batch-size"),
    (["bench", "--steps", "0"], "--steps"),
    (["bench", "--steps", "1.5"], "--steps"),
    (["bench", "--repeats", "0"], "--repeats"),
    (["bench", "--warmup", "-1"], "--warmup"),
    (["bench", "--timeout", "0"], "--timeout"),
    (["bench", "--launcher", "srun"], "--launcher"),
    (["bench", "--frobnicate"], "--frobnicate"),
    (["nonsense"], "COMMAND"),
    ([], "COMMAND"),
])
def test_bad_arguments_are_argparse_errors_naming_the_argument(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "error" in err, err


@pytest.mark.timeout(30)
def test_bench_defaults_parse():
    args = cli.build_parser().parse_args(["bench"])
    assert args.np_list == [1, 2] and args.launcher == "horovodrun" and not args.json
    args = cli.build_parser().parse_args(
        ["bench", "--np", "1", "2", "4", "--steps", "7", "--batch-size", "32", "--repeats", "2",
         "--launcher", "mpirun", "--json"])
    assert (args.np_list, args.steps, args.batch_size, args.repeats, args.launcher, args.json) \
        == ([1, 2, 4], 7, 32, 2, "mpirun", True)


@pytest.mark.timeout(60)
def test_cli_module_imports_without_tensorflow_or_horovod():
    code = ("import sys, hvdtrain.cli; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules))")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.timeout(120)
def test_info_reports_versions_and_horovod_controllers():
    script = BIN / "hvdtrain"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hvdtrain.cli"]
    proc = _run(cmd + ["info", "--json"])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    import hvdtrain
    assert info["hvdtrain"] == hvdtrain.__version__
    for key in ("tensorflow", "keras", "horovod"):
        assert info[key] and info[key][0].isdigit(), info
    assert info["gloo_built"] is True or info["mpi_built"] is True, info

    proc = _run([sys.executable, "-m", "hvdtrain.cli", "info"])
    assert proc.returncode == 0, proc.stderr
    assert "tensorflow" in proc.stdout and "mpi_built" in proc.stdout and "gloo_built" in proc.stdout


@pytest.mark.timeout(240)
def test_worker_on_one_rank_gives_positive_samples_per_second(tmp_path):
    """The worker started by hand, outside the driver (which runs every mode at one and two
    ranks in tests/parallel/test_bench.py, and compares their losses there)."""
    out = tmp_path / "trainer.json"
    proc = _run([sys.executable, "-m", "hvdtrain_bench", "--worker", "--mode", "trainer",
                 "--steps", "5", "--warmup", "2", "--examples", "1024", "--out", str(out)],
                timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert settings.RESULT_MARKER.strip() in proc.stdout
    r = json.loads(out.read_text())
    assert r["mode"] == "trainer" and r["np"] == 1 and r["steps"] == 5
    assert r["elapsed_s"] > 0 and r["samples_per_s"] > 0
    assert r["samples_per_s"] == pytest.approx(128 * 5 / r["elapsed_s"])
    # launch time unknown outside the driver: no start-up figure; memory is measured
    assert r["startup_s"] is None and r["peak_rss_mb_per_rank"][0] > 100
    assert r["examples"] == 1024 and r["final_loss"] == r["final_loss"]


def _fake_runs(values):
    return [{"np": np, "mode": mode, "samples_per_s": v}
            for (np, mode), vs in values.items() for v in vs]


@pytest.mark.timeout(30)
def test_summary_takes_medians_ratio_and_efficiency():
    runs = _fake_runs({(1, "trainer"): [900, 1000, 5000], (1, "plain"): [1100, 1000, 10],
                       (2, "trainer"): [1500], (2, "plain"): [1600, 1800]})
    rows = {r["np"]: r for r in driver.summarize(runs, [1, 2], ("trainer", "plain"))}
    assert rows[1]["trainer"]["samples_per_s"] == 1000
    assert rows[1]["plain"]["samples_per_s"] == 1000
    assert rows[2]["plain"]["samples_per_s"] == 1700
    assert rows[1]["ratio_trainer_over_plain"] == pytest.approx(1.0)
    assert rows[2]["ratio_trainer_over_plain"] == pytest.approx(1500 / 1700)
    assert rows[1]["efficiency"] == {"trainer": 1.0, "plain": 1.0}
    assert rows[2]["efficiency"]["trainer"] == pytest.approx(0.75)
    assert rows[2]["efficiency"]["plain"] == pytest.approx(0.85)

    # Without a one-rank run there is no efficiency; the table shows "-".
    rows = driver.summarize(_fake_runs({(2, "trainer"): [10], (2, "plain"): [20]}), [2],
                           ("trainer", "plain"))
    assert rows[0]["efficiency"] == {"trainer": None, "plain": None}
    rep = {"benchmark": settings.MODEL, "results": rows,
           "config": {"batch_size": 128, "steps": 5, "warmup": 1, "repeats": 1,
                      "launcher": "mpirun", "cpu_count": 2, "modes": ["trainer", "plain"]}}
    table = report.format_table(rep)
    assert "trainer/plain" in table and "0.500" in table and " - " in table


@pytest.mark.timeout(30)
def test_worker_commands_per_launcher():
    kw = dict(steps=3, warmup=1, batch_size=8, examples=64, seed=0, out="r.json")
    one = launch.worker_command(1, "plain", launcher="mpirun", **kw)
    assert one[0] == sys.executable and one[1:4] == ["-m", "hvdtrain_bench", "--worker"]
    hvdrun = launch.worker_command(2, "trainer", launcher="horovodrun", **kw)
    assert Path(hvdrun[0]).name == "horovodrun"
    assert hvdrun[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert hvdrun[6:] == launch.worker_command(1, "trainer", launcher="horovodrun", **kw)
    mpi = launch.worker_command(2, "trainer", launcher="mpirun", **kw)
    assert Path(mpi[0]).name == "mpirun" and "--bind-to" in mpi and "-x" in mpi
    assert mpi[mpi.index("-np") + 1] == "2"


@pytest.mark.timeout(30)
def test_the_baselines_never_get_the_speed_levers():
    """Levers go to hvdtrain's modes only: the plain Horovod and MultiWorkerMirrored loops
    run stock, under any launcher, and send dense float32 gradients."""
    kw = dict(steps=3, warmup=1, batch_size=8, examples=64, seed=0, out="r.json",
              options={"compression": "topk", "compression_ratio": 0.01})
    for launcher in ("horovodrun", "mpirun"):
        assert "--options" in launch.worker_command(2, "trainer", launcher=launcher, **kw)
        assert "--options" in launch.worker_command(2, "fit", launcher=launcher, **kw)
        for baseline in ("plain", "mwms"):
            command = launch.worker_command(2, baseline, launcher=launcher, **kw)
            assert "--options" not in command, (launcher, baseline)
        mwms = launch.worker_command(2, "mwms", launcher=launcher, **kw)
        assert launcher not in " ".join(mwms)  # tf.distribute workers start on their own


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs, named", [
    ({"np_list": [0]}, "np_list"), ({"np_list": []}, "np_list"), ({"steps": 0}, "steps"),
    ({"batch_size": -1}, "batch_size"), ({"repeats": 0}, "repeats"),
    ({"launcher": "srun"}, "launcher"), ({"modes": ["fast"]}, "modes"),
])
def test_run_bench_rejects_bad_arguments_before_launching(kwargs, named):
    with pytest.raises(ValueError, match=named):
        driver.run_bench(**kwargs)


@pytest.mark.timeout(60)
def test_script_wraps_the_bench_command():
    proc = _run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--help"])
    assert proc.returncode == 0 and "--launcher" in proc.stdout and "--np" in proc.stdout
    proc = _run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--np", "0"])
    assert proc.returncode == 2 and "argument --np" in proc.stderr
    # ``python -m hvdtrain_bench`` without --worker is ``hvdtrain bench`` too.
    proc = _run([sys.executable, "-m", "hvdtrain_bench", "--np", "0"])
    assert proc.returncode == 2 and "hvdtrain bench: error: argument --np" in proc.stderr


@pytest.mark.timeout(60)
def test_a_hanging_or_failing_job_fails_the_bench_with_its_command(tmp_path):
    never = tmp_path / "never.json"
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(RuntimeError, match="timed out after 1 s"):
        jobs.run_job([(hang, {})], never, timeout=1)
    fail = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="exited 3.*boom"):
        jobs.run_job([(fail, {})], never, timeout=30)
    # One process of a multi-process job failing fails the job, and ends its peers at
    # once instead of leaving them to wait for it until the timeout; the error names the
    # failing process, not the first one.
    ok = [sys.executable, "-c", "pass"]
    with pytest.raises(RuntimeError, match="exited 3"):
        jobs.run_job([(ok, {}), (fail, {})], never, timeout=30)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited 3.*boom") as err:
        jobs.run_job([(hang, {}), (fail, {})], never, timeout=50, what="backend job")
    assert time.monotonic() - t0 < 20
    first = str(err.value).splitlines()[0]
    assert first.startswith("backend job exited 3") and "sys.exit(3)" in first
    assert "time.sleep" not in first
    # A job that succeeds without writing its result is a failure too.
    with pytest.raises(RuntimeError, match="exited 0 without a result"):
        jobs.run_job([(ok, {})], never, timeout=30)
    # And one that writes it returns it, with the launch time in its environment.
    out = tmp_path / "result.json"
    write = [sys.executable, "-c", "import json, os, sys; json.dump({'at': os.environ["
             f"{settings.LAUNCHED_AT_ENV!r}]}}, open(sys.argv[1], 'w'))", str(out)]
    assert float(jobs.run_job([(write, {})], out, timeout=30)["at"]) <= time.time()


@pytest.mark.timeout(30)
def test_free_ports_and_shown_commands():
    ports = jobs.free_ports(4)
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)
    procs = [([str(Path.cwd() / "scripts" / "x.py"), "--out", "/tmp/r.json"], {"A": "1 2"}),
             (["b"], {})]
    assert jobs.shown_command(procs, "/tmp/r.json") == "A='1 2' scripts/x.py --out <result.json> & b"
    each = [(["w", "--out", f"/tmp/r-{i}.json"], {}) for i in range(2)]
    assert (jobs.shown_command(each, ["/tmp/r-0.json", "/tmp/r-1.json"])
            == "w --out <result0.json> & w --out <result1.json>")


@pytest.mark.timeout(60)
def test_job_processes_reference_cores_and_tf_config(tmp_path):
    kw = dict(steps=3, warmup=1, batch_size=8, examples=64, seed=0, out="r.json")
    (one,) = launch.job_processes(1, "trainer", launcher="horovodrun", reference_cores=1, **kw)
    assert one[0][:3] == ["taskset", "-c", str(min(os.sched_getaffinity(0)))] and one[1] == {}
    workers = launch.job_processes(2, "mwms", launcher="horovodrun", **kw)
    assert len(workers) == 2
    configs = [json.loads(env["TF_CONFIG"]) for _, env in workers]
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    assert all("horovodrun" not in " ".join(cmd) for cmd, _ in workers)


def _fake_report():
    runs = []
    for np, mode, rate, rss in ((1, "trainer", 10000, 700), (1, "plain", 10500, 690),
                                (2, "trainer", 15000, 720), (2, "plain", 11000, 700)):
        runs.append({"np": np, "mode": mode, "samples_per_s": rate, "startup_s": 4.0 + np,
                     "peak_rss_mb_per_rank": [rss] * np, "bytes_sent_per_step": 5107240})
    rep = {"benchmark": settings.MODEL, "runs": runs, "commands": {
        f"np={n} {m}": f"cmd {n} {m}" for n in (1, 2) for m in ("trainer", "plain")}
        | {"probe": "cmd probe"},
        "probes": [{"np": 2, "bytes": b, "seconds": 2e-4 + b / 1e9} for b in (4096, 1 << 20, 4 << 20)],
        "config": {"batch_size": 128, "steps": 5, "warmup": 1, "repeats": 1, "launcher": "horovodrun",
                   "cpu_count": 2, "modes": ["trainer", "plain"], "reference_cores": 1}}
    rep["results"] = driver.summarize(runs, [1, 2], ("trainer", "plain"))
    rep["figures"] = driver.figures(rep)
    return rep


@pytest.mark.timeout(60)
def test_report_figures_commands_and_written_files(tmp_path):
    rep = _fake_report()
    row = rep["results"][1]
    assert row["trainer"]["startup_s"] == 6.0 and row["trainer"]["peak_rss_mb"] == 720
    assert row["rss_trainer_over_plain"] == pytest.approx(720 / 700)
    eff = next(f for f in rep["figures"] if f["figure"] == "efficiency" and f["np"] == 2
               and f["mode"] == "trainer")
    assert eff["value"] == pytest.approx(0.75) and eff["command"] == ["cmd 1 trainer", "cmd 2 trainer"]
    assert all(f["command"] for f in rep["figures"])
    paths = report.write_report(rep, tmp_path)
    text = paths["markdown"].read_text()
    assert "15,000 (0.75)" in text and "512" in text and "90%" in text
    assert ET.parse(paths["plot"]).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert json.loads(paths["json"].read_text())["results"][1]["np"] == 2
    rep["probes"] = None
    with pytest.raises(ValueError, match="probes"):
        report.write_report(rep, tmp_path)
