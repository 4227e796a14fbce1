"""An analytic model of one synchronous data-parallel training step, for extrapolation.

Each of ``N`` workers computes its gradients, then all of them average the gradients with
a ring all-reduce before the next step. The model of one step is::

    step_time(N) = t_compute + t_overhead + exposed * comm(N)
    comm(N)      = 2 (N - 1) / N * S / bandwidth + 2 (N - 1) * latency
    efficiency(N) = t_compute / step_time(N)

``S`` is the number of gradient bytes each worker all-reduces per step, ``t_compute`` the
single-worker step time, ``t_overhead`` a fixed per-step cost of the framework that only
exists when ``N > 1`` (negotiation, fusion-buffer copies, the extra ``tf.function`` work),
and ``exposed`` the fraction of the communication that is not hidden behind computation
(1.0 = no overlap at all). A ring all-reduce sends ``2 (N - 1)`` messages per worker
(``N - 1`` in the reduce-scatter, ``N - 1`` in the all-gather), each carrying ``S / N``
bytes, which gives the two terms of ``comm(N)``. ``efficiency`` is weak-scaling
efficiency: the per-worker batch is fixed, so ideal scaling keeps the step time constant.

The workflow is: :func:`fit_link` on all-reduce probes (message size against time),
:func:`fit_step` on measured step times to get the overhead, and :func:`predict` to
extrapolate to other worker counts and networks; :mod:`hvdtrain_bench.perf_report` sets
the formula against Horovod's published result and writes the report page and plot.

Only numpy is used; TensorFlow and Horovod are never imported.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, Callable, Mapping, Sequence

import numpy as np

#: Default one-way latency of one message on the network we extrapolate to, in seconds
#: per hop. 25 microseconds is a typical figure for kernel TCP between two servers on
#: datacenter Ethernet (a switch hop plus the host stacks; RDMA/RoCE is a few us lower).
DEFAULT_LATENCY_S = 25e-6

#: Worker counts of the predicted-efficiency table: 2, 4, 8, ..., 512.
DEFAULT_WORKERS = tuple(2 ** k for k in range(1, 10))

#: Network bandwidths of the predicted-efficiency table, in Gbit/s.
DEFAULT_BANDWIDTHS_GBIT = (10.0, 25.0, 100.0)
#: Floor on a fitted latency and ceiling on a fitted bandwidth: :func:`fit_link` clamps
#: its least-squares solution to these so both stay positive and finite.
MIN_LATENCY_S = 1e-9
MAX_BANDWIDTH_BPS = 1e15

#: The share of a step the backward pass takes, the overlap window (gradients made evenly).
BACKWARD_SHARE = 2 / 3
#: The fields of a model dict (:func:`fit_step`).
_MODEL_KEYS = ("t_compute_s", "t_overhead_s", "bytes_per_step", "latency_s",
               "bandwidth_Bps", "exposed")


# --------------------------------------------------------------------------- formula
def comm_time(workers: int, nbytes: float, bandwidth_Bps: float, latency_s: float) -> float:
    """Time of one ring all-reduce of ``nbytes`` per worker over ``workers`` workers.

    Args:
        workers: Number of workers ``N`` (1 means no communication).
        nbytes: Bytes each worker contributes (``S``).
        bandwidth_Bps: Link bandwidth in bytes per second.
        latency_s: Latency of one message in seconds.

    Returns:
        ``2 (N-1)/N * S / bandwidth + 2 (N-1) * latency`` in seconds.
    """
    n = workers
    return 2.0 * (n - 1) / n * nbytes / bandwidth_Bps + 2.0 * (n - 1) * latency_s


def step_time(model: Mapping[str, float], workers: int, *,
              bandwidth_Bps: float | None = None, latency_s: float | None = None) -> float:
    """Modelled step time at ``workers`` workers.

    Args:
        model: A model dict as returned by :func:`fit_step`.
        workers: Number of workers ``N``.
        bandwidth_Bps: Network bandwidth; the model's own (fitted) one when None.
        latency_s: Message latency; the model's own (fitted) one when None.

    Returns:
        ``t_compute + t_overhead + exposed * comm(N)``; just ``t_compute`` when ``N == 1``.
    """
    if workers == 1:
        return float(model["t_compute_s"])
    bw = model["bandwidth_Bps"] if bandwidth_Bps is None else bandwidth_Bps
    lat = model["latency_s"] if latency_s is None else latency_s
    comm = comm_time(workers, model["bytes_per_step"], bw, lat)
    return model["t_compute_s"] + model["t_overhead_s"] + model["exposed"] * comm


def efficiency(model: Mapping[str, float], workers: int, **network: float | None) -> float:
    """Weak-scaling efficiency ``t_compute / step_time(N)``.

    Args:
        model: A model dict as returned by :func:`fit_step`.
        workers: Number of workers ``N``.
        **network: ``bandwidth_Bps`` and/or ``latency_s`` overrides for :func:`step_time`.

    Returns:
        The efficiency, in (0, 1].
    """
    return model["t_compute_s"] / step_time(model, workers, **network)


def gbit_to_Bps(gbit_per_s: float) -> float:
    """Converts Gbit/s (10^9 bits per second) to bytes per second."""
    return gbit_per_s * 1e9 / 8.0


# --------------------------------------------------------------------------- validation
def _number(value: Any, name: str, *, positive: bool = False,
            nonnegative: bool = False) -> float:
    """Returns ``value`` as a float, or raises ValueError naming it and the bad value."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def _workers(value: Any, name: str, *, minimum: int) -> int:
    """Returns ``value`` as an int worker count >= ``minimum``, or raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def required_field(record: Any, key: str, where: str) -> Any:
    """``record[key]``, or a ValueError saying which record lacks which key."""
    if not isinstance(record, Mapping) or key not in record:
        raise ValueError(f"{where} must be a dict with key {key!r}, got {record!r}")
    return record[key]


def check_model(model: Any) -> dict[str, float]:
    """Validates a model dict and returns its numeric fields as floats."""
    out = {key: required_field(model, key, "model") for key in _MODEL_KEYS}
    _number(out["t_compute_s"], "model['t_compute_s']", positive=True)
    _number(out["t_overhead_s"], "model['t_overhead_s']", nonnegative=True)
    _number(out["bytes_per_step"], "model['bytes_per_step']", nonnegative=True)
    _number(out["latency_s"], "model['latency_s']", nonnegative=True)
    _number(out["bandwidth_Bps"], "model['bandwidth_Bps']", positive=True)
    exposed = _number(out["exposed"], "model['exposed']", nonnegative=True)
    if exposed > 1:
        raise ValueError(f"model['exposed'] must be in [0, 1], got {exposed!r}")
    return {key: float(value) for key, value in out.items()}


# --------------------------------------------------------------------------- fit_link
def _probe_arrays(probes: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, ...]:
    """Validates the probes; returns arrays of N, bytes and seconds."""
    if not isinstance(probes, Sequence) or isinstance(probes, (str, bytes)):
        raise ValueError(f"probes must be a list of dicts, got {probes!r}")
    rows = []
    for i, probe in enumerate(probes):
        where = f"probes[{i}]"
        n = _workers(required_field(probe, "np", where), f"{where}['np']", minimum=2)
        size = _number(required_field(probe, "bytes", where), f"{where}['bytes']", positive=True)
        secs = _number(required_field(probe, "seconds", where), f"{where}['seconds']",
                       positive=True)
        rows.append((n, size, secs))
    sizes = sorted({size for _, size, _ in rows})
    if len(sizes) < 2:
        raise ValueError("fit_link needs probes at >= 2 distinct message sizes to separate "
                         f"latency from bandwidth, got sizes {sizes}")
    n, size, secs = (np.array(col, dtype=float) for col in zip(*rows))
    return n, size, secs


def _two_term_lstsq(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of ``t ~ x*a + y*b`` with ``x, y >= 0`` (two-variable NNLS)."""
    scale = np.array([np.abs(a).max(), np.abs(b).max()])
    design = np.column_stack([a, b]) / scale
    (x, y), *_ = np.linalg.lstsq(design, t, rcond=None)
    x, y = x / scale[0], y / scale[1]
    if x >= 0 and y >= 0:
        return float(x), float(y)
    # One coefficient is negative: the constrained optimum has it at 0, refit the other.
    x_only = max(float(a @ t / (a @ a)), 0.0)
    y_only = max(float(b @ t / (b @ b)), 0.0)
    err_x = float(np.sum((t - x_only * a) ** 2))
    err_y = float(np.sum((t - y_only * b) ** 2))
    return (x_only, 0.0) if err_x <= err_y else (0.0, y_only)


def fit_link(probes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Fits message latency and link bandwidth to all-reduce timings.

    Each probe is one all-reduce of ``bytes`` per worker among ``np`` workers that took
    ``seconds``. The fit is least squares of ``t = 2(N-1)/N * S / bw + 2(N-1) * lat``,
    linear in ``1/bw`` and ``lat``, on relative residuals ``(t_model - t) / t``: probes
    usually span several orders of magnitude in size and their timing noise is roughly
    proportional to ``t``, so plain residuals would let the largest probes swamp the
    latency. Both unknowns are constrained to be non-negative and then clamped to
    :data:`MIN_LATENCY_S` / :data:`MAX_BANDWIDTH_BPS` so they stay positive.

    Args:
        probes: Dicts ``{"np": N, "bytes": S, "seconds": t}`` with ``N >= 2`` and ``S``,
            ``t`` > 0, at two or more distinct sizes ``S`` (any mix of ``N``).

    Returns:
        ``{"latency_s": ..., "bandwidth_Bps": ...}``.

    Raises:
        ValueError: A probe is malformed or non-positive, or fewer than two distinct
            sizes were given.
    """
    n, size, secs = _probe_arrays(probes)
    weight = 1.0 / secs  # relative residuals: small probes count as much as large ones
    inv_bw, latency = _two_term_lstsq(2 * (n - 1) / n * size * weight,
                                      2 * (n - 1) * weight, secs * weight)
    bandwidth = MAX_BANDWIDTH_BPS if inv_bw <= 1 / MAX_BANDWIDTH_BPS else 1 / inv_bw
    return {"latency_s": max(latency, MIN_LATENCY_S), "bandwidth_Bps": float(bandwidth)}


# --------------------------------------------------------------------------- fit_step
def _check_link(link: Any) -> tuple[float, float]:
    """Validates a link dict from :func:`fit_link`; returns (latency, bandwidth)."""
    lat = _number(required_field(link, "latency_s", "link"), "link['latency_s']", nonnegative=True)
    bw = _number(required_field(link, "bandwidth_Bps", "link"), "link['bandwidth_Bps']",
                 positive=True)
    return lat, bw


def _measured_pairs(measured: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """Validates the measured step times; returns (N, step_s) pairs."""
    if not isinstance(measured, Sequence) or isinstance(measured, (str, bytes)) \
            or not measured:
        raise ValueError(f"measured must be a non-empty list of dicts, got {measured!r}")
    pairs = []
    for i, row in enumerate(measured):
        where = f"measured[{i}]"
        n = _workers(required_field(row, "np", where), f"{where}['np']", minimum=2)
        step = _number(required_field(row, "step_s", where), f"{where}['step_s']", positive=True)
        pairs.append((n, step))
    return pairs


def fit_step(t_compute_s: float, measured: Sequence[Mapping[str, Any]],
             bytes_per_step: float, link: Mapping[str, float]) -> dict[str, Any]:
    """Fits the per-step framework overhead to measured multi-worker step times.

    Assumption: the measured runs overlap none of their communication with compute
    (``exposed = 1``), so the whole modelled all-reduce time is charged to each step and
    the overhead is what remains. On a small CPU cluster this is close to true (the
    all-reduce waits for backprop to finish); if a run did overlap, part of the
    overhead is hidden with the communication and the fit under-states it. The overhead
    is the least-squares constant over all measurements, i.e. the mean of
    ``step_s - t_compute - comm(N)``, floored at 0.

    Args:
        t_compute_s: Single-worker step time in seconds (same per-worker batch).
        measured: Dicts ``{"np": N, "step_s": t}`` with ``N >= 2``.
        bytes_per_step: Gradient bytes each worker all-reduces per step.
        link: ``{"latency_s", "bandwidth_Bps"}``, e.g. from :func:`fit_link`.

    Returns:
        The model dict: ``t_compute_s``, ``t_overhead_s``, ``bytes_per_step``,
        ``latency_s``, ``bandwidth_Bps``, ``exposed`` (1.0), and ``residuals``: one dict
        per measurement with ``np``, ``step_s``, ``predicted_s`` and ``residual_s``
        (measured minus predicted).

    Raises:
        ValueError: An argument is missing, malformed or out of range.
    """
    t_compute = _number(t_compute_s, "t_compute_s", positive=True)
    nbytes = _number(bytes_per_step, "bytes_per_step", nonnegative=True)
    latency, bandwidth = _check_link(link)
    pairs = _measured_pairs(measured)
    gaps = [step - t_compute - comm_time(n, nbytes, bandwidth, latency) for n, step in pairs]
    model: dict[str, Any] = {
        "t_compute_s": t_compute, "t_overhead_s": max(float(np.mean(gaps)), 0.0),
        "bytes_per_step": nbytes, "latency_s": latency, "bandwidth_Bps": bandwidth,
        "exposed": 1.0,
    }
    model["residuals"] = [_residual(model, n, step) for n, step in pairs]
    return model


def _residual(model: Mapping[str, float], workers: int, measured_s: float) -> dict[str, Any]:
    """One row of :func:`fit_step`'s residuals."""
    predicted = step_time(model, workers)
    return {"np": workers, "step_s": measured_s, "predicted_s": predicted,
            "residual_s": measured_s - predicted}


# --------------------------------------------------------------------------- predict
def predict(model: Mapping[str, Any], workers: Sequence[int] | None = None,
            bandwidths_gbit: Sequence[float] | None = None,
            latency_s: float | None = None) -> list[dict[str, Any]]:
    """Predicted efficiency for each (worker count, network bandwidth) pair.

    Compute time, overhead, gradient size and exposed fraction come from ``model``; the
    network (bandwidth and latency) is the hypothetical one being extrapolated to, so the
    model's own fitted link is not used. Latency defaults to :data:`DEFAULT_LATENCY_S`
    rather than the fitted one, which describes the machine the probes ran on.

    Args:
        model: A model dict, e.g. from :func:`fit_step`.
        workers: Worker counts (>= 1); default :data:`DEFAULT_WORKERS` (2, 4, ..., 512).
        bandwidths_gbit: Bandwidths in Gbit/s (> 0); default 10, 25 and 100.
        latency_s: Message latency in seconds (>= 0); default :data:`DEFAULT_LATENCY_S`.

    Returns:
        One dict per pair, workers varying fastest within each bandwidth:
        ``np``, ``bandwidth_gbit``, ``comm_s`` (full all-reduce time), ``step_s`` and
        ``efficiency``.

    Raises:
        ValueError: The model or any argument is malformed or out of range.
    """
    checked = check_model(model)
    counts = [_workers(n, f"workers[{i}]", minimum=1)
              for i, n in enumerate(DEFAULT_WORKERS if workers is None else workers)]
    bands = [_number(g, f"bandwidths_gbit[{i}]", positive=True) for i, g in
             enumerate(DEFAULT_BANDWIDTHS_GBIT if bandwidths_gbit is None else bandwidths_gbit)]
    lat = DEFAULT_LATENCY_S if latency_s is None else _number(latency_s, "latency_s",
                                                              nonnegative=True)
    return [_prediction(checked, n, g, lat) for g in bands for n in counts]


def _prediction(model: Mapping[str, float], workers: int, gbit: float,
                latency_s: float) -> dict[str, Any]:
    """One row of :func:`predict`."""
    bw = gbit_to_Bps(gbit)
    step = step_time(model, workers, bandwidth_Bps=bw, latency_s=latency_s)
    return {"np": workers, "bandwidth_gbit": gbit,
            "comm_s": comm_time(workers, model["bytes_per_step"], bw, latency_s),
            "step_s": step, "efficiency": model["t_compute_s"] / step}


# --------------------------------------------------------------------------- overlap
def exposed_with_buckets(bucket_bytes: Sequence[float], backward_s: float, workers: int,
                         bandwidth_Bps: float, latency_s: float) -> float:
    """Seconds of the exchange left after the backward pass ends, when the gradients go in
    buckets that start as soon as the backward pass has produced them (hvdtrain's
    ``bucket_mb``).

    The backward pass is taken to produce the gradient bytes at an even rate over
    ``backward_s`` (last layers first, as the buckets are listed), and the buckets share
    one link, one after the other, each costing :func:`comm_time` of its bytes (so each
    pays the ring's ``2 (N-1)`` message latencies: many small buckets cost more than they
    hide on a large ring). With one bucket the whole exchange is left. A lower bound of
    the measured figure on hosts whose cores all compute: the exchange's own CPU work is
    not hidden there.

    Args:
        bucket_bytes: Bytes of each bucket, in the order they are exchanged.
        backward_s: Time of the backward pass in seconds (about 2/3 of a step).
        workers: Number of workers ``N`` (>= 2).
        bandwidth_Bps, latency_s: The link.

    Returns:
        The exposed seconds (``exposed * comm(N)`` of the step-time formula).
    """
    if workers < 2:
        return 0.0
    return exposed_after_backward(
        bucket_bytes, backward_s, lambda n: comm_time(workers, n, bandwidth_Bps, latency_s))


def exposed_after_backward(bucket_bytes: Sequence[float], backward_s: float,
                           seconds: Callable[[float], float]) -> float:
    """:func:`exposed_with_buckets` with each bucket's exchange taking ``seconds(bytes)``
    (a formula, or :func:`probed_seconds` of measured all-reduces)."""
    if not bucket_bytes:
        return 0.0
    total = float(sum(bucket_bytes))
    link_free, produced = 0.0, 0.0
    for nbytes in bucket_bytes:
        produced += nbytes
        link_free = max(link_free, backward_s * produced / total) + seconds(nbytes)
    return max(0.0, link_free - backward_s)


def probed_seconds(probes: Sequence[Mapping[str, Any]], nbytes: float) -> float:
    """The time of an all-reduce of ``nbytes`` read off measured all-reduces (the probes
    of :mod:`hvdtrain_bench.probe`, one world size): linear between the two probed sizes
    around it, the smallest probe's time below them, the last two probes' slope beyond.

    Raises:
        ValueError: bad probes (fewer than two sizes, different world sizes), named.
    """
    workers, sizes, seconds = _probe_arrays(probes)
    if len(set(workers.tolist())) != 1:
        raise ValueError(f"probes must come from one world size, got sizes "
                         f"{sorted(set(workers.tolist()))}")
    order = np.argsort(sizes, kind="stable")
    sizes, seconds = sizes[order], seconds[order]
    keep = np.concatenate([[True], np.diff(sizes) > 0])
    sizes, seconds = sizes[keep], seconds[keep]
    if nbytes <= sizes[-1]:
        return float(np.interp(nbytes, sizes, seconds))  # the smallest's time below
    slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
    return float(seconds[-1] + slope * (nbytes - sizes[-1]))
