"""When the gradient exchange starts, against the end of the backward pass, read from a
Horovod timeline (``Trainer(timeline=...)``).

Horovod's timeline has one track per tensor. A tensor's ``NEGOTIATE_ALLREDUCE`` begins
when this rank hands it to Horovod (the moment its gradient exists) and its
``ALLREDUCE`` begins when the exchange of it starts. So in each step the last
``NEGOTIATE_ALLREDUCE`` to begin marks the end of the backward pass (the first layer's
gradients), and an ``ALLREDUCE`` that begins before it overlaps the backward pass.

``python -m hvdtrain_bench.timeline TIMELINE.json`` prints the per-step figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load_events(path: str | Path) -> list[dict]:
    """The events of a timeline file (Horovod leaves the JSON array open when it stops)."""
    text = Path(path).read_text().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def allreduce_tracks(events: list[dict]) -> dict[int, dict[str, list[int]]]:
    """For each all-reduced tensor's track: the begin times (us) of its negotiations and
    of its exchanges, one per step, in order."""
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    tracks: dict[int, dict[str, list[int]]] = {}
    for e in events:
        if e.get("ph") != "B" or "Allreduce" not in names.get(e["pid"], ""):
            continue
        kind = {"NEGOTIATE_ALLREDUCE": "negotiate", "ALLREDUCE": "exchange"}.get(e["name"])
        if kind:
            tracks.setdefault(e["pid"], {"negotiate": [], "exchange": []})[kind].append(e["ts"])
    return tracks


def phase_durations(events: list[dict]) -> dict[str, float]:
    """The median duration (us) of each phase Horovod records on the all-reduce tracks
    (``NEGOTIATE_ALLREDUCE``: waiting for every rank to hand the tensor over;
    ``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE`` or ``MPI_ALLREDUCE``, ...)."""
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    open_phases: dict[int, list] = {}
    durations: dict[str, list[int]] = {}
    for e in events:
        if "Allreduce" not in names.get(e.get("pid"), ""):
            continue
        if e.get("ph") == "B":
            open_phases.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_phases.get(e["pid"]):
            name, start = open_phases[e["pid"]].pop()
            durations.setdefault(name, []).append(e["ts"] - start)
    return {name: statistics.median(d) for name, d in sorted(durations.items())}


def overlap_per_step(events: list[dict]) -> list[dict]:
    """Per step: when the backward pass ended (the last tensor handed over) and when the
    first exchange began, in us from the step's first hand-over. Only the tracks seen
    in every step (the training step's tensors) count; the first step (tracing) is left
    out."""
    tracks = [t for t in allreduce_tracks(events).values() if t["exchange"]]
    steps = max((len(t["negotiate"]) for t in tracks), default=0)
    tracks = [t for t in tracks if len(t["negotiate"]) == steps and len(t["exchange"]) == steps]
    out = []
    for i in range(1, steps):
        handed = [t["negotiate"][i] for t in tracks]
        started = [t["exchange"][i] for t in tracks]
        first = min(handed)
        out.append({"backward_end_us": max(handed) - first,
                    "first_exchange_us": min(started) - first,
                    "tensors": len(tracks)})
    return out


def summary(events: list[dict]) -> dict:
    """Medians over the steps, and the share of steps whose first exchange began before
    their backward pass ended."""
    steps = overlap_per_step(events)
    if not steps:
        return {"steps": 0}
    before = sum(s["first_exchange_us"] < s["backward_end_us"] for s in steps)
    return {"steps": len(steps), "tensors": steps[0]["tensors"],
            "median_phase_us": phase_durations(events),
            "median_backward_end_us": statistics.median(s["backward_end_us"] for s in steps),
            "median_first_exchange_us": statistics.median(s["first_exchange_us"] for s in steps),
            "share_overlapping": before / len(steps)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", nargs="+", help="Horovod timeline JSON files")
    for path in parser.parse_args(argv).timeline:
        print(path, json.dumps(summary(load_events(path))))


if __name__ == "__main__":
    main()
