"""The cluster forecast: the emulated links' cost model carried to 64-512 GPUs (numpy
only, nothing launched)."""
import pytest

from hvdtrain_bench import cluster_forecast as cf
from hvdtrain_bench import perf_model
from hvdtrain.horovod import buckets


def test_buckets_of_a_gradient_stream_are_cut_as_the_trainer_cuts_them():
    mib = 2 ** 20
    assert cf.uniform_buckets(60 * mib, 25) == [1 * mib, 25 * mib, 25 * mib, 9 * mib]
    assert cf.uniform_buckets(60 * mib, 25, first_bucket_mb=25) == [25 * mib, 25 * mib, 10 * mib]
    assert cf.uniform_buckets(0.5 * mib, 25) == [0.5 * mib]
    assert buckets.FIRST_BUCKET_MB == 1.0  # what the forecast assumes by default


def test_each_row_is_the_model_s_step_for_its_inputs():
    rows = cf.forecast(["resnet50"], workers=[64], rates_gbit=[100])
    (row,) = rows
    w = cf.WORKLOADS["resnet50"]
    exposed = perf_model.exposed_with_buckets(
        cf.uniform_buckets(w.gradient_bytes, 25), w.step_s * 2 / 3, 64,
        perf_model.gbit_to_Bps(100), cf.LATENCY_S)
    assert row["exposed_s"] == pytest.approx(exposed) and exposed > 0
    assert row["efficiency"] == pytest.approx(w.step_s / (w.step_s + exposed))


def test_efficiency_falls_with_more_gpus_and_rises_with_a_faster_link():
    rows = cf.forecast()
    assert {r["workload"] for r in rows} == set(cf.WORKLOADS)
    for name in cf.WORKLOADS:
        eff = {(r["workers"], r["rate_gbit"]): r["efficiency"] for r in rows
               if r["workload"] == name}
        for n in cf.WORKERS:
            assert [eff[n, g] for g in cf.RATES_GBIT] == sorted(eff[n, g] for g in cf.RATES_GBIT)
        for g in cf.RATES_GBIT:
            assert [eff[n, g] for n in cf.WORKERS] == sorted(
                (eff[n, g] for n in cf.WORKERS), reverse=True)
        assert all(0 < e <= 1 for e in eff.values())
    # Accumulating 8 passes and sending fp16 hides far more of BERT-large's exchange.
    bert = {r["workers"]: r["efficiency"] for r in rows
            if r["workload"] == "bert_large" and r["rate_gbit"] == 400}
    accum = {r["workers"]: r["efficiency"] for r in rows
             if r["workload"] == "bert_large_accum" and r["rate_gbit"] == 400}
    assert all(accum[n] > bert[n] for n in cf.WORKERS)


def test_the_table_and_bad_arguments(capsys):
    cf.main(["--latency-us", "5"])
    out = capsys.readouterr().out
    assert out.count("| GPUs | 100 Gbit/s | 200 Gbit/s | 400 Gbit/s |") == len(cf.WORKLOADS)
    assert "**ResNet-50" in out and "| 512 |" in out
    with pytest.raises(ValueError, match="workloads must be drawn from"):
        cf.forecast(["gpt"])
    with pytest.raises(ValueError, match="workers must be >= 2"):
        cf.forecast(workers=[1])
