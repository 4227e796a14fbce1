"""The figures of ``hvdtrain bench --hosts N --link RATE``: link rates, the wire's limit,
the cost model's prediction per loop, and the report as figures and as a table.

The wire's limit: a 2-rank ring all-reduce moves the ``S`` gradient bytes of each rank
once each way per step, so the wire needs ``S * 8 / rate`` seconds a step, and no loop
can beat ``global batch / max(compute, wire)`` samples/s. (For ``N`` ranks the ring moves
``2 (N-1)/N * S``; the formula here uses :func:`~hvdtrain_bench.perf_model.comm_time`.)
The prediction is one rank's compute plus the exchange left after the backward pass
(:func:`~hvdtrain_bench.perf_model.exposed_with_buckets`). Imports nothing heavy.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

from hvdtrain_bench import perf_model
from hvdtrain_bench.report import fmt
from hvdtrain_bench.settings import param_counts

UNSHAPED = "none"
#: The Trainer with ``shard_optimizer=True``, a loop of its own: when the options shard
#: the optimizer state, the link bench runs it beside ``trainer``, which then runs
#: unsharded, so that one run compares the two on the same link.
SHARDED_TRAINER = "trainer_sharded"
RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # tc's: SI multiples of bits/s
#: How a rank of each loop exchanges its gradients: hvdtrain's buckets, one grouped
#: all-reduce, one all-reduce per tensor (Horovod may fuse those that are ready together),
#: or, with the optimizer state sharded, a reduce-scatter per bucket and an all-gather of
#: the updated slices.
EXCHANGE = {"trainer": "buckets", "fit": "buckets", "plain": "one", "mwms": "one",
            "pertensor": "per_tensor", SHARDED_TRAINER: "sharded"}


def parse_rate(text: str) -> float | None:
    """Bits per second of a tc rate such as ``500mbit``, ``2gbit``; ``None`` for ``none``.

    Raises:
        ValueError: not a positive number followed by kbit, mbit or gbit, nor ``none``.
    """
    if text == UNSHAPED:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"a link rate must be a positive number followed by kbit, mbit or "
                         f"gbit (e.g. 500mbit, 2gbit, 5gbit), or {UNSHAPED!r} for an unshaped "
                         f"veth; got {text!r}")
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def wire_limit(bytes_per_step: float, rate_bps: float | None, compute_s: float,
               global_batch: int, workers: int = 2) -> dict:
    """The most samples/s the wire and the compute allow together.

    Args:
        bytes_per_step: gradient bytes each rank all-reduces per step (``S``).
        rate_bps: the link's rate in bits/s; ``None``: unshaped (compute-bound).
        compute_s: one rank's step time without any exchange.
        global_batch: samples per step over all ranks.
        workers: ranks in the ring.

    Returns:
        ``wire_s`` (ring all-reduce time at the rate, no latency: ``S * 8 / rate`` at two
        ranks), ``compute_s``, ``bound`` (``"wire"`` or ``"compute"``),
        ``limit_samples_per_s`` = ``global_batch / max(compute_s, wire_s)``, and
        ``sync_limit_samples_per_s``: the same where the wire cannot start before the
        forward pass ends (``1 - perf_model.BACKWARD_SHARE`` of ``compute_s``), as in synchronous SGD
        whose next step needs every averaged gradient.
    """
    wire = 0.0 if rate_bps is None else perf_model.comm_time(
        workers, bytes_per_step, rate_bps / 8, 0.0)
    forward = (1 - perf_model.BACKWARD_SHARE) * compute_s
    return {"wire_s": wire, "compute_s": compute_s,
            "bound": "wire" if wire > compute_s else "compute",
            "limit_samples_per_s": global_batch / max(compute_s, wire),
            "sync_limit_samples_per_s": global_batch / max(compute_s, forward + wire)}


def bucket_bytes(mode: str, model: str, bucket_mb: float) -> list[float]:
    """Bytes of each all-reduce a rank of ``mode`` makes per step, in the order the
    backward pass lets them go (the last layers first)."""
    from hvdtrain.horovod import buckets  # light: no TensorFlow, no Horovod

    sizes = [4.0 * n for n in param_counts(model)]  # float32 gradients, forward order
    if EXCHANGE[mode] == "one":
        return [sum(sizes)]
    if EXCHANGE[mode] == "per_tensor":  # a layer's kernel and bias: ready at once, fused
        return [sizes[i] + sizes[i + 1] for i in range(0, len(sizes), 2)][::-1]
    shapes = [SimpleNamespace(shape=(int(b) // 4,), dtype="float32") for b in sizes]
    return [sum(sizes[i] for i in bucket) for bucket in buckets.plan(shapes, bucket_mb)]


def predict(mode: str, model: str, compute_s: float, rate_bps: float | None,
            probes: list[dict] | None, bucket_mb: float, global_batch: int,
            workers: int = 2) -> dict:
    """The cost model's step for ``mode``: its one-rank compute plus the exchange left
    after the backward pass (:func:`~hvdtrain_bench.perf_model.exposed_after_backward`,
    the backward pass taken as 2/3 of the step). With the optimizer state sharded, each
    bucket's reduce-scatter takes half its all-reduce's time during the backward pass,
    and the all-gathers (the other halves) all come after the update.

    Args:
        compute_s: the loop's step time without exchange, measured with every host's
            rank computing at once.
        probes: Horovod's all-reduce timed between the hosts at this rate; each
            all-reduce then takes :func:`~hvdtrain_bench.perf_model.probed_seconds` of
            its size (``None``: the ring's time at ``rate_bps``, no latency).

    Returns:
        ``buckets`` (their count), ``exposed_s``, ``step_s`` and ``samples_per_s``; the
        last three ``None`` on an unshaped link (no rate to model).
    """
    sizes = bucket_bytes(mode, model, bucket_mb)
    if rate_bps is None:
        return {"buckets": len(sizes), "exposed_s": None, "step_s": None,
                "samples_per_s": None}
    if probes:
        seconds = lambda n: perf_model.probed_seconds(probes, n)  # noqa: E731
    else:
        seconds = lambda n: perf_model.comm_time(workers, n, rate_bps / 8, 0.0)  # noqa: E731
    backward = perf_model.BACKWARD_SHARE * compute_s
    if EXCHANGE[mode] == "sharded":  # a ring moves half an all-reduce's bytes in each half
        half = lambda n: seconds(n) / 2  # noqa: E731
        exposed = perf_model.exposed_after_backward(sizes, backward, half) \
            + sum(half(n) for n in sizes)  # the all-gathers wait for the update
    else:
        exposed = perf_model.exposed_after_backward(sizes, backward, seconds)
    step = compute_s + exposed
    return {"buckets": len(sizes), "exposed_s": exposed, "step_s": step,
            "samples_per_s": global_batch / step}


def sharded_ratio(loops: dict) -> dict | None:
    """The sharded Trainer's samples/s over the unsharded one's (:data:`SHARDED_TRAINER`
    over ``trainer``), of the medians (``value``) and repeat by repeat (``runs``: the two
    ran back to back), with both rows' commands; ``None`` unless both rows are there."""
    if SHARDED_TRAINER not in loops or "trainer" not in loops:
        return None
    sharded, unsharded = loops[SHARDED_TRAINER], loops["trainer"]
    return {"value": sharded["samples_per_s"] / unsharded["samples_per_s"],
            "runs": [s / u for s, u in zip(sharded["runs"], unsharded["runs"])],
            "command": [unsharded["command"], sharded["command"]]}


def figures(report: dict) -> list[dict]:
    """Every figure of the report, one dict each, with the command(s) it came from."""
    out = []
    for model, per_mode in report["compute"].items():
        for mode, c in per_mode.items():
            out.append({"figure": "one_rank_samples_per_s", "model": model, "mode": mode,
                        "value": c["samples_per_s"], "command": c["command"]})
    for s in report["sections"]:
        base = {"link": s["link"], "model": s["model"]}
        compute_cmds = [c["command"] for c in report["compute"][s["model"]].values()]
        for key in ("wire_s", "compute_s", "limit_samples_per_s", "sync_limit_samples_per_s"):
            out.append({"figure": key, **base, "value": s[key], "command": compute_cmds})
        if s["probe"]:
            out.append({"figure": "allreduce_probes", **base, "value": s["probe"]["probes"],
                        "fit": s["probe"]["fit"], "command": s["probe"]["command"]})
        for mode, row in s["loops"].items():
            for key in ("samples_per_s", "ratio_to_limit", "ratio_to_trainer",
                        "measured_over_predicted", "wire_bytes_per_step"):
                out.append({"figure": key, **base, "mode": mode, "value": row[key],
                            "command": row["command"]})
            out.append({"figure": "predicted_samples_per_s", **base, "mode": mode,
                        "value": row["predicted"]["samples_per_s"],
                        "inputs": {"compute_s": report["compute"][s["model"]][mode]
                                   ["together_step_s"], "rate_bps": s["rate_bps"],
                                   "probes": s["probe"]["probes"] if s["probe"] else None,
                                   "buckets": row["predicted"]["buckets"]},
                        "command": [report["compute"][s["model"]][mode]["together_command"],
                                    s["probe"]["command"] if s["probe"] else None]})
        if s.get("sharded_over_unsharded"):
            ratio = s["sharded_over_unsharded"]
            out.append({"figure": "sharded_over_unsharded", **base, "value": ratio["value"],
                        "runs": ratio["runs"], "command": ratio["command"]})
    return out


def format_table(report: dict) -> str:
    """The report of :func:`run_link_bench` as readable text, a block per rate and model."""
    cfg = report["config"]
    launch = {"mpirun": "mpirun over hvdt0", "horovodrun": "horovodrun --gloo"}[cfg["launcher"]]
    lines = [f"{report['benchmark']}: {cfg['hosts']} namespace hosts, one rank and one core's "
             f"threads each, {launch}; batch {cfg['batch_size']} per rank, {cfg['steps']} timed "
             f"steps after {cfg['warmup']}, median of {cfg['repeats']}; tbf burst "
             f"{cfg['burst']} latency {cfg['latency']}; {cfg['cpu_count']} CPUs", ""]
    for model, per_mode in report["compute"].items():
        lines.append(f"one rank, one core, unshaped ({model}): " + ", ".join(
            f"{m} {c['samples_per_s']:,.0f} samples/s ({c['step_s'] * 1e3:.2f} ms)"
            for m, c in per_mode.items()))
        lines.append(f"  with {cfg['hosts']} at once, one per core: " + ", ".join(
            f"{m} {c['together_samples_per_s']:,.0f} ({c['together_step_s'] * 1e3:.2f} ms)"
            for m, c in per_mode.items()))
    for s in report["sections"]:
        wire = "unshaped" if s["rate_bps"] is None else f"wire {s['wire_s'] * 1e3:.1f} ms"
        lines += ["", f"== {s['link']}, {s['model']} ({s['bytes_per_step'] / 1e6:.2f} MB of "
                      f"gradients per rank per step): {wire}, compute {s['compute_s'] * 1e3:.2f} "
                      f"ms -> limit {s['limit_samples_per_s']:,.0f} samples/s "
                      f"({s['bound']}-bound); synchronous bound "
                      f"{s['sync_limit_samples_per_s']:,.0f} "
                      f"({s['sync_limit_samples_per_s'] / s['limit_samples_per_s']:.2f} of it)"]
        if s["probe"]:
            fit = s["probe"]["fit"]
            lines.append("   all-reduce probe: " + ", ".join(
                f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms"
                for p in s["probe"]["probes"])
                + f"; fit {fit['latency_s'] * 1e3:.2f} ms a message, "
                  f"{fit['bandwidth_Bps'] * 8 / 1e9:.2f} Gbit/s")
        lines.append(f"   {'loop':<15} {'samples/s':>10} {'/limit':>7} {'/trainer':>9} "
                     f"{'model':>10} {'meas/model':>10} {'wire MB/step':>12}")
        for mode, row in s["loops"].items():
            wire_mb = row["wire_bytes_per_step"]
            lines.append(
                f"   {mode:<15} {row['samples_per_s']:>10,.0f} {row['ratio_to_limit']:>7.2f} "
                f"{fmt(row['ratio_to_trainer'], '.2f'):>9} "
                f"{fmt(row['predicted']['samples_per_s'], ',.0f'):>10} "
                f"{fmt(row['measured_over_predicted'], '.2f'):>10} "
                f"{fmt(None if wire_mb is None else wire_mb / 1e6, '.2f'):>12}")
        if s.get("sharded_over_unsharded"):
            ratio = s["sharded_over_unsharded"]
            lines.append(f"   {s['link']} {s['model']}: Trainer sharded / unsharded "
                         f"{ratio['value']:.3f} of the samples/s (shard_optimizer=True over "
                         f"False, back to back; per repeat "
                         + " ".join(f"{r:.3f}" for r in ratio["runs"]) + ")")
    sharded = ("; trainer_sharded: each bucket's reduce-scatter takes half its all-reduce's "
               "time, the all-gathers come after the update"
               if any(s.get("sharded_over_unsharded") for s in report["sections"]) else "")
    lines += ["", "model: one-rank compute with every host computing at once + the exchange "
                  "left after the backward pass (perf_model.exposed_after_backward: backward = "
                  f"2/3 of the step, each all-reduce timed off the probes{sharded}); synchronous "
                  "bound: the wire starts after the forward pass (1/3 of the step); wire "
                  "MB/step: what host 1 sent per step, start-up included"]
    return "\n".join(lines)
