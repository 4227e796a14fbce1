"""What the collective watchdog judges (no threads, no sockets): its limits, read from the
environment, and the verdict on a stuck collective from the ranks' latest reports."""
from __future__ import annotations

import os

ENV_TIMEOUT = "HVDTRAIN_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
ENV_LIVENESS = "HVDTRAIN_LIVENESS_TIMEOUT"
#: Reports come from a thread at most 5 s apart whatever the main thread does (a step, an
#: XLA compile, a checkpoint save, an evaluation): 60 s, where Horovod's own stall check
#: warns, is a dozen missed reports.
DEFAULT_LIVENESS_S = 60.0


def _seconds_from_env(name: str, default: float, what: str) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0 (0 turns {what} off), "
                         f"got {text!r}")
    return value


def timeout_from_env() -> float:
    """The limit in seconds from ``HVDTRAIN_COLLECTIVE_TIMEOUT`` (0: off).

    Raises:
        ValueError: the variable is not a number >= 0.
    """
    return _seconds_from_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S, "the collective watchdog")


def liveness_from_env() -> float:
    """Seconds a rank may go unheard from ``HVDTRAIN_LIVENESS_TIMEOUT`` (0: off).

    Raises:
        ValueError: the variable is not a number >= 0.
    """
    return _seconds_from_env(ENV_LIVENESS, DEFAULT_LIVENESS_S, "the liveness check")


def describe_silent(rank: int, size: int, report: dict | None, seconds: float) -> str:
    """``rank``, unheard from for ``seconds``, described from its last ``report``."""
    if report is None:
        return (f"rank {rank} of {size} has not reported since the watchdog started "
                f"{seconds:.0f} s ago")
    doing = (f"in {report['label']!r}" if report["kind"] == "collective"
             else report["kind"] or "outside any collective")
    return (f"rank {rank} of {size} (host {report['host']}, pid {report['pid']}) has not "
            f"reported for {seconds:.0f} s (last heard at step {report['step']}, {doing})")


def silence_warning(where: str, silent: str, liveness: float) -> str:
    """The line a rank prints once when ``silent`` (a rank described) has gone quiet for a
    few report intervals: whatever ends the job later (the liveness limit, a transport
    timeout, the launcher losing the host), the log has named the rank by then."""
    return (f"hvdtrain: {where}: {silent}; it may be frozen (stopped, stuck in a driver "
            f"call, swapping) or cut off; the job ends if it stays silent for {liveness:g} s "
            f"({ENV_LIVENESS})\n")


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def verdict(reports: dict, size: int, limit: float) -> tuple | None:
    """What ends the job, or ``None`` while nothing is stuck.

    Args:
        reports: rank -> its latest report (``kind``, ``label``, ``for_s``, ``step``).
        size: ranks in the job.
        limit: seconds a collective may wait for a rank.

    Returns:
        ``(key, message)``: ``key`` names the situation without times, so a caller can
        require it to hold in every rank's next report (a report may be stale).
    """
    waiting_long = [r for r in reports.values() if r["kind"] == "collective"
                    and r["for_s"] > limit]
    if not waiting_long:
        return None
    first = min(waiting_long, key=lambda r: r["rank"])  # the same one in every round
    arrived = sorted(r["rank"] for r in reports.values() if r["kind"] == "joined" or (
        r["kind"] == "collective" and r["label"] == first["label"]))
    missing = [rank for rank in range(size) if rank not in arrived]
    if not missing or any(reports.get(rank, {}).get("kind") == "busy" for rank in missing):
        return None  # everyone is there (a slow step), or a rank is saving: wait on
    where, key = [], [first["label"], tuple(arrived)]
    for rank in missing:
        r = reports.get(rank)
        key.append((rank, None if r is None else (r["kind"], r["label"])))
        if r is None:
            where.append(f"rank {rank} never reported")
        elif r["kind"] == "exited":
            where.append(f"rank {rank} has exited (last step {r['step']})")
        elif r["kind"] == "collective":
            where.append(f"rank {rank} waits in {r['label']!r} for {r['for_s']:.0f} s")
        else:
            since = (f"last step {r['step']}, {r['for_s']:.0f} s ago" if r["step"]
                     else f"for {r['for_s']:.0f} s")
            where.append(f"rank {rank} is in no collective ({since}: it stopped training or "
                         "runs other code)")
    return tuple(key), (
        f"collective {first['label']!r} waited {first['for_s']:.0f} s on {_ranks(arrived)} "
        f"(limit {limit:g} s, {ENV_TIMEOUT}); {_ranks(missing)} did not arrive: "
        f"{'; '.join(where)}. Every rank must run the same collectives in the same order: "
        "look for a rank-dependent branch or argument")
