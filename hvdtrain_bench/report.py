"""The ``hvdtrain bench`` report as a table (:func:`format_table`), and as files with the
fitted cost model (:func:`write_report`: ``performance.md``, ``scaling.svg``,
``bench.json``)."""
from __future__ import annotations

import json
from pathlib import Path

from hvdtrain_bench.settings import DEFAULT_MODEL, MODELS, RATIOS

#: How each mode is named in the tables.
LABELS = {"trainer": "trainer", "plain": "plain hvd", "pertensor": "per-tensor hvd",
          "mwms": "MWMS", "fit": "fit", "trainer_files": "trainer files"}
WIDTH = 19


def fmt(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` for ``None``."""
    return "-" if value is None else format(value, spec)


def _ratio_names(modes) -> list[str]:
    return [name for name, top, bottom in RATIOS if top in modes and bottom in modes]


def _models(report: dict) -> list[str]:
    """The report's models, in order (a report from before there were several: the
    default)."""
    return list(report["config"].get("models") or [DEFAULT_MODEL])


def _rows_of(report: dict, model: str) -> list[dict]:
    return [r for r in report["results"] if r.get("model", DEFAULT_MODEL) == model]


def _mode_table(rows: list[dict], modes, title: str, cell) -> list[str]:
    """A table with a row per size and a column per mode; ``cell(row, mode)`` is the text."""
    lines = [title, f"{'np':>3} | " + " | ".join(f"{LABELS[m]:>{WIDTH}}" for m in modes),
             "-" * (6 + (WIDTH + 3) * len(modes))]
    for row in rows:
        lines.append(f"{row['np']:>3} | " + " | ".join(cell(row, m).rjust(WIDTH) for m in modes))
    return lines


def _model_section(rows: list[dict], modes) -> list[str]:
    """Samples/s and efficiency, the ratios, host reads per step, start-up and memory of
    one model's rows."""
    lines = _mode_table(rows, modes, "samples/s (scaling efficiency)", lambda row, m: (
        f"{fmt(row[m]['samples_per_s'], ',.0f')} ({fmt(row['efficiency'][m], '.2f')})"))
    ratio_names = _ratio_names(modes)
    if ratio_names:
        lines += ["", "ratios:"] + [f"  np={row['np']}: " + ", ".join(
            f"{name.replace('_over_', '/')} {fmt(row.get('ratio_' + name), '.3f')}"
            for name in ratio_names) for row in rows]
    lines += [""] + _mode_table(
        rows, modes, "host reads per step (device-to-host reads in the timed steps, rank 0)",
        lambda row, m: fmt(row[m].get("host_reads_per_step"), ".2f"))
    lines += [""] + _mode_table(rows, modes, "start s / peak RSS MB", lambda row, m: (
        f"{fmt(row[m]['startup_s'], '.1f')} / {fmt(row[m]['peak_rss_mb'], ',.0f')}"))
    sent = rows[-1].get("bytes_sent_per_step", {}) if rows else {}
    if sent:
        lines += ["", "bytes sent per step per rank: " + ", ".join(
            f"{LABELS[m]} {fmt(v, ',.0f')}" for m, v in sent.items() if v is not None)]
    return lines


def format_table(report: dict) -> str:
    """The report of :func:`hvdtrain_bench.driver.run_bench` as a readable table, a
    section per model."""
    cfg = report["config"]
    modes, models = cfg["modes"], _models(report)
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun --bind-to none"}[cfg["launcher"]]
    ref = cfg.get("reference_cores")
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per rank, {cfg['steps']} timed "
             f"steps after {cfg['warmup']} warm-up, median of {cfg['repeats']}; "
             f"np>1 via {launch}; {cfg['cpu_count']} CPUs"
             + (f"; np=1 runs on {ref} core(s), one rank's share" if ref else "")]
    for model in models:
        if len(models) > 1:
            lines += ["", f"== {model}: {MODELS[model].title} =="]
        lines += [""] + _model_section(_rows_of(report, model), modes)
    if report.get("probes"):
        lines += ["", "all-reduce probes (np={}): ".format(report["probes"][0]["np"]) + ", ".join(
            f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in report["probes"])]
    if cfg.get("options"):
        lines += ["", f"options (hvdtrain modes): {json.dumps(cfg['options'], sort_keys=True)}"]
    lines += ["", "efficiency = samples/s at np ranks / (np x samples/s at 1 rank); "
              "samples/s are summed over ranks;",
              "start s = launch to the end of the first step; RSS = peak resident memory of "
              "the largest rank;",
              "host reads = float()/int()/bool()/.numpy() of eager tensors (host syncs), the "
              "read that ends the timing not counted;",
              "np.array() of a tensor (numpy's buffer path, Keras's logs) is not seen: a lower "
              "bound there.",
              "plain hvd / per-tensor hvd / MWMS = hand-written Horovod (one grouped "
              "all-reduce / hvd.DistributedGradientTape)",
              "and MultiWorkerMirroredStrategy loops with stock settings.",
              "Timings share the machine with whatever else runs on it."]
    return "\n".join(lines)


def _measured_table(report: dict) -> tuple[list[str], list[dict]]:
    """The columns and rows of the measured figures for ``performance.md`` (with a model
    column when there are several)."""
    modes, several = report["config"]["modes"], len(_models(report)) > 1
    ratio_names = _ratio_names(modes)
    columns = (["model"] * several + ["np"] + [f"{LABELS[m]} samples/s (eff.)" for m in modes]
               + [name.replace("_over_", "/") for name in ratio_names]
               + [f"{LABELS[m]} host reads/step" for m in modes]
               + [f"{LABELS[m]} start s / RSS MB" for m in modes])
    table = []
    for row in report["results"]:
        cells = {"model": row.get("model", DEFAULT_MODEL), "np": row["np"]}
        for m in modes:
            cells[f"{LABELS[m]} samples/s (eff.)"] = (
                f"{fmt(row[m]['samples_per_s'], ',.0f')} ({fmt(row['efficiency'][m], '.2f')})")
            cells[f"{LABELS[m]} host reads/step"] = fmt(row[m].get("host_reads_per_step"), ".2f")
            cells[f"{LABELS[m]} start s / RSS MB"] = (
                f"{fmt(row[m]['startup_s'], '.1f')} / {fmt(row[m]['peak_rss_mb'], ',.0f')}")
        for name in ratio_names:
            cells[name.replace("_over_", "/")] = fmt(row.get("ratio_" + name), ".3f")
        table.append(cells)
    return columns, table


def write_report(report: dict, out_dir) -> dict:
    """Writes the measured table, the fitted cost model and its predictions for 2-512
    workers (:mod:`hvdtrain_bench.perf_model`) to ``out_dir``: ``performance.md``,
    ``scaling.svg`` and the whole report as ``bench.json``. The cost model is fitted to
    the Trainer's figures on the first model; the table has every model's.

    Returns:
        The paths written: ``markdown``, ``plot`` and ``json``.

    Raises:
        ValueError: the report lacks one rank, a larger size, or the all-reduce probes.
    """
    from hvdtrain_bench import perf_model, perf_report  # numpy: only here

    cfg, fitted = report["config"], _models(report)[0]
    rows = {r["np"]: r for r in _rows_of(report, fitted)}
    larger = sorted(n for n in rows if n > 1)
    if 1 not in rows or not larger or not report.get("probes") or "trainer" not in cfg["modes"]:
        raise ValueError("--report needs the trainer mode at --np 1 and a larger size, and the "
                         "all-reduce probes (leave --no-probe off)")
    batch = cfg["batch_size"]
    model = perf_model.fit_step(
        batch / rows[1]["trainer"]["samples_per_s"],
        [{"np": n, "step_s": batch * n / rows[n]["trainer"]["samples_per_s"]} for n in larger],
        rows[larger[-1]]["bytes_sent_per_step"]["trainer"], perf_model.fit_link(report["probes"]))
    columns, table = _measured_table(report)
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun"}[cfg["launcher"]]
    paths = perf_report.write_report({
        "title": f"{MODELS[fitted].title}, batch {batch}/rank, {launch}, {cfg['cpu_count']} CPUs",
        "model": model,
        "measured_columns": columns, "measured_rows": table}, out_dir)
    paths["json"] = Path(out_dir) / "bench.json"
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    return paths
