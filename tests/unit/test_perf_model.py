"""Unit tests of the cost model (hvdtrain_bench.perf_model) and its report
(hvdtrain_bench.perf_report), and of how ``hvdtrain bench`` names, summarizes and prints
its models and modes: pure numpy, no TensorFlow or Horovod (but for one check
that builds the bench's Keras models)."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from hvdtrain import cli
from hvdtrain_bench import driver, launch
from hvdtrain_bench import perf_model as pm
from hvdtrain_bench import perf_report as pr
from hvdtrain_bench import report as bench_report
from hvdtrain_bench import settings

LAT, BW = 40e-6, 1.2e9  # the "true" link the synthetic probes are generated from


def probe(n, nbytes, lat=LAT, bw=BW):
    return {"np": n, "bytes": nbytes, "seconds": pm.comm_time(n, nbytes, bw, lat)}


def synthetic_probes():
    return [probe(n, s) for n in (2, 4) for s in (1e3, 1e5, 1e6, 1e7, 6.4e7)]


def model(**overrides):
    base = {"t_compute_s": 0.1, "t_overhead_s": 0.002, "bytes_per_step": 4e6,
            "latency_s": LAT, "bandwidth_Bps": BW, "exposed": 1.0}
    return {**base, **overrides}


def report():
    fitted = pm.fit_step(0.1, [{"np": 2, "step_s": 0.118}], 4e6,
                         {"latency_s": LAT, "bandwidth_Bps": BW})
    return {"title": "Test run", "model": fitted,
            "measured_columns": ["np", "mode", "samples/s", "efficiency"],
            "measured_rows": [{"np": 1, "mode": "trainer", "samples/s": 1280.0,
                               "efficiency": 1.0},
                              {"np": 2, "mode": "trainer", "samples/s": 2169.5,
                               "efficiency": 0.847}]}


# --------------------------------------------------------------------------- fit_link
def test_fit_link_recovers_latency_and_bandwidth():
    link = pm.fit_link(synthetic_probes())
    assert link["latency_s"] == pytest.approx(LAT, rel=1e-6)
    assert link["bandwidth_Bps"] == pytest.approx(BW, rel=1e-6)


def test_fit_link_with_noise_and_one_worker_count():
    rng = np.random.default_rng(0)
    probes = [probe(2, s) for s in np.geomspace(1e3, 1e8, 12)]
    for p in probes:
        p["seconds"] *= 1 + 0.01 * rng.standard_normal()
    link = pm.fit_link(probes)
    assert link["bandwidth_Bps"] == pytest.approx(BW, rel=0.03)
    assert link["latency_s"] == pytest.approx(LAT, rel=0.2)


def test_fit_link_clamps_to_positive_values():
    # Time independent of size: bandwidth term would be <= 0; latency must stay positive.
    flat = pm.fit_link([{"np": 2, "bytes": s, "seconds": 1e-3} for s in (1e3, 1e6)])
    assert flat["bandwidth_Bps"] > 0 and flat["latency_s"] > 0
    # Time proportional to size: latency would be ~0 or negative, clamped positive.
    prop = pm.fit_link([probe(2, s, lat=0.0) for s in (1e3, 1e6)])
    assert prop["latency_s"] > 0
    assert prop["bandwidth_Bps"] == pytest.approx(BW, rel=1e-6)


@pytest.mark.parametrize("probes, needle", [
    ([probe(2, 1e6), probe(4, 1e6)], "distinct"),
    ([probe(2, 1e6)], "distinct"),
    ([], "distinct"),
    ([probe(2, 1e3), {"np": 2, "bytes": -5, "seconds": 1e-3}], "-5"),
    ([probe(2, 1e3), {"np": 2, "bytes": 1e6, "seconds": 0.0}], "0.0"),
    ([probe(2, 1e3), {"np": 1, "bytes": 1e6, "seconds": 1e-3}], "np"),
    ([probe(2, 1e3), {"np": 2, "bytes": 1e6}], "seconds"),
    ([probe(2, 1e3), {"np": 2, "bytes": float("nan"), "seconds": 1e-3}], "nan"),
    ("not a list", "not a list"),
])
def test_fit_link_bad_inputs(probes, needle):
    with pytest.raises(ValueError, match=needle):
        pm.fit_link(probes)


# --------------------------------------------------------------------------- fit_step
def test_fit_step_recovers_known_overhead():
    truth = model(t_overhead_s=0.0123)
    measured = [{"np": n, "step_s": pm.step_time(truth, n)} for n in (2, 3, 4)]
    link = pm.fit_link(synthetic_probes())
    fitted = pm.fit_step(0.1, measured, 4e6, link)
    assert fitted["t_overhead_s"] == pytest.approx(0.0123, rel=1e-6)
    assert fitted["exposed"] == 1.0
    assert set(fitted) >= {"t_compute_s", "t_overhead_s", "bytes_per_step", "latency_s",
                           "bandwidth_Bps", "exposed", "residuals"}
    assert [r["np"] for r in fitted["residuals"]] == [2, 3, 4]
    assert all(abs(r["residual_s"]) < 1e-9 for r in fitted["residuals"])


def test_fit_step_overhead_is_mean_residual_and_never_negative():
    link = {"latency_s": LAT, "bandwidth_Bps": BW}
    base = pm.step_time(model(t_overhead_s=0.0), 2)
    fitted = pm.fit_step(0.1, [{"np": 2, "step_s": base + 0.01},
                               {"np": 2, "step_s": base + 0.03}], 4e6, link)
    assert fitted["t_overhead_s"] == pytest.approx(0.02)
    assert [r["residual_s"] for r in fitted["residuals"]] == pytest.approx([-0.01, 0.01])
    faster = pm.fit_step(0.1, [{"np": 2, "step_s": 0.1}], 4e6, link)
    assert faster["t_overhead_s"] == 0.0


@pytest.mark.parametrize("args, needle", [
    ((-0.1, [{"np": 2, "step_s": 0.2}], 1e6), "-0.1"),
    ((0.1, [], 1e6), "non-empty"),
    ((0.1, [{"np": 1, "step_s": 0.2}], 1e6), "np"),
    ((0.1, [{"np": 2, "step_s": -3.0}], 1e6), "-3.0"),
    ((0.1, [{"np": 2, "step_s": 0.2}], -7), "-7"),
])
def test_fit_step_bad_inputs(args, needle):
    with pytest.raises(ValueError, match=needle):
        pm.fit_step(*args, {"latency_s": LAT, "bandwidth_Bps": BW})


def test_fit_step_bad_link():
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        pm.fit_step(0.1, [{"np": 2, "step_s": 0.2}], 1e6, {"latency_s": LAT})
    with pytest.raises(ValueError, match="-1"):
        pm.fit_step(0.1, [{"np": 2, "step_s": 0.2}], 1e6,
                    {"latency_s": LAT, "bandwidth_Bps": -1})


# --------------------------------------------------------------------------- predict
def test_predict_is_ideal_without_bytes_or_overhead():
    rows = pm.predict(model(bytes_per_step=0, t_overhead_s=0.0), latency_s=0.0)
    assert len(rows) == len(pm.DEFAULT_WORKERS) * len(pm.DEFAULT_BANDWIDTHS_GBIT)
    assert all(r["efficiency"] == pytest.approx(1.0) for r in rows)


def test_predict_defaults_and_shape():
    rows = pm.predict(model())
    assert [r["np"] for r in rows[:9]] == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert {r["bandwidth_gbit"] for r in rows} == {10.0, 25.0, 100.0}
    r = rows[0]
    bw = 10e9 / 8
    assert r["comm_s"] == pytest.approx(pm.comm_time(2, 4e6, bw, pm.DEFAULT_LATENCY_S))
    assert r["step_s"] == pytest.approx(0.1 + 0.002 + r["comm_s"])
    assert r["efficiency"] == pytest.approx(0.1 / r["step_s"])


def test_predict_decreases_with_workers_and_increases_with_bandwidth():
    rows = pm.predict(model(exposed=0.5), workers=[1, 2, 4, 16, 64, 512],
                      bandwidths_gbit=[1, 10, 100])
    grid = {(r["np"], r["bandwidth_gbit"]): r["efficiency"] for r in rows}
    for g in (1.0, 10.0, 100.0):
        effs = [grid[(n, g)] for n in (1, 2, 4, 16, 64, 512)]
        assert effs[0] == 1.0
        assert all(a > b for a, b in zip(effs, effs[1:]))
    for n in (2, 4, 16, 64, 512):
        assert grid[(n, 1.0)] < grid[(n, 10.0)] < grid[(n, 100.0)]


def test_predict_exposed_fraction_scales_communication():
    hidden = pm.predict(model(exposed=0.0), [64], [10])[0]
    full = pm.predict(model(exposed=1.0), [64], [10])[0]
    assert hidden["step_s"] == pytest.approx(0.102)
    assert full["step_s"] == pytest.approx(0.102 + full["comm_s"])


@pytest.mark.parametrize("kwargs, needle", [
    ({"workers": [2, 0]}, "workers\\[1\\].*0"),
    ({"workers": [2.5]}, "2.5"),
    ({"bandwidths_gbit": [25, -10]}, "-10"),
    ({"latency_s": -1e-6}, "-1e-06"),
])
def test_predict_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        pm.predict(model(), **kwargs)


@pytest.mark.parametrize("overrides, needle", [
    ({"t_compute_s": 0}, "t_compute_s"),
    ({"exposed": 1.5}, "1.5"),
    ({"t_overhead_s": -0.5}, "-0.5"),
    ({"bandwidth_Bps": "fast"}, "fast"),
])
def test_predict_bad_model(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        pm.predict(model(**overrides))
    bad = model()
    del bad["exposed"]
    with pytest.raises(ValueError, match="exposed"):
        pm.predict(bad)


# --------------------------------------------------------------------------- reference
def test_reference_constant():
    ref = pr.HOROVOD_REFERENCE
    assert ref["model"] == "ResNet-101" and ref["workers"] == 512
    assert ref["efficiency"] == 0.90 and "Sergeev" in ref["source"]


def test_resnet101_example():
    ex = pr.resnet101_example()
    assert ex["model"]["bytes_per_step"] == pytest.approx(178e6)
    assert ex["published_efficiency"] == 0.90
    assert 0.8 < ex["predicted_efficiency"] < 1.0
    # More overlap or a faster network can only help; a faster GPU step only hurts.
    assert pr.resnet101_example(exposed=0.1)["predicted_efficiency"] > ex["predicted_efficiency"]
    assert (pr.resnet101_example(bandwidth_gbit=100)["predicted_efficiency"]
            > ex["predicted_efficiency"])
    assert (pr.resnet101_example(t_compute_s=0.25)["predicted_efficiency"]
            < ex["predicted_efficiency"])
    line = pr.resnet101_comparison_line(ex)
    assert "90%" in line and f"{ex['predicted_efficiency']:.1%}" in line


# --------------------------------------------------------------------------- write_report
def test_write_report(tmp_path):
    paths = pr.write_report(report(), tmp_path / "out")
    assert set(paths) == {"markdown", "plot"}
    assert paths["markdown"] == tmp_path / "out" / "performance.md"
    text = paths["markdown"].read_text()
    assert text.startswith("# Test run")
    assert "| np | mode | samples/s | efficiency |" in text
    assert "| 2 | trainer | 2170 | 0.847 |" in text
    assert "| workers | 10 Gbit/s | 25 Gbit/s | 100 Gbit/s |" in text
    for n in pm.DEFAULT_WORKERS:
        assert f"\n| {n} | " in text
    assert "t_overhead (s)" in text and "90%" in text and "ResNet-101" in text
    # Sections in the required order.
    order = [text.index(h) for h in ("## Measured", "## Fitted model",
                                     "## Predicted efficiency", "## Reference")]
    assert order == sorted(order)
    expected = pm.predict(report()["model"], [512], [25])[0]["efficiency"]
    assert "| 512 | " in text and f"{expected:.1%}" in text

    assert "![Predicted scaling efficiency](scaling.svg)" in text
    check_svg(paths["plot"], report(), "Test run")


SVG = "{http://www.w3.org/2000/svg}"


def check_svg(path, rep, title):
    """scaling.svg parses, is titled, has its axes' ticks, and one series per bandwidth
    (a line of one dot per worker count, faster networks higher), the measured points
    and Horovod's star, each named in the legend."""
    assert path.name == "scaling.svg"
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg" and int(root.get("width")) > int(root.get("height")) > 300
    texts = [t.text for t in root.iter(SVG + "text")]
    assert title in texts and "workers (log2 scale)" in texts
    assert all(str(n) in texts for n in pm.DEFAULT_WORKERS)
    assert all(f"{y:.1f}" in texts for y in (0, 0.2, 0.4, 0.6, 0.8, 1.0))
    series = [g for g in root.iter(SVG + "g") if g.get("class") == "series"]
    labels = [g.find(SVG + "title").text for g in series]
    measured = rep["model"]["residuals"]
    assert labels == [f"predicted, {g:g} Gbit/s" for g in pm.DEFAULT_BANDWIDTHS_GBIT] + [
        "measured (this machine)", "Horovod paper: ResNet-101, 90% @ 512"]
    lines = series[:len(pm.DEFAULT_BANDWIDTHS_GBIT)]
    heights = []
    for g in lines:
        dots = g.findall(SVG + "circle")
        assert len(dots) == len(pm.DEFAULT_WORKERS) and len(g.findall(SVG + "polyline")) == 1
        xs = [float(c.get("cx")) for c in dots]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        heights.append([float(c.get("cy")) for c in dots])
    for slow, fast in zip(heights, heights[1:]):  # SVG y grows downwards
        assert all(f < s for s, f in zip(slow, fast))
    assert len(series[-2].findall(SVG + "circle")) == len(measured) >= 1
    assert len(series[-1].findall(SVG + "polygon")) == 1
    legend = next(g for g in root.iter(SVG + "g") if g.get("class") == "legend")
    assert [t.text for t in legend.iter(SVG + "text")] == labels


def test_write_report_escapes_cells_and_handles_missing_ones(tmp_path):
    rep = report()
    rep["measured_rows"] = [{"np": 2, "mode": "a|b"}]
    rep["title"] = "a <b> & c"
    paths = pr.write_report(rep, tmp_path)
    assert "| 2 | a\\|b |  |  |" in paths["markdown"].read_text()
    check_svg(paths["plot"], rep, "a <b> & c")  # escaped in the SVG, so it still parses


@pytest.mark.parametrize("key", ["title", "model", "measured_columns", "measured_rows"])
def test_write_report_missing_key(tmp_path, key):
    rep = report()
    del rep[key]
    with pytest.raises(ValueError, match=key):
        pr.write_report(rep, tmp_path)


def test_module_stays_light_and_headless(tmp_path):
    code = ("import sys; from hvdtrain_bench import perf_report as pr\n"
            "heavy = [m for m in sys.modules\n"
            "         if m.split('.')[0] in ('tensorflow', 'horovod', 'matplotlib')]\n"
            "assert not heavy, heavy\n"
            f"pr.write_report({report()!r}, {str(tmp_path)!r})\n"
            "heavy = [m for m in sys.modules\n"
            "         if m.split('.')[0] in ('tensorflow', 'horovod', 'matplotlib')]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   cwd=Path(pm.__file__).resolve().parents[2])
    check_svg(tmp_path / "scaling.svg", report(), "Test run")


# --------------------------------------------------------------------------- bench models and modes
def test_bench_models_parameter_counts():
    """``mlp`` is the 784-800-800-10 MLP the all-reduce probe's largest size is made of;
    ``wide`` is 784-2048x4-10, about 14.2 M parameters."""
    assert settings.param_counts("mlp") == settings.PARAM_COUNTS == (
        784 * 800, 800, 800 * 800, 800, 800 * 10, 10)
    assert sum(settings.param_counts("mlp")) == 1276810
    wide = settings.param_counts("wide")
    assert len(wide) == 10 and wide[:2] == (784 * 2048, 2048) and wide[-2:] == (2048 * 10, 10)
    assert sum(wide) == 784 * 2048 + 3 * 2048 * 2048 + 2048 * 10 + 4 * 2048 + 10 == 14217226
    assert settings.MODEL == settings.MODELS["mlp"].title and "2048x4" in settings.MODELS["wide"].title


def test_bench_keras_models_have_the_parameters_the_bench_counts():
    """The Keras models ``--model`` builds hold the tensors ``bytes_sent_per_step`` and the
    all-reduce probe are sized from, layer by layer."""
    from hvdtrain_bench import mlp

    for name in settings.MODELS:
        net = mlp.mlp(name)
        net.build((None, settings.INPUT_DIM))
        assert [int(np.prod(w.shape)) for w in net.weights] == list(settings.param_counts(name))
    assert net.count_params() == 14217226


def test_bench_command_line_carries_the_model_and_runs_the_per_tensor_baseline():
    args = cli.build_parser().parse_args(["bench"])
    assert args.models == ["mlp"] and args.modes == ["trainer", "plain", "pertensor", "mwms"]
    args = cli.build_parser().parse_args(["bench", "--model", "mlp", "wide"])
    assert args.models == ["mlp", "wide"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--model", "huge"])
    kw = dict(steps=3, warmup=1, batch_size=8, examples=64, seed=0, out="r.json")
    wide = launch.worker_command(2, "trainer", launcher="mpirun", model="wide", **kw)
    assert wide[wide.index("--model") + 1] == "wide"
    default = launch.worker_command(1, "pertensor", launcher="horovodrun", **kw)
    assert default[default.index("--model") + 1] == "mlp" and "--mode" in default
    assert default[default.index("--mode") + 1] == "pertensor"
    # The per-tensor baseline is stock: no levers, like the other baselines.
    levers = launch.worker_command(2, "pertensor", launcher="mpirun",
                                   options={"compression": "fp16"}, **kw)
    assert "--options" not in levers
    (one,) = launch.job_processes(1, "fit", launcher="horovodrun", model="wide", **kw)
    assert one[0][one[0].index("--model") + 1] == "wide"
    with pytest.raises(ValueError, match="models"):
        driver.run_bench(models=["huge"])


def _two_model_report():
    """A report as :func:`driver.run_bench` makes it for ``--model mlp wide --np 1 2``."""
    modes, models = ["trainer", "plain", "pertensor", "mwms"], ["mlp", "wide"]
    speed = {"trainer": 1000, "plain": 900, "pertensor": 800, "mwms": 500}
    runs = []
    for model in models:
        scale = 1 if model == "mlp" else 0.1
        for np_ in (1, 2):
            for mode in modes:
                runs.append({"np": np_, "mode": mode, "model": model,
                             "samples_per_s": speed[mode] * scale * (1.5 if np_ == 2 else 1),
                             "startup_s": 5.0, "peak_rss_mb_per_rank": [700] * np_,
                             "bytes_sent_per_step": 4 * sum(settings.param_counts(model)),
                             "host_reads": 12 if mode == "trainer" else 0,
                             "host_reads_per_step": 3.0 if mode == "trainer" else 0.0})
    commands = {driver.job_key(n, m, model): f"cmd {model} {n} {m}"
                for model in models for n in (1, 2) for m in modes}
    rep = {"benchmark": driver.benchmark_title(models), "runs": runs,
           "commands": {**commands, "probe": "cmd probe"},
           "probes": [{"np": 2, "bytes": b, "seconds": 2e-4 + b / 1e9}
                      for b in (4096, 1 << 20, 4 << 20)],
           "config": {"np": [1, 2], "batch_size": 128, "steps": 4, "warmup": 1, "repeats": 1,
                      "launcher": "horovodrun", "cpu_count": 2, "modes": modes,
                      "models": models, "reference_cores": 1}}
    rep["results"] = driver.summarize(runs, [1, 2], modes, models)
    rep["figures"] = driver.figures(rep)
    return rep


def test_bench_summary_has_rows_per_model_with_every_ratio_and_host_reads():
    rep = _two_model_report()
    assert driver.job_key(2, "trainer") == "np=2 trainer"  # the default model's keys as before
    assert driver.job_key(2, "trainer", "wide") == "np=2 trainer model=wide"
    assert [(r["model"], r["np"]) for r in rep["results"]] == [
        ("mlp", 1), ("mlp", 2), ("wide", 1), ("wide", 2)]
    wide2 = rep["results"][3]
    assert wide2["trainer"]["samples_per_s"] == pytest.approx(150)
    assert wide2["efficiency"]["trainer"] == pytest.approx(0.75)  # against wide's np=1
    assert wide2["ratio_trainer_over_plain"] == pytest.approx(1000 / 900)
    assert wide2["ratio_trainer_over_pertensor"] == pytest.approx(1000 / 800)
    assert wide2["ratio_trainer_over_mwms"] == pytest.approx(2.0)
    assert wide2["trainer"]["host_reads_per_step"] == 3.0
    assert wide2["pertensor"]["host_reads_per_step"] == 0.0
    assert wide2["bytes_sent_per_step"]["plain"] == 4 * 14217226
    eff = [f for f in rep["figures"] if f["figure"] == "efficiency" and f["model"] == "wide"
           and f["np"] == 2 and f["mode"] == "pertensor"]
    assert [f["command"] for f in eff] == [["cmd wide 1 pertensor", "cmd wide 2 pertensor"]]
    reads = [f for f in rep["figures"] if f["figure"] == "host_reads_per_step"]
    assert len(reads) == 16 and all(f["command"].startswith("cmd ") for f in reads)
    ratio = next(f for f in rep["figures"] if f["figure"] == "ratio_trainer_over_pertensor"
                 and f["model"] == "mlp" and f["np"] == 1)
    assert sorted(ratio["command"]) == sorted(f"cmd mlp 1 {m}" for m in rep["config"]["modes"])
    # Runs without a model (reports from before there were several) are the default's.
    legacy = driver.summarize([{k: v for k, v in r.items() if k != "model"}
                               for r in rep["runs"] if r["model"] == "mlp"], [1, 2],
                              rep["config"]["modes"])
    assert [r["model"] for r in legacy] == ["mlp", "mlp"]
    assert legacy[1]["trainer"]["samples_per_s"] == rep["results"][1]["trainer"]["samples_per_s"]


def test_bench_table_has_a_section_per_model_with_ratios_and_host_reads():
    table = bench_report.format_table(_two_model_report())
    assert table.count("== mlp: MLP 784-800-800-10") == 1
    assert table.count("== wide: MLP 784-2048x4-10") == 1
    assert table.count("trainer/pertensor 1.250") == 4 and table.count("trainer/mwms 2.000") == 4
    assert table.count("host reads per step") == 2 and "per-tensor hvd" in table
    reads_header = table.index("host reads per step")
    assert "3.00" in table[reads_header:reads_header + 400]
    assert "bytes sent per step per rank: trainer 56,868,904" in table


def test_bench_report_fits_the_first_model_and_lists_every_model(tmp_path):
    rep = _two_model_report()
    paths = bench_report.write_report(rep, tmp_path)
    text = paths["markdown"].read_text()
    assert text.startswith("# MLP 784-800-800-10")
    assert "| model | np |" in text and "| wide | 2 |" in text
    assert "per-tensor hvd host reads/step" in text and "trainer/pertensor" in text
    assert json.loads(paths["json"].read_text())["config"]["models"] == ["mlp", "wide"]


def test_buckets_hide_all_but_the_tail_of_the_exchange():
    from hvdtrain_bench.perf_model import comm_time, exposed_with_buckets
    bw, lat = 25e9 / 8, 25e-6
    one = exposed_with_buckets([100e6], 0.1, 8, bw, lat)
    assert one == pytest.approx(comm_time(8, 100e6, bw, lat))  # all of it, after backward
    ten = exposed_with_buckets([10e6] * 10, 0.1, 8, bw, lat)
    assert ten == pytest.approx(comm_time(8, 10e6, bw, lat))  # the link keeps up: the last
    slow = exposed_with_buckets([10e6] * 10, 0.001, 8, bw, lat)
    assert ten < slow < 10 * comm_time(8, 10e6, bw, lat)  # a short backward hides little
    # on a 512-ring each bucket pays 1022 latencies: 1,000 small buckets cost more than one
    assert exposed_with_buckets([1e5] * 1000, 0.1, 512, bw, lat) > comm_time(512, 1e8, bw, lat)
    assert exposed_with_buckets([1e6], 0.1, 1, bw, lat) == 0.0


# --------------------------------------------------------------------------- compression
MLP_SHAPES = [(784, 800), (800,), (800, 800), (800,), (800, 10), (10,)]
MLP_ENTRIES = sum(int(np.prod(s)) for s in MLP_SHAPES)


def test_compression_bytes_follow_each_rule():
    from hvdtrain_bench import compression_model as cm

    assert cm.exchange(MLP_SHAPES)["bytes"] == 4 * MLP_ENTRIES == 4 * 1276810
    assert cm.exchange(MLP_SHAPES, {"compression": "fp16"})["bytes"] == 2 * MLP_ENTRIES
    topk = cm.exchange(MLP_SHAPES, {"compression": "topk", "compression_ratio": 0.01})
    ks = [max(1, round(0.01 * np.prod(s))) for s in MLP_SHAPES]
    assert topk["bytes"] == 8 * sum(ks) and len(topk["allgather"]) == 12
    # PowerSGD: r (n + m) floats per compressed matrix; the vectors, and 800x10 at r = 4
    # (8000 < 2 * 4 * 810), whole.
    for r in (2, 4):
        ps = cm.exchange(MLP_SHAPES, {"compression": "powersgd", "compression_rank": r})
        matrices = r * (784 + 800) + r * (800 + 800)
        small = 800 * 10 if 8000 < 2 * r * 810 else r * 810
        assert ps["bytes"] == 4 * (matrices + small + 800 + 800 + 10), r
        assert ps["compress_flops"] == 6 * r * (784 * 800 + 800 * 800
                                                + (800 * 10 if small == r * 810 else 0))
    with pytest.raises(ValueError, match="compression must be none, fp16, topk or powersgd"):
        cm.exchange(MLP_SHAPES, {"compression": "zip"})


def test_powersgd_bytes_match_the_compressor_itself():
    from hvdtrain.horovod.compression import PowerSGD
    from hvdtrain_bench import compression_model as cm

    shapes = MLP_SHAPES + [(3, 3, 64, 128), (2048, 2048), (5, 3)]
    for r in (1, 2, 4, 16):
        ex = cm.exchange(shapes, {"compression": "powersgd", "compression_rank": r})
        assert ex["bytes"] == sum(PowerSGD(r).bytes_per_step(s) for s in shapes), r
        for s in shapes:
            assert cm.powersgd_matrix(s, r) == PowerSGD(r).matrix_shape(s), (s, r)


def test_compressed_step_adds_its_compute_and_times_its_collectives():
    from hvdtrain_bench import compression_model as cm

    link = dict(workers=2, bandwidth_Bps=5e8 / 8, latency_s=1e-4)
    base = dict(compute_s=0.012, params=MLP_ENTRIES, batch_size=128, **link)
    plain = cm.predict_step(MLP_SHAPES, None, **base)
    assert plain["compress_s"] == 0
    assert plain["exchange_s"] == pytest.approx(pm.comm_time(2, 4 * MLP_ENTRIES, 5e8 / 8, 1e-4))
    # one bucket after the backward pass: all of it is exposed
    assert plain["exposed_s"] == pytest.approx(plain["exchange_s"])
    assert plain["step_s"] == pytest.approx(0.012 + plain["exchange_s"])
    ps = cm.predict_step(MLP_SHAPES, {"compression": "powersgd", "compression_rank": 4}, **base)
    flop_rate = 6 * MLP_ENTRIES * 128 / 0.012
    ex = cm.exchange(MLP_SHAPES, {"compression": "powersgd", "compression_rank": 4})
    assert ps["compress_s"] == pytest.approx(ex["compress_flops"] / flop_rate
                                             + ex["compress_passes"] * cm.ELEMENT_PASS_S)
    p_bytes = sum(p for p, _ in ex["allreduce"])
    q_bytes = sum(q for _, q in ex["allreduce"])
    assert ps["exchange_s"] == pytest.approx(pm.comm_time(2, p_bytes, 5e8 / 8, 1e-4)
                                             + pm.comm_time(2, q_bytes, 5e8 / 8, 1e-4))
    assert ps["step_s"] < plain["step_s"] / 3  # 72x fewer bytes on a 500 Mbit/s link
    topk = cm.predict_step(MLP_SHAPES, {"compression": "topk"}, **base)
    assert topk["compress_s"] == pytest.approx(MLP_ENTRIES * cm.TOPK_ENTRY_S)
    assert topk["exchange_s"] == pytest.approx(sum(
        cm.allgather_time(2, g, 5e8 / 8, 1e-4) for g in topk_gathers()))
    # two buckets: the first goes during the backward pass
    split = cm.predict_step(MLP_SHAPES, None, buckets=[[4, 5, 2, 3], [0, 1]], **base)
    assert split["exchange_s"] > plain["exchange_s"]  # one more message latency pair
    assert split["exposed_s"] < plain["exposed_s"]


def topk_gathers():
    from hvdtrain_bench import compression_model as cm

    return cm.exchange(MLP_SHAPES, {"compression": "topk"})["allgather"]
