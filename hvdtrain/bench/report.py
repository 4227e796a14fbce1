"""The ``hvdtrain bench`` report as a table (:func:`format_table`), and as files with the
fitted cost model (:func:`write_report`: ``performance.md``, ``scaling.png``,
``bench.json``)."""
from __future__ import annotations

import json
from pathlib import Path

from hvdtrain.bench.settings import MODEL, RATIOS

#: How each mode is named in the tables.
LABELS = {"trainer": "trainer", "plain": "plain hvd", "mwms": "MWMS", "fit": "fit",
          "trainer_files": "trainer files"}


def fmt(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` for ``None``."""
    return "-" if value is None else format(value, spec)


def _ratio_names(modes) -> list[str]:
    return [name for name, top, bottom in RATIOS if top in modes and bottom in modes]


def format_table(report: dict) -> str:
    """The report of :func:`hvdtrain.bench.driver.run_bench` as a readable table."""
    cfg = report["config"]
    modes = cfg["modes"]
    launch = {"horovodrun": "horovodrun --gloo", "mpirun": "mpirun --bind-to none"}[cfg["launcher"]]
    ref = cfg.get("reference_cores")
    lines = [f"{report['benchmark']}: batch {cfg['batch_size']} per rank, {cfg['steps']} timed "
             f"steps after {cfg['warmup']} warm-up, median of {cfg['repeats']}; "
             f"np>1 via {launch}; {cfg['cpu_count']} CPUs"
             + (f"; np=1 runs on {ref} core(s), one rank's share" if ref else ""), "",
             "samples/s (scaling efficiency)"]
    width = 19
    lines.append(f"{'np':>3} | " + " | ".join(f"{LABELS[m]:>{width}}" for m in modes))
    lines.append("-" * (6 + (width + 3) * len(modes)))
    for row in report["results"]:
        cells = []
        for m in modes:
            value, eff = row[m]["samples_per_s"], row["efficiency"][m]
            cells.append(f"{fmt(value, ',.0f')} ({fmt(eff, '.2f')})".rjust(width))
        lines.append(f"{row['np']:>3} | " + " | ".join(cells))
    ratio_names = _ratio_names(modes)
    if ratio_names:
        lines += ["", "ratios: " + "; ".join(
            f"np={row['np']} " + ", ".join(
                f"{name.replace('_over_', '/')} {fmt(row.get('ratio_' + name), '.3f')}"
                for name in ratio_names) for row in report["results"])]
    lines += ["", f"{'np':>3} | " + " | ".join(f"{LABELS[m] + ' start s / RSS MB':>28}"
                                                for m in modes)]
    for row in report["results"]:
        lines.append(f"{row['np']:>3} | " + " | ".join(
            f"{fmt(row[m]['startup_s'], '.1f')} / {fmt(row[m]['peak_rss_mb'], ',.0f')}".rjust(28)
            for m in modes))
    if report.get("probes"):
        lines += ["", "all-reduce probes (np={}): ".format(report["probes"][0]["np"]) + ", ".join(
            f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in report["probes"])]
    sent = report["results"][-1].get("bytes_sent_per_step", {})
    if cfg.get("options"):
        lines += ["", f"options (hvdtrain modes): {json.dumps(cfg['options'], sort_keys=True)}"]
    if sent:
        lines += ["bytes sent per step per rank: " + ", ".join(
            f"{LABELS[m]} {fmt(v, ',.0f')}" for m, v in sent.items() if v is not None)]
    lines += ["", "efficiency = samples/s at np ranks / (np x samples/s at 1 rank); "
              "samples/s are summed over ranks;",
              "start s = launch to the end of the first step; RSS = peak resident memory of "
              "the largest rank.",
              "plain hvd / MWMS = hand-written Horovod / MultiWorkerMirroredStrategy loops "
              "with stock settings.",
              "Timings share the machine with whatever else runs on it."]
    return "\n".join(lines)


def _measured_table(report: dict) -> tuple[list[str], list[dict]]:
    """The columns and rows of the measured figures for ``performance.md``."""
    modes = report["config"]["modes"]
    ratio_names = _ratio_names(modes)
    columns = (["np"] + [f"{LABELS[m]} samples/s (eff.)" for m in modes]
               + [name.replace("_over_", "/") for name in ratio_names]
               + [f"{LABELS[m]} start s / RSS MB" for m in modes])
    table = []
    for row in report["results"]:
        cells = {"np": row["np"]}
        for m in modes:
            cells[f"{LABELS[m]} samples/s (eff.)"] = (
                f"{fmt(row[m]['samples_per_s'], ',.0f')} ({fmt(row['efficiency'][m], '.2f')})")
            cells[f"{LABELS[m]} start s / RSS MB"] = (
                f"{fmt(row[m]['startup_s'], '.1f')} / {fmt(row[m]['peak_rss_mb'], ',.0f')}")
        for name in ratio_names:
            cells[name.replace("_over_", "/")] = fmt(row.get("ratio_" + name), ".3f")
        table.append(cells)
    return columns, table


def write_report(report: dict, out_dir) -> dict:
    """Writes the measured table, the fitted cost model and its predictions for 2-512
    workers (:mod:`hvdtrain.bench.perf_model`) to ``out_dir``: ``performance.md``,
    ``scaling.png`` and the whole report as ``bench.json``.

    Returns:
        The paths written: ``markdown``, ``plot`` and ``json``.

    Raises:
        ValueError: the report lacks one rank, a larger size, or the all-reduce probes.
    """
    from hvdtrain.bench import perf_model, perf_report  # numpy and matplotlib: only here

    cfg, rows = report["config"], {r["np"]: r for r in report["results"]}
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
        "title": f"{MODEL}, batch {batch}/rank, {launch}, {cfg['cpu_count']} CPUs",
        "model": model,
        "measured_columns": columns, "measured_rows": table}, out_dir)
    paths["json"] = Path(out_dir) / "bench.json"
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    return paths
