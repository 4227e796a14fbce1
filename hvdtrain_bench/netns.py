"""The emulated cluster both benchmarks use: hosts made of Linux network namespaces by
``netns_hosts.sh`` (one veth each, shaped with ``tc``), commands started there through
``netns_rsh.sh`` (see :func:`hvdtrain_bench.jobs.script` for where both come from).
Root only."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

from hvdtrain_bench.jobs import script

PREFIX, SUBNET, IFACE, VETH = "hvdtn", "10.213.7", "hvdt0", "hvdtv"  # netns_hosts.sh's
DEFAULT_BURST, DEFAULT_LATENCY = "512kb", "100ms"     # netns_hosts.sh's tbf defaults


def hosts_script() -> Path:
    """``netns_hosts.sh``: makes, shapes, lists and removes the hosts."""
    return script("netns_hosts.sh")


def rsh_agent() -> Path:
    """``netns_rsh.sh``: the rsh agent of ``mpirun`` (and, named ``ssh``, of
    ``horovodrun``) that runs a command on a host."""
    return script("netns_rsh.sh")


def run_hosts_script(*args: str) -> str:
    """Runs ``netns_hosts.sh`` with ``args``; returns its output or raises RuntimeError
    with it."""
    proc = subprocess.run(["sh", str(hosts_script()), *args], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"netns_hosts.sh {' '.join(args)} failed: "
                           f"{(proc.stderr or proc.stdout).strip()[-1000:]}")
    return proc.stdout


@contextlib.contextmanager
def namespace_hosts(n: int, hostfile: str) -> Iterator[None]:
    """``n`` namespace hosts with an ``mpirun`` hostfile; removed afterwards."""
    run_hosts_script("up", str(n), "--hostfile", hostfile)
    try:
        yield
    finally:
        subprocess.run(["sh", str(hosts_script()), "down"], capture_output=True, timeout=120)


def set_link(rate: str, burst: str = DEFAULT_BURST, latency: str = DEFAULT_LATENCY) -> None:
    """Shapes every host's link to ``rate`` each way (``none``: unshaped)."""
    run_hosts_script("link", rate, "--burst", burst, "--latency", latency)


def veth_bytes(n: int) -> list[tuple[int, int]]:
    """Per host: (bytes it sent, bytes it received), read on the root end of its veth."""
    out = []
    for i in range(1, n + 1):
        base = Path(f"/sys/class/net/{VETH}{i}/statistics")
        out.append((int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())))
    return out
