"""``hvdtrain bench --hosts N --link RATE... --to-accuracy T``: time to a test accuracy on
the emulated cluster of :mod:`hvdtrain_bench.links`, one rank per namespace host.

Per rate, every configuration (:data:`CONFIGS`: the Trainer uncompressed, with fp16,
top-k and PowerSGD at two ranks, Horovod's plain loop and the per-tensor
``DistributedGradientTape`` loop) trains the MLP on the real dataset
(:mod:`hvdtrain_bench.accuracy`) until the target or ``max_epochs``, the order of the
configurations alternating (ABBA) from one section and repeat to the next; at each rate
in ``wide_links`` the wide MLP (57 MB of gradients) does the same with ``wide_configs``.
Each row has the wall time to the target, the epochs, the final test accuracy, its
ratio to the faster Horovod loop, and the cost model's step
(:mod:`hvdtrain_bench.compression_model`) against the measured one; the one-rank compute
the model starts from and the all-reduce probes come from the link bench's own jobs.
Root only.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from hvdtrain_bench import compression_model, links
from hvdtrain_bench.accuracy import DATASETS
from hvdtrain_bench.jobs import run_job
from hvdtrain_bench.link_figures import parse_rate
from hvdtrain_bench.netns import DEFAULT_BURST, DEFAULT_LATENCY, namespace_hosts, set_link, \
    veth_bytes
from hvdtrain_bench.report import fmt
from hvdtrain_bench.settings import INPUT_DIM, CLASSES, MODELS, param_counts

#: Configuration name -> (loop, Trainer options); ``trainer_powersgd_rN`` for any N.
CONFIGS = {"trainer": ("trainer", {}), "trainer_fp16": ("trainer", {"compression": "fp16"}),
           "trainer_topk": ("trainer", {"compression": "topk"}),
           "trainer_powersgd_r4": ("trainer", {"compression": "powersgd",
                                               "compression_rank": 4}),
           "trainer_powersgd_r8": ("trainer", {"compression": "powersgd",
                                               "compression_rank": 8}),
           "plain": ("plain", {}), "pertensor": ("pertensor", {})}
WIDE_CONFIGS = ("trainer", "trainer_powersgd_r8", "plain")
HOROVOD_LOOPS = ("plain", "pertensor")
THROUGHPUT_STEPS, THROUGHPUT_WARMUP = 40, 5  # the compute and probe jobs


def config(name: str) -> tuple[str, dict]:
    """``(loop, options)`` of a configuration's name; raises ValueError naming it."""
    match = re.fullmatch(r"trainer_powersgd_r([1-9]\d*)", name)
    if match:
        return "trainer", {"compression": "powersgd", "compression_rank": int(match.group(1))}
    if name not in CONFIGS:
        raise ValueError(f"a configuration must be one of {list(CONFIGS)} (or "
                         f"trainer_powersgd_rN), got {name!r}")
    return CONFIGS[name]


def shapes(model: str) -> list[tuple[int, ...]]:
    """The gradient shapes of ``model``, kernels and biases, forward order."""
    widths = (INPUT_DIM, *MODELS[model].hidden, CLASSES)
    return [s for a, b in zip(widths, widths[1:]) for s in ((a, b), (b,))]


class _AccuracyJobs(links._Jobs):
    """The link bench's jobs (compute, probes) plus time-to-accuracy jobs across hosts."""

    def accuracy(self, key: str, name: str, model: str) -> dict:
        mode, options = config(name)
        self.count += 1
        out = self.tmp / f"job{self.count}.json"
        a = self.cfg["accuracy"]
        worker = [sys.executable, "-m", "hvdtrain_bench", "--worker", "--mode", mode,
                  "--to-accuracy", repr(a["target"]), "--max-epochs", str(a["max_epochs"]),
                  "--dataset", a["dataset"], "--lr", repr(a["learning_rate"]),
                  "--batch-size", str(self.cfg["batch_size"]), "--seed", str(self.cfg["seed"]),
                  "--model", model, "--out", str(out)]
        if options:
            worker += ["--options", json.dumps(options, sort_keys=True)]
        procs = [links.across_hosts(worker, self.hosts, self.cfg["launcher"],
                                    self.cfg["hostfile"], self.cfg["fake_bin"])]
        self.commands.setdefault(key, self.shown(procs, out))
        before = veth_bytes(self.hosts)[0][0]
        result = run_job(procs, out, self.timeout, what=f"bench job {key!r}")
        result["wire_bytes_per_step"] = (veth_bytes(self.hosts)[0][0] - before) / result["steps"]
        result["command"] = self.commands[key]
        return result


def _row(result: dict, name: str, model: str, compute_s: float, link: dict,
         bucket_mb: float, hosts: int) -> dict:
    """One configuration's figures, with the cost model's step beside the measured one."""
    from hvdtrain.horovod import buckets  # light: no TensorFlow, no Horovod
    from types import SimpleNamespace

    mode, options = config(name)
    grads = shapes(model)
    plan = None
    if mode == "trainer":
        plan = buckets.plan([SimpleNamespace(shape=s, dtype="float32") for s in grads], bucket_mb)
    elif mode == "pertensor":
        plan = [[i, i + 1] for i in range(0, len(grads), 2)][::-1]
    pred = compression_model.predict_step(
        grads, options, compute_s=compute_s, params=sum(param_counts(model)),
        batch_size=result["batch_size"], workers=hosts, buckets=plan, **link)
    epochs = result["epochs_to_target"] or len(result["epochs"])
    return {"config": name, "mode": mode, "options": options,
            "time_to_target_s": result["time_to_target_s"],
            "epochs": len(result["epochs"]), "epochs_to_target": result["epochs_to_target"],
            "final_accuracy": result["final_accuracy"], "per_epoch": result["epochs"],
            "train_s": result["train_s"], "step_s": result["step_s"],
            "samples_per_s": result["samples_per_s"],
            "wire_bytes_per_step": result["wire_bytes_per_step"], "predicted": pred,
            "predicted_time_to_target_s": pred["step_s"] * result["steps_per_epoch"] * epochs,
            "measured_over_predicted_step": result["step_s"] / pred["step_s"],
            "command": result["command"]}


def _section(jobs: _AccuracyJobs, link: str, model: str, names: list[str], flip: int,
             repeats: int, compute: dict, fitted: dict | None, say) -> dict:
    rate = parse_rate(link)
    if fitted:
        net = {"bandwidth_Bps": fitted["bandwidth_Bps"], "latency_s": fitted["latency_s"]}
    else:
        net = {"bandwidth_Bps": (rate or 1e15) / 8, "latency_s": 0.0}
    runs: dict = {n: [] for n in names}
    for rep in range(repeats):
        for name in (names if (rep + flip) % 2 == 0 else names[::-1]):
            r = jobs.accuracy(f"{link} {model} {name}", name, model)
            runs[name].append(r)
            say(f"  {link} {model} {name:<20} {fmt(r['time_to_target_s'], '.1f'):>6} s to "
                f"{r['target']} ({len(r['epochs'])} epochs, test {r['final_accuracy']:.4f})")
    rows = {}
    for name in names:
        result = sorted(runs[name], key=lambda r: r["train_s"])[len(runs[name]) // 2]
        mode = config(name)[0]
        rows[name] = _row(result, name, model, compute[mode]["together_step_s"], net,
                          jobs.cfg["bucket_mb"], jobs.hosts)
    reached = [rows[n]["time_to_target_s"] for n in HOROVOD_LOOPS
               if n in rows and rows[n]["time_to_target_s"]]
    best = min(reached) if reached else None
    base = rows.get("trainer", {}).get("samples_per_s")
    for row in rows.values():
        t = row["time_to_target_s"]
        row["ratio_to_best_horovod"] = t / best if (t and best) else None
        row["samples_per_s_over_trainer"] = row["samples_per_s"] / base if base else None
    return {"link": link, "rate_bps": rate, "model": model, "link_fit": net,
            "best_horovod_s": best, "rows": rows}


def run_accuracy_bench(hosts: int = 2, link_rates: Sequence[str] = ("500mbit", "2gbit"), *,
                       target: float = 0.86, max_epochs: int = 5,
                       dataset: str = "fashion_mnist",
                       configs: Sequence[str] = tuple(CONFIGS),
                       wide_links: Sequence[str] = ("2gbit",),
                       wide_configs: Sequence[str] = WIDE_CONFIGS, batch_size: int = 128,
                       learning_rate: float = 5e-4, seed: int = 0, repeats: int = 1,
                       launcher: str = links.DEFAULT_HOSTS_LAUNCHER,
                       burst: str = DEFAULT_BURST, latency: str = DEFAULT_LATENCY,
                       timeout: float = 1800.0, probe: bool = True,
                       progress: Callable[[str], None] | None = None) -> dict:
    """Runs the time-to-accuracy bench; returns its report (see :func:`format_table`).

    Raises:
        ValueError: a bad argument, named.
        RuntimeError: not root, a tool missing, or a job failed (with its command).
    """
    link_rates, configs = list(dict.fromkeys(link_rates)), list(dict.fromkeys(configs))
    wide_links = [w for w in dict.fromkeys(wide_links or []) if w != "none"]
    wide_configs = list(dict.fromkeys(wide_configs))
    for name in configs + wide_configs:
        config(name)
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if not 0 < target <= 1:
        raise ValueError(f"target must be a test accuracy in (0, 1], got {target!r}")
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be a positive integer, got {max_epochs!r}")
    models = ["mlp"] + (["wide"] if wide_links and wide_configs else [])
    links._check(hosts, link_rates + wide_links, ["trainer"], models, launcher, burst,
                 latency, batch_size=batch_size, repeats=repeats)
    links.check_root()
    from hvdtrain.options import DEFAULT_BUCKET_MB

    acc = dict(target=target, max_epochs=max_epochs, dataset=dataset,
               learning_rate=learning_rate)
    cfg = dict(steps=THROUGHPUT_STEPS, warmup=THROUGHPUT_WARMUP, batch_size=batch_size,
               examples=8192, seed=seed, options={}, launcher=launcher, accuracy=acc,
               bucket_mb=float(DEFAULT_BUCKET_MB))

    def say(line: str) -> None:
        if progress:
            progress(time.strftime("%H:%M:%S ") + line)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hvdtrain-acc-") as tmp:
        cfg.update(hostfile=str(Path(tmp) / "hostfile"), fake_bin=str(Path(tmp) / "bin"))
        Path(cfg["fake_bin"]).mkdir()
        (Path(cfg["fake_bin"]) / "ssh").symlink_to(links.rsh_agent())
        jobs = _AccuracyJobs(tmp, hosts, timeout, cfg)
        loops = sorted({config(n)[0] for n in configs + wide_configs})
        compute = links._one_rank_compute(jobs, models, loops, 1, say)
        sections = []
        with namespace_hosts(hosts, cfg["hostfile"]):
            for rate in dict.fromkeys(link_rates + wide_links):
                set_link(rate, burst, latency)
                fitted = links._probe(jobs, rate, say)["fit"] if probe else None
                for model, names in (("mlp", configs if rate in link_rates else []),
                                     ("wide", wide_configs if rate in wide_links else [])):
                    if names:
                        sections.append(_section(jobs, rate, model, names, len(sections),
                                                 repeats, compute[model], fitted, say))
    cfg = {k: v for k, v in cfg.items() if k not in ("hostfile", "fake_bin", "options")}
    cfg.update(hosts=hosts, links=link_rates, wide_links=wide_links, configs=configs,
               wide_configs=wide_configs, repeats=repeats, burst=burst, latency=latency,
               optimizer="Adam (learning rate per rank x ranks)", host_env=links.HOST_ENV,
               elapsed_s=time.time() - started)
    return {"benchmark": f"time to {target} test accuracy on {dataset}", "config": cfg,
            "compute": compute, "sections": sections, "commands": jobs.commands}


def format_table(report: dict) -> str:
    """The report of :func:`run_accuracy_bench` as text, a block per rate and model."""
    cfg, a = report["config"], report["config"]["accuracy"]
    lines = [f"{report['benchmark']}: {cfg['hosts']} namespace hosts, one rank each, "
             f"{cfg['launcher']}; batch {cfg['batch_size']} per rank, {cfg['optimizer']} "
             f"{a['learning_rate']:g}, at most {a['max_epochs']} epochs, seed {cfg['seed']}; "
             f"wall time counts training only (not the per-epoch evaluation); "
             f"{cfg['elapsed_s']:.0f} s in all"]
    for s in report["sections"]:
        lines += ["", f"== {s['link']}, {s['model']}: faster Horovod loop "
                      f"{fmt(s['best_horovod_s'], '.1f')} s to target",
                  f"   {'config':<20} {'to target s':>11} {'epochs':>6} {'test acc':>8} "
                  f"{'/hvd best':>9} {'samples/s':>9} {'step ms':>8} {'model ms':>8} "
                  f"{'wire MB/step':>12}"]
        for name, r in s["rows"].items():
            epochs = str(r["epochs_to_target"]) if r["epochs_to_target"] else f">{r['epochs']}"
            lines.append(
                f"   {name:<20} {fmt(r['time_to_target_s'], '.1f'):>11} "
                f"{epochs:>6} "
                f"{r['final_accuracy']:>8.4f} {fmt(r['ratio_to_best_horovod'], '.2f'):>9} "
                f"{r['samples_per_s']:>9,.0f} {r['step_s'] * 1e3:>8.1f} "
                f"{r['predicted']['step_s'] * 1e3:>8.1f} {r['wire_bytes_per_step'] / 1e6:>12.3f}")
    lines += ["", "epochs '>N': not reached in N; /hvd best: time to target over the faster "
                  "of Horovod's plain and per-tensor loops; model: compute (both hosts at "
                  "once) + compression's compute + the exchange left after the backward pass "
                  "(hvdtrain_bench.compression_model, the link fitted to the probes)"]
    return "\n".join(lines)
