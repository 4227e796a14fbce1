#!/usr/bin/env python3
"""Raw TCP between two network-namespace hosts (scripts/netns_hosts.sh): what the shaped
link gives one direction alone, both directions at once, and a 2-rank ring all-reduce's
pattern of messages, with nothing of Horovod's in the way.

    scripts/netns_tcp.py [--seconds S] [--bytes B] [--rounds R]   (root; hosts up)

* ``one-way``: host 1 streams to host 2 for S seconds;
* ``both-ways``: host 1 streams to host 2 and host 2 to host 1 at the same time, on two
  connections;
* ``exchange``: the pattern of a 2-rank ring all-reduce of B bytes: each host sends B/2
  and receives B/2 at the same time on one connection, twice per round (reduce-scatter,
  then all-gather), R rounds; reported as seconds per round against B*8/rate.

Prints one JSON line per pattern. Each side runs as ``ip netns exec hvdtnI python this
--serve/--connect ...``.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time

SUBNET, PREFIX, PORT = "10.213.7", "hvdtn", 25001
CHUNK = 1 << 20


def _stream_out(sock: socket.socket, seconds: float) -> int:
    """Sends for ``seconds``; returns the bytes sent."""
    buf, sent, end = b"\0" * CHUNK, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(buf)
        sent += CHUNK
    sock.shutdown(socket.SHUT_WR)
    return sent


def _stream_in(sock: socket.socket) -> tuple[int, float]:
    """Reads to EOF; returns the bytes and the seconds from the first byte to EOF."""
    got, first = 0, None
    while True:
        data = sock.recv(CHUNK)
        if not data:
            break
        first = first or time.monotonic()
        got += len(data)
    return got, time.monotonic() - (first or time.monotonic())


def _recv_exact(sock: socket.socket, n: int) -> None:
    view = memoryview(bytearray(n))
    while n:
        k = sock.recv_into(view[-n:], n)
        if not k:
            raise ConnectionError("peer closed")
        n -= k


def _exchange(sock: socket.socket, nbytes: int, rounds: int) -> list[float]:
    """Each round: send and receive half of ``nbytes`` at once, twice."""
    half = b"\0" * (nbytes // 2)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _phase in range(2):
            sender = threading.Thread(target=sock.sendall, args=(half,))
            sender.start()
            _recv_exact(sock, len(half))
            sender.join()
        times.append(time.perf_counter() - start)
    return times


def side(args) -> None:
    """One host's part of a pattern (``--serve`` or ``--connect``)."""
    if args.serve:
        lsock = socket.create_server(("0.0.0.0", args.port))
        sock = lsock.accept()[0]
    else:
        for _ in range(100):
            try:
                sock = socket.create_connection((args.connect, args.port))
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"could not connect to {args.connect}:{args.port}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    result: dict = {}
    if args.pattern == "exchange":
        times = _exchange(sock, args.bytes, args.rounds)
        result["round_s"] = sorted(times)[len(times) // 2]
    elif args.serve:
        result["bytes"], result["seconds"] = _stream_in(sock)
    else:
        result["sent"] = _stream_out(sock, args.seconds)
    print(json.dumps(result), flush=True)


def _in_host(i: int, *argv: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}{i}", sys.executable, __file__,
                             *argv], stdout=subprocess.PIPE, text=True)


def run_pattern(pattern: str, args) -> dict:
    """Runs one pattern between hosts 1 and 2; returns its figures."""
    common = ["--pattern", pattern, "--seconds", str(args.seconds), "--bytes", str(args.bytes),
              "--rounds", str(args.rounds)]
    pairs = [(2, 1, PORT)]                     # (server host, client host, port)
    if pattern == "both-ways":
        pairs.append((1, 2, PORT + 1))
    procs = []
    for server, client, port in pairs:
        procs.append(_in_host(server, "--serve", "--port", str(port), *common))
        procs.append(_in_host(client, "--connect", f"{SUBNET}.{10 + server}", "--port",
                              str(port), *common))
    outs = [json.loads(p.communicate(timeout=args.seconds * 4 + 120)[0]) for p in procs]
    if pattern == "exchange":
        round_s = max(o["round_s"] for o in outs)
        return {"pattern": pattern, "bytes": args.bytes, "round_s": round_s,
                "gbit_per_s_each_way": args.bytes * 8 / round_s / 1e9}
    rates = [o["bytes"] * 8 / o["seconds"] / 1e9 for o in outs[::2]]
    return {"pattern": pattern, "gbit_per_s": rates}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pattern", choices=("one-way", "both-ways", "exchange"))
    p.add_argument("--serve", action="store_true")
    p.add_argument("--connect")
    p.add_argument("--port", type=int, default=PORT)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--bytes", type=int, default=4 * 1276810)  # the MLP's gradients
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    if args.serve or args.connect:
        side(args)
        return 0
    for pattern in ([args.pattern] if args.pattern else ["one-way", "both-ways", "exchange"]):
        print(json.dumps(run_pattern(pattern, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
