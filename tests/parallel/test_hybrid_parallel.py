"""Hybrid parallelism under real 2-rank horovodrun (Gloo) and mpirun jobs: each rank splits
the network over its 2 logical CPU devices, Horovod averages the gradients across ranks."""
import numpy as np
import pytest

from conftest import WORKERS, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(600)]
WORKER = str(WORKERS / "hybrid_worker.py")


def test_two_ranks_of_two_stages_match_one_device_with_double_batch(launcher, tmp_path):
    run_job(launcher, 2, [WORKER, "ranks", str(tmp_path / "np2"), "--batch-size", "16"],
            timeout=300)
    run_job("python", 1, [WORKER, "reference", str(tmp_path / "np1"), "--batch-size", "32"],
            timeout=300)
    ranks = read_ranks(tmp_path / "np2", 2)
    (single,) = read_ranks(tmp_path / "np1", 1)

    # On every rank: stage 0 (Dense 16, Dense 8) on CPU:0, stage 1 (the head) on CPU:1.
    for r in ranks:
        assert [s["device"] for s in r["stages"]] == ["/device:CPU:0", "/device:CPU:1"]
        assert [len(s["variables"]) for s in r["stages"]] == [4, 2]
        for i, stage in enumerate(r["stages"]):
            for path, device in stage["variables"].items():
                assert device.endswith(f"device:CPU:{i}"), (r["rank"], path, device)
    r0, r1 = ranks
    # Seeded differently, both ranks started from rank 0's weights (the broadcast reached
    # variables on both devices), which are the reference's.
    for a, b, c in zip(r0["initial_weights_seen"], r1["initial_weights_seen"],
                       single["initial_weights_seen"]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    assert r0["global_step"] == r1["global_step"] == single["global_step"] == 8
    for a, b in zip(r0["weights"], r1["weights"]):
        np.testing.assert_array_equal(a, b)
    # 2 ranks x batch 16 == 1 process x batch 32 on one device (plain SGD, averaged).
    for a, b in zip(r0["weights"], single["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(r0["weights"], r0["initial_weights_seen"]))
