"""``hvdtrain bench --memory``'s table: state bytes, peak RSS and TensorFlow's allocator
peak, sharded beside unsharded, one line per rank."""
from __future__ import annotations

from hvdtrain_bench import memory

MB = 2**20


def record(size, rank, sharded, state, rss, alloc):
    return {"size": size, "rank": rank, "sharded": sharded, "params": 1000,
            "state_bytes": state * MB, "peak_rss_bytes": rss * MB,
            "allocator_peak_bytes": None if alloc is None else alloc * MB}


def test_the_table_puts_each_rank_sharded_beside_unsharded():
    table = memory.format_table([record(2, 0, False, 800, 3000, 2400),
                                 record(2, 0, True, 400, 2400, 1800),
                                 record(2, 1, False, 800, 3000, None),
                                 record(2, 1, True, 400, 2700, None)])
    rows = [line.split() for line in table.splitlines()[1:3]]
    assert rows[0] == ["2", "0", "800.0", "400.0", "0.50", "3000", "2400", "0.80",
                       "2400", "1800", "0.75"]
    assert rows[1] == ["2", "1", "800.0", "400.0", "0.50", "3000", "2700", "0.90"]
    assert "MLP of 1,000 parameters" in table
