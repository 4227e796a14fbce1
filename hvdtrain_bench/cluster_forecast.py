"""The cost model carried from the emulated links to GPU clusters: the predicted scaling
efficiency of ResNet-50, BERT-large and the wide MLP on 64 to 512 GPUs with 100 to 400
Gbit/s per GPU, with hvdtrain's default gradient buckets.

A prediction, not a measurement. The model is the one the emulated-link bench checks
(:func:`hvdtrain_bench.perf_model.exposed_after_backward`): the gradients are produced
evenly over the backward pass (2/3 of the step), last layers first, and go in the
Trainer's buckets (:func:`hvdtrain.horovod.buckets.plan`), one after another on one flat
ring, each costing ``2 (N-1)/N * S / rate + 2 (N-1) * latency``. It leaves out what a
cluster adds (NVLink inside a node, NCCL's trees and channels, Horovod fusing buckets
that are ready together) and what it costs (stragglers, the exchange's own use of the
GPU's memory bandwidth). Every input is in :data:`WORKLOADS` with where it comes from.

``python -m hvdtrain_bench.cluster_forecast`` prints the table of docs/performance.md.
"""
from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import NamedTuple, Sequence

from hvdtrain_bench import perf_model
from hvdtrain_bench.perf_report import markdown_table
from hvdtrain_bench.settings import param_counts


class Workload(NamedTuple):
    """One model on one GPU: its float32 gradient bytes and its step time; ``passes``
    backward passes run per exchange (``backward_passes_per_step``), the exchange
    overlapping only the last; ``wire_share`` of each bucket's bytes is sent (0.5: fp16
    compression)."""
    title: str
    gradient_bytes: float
    step_s: float
    source: str
    passes: int = 1
    wire_share: float = 1.0


#: The wide MLP's step on one core, one thread, as the emulated-link bench measured it
#: (``--model wide``: 365 ms at batch 128), and the emulated links' time scaling: a GPU
#: computes about 100x faster.
WIDE_MLP_CPU_STEP_S = 0.365
TIME_SCALING = 100.0

WORKLOADS: dict[str, Workload] = {
    "resnet50": Workload(
        "ResNet-50, batch 256 per GPU, mixed precision", 25.6e6 * 4, 0.10,
        "25.6 M parameters, float32 gradients (Keras keeps float32 variables under "
        "mixed precision); about 2,600 images/s on one H100 assumed (the order of "
        "NVIDIA's published TensorFlow figures), so 0.10 s a step"),
    "bert_large": Workload(
        "BERT-large pre-training, sequence 128, batch 64 per GPU, mixed precision",
        340e6 * 4, 0.05,
        "340 M parameters, float32 gradients (1.36 GB a step); about 1,300 sequences/s "
        "on one H100 assumed, so 0.05 s a step"),
    "bert_large_accum": Workload(
        "BERT-large as above, 8 backward passes per exchange, fp16 compression",
        340e6 * 4, 0.05,
        "as bert_large with backward_passes_per_step=8 and compression='fp16' (0.68 GB "
        "per exchange), as large-batch BERT training runs it", passes=8, wire_share=0.5),
    "wide_mlp": Workload(
        "the wide MLP 784-2048x4-10, batch 128 per GPU", 4.0 * sum(param_counts("wide")),
        WIDE_MLP_CPU_STEP_S / TIME_SCALING,
        "54.2 MiB of float32 gradients; its one-core step on the emulated links (365 ms) "
        "/ 100, their time scaling"),
}
WORKERS = (64, 128, 256, 512)
RATES_GBIT = (100.0, 200.0, 400.0)
#: Per message of the ring: an InfiniBand / RoCE hop with NCCL's own overheads (a few
#: microseconds; the loopback fit of the 2-core bench is far higher and not a cluster's).
LATENCY_S = 5e-6


#: The grain of :func:`uniform_buckets`' gradient stream: layers of this many bytes.
LAYER_BYTES = 64 * 1024


def uniform_buckets(total_bytes: float, bucket_mb: float,
                    first_bucket_mb: float | None = None) -> list[float]:
    """Bucket sizes of a gradient stream of ``total_bytes``, cut by :func:`buckets.plan`
    itself, the stream taken as float32 layers of :data:`LAYER_BYTES` (the last one
    smaller)."""
    from hvdtrain.horovod import buckets

    full, rest = divmod(int(total_bytes), LAYER_BYTES)
    layers = [LAYER_BYTES] * full + ([rest] if rest else [])
    shapes = [SimpleNamespace(shape=(n // 4,), dtype="float32") for n in layers]
    first = buckets.FIRST_BUCKET_MB if first_bucket_mb is None else first_bucket_mb
    return [float(sum(layers[i] for i in bucket))
            for bucket in buckets.plan(shapes, bucket_mb, first)]


def forecast(workloads: Sequence[str] = tuple(WORKLOADS), workers: Sequence[int] = WORKERS,
             rates_gbit: Sequence[float] = RATES_GBIT, latency_s: float = LATENCY_S,
             bucket_mb: float = 25.0) -> list[dict]:
    """The predicted efficiency (one GPU's step / the distributed step) of each workload
    at each worker count and rate per GPU.

    Raises:
        ValueError: an unknown workload, fewer than 2 workers or a rate not above 0.
    """
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"workloads must be drawn from {tuple(WORKLOADS)}, got {unknown}")
    if any(n < 2 for n in workers) or any(r <= 0 for r in rates_gbit):
        raise ValueError(f"workers must be >= 2 and rates above 0 Gbit/s, got "
                         f"{list(workers)} and {list(rates_gbit)}")
    rows = []
    for name in workloads:
        w = WORKLOADS[name]
        sizes = [b * w.wire_share for b in uniform_buckets(w.gradient_bytes, bucket_mb)]
        for n in workers:
            for gbit in rates_gbit:
                exposed = perf_model.exposed_with_buckets(
                    sizes, perf_model.BACKWARD_SHARE * w.step_s, n, perf_model.gbit_to_Bps(gbit),
                    latency_s)
                compute = w.step_s * w.passes
                rows.append({"workload": name, "workers": n, "rate_gbit": gbit,
                             "buckets": len(sizes), "step_s": compute + exposed,
                             "exposed_s": exposed,
                             "efficiency": compute / (compute + exposed)})
    return rows


def format_markdown(rows: list[dict]) -> str:
    """The forecast as one markdown table per workload: workers down, rates across."""
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        w, mine = WORKLOADS[name], [r for r in rows if r["workload"] == name]
        rates = list(dict.fromkeys(r["rate_gbit"] for r in mine))
        out += [f"**{w.title}** ({w.gradient_bytes * w.wire_share / 1e6:,.0f} MB sent per "
                f"exchange, "
                f"{w.step_s * 1e3:.3g} ms a step, {mine[0]['buckets']} buckets; {w.source})", ""]
        out += markdown_table(["GPUs"] + [f"{g:g} Gbit/s" for g in rates], [
            [n] + [f"{r['efficiency']:.1%}" for r in mine if r["workers"] == n]
            for n in dict.fromkeys(r["workers"] for r in mine)])
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the forecast's tables (``--latency-us``, ``--bucket-mb`` to vary them)."""
    p = argparse.ArgumentParser(prog="python -m hvdtrain_bench.cluster_forecast",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--latency-us", type=float, default=LATENCY_S * 1e6)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    args = p.parse_args(argv)
    print(format_markdown(forecast(latency_s=args.latency_us * 1e-6,
                                   bucket_mb=args.bucket_mb)), end="")


if __name__ == "__main__":
    main()
