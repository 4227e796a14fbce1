"""``hvdtrain bench --memory`` runs real 2-rank jobs and reports halved optimizer state."""
from __future__ import annotations

import json
import subprocess

from conftest import BIN, ROOT


def test_memory_bench_reports_state_and_peak_rss_per_rank():
    proc = subprocess.run([str(BIN / "hvdtrain"), "bench", "--memory", "--np", "1", "2",
                           "--params", "200000", "--steps", "2", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(proc.stdout)
    assert sorted((r["size"], r["sharded"]) for r in records) == [
        (1, False), (1, True), (2, False), (2, False), (2, True), (2, True)]
    by = {(r["size"], r["rank"], r["sharded"]): r for r in records}
    for rank in (0, 1):
        plain, shard = by[(2, rank, False)], by[(2, rank, True)]
        assert 0.49 < shard["state_bytes"] / plain["state_bytes"] < 0.51
        assert shard["peak_rss_bytes"] > 100 * 2**20  # measured: a TensorFlow process
    assert by[(1, 0, True)]["state_bytes"] == by[(1, 0, False)]["state_bytes"]
