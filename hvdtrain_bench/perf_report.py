"""The cost model of :mod:`hvdtrain_bench.perf_model` against Horovod's published
ResNet-101 result (:func:`resnet101_example`, :data:`HOROVOD_REFERENCE`), and as a report:
:func:`write_report` writes ``performance.md`` (measured figures, fitted model, predicted
efficiency) and ``scaling.svg``.

Only numpy and the standard library are used: the plot is an SVG written by hand
(:func:`_svg`), so no plotting library is needed. TensorFlow and Horovod are never
imported.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence
from xml.sax.saxutils import escape

import numpy as np

from hvdtrain_bench.perf_model import (DEFAULT_BANDWIDTHS_GBIT, DEFAULT_LATENCY_S,
                                       DEFAULT_WORKERS, check_model, gbit_to_Bps, predict,
                                       required_field)

#: Horovod's published scaling result, the reference point of :func:`resnet101_example`.
HOROVOD_REFERENCE: dict[str, Any] = {
    "model": "ResNet-101",
    "workers": 512,
    "efficiency": 0.90,
    "network": "25 Gbit/s RoCE-capable Ethernet (TCP and RDMA runs)",
    "source": ("A. Sergeev and M. Del Balso, 'Horovod: fast and easy distributed deep "
               "learning in TensorFlow', arXiv:1802.05799 (2018), and the Horovod README / "
               "benchmarks page: about 90% scaling efficiency for Inception V3 and "
               "ResNet-101 on 512 GPUs (128 servers x 4 Pascal GPUs, 25 Gbit/s network)"),
}

#: ResNet-101 has about 44.5 million parameters; fp32 gradients are 4 bytes each.
RESNET101_PARAMS = 44.5e6
RESNET101_GRADIENT_BYTES = RESNET101_PARAMS * 4  # 178 MB

#: Assumed single-P100 fp32 step time of ResNet-101 at batch 64 (synthetic ImageNet data).
#: TensorFlow's published P100 benchmark gives ResNet-50 about 219 images/s (0.29 s per
#: batch of 64); ResNet-101 needs about 1.9x its FLOPs (7.8 vs 4.1 GFLOPs per image), so
#: about 115 images/s, or 0.55 s per step. The 16-GPU example run on Horovod's benchmark
#: page (1657 images/s, i.e. about 104 images/s per GPU) is consistent with it.
RESNET101_P100_STEP_S = 0.55

#: Assumed exposed fraction of Horovod's all-reduce: Horovod starts reducing the gradients
#: of the last layers while backprop still computes the earlier ones, hiding most of it.
RESNET101_EXPOSED = 0.3


# --------------------------------------------------------------------------- reference
def resnet101_example(t_compute_s: float = RESNET101_P100_STEP_S,
                      exposed: float = RESNET101_EXPOSED, bandwidth_gbit: float = 25.0,
                      workers: int = 512, t_overhead_s: float = 0.0,
                      latency_s: float = DEFAULT_LATENCY_S) -> dict[str, Any]:
    """What the formula predicts for Horovod's ResNet-101 benchmark.

    Assumptions (all adjustable): 44.5 M parameters with fp32 gradients, so 178 MB
    all-reduced per step; a P100 fp32 step at batch 64 of ``t_compute_s`` = 0.55 s
    (see :data:`RESNET101_P100_STEP_S` for where that comes from; 0.25 s would be a
    faster, ResNet-50-class GPU step); ``exposed`` = 0.3 because Horovod reduces the
    gradients of finished layers while backprop continues; no extra framework overhead;
    one flat ring over all 512 GPUs at 25 Gbit/s with :data:`DEFAULT_LATENCY_S` per
    message. The real run used NCCL inside each 4-GPU server and tensor fusion, which
    this one-ring model does not represent.

    Args:
        t_compute_s: Single-GPU step time in seconds.
        exposed: Fraction of the all-reduce not hidden behind backprop, in [0, 1].
        bandwidth_gbit: Network bandwidth in Gbit/s.
        workers: Number of GPUs.
        t_overhead_s: Per-step framework overhead in seconds.
        latency_s: Message latency in seconds.

    Returns:
        ``model`` (the model dict used), ``workers``, ``bandwidth_gbit``,
        ``predicted_efficiency``, ``published_efficiency`` (from
        :data:`HOROVOD_REFERENCE`) and ``reference`` (that dict).
    """
    model = {"t_compute_s": t_compute_s, "t_overhead_s": t_overhead_s,
             "bytes_per_step": RESNET101_GRADIENT_BYTES, "latency_s": latency_s,
             "bandwidth_Bps": gbit_to_Bps(bandwidth_gbit), "exposed": exposed}
    (row,) = predict(model, [workers], [bandwidth_gbit], latency_s=latency_s)
    return {"model": model, "workers": workers, "bandwidth_gbit": bandwidth_gbit,
            "predicted_efficiency": row["efficiency"],
            "published_efficiency": HOROVOD_REFERENCE["efficiency"],
            "reference": dict(HOROVOD_REFERENCE)}


def resnet101_comparison_line(example: Mapping[str, Any] | None = None) -> str:
    """One sentence setting :func:`resnet101_example`'s prediction against the paper's."""
    ex = resnet101_example() if example is None else example
    m = ex["model"]
    return (f"ResNet-101 on {ex['workers']} GPUs at {ex['bandwidth_gbit']:g} Gbit/s: this "
            f"model predicts {ex['predicted_efficiency']:.1%} efficiency "
            f"(178 MB fp32 gradients, {m['t_compute_s']:g} s GPU step, exposed "
            f"{m['exposed']:g}, {m['latency_s'] * 1e6:g} us latency); Horovod published "
            f"about {ex['published_efficiency']:.0%} on {ex['reference']['workers']} GPUs "
            f"(Sergeev & Del Balso 2018; Horovod README).")


# --------------------------------------------------------------------------- report
def _cell(value: Any) -> str:
    """Formats one markdown table cell."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table as lines (numbers by :func:`_cell`, text as it is)."""
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _measured_section(report: Mapping[str, Any]) -> list[str]:
    """The measured-figures table; cells missing from a row are left empty."""
    columns = list(required_field(report, "measured_columns", "report"))
    rows = required_field(report, "measured_rows", "report")
    if not columns:
        raise ValueError(f"report['measured_columns'] must be non-empty, got {columns!r}")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"report['measured_rows'][{i}] must be a dict, got {row!r}")
    body = [[row.get(c, "") for c in columns] for row in rows]
    return ["## Measured", ""] + markdown_table(columns, body) + [""]


def _model_section(model: Mapping[str, Any]) -> list[str]:
    """The fitted parameters and residuals."""
    lines = ["## Fitted model", "",
             "`step_time(N) = t_compute + t_overhead + exposed * "
             "(2 (N-1)/N * S / bandwidth + 2 (N-1) * latency)`, "
             "`efficiency(N) = t_compute / step_time(N)`", ""]
    lines += markdown_table(["parameter", "value"], [
        ["t_compute (s)", model["t_compute_s"]], ["t_overhead (s)", model["t_overhead_s"]],
        ["gradient bytes per step S", model["bytes_per_step"]],
        ["latency (s per message)", model["latency_s"]],
        ["bandwidth (bytes/s)", model["bandwidth_Bps"]], ["exposed", model["exposed"]]])
    residuals = model.get("residuals") or []
    if residuals:
        lines += ["", "Residuals of the fit (measured minus modelled step time):", ""]
        lines += markdown_table(["np", "measured step (s)", "modelled step (s)", "residual (s)"],
                        [[r["np"], r["step_s"], r["predicted_s"], r["residual_s"]]
                         for r in residuals])
    return lines + [""]


def _prediction_section(rows: Sequence[Mapping[str, Any]],
                        bands: Sequence[float], latency_s: float) -> list[str]:
    """Predicted efficiency: one row per worker count, one column per bandwidth."""
    by_key = {(r["np"], r["bandwidth_gbit"]): r["efficiency"] for r in rows}
    counts = sorted({r["np"] for r in rows})
    body = [[n] + [f"{by_key[(n, float(g))]:.1%}" for g in bands] for n in counts]
    head = ["workers"] + [f"{g:g} Gbit/s" for g in bands]
    return (["## Predicted efficiency", "",
             f"Measured compute, overhead and gradient size; the network's bandwidth and "
             f"{latency_s * 1e6:g} us latency per message.", ""]
            + markdown_table(head, body) + [""])


def _markdown(report: Mapping[str, Any], model: Mapping[str, Any],
              predicted: Sequence[Mapping[str, Any]], latency_s: float) -> str:
    """The whole performance.md text."""
    lines = [f"# {report['title']}", ""]
    lines += _measured_section(report)
    lines += _model_section(model)
    lines += _prediction_section(predicted, DEFAULT_BANDWIDTHS_GBIT, latency_s)
    lines += ["## Reference", "", resnet101_comparison_line(), "",
              "![Predicted scaling efficiency](scaling.svg)", ""]
    return "\n".join(lines)


def _measured_points(model: Mapping[str, Any]) -> list[tuple[int, float]]:
    """(N, measured efficiency) from the fit's residuals."""
    return [(r["np"], model["t_compute_s"] / r["step_s"]) for r in model.get("residuals", [])]


#: Colours of the predicted lines, one per bandwidth (the tab10 palette).
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _star(x: float, y: float, r: float) -> str:
    """The ``points`` of a five-pointed star of outer radius ``r`` centred on (x, y)."""
    corners = []
    for i in range(10):
        radius, angle = (r if i % 2 == 0 else 0.4 * r), math.pi / 2 + i * math.pi / 5
        corners.append(f"{x + radius * math.cos(angle):.1f},{y - radius * math.sin(angle):.1f}")
    return " ".join(corners)


def _svg(model: Mapping[str, Any], predicted: Sequence[Mapping[str, Any]],
         title: str) -> str:
    """The text of scaling.svg: predicted efficiency against workers (log2 axis).

    One line with dots per bandwidth of :data:`DEFAULT_BANDWIDTHS_GBIT`, black dots for
    the measured efficiencies, a red star for :data:`HOROVOD_REFERENCE`, and a legend.
    Each series is a ``<g class="series">`` whose ``<title>`` is its legend label; points
    outside the plotted range (efficiency 0 to 1.05) are clipped.

    Args:
        model: The fitted model; its ``residuals`` give the measured points.
        predicted: Rows of :func:`predict` (``np``, ``bandwidth_gbit``, ``efficiency``).
        title: The plot's title.

    Returns:
        A standalone SVG document.
    """
    width, height = 825, 528
    left, right, top, bottom = 80, 805, 40, 470  # the plot area
    lo, hi = math.log2(min(DEFAULT_WORKERS)), math.log2(max(DEFAULT_WORKERS))
    pad = 0.05 * (hi - lo)

    def sx(n: float) -> float:
        return left + (math.log2(n) - lo + pad) / (hi - lo + 2 * pad) * (right - left)

    def sy(efficiency: float) -> float:
        return bottom - efficiency / 1.05 * (bottom - top)

    ref = HOROVOD_REFERENCE
    series = [(f"predicted, {g:g} Gbit/s", color, "line",
               [(r["np"], r["efficiency"]) for r in predicted if r["bandwidth_gbit"] == g])
              for g, color in zip(DEFAULT_BANDWIDTHS_GBIT, _COLORS)]
    points = _measured_points(model)
    if points:
        series.append(("measured (this machine)", "black", "dot", points))
    series.append((f"Horovod paper: {ref['model']}, {ref['efficiency']:.0%} @ {ref['workers']}",
                   "red", "star", [(ref["workers"], ref["efficiency"])]))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<clipPath id="plot-area"><rect x="{left}" y="{top}" width="{right - left}" '
           f'height="{bottom - top}"/></clipPath>',
           f'<text x="{(left + right) / 2}" y="25" text-anchor="middle" font-size="15">'
           f'{escape(title)}</text>',
           '<g class="axes" stroke="#e0e0e0">']
    for n in DEFAULT_WORKERS:
        out.append(f'<line x1="{sx(n):.1f}" y1="{top}" x2="{sx(n):.1f}" y2="{bottom}"/>')
        out.append(f'<text x="{sx(n):.1f}" y="{bottom + 18}" text-anchor="middle" '
                   f'stroke="none">{n}</text>')
    for tick in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        out.append(f'<line x1="{left}" y1="{sy(tick):.1f}" x2="{right}" y2="{sy(tick):.1f}"/>')
        out.append(f'<text x="{left - 8}" y="{sy(tick) + 4:.1f}" text-anchor="end" '
                   f'stroke="none">{tick:.1f}</text>')
    out += [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
            f'fill="none" stroke="black"/>', "</g>",
            f'<text x="{(left + right) / 2}" y="{bottom + 42}" text-anchor="middle">'
            "workers (log2 scale)</text>",
            f'<text transform="translate(22,{(top + bottom) / 2}) rotate(-90)" '
            'text-anchor="middle">scaling efficiency  t_compute / step_time</text>']
    for label, color, kind, pts in series:
        xy = [(sx(n), sy(e)) for n, e in pts]
        out.append(f'<g class="series" fill="{color}" stroke="{color}" '
                   f'clip-path="url(#plot-area)"><title>{escape(label)}</title>')
        if kind == "line":
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            out.append(f'<polyline points="{line}" fill="none" stroke-width="1.5"/>')
        for x, y in xy:
            out.append(f'<polygon points="{_star(x, y, 10)}"/>' if kind == "star" else
                       f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3 if kind == "line" else 5}"/>')
        out.append("</g>")

    row = 19
    box_w, box_h = 40 + 6.8 * max(len(label) for label, *_ in series), row * len(series) + 8
    box_x, box_y = left + 8, bottom - 8 - box_h
    out.append(f'<g class="legend"><rect x="{box_x}" y="{box_y}" width="{box_w:.0f}" '
               f'height="{box_h}" fill="white" stroke="#cccccc" rx="3"/>')
    for i, (label, color, kind, _) in enumerate(series):
        x, y = box_x + 18, box_y + 4 + row * i + row / 2
        if kind == "line":
            out.append(f'<line x1="{x - 11}" y1="{y}" x2="{x + 11}" y2="{y}" '
                       f'stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<polygon points="{_star(x, y, 8)}" fill="{color}"/>' if kind == "star" else
                   f'<circle cx="{x}" cy="{y}" r="{3 if kind == "line" else 5}" fill="{color}"/>')
        out.append(f'<text x="{x + 20}" y="{y + 4}" font-size="11">{escape(label)}</text>')
    out += ["</g>", "</svg>", ""]
    return "\n".join(out)


def write_report(report: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Writes ``performance.md`` and ``scaling.svg`` into ``out_dir``.

    Args:
        report: ``title`` (str), ``model`` (the dict from :func:`fit_step`),
            ``measured_columns`` (column names, in order) and ``measured_rows`` (dicts
            keyed by those names; values may be strings or numbers). Optional:
            ``latency_s`` for the predicted table (default :data:`DEFAULT_LATENCY_S`).
        out_dir: Directory to write to; created if missing.

    Returns:
        ``{"markdown": path of performance.md, "plot": path of scaling.svg}``.

    Raises:
        ValueError: A required key is missing or the model is malformed.
    """
    title = str(required_field(report, "title", "report"))
    model = required_field(report, "model", "report")
    check_model(model)
    latency = report.get("latency_s")
    predicted = predict(model, latency_s=latency)
    latency = DEFAULT_LATENCY_S if latency is None else float(latency)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "performance.md", "plot": out / "scaling.svg"}
    paths["markdown"].write_text(_markdown(report, model, predicted, latency),
                                 encoding="utf-8")
    paths["plot"].write_text(_svg(model, predicted, title), encoding="utf-8")
    return paths
