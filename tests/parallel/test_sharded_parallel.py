"""Optimizer state sharded over 2 real ranks (ZeRO-1): the same weights as unsharded Adam
and AdamW after 200 steps, for the Trainer and for ``fit``, with half the state per rank;
and with clipping, local accumulation, fp16 and loss scaling (``fit``: accumulation)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import WORKERS, read_ranks, run_job

STEPS = 200
#: the Trainer's combinations each launcher's job also runs, sharded and not, for
#: COMBO_STEPS (tests/parallel/workers/sharded_worker.py's COMBOS); fp16 under both (Gloo's
#: and MPI's float16 reduce-scatter)
COMBOS = {"horovodrun": ["clipnorm", "global_clipnorm", "passes", "fp16", "mixed"],
          "mpirun": ["fp16"]}
#: the combinations (the same names) ``fit`` also runs, through hvdtrain.DistributedOptimizer
FIT_COMBOS = {"horovodrun": ["passes"], "mpirun": []}
COMBO_STEPS = 100
#: relative weight gaps allowed, 1e-6 unless named: the clipping norms are sums in another
#: order (each rank sums its own runs of a variable); Adam's normalised steps carry those
#: last-bit differences (clipnorm measured 1.6e-5 after 100 steps, its largest difference
#: 1.8e-7, 3 float32 steps of a weight of 0.79; the clip that binds moves them by 0.1), and
#: global_clipnorm's 1.3e-6 is one float32 step of a bias of 0.016 (accumulation, fp16 and
#: loss scaling: equal)
COMBO_GAP = {"clipnorm": 1e-4, "global_clipnorm": 1e-5}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for launcher in ("horovodrun", "mpirun"):
        d = tmp_path_factory.mktemp(launcher)
        run_job(launcher, 2, [str(WORKERS / "sharded_worker.py"), str(d), str(STEPS),
                              ",".join(COMBOS[launcher]), str(COMBO_STEPS),
                              ",".join(FIT_COMBOS[launcher])], timeout=600)
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


@pytest.mark.parametrize("launcher, combo", [(launcher, combo) for launcher in COMBOS
                                             for combo in COMBOS[launcher]])
def test_sharded_matches_unsharded_with_clipping_accumulation_fp16_and_loss_scaling(
        results, launcher, combo):
    """clipnorm over a variable split between the ranks' slices, global_clipnorm,
    backward_passes_per_step=2, fp16 reduce-scatter and mixed_float16's loss scaler: the
    same weights as unsharded."""
    ranks = results[launcher]
    for r in ranks:
        plain, shard = r[f"trainer/{combo}/plain"], r[f"trainer/{combo}/sharded"]
        assert shard["steps"] == plain["steps"] >= COMBO_STEPS
        assert relative_gap(plain["weights"], shard["weights"]) <= COMBO_GAP.get(combo, 1e-6)
    assert relative_gap(ranks[0][f"trainer/{combo}/sharded"]["weights"],
                        ranks[1][f"trainer/{combo}/sharded"]["weights"]) == 0.0


@pytest.mark.parametrize("launcher, combo", [(launcher, combo) for launcher in FIT_COMBOS
                                             for combo in FIT_COMBOS[launcher]])
def test_fit_sharded_matches_unsharded_with_accumulation(results, launcher, combo):
    """``model.fit`` with backward_passes_per_step=2: the sharded optimizer accumulates
    the passes locally and exchanges every second one, as the unsharded one does; the
    same weights and the same count of updates (half the batches)."""
    ranks = results[launcher]
    for r in ranks:
        plain, shard = r[f"fit/{combo}/plain"], r[f"fit/{combo}/sharded"]
        assert shard["passes"] == plain["passes"] >= COMBO_STEPS
        assert shard["steps"] == plain["steps"] == plain["passes"] // 2
        assert shard["state_bytes"] < plain["state_bytes"]
        assert relative_gap(plain["weights"], shard["weights"]) <= COMBO_GAP.get(combo, 1e-6)
    assert relative_gap(ranks[0][f"fit/{combo}/sharded"]["weights"],
                        ranks[1][f"fit/{combo}/sharded"]["weights"]) == 0.0


@pytest.mark.parametrize("door", ["trainer", "fit"])
def test_state_bytes_are_halved(results, door):
    for r in results["horovodrun"]:
        plain = r[f"{door}/adam/plain"]["state_bytes"]
        shard = r[f"{door}/adam/sharded"]["state_bytes"]
        # 109 parameters, two moments: 872 bytes unsharded; 2 x (5 + 50) x 4 = 440 sharded
        # (one entry of padding; fit: one bucket of 55 each), plus the same counters on both
        assert plain - shard == 872 - 440


def test_the_trainer_logs_the_state_bytes_per_rank_once(results):
    r0, r1 = results["horovodrun"]
    # 872 bytes of moments unsharded (plus the counters), 440 in each rank's slices
    plain, shard = r0["trainer/adam/plain"], r0["trainer/adam/sharded"]
    assert plain["state_log"] == [f"optimizer state: {plain['state_bytes'] / 2**10:.1f} KB "
                                  "per rank (not sharded)"]
    assert shard["state_log"] == [f"optimizer state: {shard['state_bytes'] / 2**10:.1f} KB "
                                  "per rank (sharded over 2: 1/2 of 0.9 KB)"]
    assert r1["trainer/adam/sharded"]["state_log"] == []  # rank 0 alone logs
