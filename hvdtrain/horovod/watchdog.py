"""A watchdog for collectives: one that waits longer than a limit ends the job on every
rank, naming the collective and the ranks that did not arrive, instead of a silent hang.

Each rank marks what it waits in (:func:`waiting`: the Trainer's and ``fit``'s training
steps, eager collectives; :func:`enter`/:func:`leave`: collectives inside a
``tf.function``, such as a tape loop's exchange) or the long local work it does
(:func:`busy`: a checkpoint save). It starts with Horovod (``hvdtrain.init``, the drop-in's
``hvd.init``), so every front door is covered. Every few
seconds each rank reports that to rank 0 over a plain TCP connection, apart from
Horovod, whose own background loop is what a mismatched collective blocks. Rank 0
compares the reports: when a rank has waited in a collective longer than the limit while
another rank is elsewhere (in another collective, or not in one: it stopped calling
``train_on_batch``), rank 0 hands every rank the verdict, and each prints it and exits.
Ranks that all wait in the same collective are left alone (a slow first step, a long
XLA compile), and so is a rank busy with a checkpoint save.

The reports are also the ranks' pulse. A rank rank 0 has not heard from for
``HVDTRAIN_LIVENESS_TIMEOUT`` seconds (default 60) is frozen (stopped, stuck in a driver
call, swapping) or cut off: rank 0 ends the job naming it, its host and pid, even when every
other rank waits in the same collective. A rank whose reports go unanswered that long ends
the job naming rank 0. Either names the silent rank once already after two missed reports
(11 s by default; rank 0 looks every second), so the log names it whatever ends the job
first (a transport timeout, a launcher that lost the host). A rank leaving normally says
so first, so a rank that finishes early is not taken for a frozen one.

The limit is ``HVDTRAIN_COLLECTIVE_TIMEOUT`` seconds on rank 0 (default 300; 0 turns
the watchdog off). Elastic jobs run without it (their driver handles lost workers).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import socket
import sys
import threading
import time

from hvdtrain.horovod.watchdog_rules import (  # noqa: F401 - the watchdog's own names
    DEFAULT_LIVENESS_S, DEFAULT_TIMEOUT_S, ENV_LIVENESS, ENV_TIMEOUT, describe_silent,
    liveness_from_env, silence_warning, timeout_from_env, verdict)

_CONNECT_TIMEOUT_S = 2.0
_FROZEN = "it is frozen (stopped, stuck in a driver call, swapping) or cut off from"


class _Mark:
    """What this rank does now: ``kind`` is "collective", "busy", "joined" or ``None``.

    Set by the Python thread that drives training (:func:`waiting`, :func:`busy`), and,
    for collectives that run inside a ``tf.function`` (a tape loop's exchange), by the
    graph itself as each one starts and ends (:func:`enter`, :func:`leave`).
    """

    def __init__(self) -> None:
        self.kind: str | None = None
        self.label = ""
        self.since = time.monotonic()
        self.step = 0
        self.in_graph: dict[int, tuple[str, float]] = {}
        self.lock = threading.Lock()

    def report(self, rank: int) -> dict:
        kind, label, since = self.kind, self.label, self.since
        if kind is None:
            with self.lock:
                oldest = min(self.in_graph.values(), key=lambda e: e[1], default=None)
            if oldest is not None:
                kind, (label, since) = "collective", oldest
        return {"rank": rank, "kind": kind, "label": label, "step": self.step,
                "for_s": time.monotonic() - since, "host": _HOST, "pid": os.getpid()}


_HOST = socket.gethostname()
_mark = _Mark()
_tokens = itertools.count()
_running: "_Watchdog | None" = None


@contextlib.contextmanager
def _marked(kind: str, label: str, step: int | None):
    outer = (_mark.kind, _mark.label, _mark.since)
    if step is not None:
        _mark.step = step
    if outer[0] != "collective":  # a collective inside another keeps the outer label
        _mark.kind, _mark.label, _mark.since = kind, label, time.monotonic()
    try:
        yield
    finally:
        if outer[0] is None:  # back to no collective: count from now
            _mark.kind, _mark.label, _mark.since = None, "", time.monotonic()
        else:
            _mark.kind, _mark.label, _mark.since = outer


def waiting(label: str, step: int | None = None):
    """Context manager: this rank is in the collective ``label`` (the same text on every
    rank for the same collective), at training step ``step``."""
    return _marked("collective", label, step)


def joined():
    """Context manager: this rank has joined (``hvd.join()``) and takes part in whatever
    collective the others run, so it counts as arrived in each."""
    return _marked("joined", "join", None)


def busy(label: str):
    """Context manager: this rank does long local work (others may wait for it)."""
    return _marked("busy", label, None)


def enter(label: str) -> int:
    """Marks a collective inside a graph as started (called by the graph); returns the
    token to :func:`leave` it with."""
    with _mark.lock:
        token = next(_tokens)
        _mark.in_graph[token] = (label, time.monotonic())
    return token


def leave(token: int) -> None:
    """Marks the collective :func:`enter` returned ``token`` for as finished."""
    with _mark.lock:
        _mark.in_graph.pop(token, None)


def report_now(rank: int) -> dict:
    """What this rank would report now (``kind``, ``label``, ``for_s``, ``step``)."""
    return _mark.report(rank)


def marked() -> bool:
    """True inside :func:`waiting` or :func:`busy` (a step already watched from Python,
    whose graph needs no marks of its own)."""
    return _mark.kind is not None


def running() -> bool:
    """True when this process runs the watchdog (marks then matter)."""
    return _running is not None


class _Watchdog:
    """The reporting thread of one rank, and on rank 0 the server that judges."""

    def __init__(self, rank: int, size: int, limit: float, address: tuple | None,
                 server: socket.socket | None, where: str | None = None, *,
                 liveness: float = 0.0, root: dict | None = None) -> None:
        self.rank, self.size, self.limit, self.liveness = rank, size, limit, liveness
        self.where = where or f"rank {rank} of {size}"
        bounds = [limit / 5] + ([liveness / 6] if liveness else [])
        self.interval = max(0.2, min(5.0, *bounds))
        self.warn_after = 2 * self.interval + 1.0  # a silence named early (11 s by default)
        self._address, self._server = address, server
        self._root = root or {}  # rank 0's host and pid, for the other ranks' messages
        self._reports: dict[int, dict] = {}
        self._heard = {r: time.monotonic() for r in range(size)}  # rank 0: last report
        self._gone: set[int] = set()  # ranks that left normally
        self._silent: set[int] = set()  # ranks the liveness verdict named
        self._warned: set[int] = set()  # silent ranks named early (rank 0); 0: rank 0's
        self._unanswered_since: float | None = None  # other ranks: rank 0 timed out
        self._candidate, self._confirmed = None, set()
        self._verdict: str | None = None
        self._lock = threading.Lock()
        self._told: set[int] = set()
        self._pid = os.getpid()
        if server is not None:
            threading.Thread(target=self._serve, name="hvdtrain-watchdog-server",
                             daemon=True).start()
        threading.Thread(target=self._loop, name="hvdtrain-watchdog", daemon=True).start()
        if server is None:
            atexit.register(self._leave)

    # rank 0 ---------------------------------------------------------------------------
    def _judge(self, report: dict) -> str | None:
        """Records ``report``; returns the verdict once the same stuck situation was seen
        in a report of every rank after it first appeared (no stale report decides), or
        once a rank has been silent longer than the liveness limit."""
        with self._lock:
            rank = report["rank"]
            self._reports[rank] = report
            self._heard[rank] = time.monotonic()
            self._warned.discard(rank)
            if report["kind"] == "exited":
                self._gone.add(rank)
            else:  # a report after "exited" (one from a forked child): still in the job
                self._gone.discard(rank)
            if self._verdict is None:
                self._verdict = self._liveness_verdict()
            if self._verdict is None:
                found = verdict(self._reports, self.size, self.limit)
                if found is None or found[0] != self._candidate:
                    self._candidate, self._confirmed = (found[0] if found else None), set()
                else:
                    self._confirmed.add(rank)
                    if len(self._confirmed | self._gone) >= self.size:
                        self._verdict = found[1]
            if self._verdict is not None:
                self._told.add(rank)
            return self._verdict

    def _quiet_for(self) -> dict[int, float]:
        """Rank -> seconds since rank 0 last heard from it (ranks still in the job)."""
        now = time.monotonic()
        return {r: now - t for r, t in self._heard.items() if r != 0 and r not in self._gone}

    def _liveness_verdict(self) -> str | None:
        if not self.liveness:
            return None
        quiet = self._quiet_for()
        for r in sorted({r for r, s in quiet.items() if s > self.warn_after} - self._warned):
            self._warned.add(r)
            self._say(silence_warning(self.where, self._describe_silent(r, quiet[r]),
                                      self.liveness))
        silent = {r: s for r, s in quiet.items() if s > self.liveness}
        if not silent:
            return None
        self._silent = set(silent)
        return "; ".join(self._describe_silent(r, s) for r, s in sorted(silent.items())) + (
            f" (limit {self.liveness:g} s, {ENV_LIVENESS}): {_FROZEN} rank 0 (a link or host "
            "down)")

    def _describe_silent(self, rank: int, seconds: float) -> str:
        return describe_silent(rank, self.size, self._reports.get(rank), seconds)

    def suspects(self) -> str | None:
        """The ranks this rank has not heard from for a few report intervals, described,
        or ``None``: what a failed collective's message adds (a transport timeout)."""
        late = 2 * self.interval + 1.0
        if self._server is not None:
            with self._lock:
                quiet = {r: s for r, s in self._quiet_for().items() if s > late}
                return "; ".join(self._describe_silent(r, s)
                                 for r, s in sorted(quiet.items())) or None
        since = self._unanswered_since
        if since is None or time.monotonic() - since <= late:
            return None
        return (f"rank 0 ({self._describe_root()}) has not answered for "
                f"{time.monotonic() - since:.0f} s")

    def _describe_root(self) -> str:
        return f"host {self._root.get('host', '?')}, pid {self._root.get('pid', '?')}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(_CONNECT_TIMEOUT_S)
                    line = conn.makefile("r").readline()
                    answer = self._judge(json.loads(line))
                    conn.sendall((json.dumps({"verdict": answer}) + "\n").encode())
                except (OSError, ValueError, KeyError):
                    continue

    # every rank -----------------------------------------------------------------------
    def _ask(self, report: dict) -> str | None:
        if self._server is not None:
            return self._judge(report)
        with socket.create_connection(self._address, timeout=_CONNECT_TIMEOUT_S) as conn:
            conn.sendall((json.dumps(report) + "\n").encode())
            return json.loads(conn.makefile("r").readline() or "{}").get("verdict")

    def _loop(self) -> None:
        while True:  # a first report at once: rank 0 learns this rank's host and pid
            report = _mark.report(self.rank)
            try:
                answer = self._ask(report)
                self._unanswered_since = None
                self._warned.discard(0)
            except ConnectionRefusedError:  # rank 0's process is gone: its launcher ends
                answer = None  # the job if it failed; if it finished, this rank may go on
            except (OSError, ValueError):
                self._unanswered_since = self._unanswered_since or time.monotonic()
                answer = self._rank0_silent(report)
            if answer:
                self._exit(answer)
            time.sleep(self.interval if self._server is None else min(self.interval, 1.0))

    def _rank0_silent(self, report: dict) -> str | None:
        unanswered = time.monotonic() - self._unanswered_since
        quiet = (f"rank 0 of {self.size} ({self._describe_root()}) has not answered for "
                 f"{unanswered:.0f} s")
        if self.liveness and unanswered > self.warn_after and 0 not in self._warned:
            self._warned.add(0)
            self._say(silence_warning(self.where, quiet, self.liveness))
        if self.liveness and unanswered > self.liveness:
            return (f"{quiet} (limit {self.liveness:g} s, {ENV_LIVENESS}): {_FROZEN} this rank "
                    "(a link or host down)")
        if (report["kind"] == "collective" and report["for_s"] > self.limit
                and unanswered > 2 * self.interval):
            return (f"collective {report['label']!r} waited {report['for_s']:.0f} s "
                    f"(limit {self.limit:g} s, {ENV_TIMEOUT}) and rank 0's watchdog "
                    "does not answer")
        return None

    def _leave(self) -> None:
        """Tells rank 0 this rank leaves normally (at interpreter exit)."""
        if os.getpid() != self._pid:  # a forked child's exit: the rank goes on
            return
        try:
            self._ask({**_mark.report(self.rank), "kind": "exited"})
        except (OSError, ValueError):
            pass

    def _exit(self, message: str) -> None:
        if self._server is not None:  # let the other ranks fetch the verdict first
            deadline = time.monotonic() + 3 * self.interval
            while (time.monotonic() < deadline
                   and len(self._told | self._silent | self._gone | {0}) < self.size):
                time.sleep(0.05)
        self._say(f"hvdtrain: {self.where} stopped by the collective watchdog: {message}\n")
        sys.stdout.flush()
        os._exit(1)

    _say = staticmethod(lambda line: (sys.stderr.write(line), sys.stderr.flush()))


def start(rank: int, size: int, local_size: int, broadcast_object, *,
          where: str | None = None) -> None:
    """Starts the watchdog on every rank (a collective: one broadcast of rank 0's address).
    Once per process; nothing with one rank or a limit of 0.

    Rank 0 listens on a port the system picks and tells the others through
    ``broadcast_object`` over Horovod's job, so each sub-job of an ``mpirun`` job split by
    ``hvdtrain.init(comm=...)`` has its own server and reports only to it. Rank 0's limits
    are the job's.

    Args:
        rank, size, local_size: this rank, the job's size, the ranks on this host.
        broadcast_object: returns rank 0's copy of a JSON-serialisable value, or ``None``
            where it cannot (then no watchdog runs).
        where: this process in messages (default ``"rank R of N"``; on a sub-communicator
            also its world rank).
    """
    global _running
    if _running is not None or size == 1:
        return
    limit, server, offer = timeout_from_env(), None, None
    if rank == 0 and limit > 0:
        server = socket.create_server(("", 0), family=socket.AF_INET)
        hosts = ["127.0.0.1"] if local_size == size else _host_addresses()
        offer = {"hosts": hosts, "port": server.getsockname()[1], "limit": limit,
                 "liveness": liveness_from_env(), "host": _HOST, "pid": os.getpid()}
    offer = broadcast_object(offer)
    if offer is None:
        return
    hosts, port = offer["hosts"], offer["port"]
    address = None if rank == 0 else _reachable(hosts, port)
    if rank != 0 and address is None:
        sys.stderr.write(f"hvdtrain: {where or f'rank {rank}'}: the collective watchdog cannot "
                         f"reach rank 0 at {hosts} port {port}; this rank runs without it\n")
        return
    _running = _Watchdog(rank, size, offer["limit"], address, server, where,
                         liveness=offer["liveness"], root=offer)


def suspects() -> str | None:
    """Ranks this rank has not heard from lately (see :meth:`_Watchdog.suspects`), or
    ``None`` (also when no watchdog runs)."""
    return None if _running is None else _running.suspects()


def _host_addresses() -> list[str]:
    """This host's names and addresses, the most specific first."""
    names = [socket.getfqdn(), socket.gethostname()]
    try:
        names += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                             socket.AF_INET)]
    except OSError:
        pass
    return list(dict.fromkeys(n for n in names if n and not n.startswith("127.")))


def _reachable(hosts: list[str], port: int) -> tuple | None:
    for host in hosts:
        try:
            socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S).close()
            return host, port
        except OSError:
            continue
    return None


def endpoint() -> tuple | None:
    """Where this rank's watchdog reports go: rank 0's ``(host, port)`` (on rank 0 its own
    server's port); ``None`` while no watchdog runs in this process."""
    if _running is None:
        return None
    if _running._server is not None:
        return ("127.0.0.1", _running._server.getsockname()[1])
    return tuple(_running._address)
