"""``hvdtrain bench --hosts N --link RATE``: its figures and its arguments (one process,
nothing launched; tests/parallel/test_link_bench.py runs it on namespace hosts)."""
import subprocess

import pytest

from hvdtrain import cli
from hvdtrain_bench import link_figures, links, netns, perf_model
from hvdtrain_bench.settings import param_counts

MLP_BYTES = 4 * sum(param_counts("mlp"))


@pytest.mark.parametrize("text, bps", [("500mbit", 5e8), ("2gbit", 2e9), ("5gbit", 5e9),
                                       ("1.5gbit", 1.5e9), ("800kbit", 8e5), ("none", None)])
def test_rates_are_tc_rates_in_bits_per_second(text, bps):
    assert link_figures.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["2gbps", "2GBIT", "gbit", "0mbit", "-1gbit", "2 gbit", "",
                                  "500"])
def test_a_bad_rate_is_refused_with_what_is_expected(text):
    with pytest.raises(ValueError, match=r"number followed by kbit, mbit or gbit.*500mbit"):
        link_figures.parse_rate(text)


def test_the_wire_limit_is_the_slower_of_compute_and_the_ring():
    # 2 ranks: each sends its S bytes once each way per step: S * 8 / rate seconds.
    lim = link_figures.wire_limit(MLP_BYTES, 2e9, 0.0094, 256)
    assert lim["wire_s"] == pytest.approx(MLP_BYTES * 8 / 2e9)
    assert lim["bound"] == "wire"
    assert lim["limit_samples_per_s"] == pytest.approx(256 / lim["wire_s"])
    fast = link_figures.wire_limit(MLP_BYTES, 5e9, 0.0094, 256)
    assert fast["bound"] == "compute" and fast["limit_samples_per_s"] == pytest.approx(256 / 0.0094)
    unshaped = link_figures.wire_limit(MLP_BYTES, None, 0.0094, 256)
    assert unshaped["wire_s"] == 0 and unshaped["bound"] == "compute"
    # 4 ranks: the ring moves 2 * 3/4 * S.
    assert link_figures.wire_limit(1e6, 1e9, 1e-3, 512, workers=4)["wire_s"] == pytest.approx(1.5e6 * 8 / 1e9)


def test_each_loop_exchanges_what_it_does():
    counts = param_counts("wide")
    assert link_figures.bucket_bytes("plain", "wide", 25) == [4.0 * sum(counts)]
    assert link_figures.bucket_bytes("mwms", "mlp", 25) == [float(MLP_BYTES)]
    # Per tensor: a layer's kernel and bias are ready together and go as one message.
    mlp = param_counts("mlp")
    assert link_figures.bucket_bytes("pertensor", "mlp", 25) == [
        4.0 * (mlp[4] + mlp[5]), 4.0 * (mlp[2] + mlp[3]), 4.0 * (mlp[0] + mlp[1])]
    # The Trainer's buckets: the last layers first, the first closed at >= 1 MiB
    # (buckets.FIRST_BUCKET_MB), the others at >= 25 MiB; no byte lost or repeated.
    assert link_figures.bucket_bytes("trainer", "mlp", 25) == [
        4.0 * sum(mlp[2:]), 4.0 * sum(mlp[:2])]
    wide = link_figures.bucket_bytes("fit", "wide", 25)
    assert len(wide) == 3 and sum(wide) == 4.0 * sum(counts)
    assert 2 ** 20 <= wide[0] < 25 * 2 ** 20 <= wide[1]


PROBES = [{"np": 2, "bytes": b, "seconds": s}
          for b, s in ((4096, 1e-3), (1 << 20, 5e-3), (4 << 20, 20e-3))]


def test_an_allreduce_takes_the_time_read_off_the_probes():
    assert perf_model.probed_seconds(PROBES, 100) == 1e-3          # below: the smallest's
    assert perf_model.probed_seconds(PROBES, 1 << 20) == pytest.approx(5e-3)
    assert perf_model.probed_seconds(PROBES, 2.5 * (1 << 20)) == pytest.approx(12.5e-3)
    assert perf_model.probed_seconds(PROBES, 8 << 20) == pytest.approx(40e-3)  # last slope
    with pytest.raises(ValueError, match="one world size"):
        perf_model.probed_seconds(PROBES + [{"np": 4, "bytes": 1, "seconds": 1.0}], 10)
    with pytest.raises(ValueError, match=">= 2 distinct message sizes"):
        perf_model.probed_seconds(PROBES[:1], 10)


def test_the_prediction_is_compute_plus_the_exposed_exchange():
    compute, rate = 0.0094, 2e9
    one = link_figures.predict("plain", "mlp", compute, rate, PROBES, 25, 256)
    # One all-reduce after the backward pass: nothing hidden, its time off the probes.
    assert one["exposed_s"] == pytest.approx(perf_model.probed_seconds(PROBES, MLP_BYTES))
    assert one["samples_per_s"] == pytest.approx(256 / (compute + one["exposed_s"]))
    # Without probes: the ring's time at the rate.
    bare = link_figures.predict("plain", "mlp", compute, rate, None, 25, 256)
    assert bare["exposed_s"] == pytest.approx(MLP_BYTES * 8 / rate)
    # The Trainer's first bucket goes while the backward pass still runs.
    trainer = link_figures.predict("trainer", "mlp", compute, rate, PROBES, 25, 256)
    assert trainer["buckets"] == 2 and trainer["exposed_s"] < one["exposed_s"]
    per_tensor = link_figures.predict("pertensor", "mlp", compute, rate, PROBES, 25, 256)
    assert per_tensor["buckets"] == 3 and per_tensor["exposed_s"] < one["exposed_s"]
    unshaped = link_figures.predict("trainer", "mlp", compute, None, PROBES, 25, 256)
    assert unshaped["samples_per_s"] is None


def test_the_synchronous_bound_starts_the_wire_after_the_forward_pass():
    lim = link_figures.wire_limit(MLP_BYTES, 2e9, 0.015, 256)
    assert lim["sync_limit_samples_per_s"] == pytest.approx(256 / (0.005 + lim["wire_s"]))
    assert lim["sync_limit_samples_per_s"] < lim["limit_samples_per_s"]
    compute_bound = link_figures.wire_limit(MLP_BYTES, None, 0.015, 256)
    assert compute_bound["sync_limit_samples_per_s"] == pytest.approx(256 / 0.015)


def test_cli_parses_hosts_links_and_keeps_the_plain_bench_defaults():
    args = cli.build_parser().parse_args(["bench", "--hosts", "2", "--link", "500mbit", "2gbit",
                                          "none", "--model", "mlp", "wide"])
    assert (args.hosts, args.link, args.models) == (2, ["500mbit", "2gbit", "none"],
                                                    ["mlp", "wide"])
    assert args.given == set() and args.launcher == "horovodrun"
    given = cli.build_parser().parse_args(["bench", "--hosts", "2", "--link", "2gbit",
                                           "--launcher", "horovodrun", "--modes", "trainer"])
    assert given.given == {"launcher", "modes"}


@pytest.mark.parametrize("argv, words", [
    (["bench", "--hosts", "2", "--link", "2gbps"], "number followed by kbit, mbit or gbit"),
    (["bench", "--hosts", "0", "--link", "2gbit"], "--hosts"),
])
def test_cli_refuses_a_bad_rate_or_host_count(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_hosts_and_link_go_together(capsys):
    assert cli.main(["bench", "--hosts", "2"]) == 2
    assert "--hosts N and --link RATE... go together" in capsys.readouterr().err
    assert cli.main(["bench", "--link", "2gbit"]) == 2


def test_arguments_are_checked_before_anything_runs():
    for kwargs, words in [({"hosts": 1}, "hosts must be an integer >= 2"),
                          ({"links": []}, "at least one rate"),
                          ({"links": ["fast"]}, "kbit, mbit or gbit"),
                          ({"modes": ["trainer_files"]}, "modes must be drawn from"),
                          ({"models": ["huge"]}, "models must be drawn from"),
                          ({"launcher": "srun"}, "launcher must be one of"),
                          ({"burst": "lots"}, "burst must be a tc size"),
                          ({"latency": "5"}, "latency must be a tc time"),
                          ({"steps": 0}, "steps must be a positive integer")]:
        with pytest.raises(ValueError, match=words):
            links.run_link_bench(**kwargs)


def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="--hosts needs root"):
        links.run_link_bench(2, ["2gbit"])


@pytest.mark.parametrize("args, words", [
    (["link", "2gbps"], "RATE must be a number followed by kbit, mbit or gbit"),
    (["link", "0gbit"], "RATE must be above zero"),
    (["link", "2gbit", "--burst", "lots"], "--burst must be a size"),
    (["link", "2gbit", "--latency", "5"], "--latency must be a time"),
    (["link", "2gbit", "--queue", "1"], "unknown argument '--queue'"),
    (["up", "2", "--link", "fast"], "RATE must be a number followed by kbit, mbit or gbit"),
    (["up", "2", "--link"], "--link needs a RATE"),
])
def test_hosts_script_refuses_a_bad_link_before_touching_anything(args, words):
    proc = subprocess.run(["sh", str(netns.hosts_script()), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- --shard-optimizer
SHARDED = {"shard_optimizer": True, "bucket_mb": 4.0}


def test_sharding_adds_a_sharded_trainer_row_right_after_the_unsharded_one():
    assert links.link_loops(["plain", "trainer", "mwms"], SHARDED) == [
        "plain", "trainer", "trainer_sharded", "mwms"]
    assert links.link_loops(["plain", "trainer"], {"bucket_mb": 4.0}) == ["plain", "trainer"]
    assert links.link_loops(["fit", "plain"], SHARDED) == ["fit", "plain"]  # no Trainer asked
    # Each row runs the Trainer with the options it names: sharded only in its own row.
    assert links.loop_job("trainer", SHARDED) == ("trainer", {"bucket_mb": 4.0})
    assert links.loop_job("trainer_sharded", SHARDED) == ("trainer", SHARDED)
    assert links.loop_job("trainer_sharded", {}) == ("trainer", {"shard_optimizer": True})
    assert links.loop_job("fit", SHARDED) == ("fit", SHARDED)
    assert links.loop_job("plain", SHARDED) == ("plain", {})  # stock settings


class _CannedJobs(links._Jobs):
    """The link bench's jobs with each job's real worker command, and canned results in
    place of running it (the report's assembly, not a speed, is under test)."""

    def __init__(self, tmp, speeds: dict):
        super().__init__(tmp, 2, 60.0, {"batch_size": 32, "steps": 3, "warmup": 1,
                                        "examples": 256, "seed": 0, "options": SHARDED})
        self.speeds, self.order = speeds, []

    def run(self, key, mode, model, where):
        self.commands.setdefault(key, " ".join(self.worker(mode, model, self.tmp / "o.json")))
        self.order.append(mode)
        return {"np": 2, "samples_per_s": self.speeds[mode].pop(0), "final_loss": 0.5,
                "wire_bytes_per_step": 6e6}


def _sharded_report(tmp_path) -> tuple[dict, _CannedJobs]:
    loops = links.link_loops(["trainer", "plain"], SHARDED)
    jobs = _CannedJobs(tmp_path, {"trainer": [1000.0, 1100.0, 900.0],
                                  "trainer_sharded": [950.0, 1078.0, 810.0],
                                  "plain": [800.0, 820.0, 810.0]})
    compute = {m: {"samples_per_s": 3200.0, "step_s": 0.01, "together_samples_per_s": 3200.0,
                   "together_step_s": 0.01, "command": f"c {m}", "together_command": f"t {m}"}
               for m in loops}
    section = links._section(jobs, "2gbit", "mlp", loops, 3, None, compute, 4.0,
                             lambda line: None)
    report = {"benchmark": "MLP", "compute": {"mlp": compute}, "sections": [section],
              "commands": jobs.commands,
              "config": {"hosts": 2, "launcher": "horovodrun", "batch_size": 32, "steps": 3,
                         "warmup": 1, "repeats": 3, "burst": "512kb", "latency": "100ms",
                         "cpu_count": 2}}
    report["figures"] = link_figures.figures(report)
    return report, jobs


def test_one_run_has_the_trainer_unsharded_and_sharded_back_to_back_with_their_ratio(tmp_path):
    report, jobs = _sharded_report(tmp_path)
    # ABBA: the two Trainer rows are neighbours in every repeat.
    assert jobs.order == ["trainer", "trainer_sharded", "plain", "plain", "trainer_sharded",
                          "trainer", "trainer", "trainer_sharded", "plain"]
    (section,) = report["sections"]
    rows = section["loops"]
    assert list(rows) == ["trainer", "trainer_sharded", "plain"]
    assert rows["trainer"]["samples_per_s"] == 1000.0
    assert rows["trainer_sharded"]["samples_per_s"] == 950.0
    assert rows["trainer_sharded"]["ratio_to_trainer"] == pytest.approx(0.95)
    # Each row's options and shown command say whether it sharded.
    assert rows["trainer"]["options"] == {"bucket_mb": 4.0}
    assert rows["trainer_sharded"]["options"] == SHARDED
    assert "--mode trainer " in rows["trainer"]["command"]
    assert "shard_optimizer" not in rows["trainer"]["command"]
    assert "--mode trainer " in rows["trainer_sharded"]["command"]
    assert '"shard_optimizer": true' in rows["trainer_sharded"]["command"]
    assert "--options" not in rows["plain"]["command"] and rows["plain"]["options"] == {}
    ratio = section["sharded_over_unsharded"]
    assert ratio["value"] == pytest.approx(950 / 1000)  # of the medians
    assert ratio["runs"] == pytest.approx([0.95, 0.98, 0.9])  # repeat by repeat
    assert ratio["command"] == [rows["trainer"]["command"], rows["trainer_sharded"]["command"]]
    (figure,) = [f for f in report["figures"] if f["figure"] == "sharded_over_unsharded"]
    assert figure["value"] == ratio["value"] and figure["command"] == ratio["command"]
    assert figure["link"] == "2gbit" and figure["model"] == "mlp"
    assert {f.get("mode") for f in report["figures"] if f["figure"] == "samples_per_s"} == {
        "trainer", "trainer_sharded", "plain"}
    table = link_figures.format_table(report)
    rows_shown = {line.split()[0]: line.split()[1] for line in table.splitlines()
                  if line.startswith("   trainer")}
    assert rows_shown == {"trainer": "1,000", "trainer_sharded": "950"}
    assert ("2gbit mlp: Trainer sharded / unsharded 0.950 of the samples/s "
            "(shard_optimizer=True over False, back to back; per repeat 0.950 0.980 0.900)"
            in table)


def test_the_sharded_trainer_takes_the_trainers_one_rank_compute(tmp_path):
    # One rank has nothing to shard over (shard_optimizer leaves the optimizer whole at
    # np=1): no one-rank job runs for the sharded row.
    jobs = _CannedJobs(tmp_path, {"trainer": [3200.0, 3000.0], "plain": [3300.0, 3100.0]})
    compute = links._one_rank_compute(jobs, ["mlp"], ["trainer", "trainer_sharded", "plain"],
                                      1, lambda line: None)["mlp"]
    assert jobs.order == ["trainer", "trainer", "plain", "plain"]
    assert list(compute) == ["trainer", "trainer_sharded", "plain"]
    assert compute["trainer_sharded"] == compute["trainer"]
    assert compute["trainer"]["together_samples_per_s"] == 3000.0
    assert "shard_optimizer" not in compute["trainer_sharded"]["command"]


def test_without_sharding_there_is_no_sharded_row_nor_ratio():
    loops = {"trainer": {"samples_per_s": 1.0, "runs": [1.0], "command": "a"}}
    assert link_figures.sharded_ratio(loops) is None
    assert link_figures.sharded_ratio({"trainer_sharded": loops["trainer"]}) is None


def test_the_sharded_prediction_waits_for_the_all_gathers_after_the_update():
    compute, rate = 0.0094, 2e9
    trainer = link_figures.predict("trainer", "mlp", compute, rate, PROBES, 25, 256)
    sharded = link_figures.predict("trainer_sharded", "mlp", compute, rate, PROBES, 25, 256)
    sizes = link_figures.bucket_bytes("trainer_sharded", "mlp", 25)
    assert sizes == link_figures.bucket_bytes("trainer", "mlp", 25)  # the Trainer's buckets
    half = lambda n: perf_model.probed_seconds(PROBES, n) / 2  # noqa: E731
    assert sharded["exposed_s"] == pytest.approx(
        perf_model.exposed_after_backward(sizes, compute * 2 / 3, half)
        + sum(half(n) for n in sizes))
    assert sharded["buckets"] == trainer["buckets"] == 2


def test_cli_shard_optimizer_with_hosts_reaches_the_link_bench(monkeypatch, capsys, tmp_path):
    report, _ = _sharded_report(tmp_path)
    seen = {}

    def fake_bench(hosts, rates, **kwargs):
        seen.update(hosts=hosts, rates=rates, **kwargs)
        return report
    monkeypatch.setattr(links, "run_link_bench", fake_bench)
    assert cli.main(["bench", "--hosts", "2", "--link", "2gbit", "--shard-optimizer",
                     "--modes", "trainer", "plain"]) == 0
    assert seen["options"]["shard_optimizer"] is True and seen["modes"] == ["trainer", "plain"]
    assert "Trainer sharded / unsharded 0.950" in capsys.readouterr().out
