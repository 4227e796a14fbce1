"""Optimizer state sharded over 2 real ranks (ZeRO-1): the same weights as unsharded Adam
and AdamW after 200 steps, for the Trainer and for ``fit``, with half the state per rank."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import WORKERS, read_ranks, run_job

STEPS = 200


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for launcher in ("horovodrun", "mpirun"):
        d = tmp_path_factory.mktemp(launcher)
        run_job(launcher, 2, [str(WORKERS / "sharded_worker.py"), str(d), str(STEPS)],
                timeout=600)
        out[launcher] = read_ranks(d, 2)
    return out


def relative_gap(a, b) -> float:
    return max(float(np.max(np.abs(np.subtract(p, q)) / np.maximum(np.abs(p), 1e-6)))
               for p, q in zip(a, b))


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
@pytest.mark.parametrize("door", ["trainer", "fit"])
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_sharded_matches_unsharded(results, launcher, door, name):
    ranks = results[launcher]
    for r in ranks:
        plain, shard = r[f"{door}/{name}/plain"], r[f"{door}/{name}/sharded"]
        assert shard["steps"] == plain["steps"] >= STEPS
        assert relative_gap(plain["weights"], shard["weights"]) <= 1e-6
    # both ranks hold the same gathered weights
    assert relative_gap(ranks[0][f"{door}/{name}/sharded"]["weights"],
                        ranks[1][f"{door}/{name}/sharded"]["weights"]) == 0.0


@pytest.mark.parametrize("door", ["trainer", "fit"])
def test_state_bytes_are_halved(results, door):
    for r in results["horovodrun"]:
        plain = r[f"{door}/adam/plain"]["state_bytes"]
        shard = r[f"{door}/adam/sharded"]["state_bytes"]
        # 109 parameters, two moments: 872 bytes unsharded; 2 x (5 + 50) x 4 = 440 sharded
        # (one entry of padding; fit: one bucket of 55 each), plus the same counters on both
        assert plain - shard == 872 - 440
