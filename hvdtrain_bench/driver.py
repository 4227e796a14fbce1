"""The ``hvdtrain bench`` driver: throughput of the Trainer against hand-written loops,
measured in the same run.

:func:`run_bench` launches the workers of :mod:`hvdtrain_bench.worker` as subprocesses
(``python`` for one rank, ``horovodrun --gloo`` or ``mpirun`` for more, see
:mod:`hvdtrain_bench.launch`), alternates the modes ``repeats`` times, and reports medians,
the ratios between modes and the scaling efficiency ``samples/s(np) / (np * samples/s(1))``
of each mode (:func:`summarize`), per model when several are asked for, each figure with
the command that produced it (:func:`figures`). Nothing here imports TensorFlow, so the
driver stays light.
"""
from __future__ import annotations

import os
import shlex
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from hvdtrain.threads import usable_cores
from hvdtrain_bench.jobs import run_job, shown_command
from hvdtrain_bench.launch import job_processes
from hvdtrain_bench.settings import (DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLES, DEFAULT_MODEL,
                                     DEFAULT_MODES, DEFAULT_REPEATS, DEFAULT_SEED,
                                     DEFAULT_STEPS, DEFAULT_TIMEOUT, DEFAULT_WARMUP, MODELS,
                                     OPTION_KEYS, RATIOS, check_job_arguments)

#: The fields of a worker's result that each run of the report keeps.
RUN_KEYS = ("samples_per_s", "elapsed_s", "elapsed_per_rank_s", "final_loss", "examples",
            "bytes_sent_per_step", "startup_s", "peak_rss_mb_per_rank", "host_reads",
            "host_reads_per_step")


def job_key(np: int, mode: str, model: str = DEFAULT_MODEL) -> str:
    """The name of a job in the report's ``commands``: ``np=2 trainer`` for the default
    model (as before there were others), ``np=2 trainer model=wide`` for another."""
    return f"np={np} {mode}" + ("" if model == DEFAULT_MODEL else f" model={model}")


def benchmark_title(models: Sequence[str]) -> str:
    """The report's ``benchmark``: the models' titles (the default's alone by default)."""
    return "; ".join(MODELS[m].title for m in models)


def _check_arguments(np_list: list, launcher: str, modes: Sequence[str], options: dict,
                     models: Sequence[str], **positive: int) -> None:
    """Raises ValueError naming the first bad argument of :func:`run_bench`."""
    if not np_list or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in np_list):
        raise ValueError(f"np_list must hold positive integers, got {np_list!r}")
    check_job_arguments(launcher, modes, models, **positive)
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown bench options {unknown}; known: {list(OPTION_KEYS)}")


def run_bench(np_list: Sequence[int] = (1, 2), steps: int = DEFAULT_STEPS,
              batch_size: int = DEFAULT_BATCH_SIZE, repeats: int = DEFAULT_REPEATS,
              launcher: str = "horovodrun", *, warmup: int = DEFAULT_WARMUP,
              examples: int = DEFAULT_EXAMPLES, seed: int = DEFAULT_SEED,
              timeout: float = DEFAULT_TIMEOUT, modes: Sequence[str] = DEFAULT_MODES,
              python: str | None = None, progress: Callable[[str], None] | None = None,
              options: dict | None = None, probe: bool = True,
              models: Sequence[str] = (DEFAULT_MODEL,)) -> dict:
    """Launches the workers and returns the report (see
    :func:`hvdtrain_bench.report.format_table`).

    Each repeat runs every size once in each mode, alternating which mode goes first so
    a drift in machine load falls on both; the report holds medians over the repeats.
    One-rank runs use the cores one rank gets at the largest size (see
    :func:`hvdtrain_bench.launch.job_processes`).

    Args:
        np_list: numbers of ranks to measure (one rank runs under plain ``python``).
        steps: timed steps per run (after ``warmup`` untimed ones).
        batch_size: examples per step on each rank.
        repeats: runs per (size, mode).
        launcher: ``"horovodrun"`` (Gloo) or ``"mpirun"`` for more than one rank.
        timeout: seconds before a job is killed and the benchmark fails.
        progress: called with a line of text after each run (e.g. ``print``).
        options: Trainer / DistributedOptimizer options for the hvdtrain modes (keys
            from ``OPTION_KEYS``); the baselines stay uncompressed.
        probe: also time all-reduces of several sizes at the largest size (the inputs of
            the cost model in :mod:`hvdtrain_bench.perf_model`).
        models: the benchmark models (``hvdtrain_bench.settings.MODELS``), each measured
            in every mode and size, with rows of its own.

    Raises:
        ValueError: a bad argument, named.
        RuntimeError: a job failed or timed out, with its command and output.
    """
    np_list = list(dict.fromkeys(np_list))  # each size once, in the order given
    models = list(dict.fromkeys(models))
    options = {k: v for k, v in (options or {}).items() if v is not None}
    _check_arguments(np_list, launcher, modes, options, models, steps=steps,
                     batch_size=batch_size, repeats=repeats, examples=examples)
    largest = max(np_list)
    reference_cores = max(1, usable_cores() // largest) if largest > 1 else None
    common = dict(launcher=launcher, steps=steps, warmup=warmup, batch_size=batch_size,
                  examples=examples, seed=seed, python=python)
    runs, commands, probes = [], {}, None
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for rep in range(repeats):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for model, np in ((m, n) for m in models for n in np_list):
                for mode in order:
                    out = Path(tmp) / f"{model}-np{np}-{mode}-{rep}.json"
                    procs = job_processes(np, mode, reference_cores=reference_cores,
                                          out=str(out), options=options, model=model, **common)
                    commands.setdefault(job_key(np, mode, model), shown_command(procs, out))
                    t0 = time.perf_counter()
                    result = run_job(procs, out, timeout)
                    if result["np"] != np:
                        raise RuntimeError(f"asked for {np} ranks but the job ran {result['np']}: "
                                           f"{shlex.join(procs[0][0])}")
                    run = {key: result.get(key) for key in RUN_KEYS}
                    run.update(np=np, mode=mode, model=model, repeat=rep,
                               job_wall_s=time.perf_counter() - t0)
                    runs.append(run)
                    if progress:
                        progress(f"  {model} np={np} {mode:<13} repeat {rep + 1}/{repeats}: "
                                 f"{run['samples_per_s']:,.0f} samples/s, "
                                 f"{run['host_reads_per_step']:.2f} host reads/step")
        if probe and largest > 1:
            out = Path(tmp) / "probe.json"
            procs = job_processes(largest, "probe", out=str(out), options=None, **common)
            commands["probe"] = shown_command(procs, out)
            probes = run_job(procs, out, timeout)["probes"]
            if progress:
                progress(f"  np={largest} all-reduce probes: " + ", ".join(
                    f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in probes))
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    report = {
        "benchmark": benchmark_title(models),
        "config": {"np": np_list, "steps": steps, "warmup": warmup, "batch_size": batch_size,
                   "examples": examples, "seed": seed, "repeats": repeats, "launcher": launcher,
                   "modes": list(modes), "models": models, "options": options,
                   "cpu_count": os.cpu_count(), "reference_cores": reference_cores,
                   "load_average_after": load},
        "results": summarize(runs, np_list, modes, models),
        "runs": runs,
        "probes": probes,
        "commands": commands,
    }
    report["figures"] = figures(report)
    return report


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], np_list: Sequence[int],
              modes: Sequence[str] = DEFAULT_MODES,
              models: Sequence[str] | None = None) -> list[dict]:
    """Medians per (model, np, mode), the ratios between modes and each mode's scaling
    efficiency; one row per model and size (a run without ``model`` is of the default).

    Efficiency at ``np`` ranks is ``samples/s(np) / (np * samples/s(1))``; it is ``None``
    when one rank was not measured. Start-up is launch to the end of the first step (the
    slowest rank); memory is the peak resident set of the largest rank; host reads per
    step are rank 0's device-to-host reads in the timed steps over the steps.
    """
    if models is None:
        models = list(dict.fromkeys(r.get("model", DEFAULT_MODEL) for r in runs)) \
            or [DEFAULT_MODEL]
    return [_summary_row(runs, np, modes, model) for model in models for np in np_list]


def _summary_row(runs: list[dict], np: int, modes: Sequence[str], model: str) -> dict:
    """The row of :func:`summarize` for one model and size."""
    def pick(n, mode, key):
        return [r.get(key) for r in runs if r["np"] == n and r["mode"] == mode
                and r.get("model", DEFAULT_MODEL) == model]

    def speed(n, mode):
        return _median(pick(n, mode, "samples_per_s"))

    row: dict = {"np": np, "model": model}
    for mode in modes:
        rss = [max(v) for v in pick(np, mode, "peak_rss_mb_per_rank") if v]
        row[mode] = {"samples_per_s": speed(np, mode),
                     "runs_samples_per_s": pick(np, mode, "samples_per_s"),
                     "startup_s": _median(pick(np, mode, "startup_s")),
                     "peak_rss_mb": _median(rss),
                     "host_reads_per_step": _median(pick(np, mode, "host_reads_per_step"))}
    for name, top, bottom in RATIOS:
        if top in modes and bottom in modes:
            t, b = speed(np, top), speed(np, bottom)
            row[f"ratio_{name}"] = t / b if t and b else None
    if "trainer" in modes and "plain" in modes:
        t, p = row["trainer"]["peak_rss_mb"], row["plain"]["peak_rss_mb"]
        row["rss_trainer_over_plain"] = t / p if t and p else None
    row["bytes_sent_per_step"] = {m: next(iter(pick(np, m, "bytes_sent_per_step")), None)
                                  for m in modes}
    row["efficiency"] = {}
    for mode in modes:
        base, value = speed(1, mode), speed(np, mode)
        row["efficiency"][mode] = value / (np * base) if base and value else None
    return row


def figures(report: dict) -> list[dict]:
    """Every figure of the report, flat, each with the model and the command that
    produced it."""
    cmds, out = report["commands"], []
    for row in report["results"]:
        np, model = row["np"], row.get("model", DEFAULT_MODEL)
        for mode in report["config"]["modes"]:
            cmd = cmds.get(job_key(np, mode, model))
            for key in ("samples_per_s", "startup_s", "peak_rss_mb", "host_reads_per_step"):
                out.append({"figure": key, "np": np, "model": model, "mode": mode,
                            "value": row[mode].get(key), "command": cmd})
            out.append({"figure": "efficiency", "np": np, "model": model, "mode": mode,
                        "value": row["efficiency"][mode],
                        "command": [cmds.get(job_key(1, mode, model)), cmd]})
        row_cmds = [cmds[k] for k in (job_key(np, m, model) for m in report["config"]["modes"])
                    if k in cmds]
        for key, value in row.items():
            if key.startswith(("ratio_", "rss_")):
                out.append({"figure": key, "np": np, "model": model, "value": value,
                            "command": row_cmds})
    if report.get("probes"):
        out.append({"figure": "allreduce_probes", "value": report["probes"],
                    "command": cmds.get("probe")})
    return out
