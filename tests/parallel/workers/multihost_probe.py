"""One rank of a multi-host probe: where am I, and do collectives across hosts add up?

Usage: ``multihost_probe.py OUT_DIR SUBNET_PREFIX MEGABYTES``. Each rank all-reduces a
float32 tensor of MEGABYTES (its values depend on the rank, so a wrong sum shows) and
writes ``OUT_DIR/rank<R>.json`` with its rank, the host it ran on (hostname, network
namespace, address) and what the all-reduce returned.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def namespace_id() -> str:
    """The network namespace this process runs in, as the kernel names it (net:[inode])."""
    return os.readlink("/proc/self/ns/net")


def address_towards(prefix: str) -> str:
    """This host's address on the route to ``prefix``.1 (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((f"{prefix}.1", 9))
        return sock.getsockname()[0]


def main() -> None:
    out_dir, prefix, megabytes = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    import numpy as np
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.horovod import collectives as dist

    hvdtrain.init()
    rank, size = hvdtrain.rank(), hvdtrain.size()
    n = int(megabytes * 2**20 / 4)
    local = tf.fill([n], float(rank + 1))
    mean = dist.allreduce_mean(local).numpy()
    expected = sum(range(1, size + 1)) / size
    hosts = dist.allgather_object(socket.gethostname())
    result = {
        "rank": rank,
        "size": size,
        "local_rank": dist.local_rank(),
        "local_size": dist.local_size(),
        "mpi": dist.mpi_enabled(),
        "hostname": socket.gethostname(),
        "netns": namespace_id(),
        "address": address_towards(prefix),
        "hosts_seen": hosts,
        "allreduce_bytes": n * 4,
        "allreduce_ok": bool(np.all(mean == np.float32(expected))),
        "allreduce_first": float(mean[0]),
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
