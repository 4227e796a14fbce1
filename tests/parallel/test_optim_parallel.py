"""DistributedOptimizer's reductions on 2 real ranks, checked against hand computation."""
import numpy as np
import pytest

from conftest import WORKERS, assert_settings_took_effect, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]


def grads_for(rank, step=0):
    base = np.array([[1.0, -4.0, 0.5, 3.0], [2.0, 0.25, -1.0, -6.0]], dtype="float32")
    return base * (rank + 1) + step * np.float32(0.5) * (-1) ** rank


def topk_by_hand(ratio, steps, size=2):
    """Top-K with error feedback, simulated with numpy; returns (w, residual per rank)."""
    w = np.zeros(8, "float32")
    residual = [np.zeros(8, "float32") for _ in range(size)]
    k = max(1, round(ratio * 8))
    for s in range(steps):
        dense = np.zeros(8, "float32")
        for r in range(size):
            full = grads_for(r, s).ravel() + residual[r]
            idx = np.argsort(-np.abs(full), kind="stable")[:k]
            dense[idx] += full[idx]
            residual[r] = full.copy()
            residual[r][idx] = 0
        w -= dense / size
    return w.reshape(2, 4), [r.reshape(2, 4) for r in residual]


def powersgd_by_hand(q, steps, size=2):
    """PowerSGD (rank 1) with error feedback in numpy; returns (w, error per rank)."""
    w = np.zeros((2, 4), "float32")
    error = [np.zeros((2, 4), "float32") for _ in range(size)]
    for s in range(steps):
        m = [grads_for(r, s) + error[r] for r in range(size)]
        p = sum(mr @ q for mr in m) / size
        p = p / (np.linalg.norm(p, axis=0) + 1e-8)
        q = sum(mr.T @ p for mr in m) / size
        approx = p @ q.T
        error = [mr - approx for mr in m]
        w -= approx
    return w, error


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for launcher in ("horovodrun", "mpirun"):
        d = tmp_path_factory.mktemp(launcher)
        run_job(launcher, 2, [str(WORKERS / "optim_worker.py"), str(d)])
        out[launcher] = read_ranks(d, 2)
    return out


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_average_sum_fp16_accumulate(results, launcher):
    r0, r1 = results[launcher]
    g0, g1 = grads_for(0), grads_for(1)
    for rank in (r0, r1):
        np.testing.assert_allclose(rank["average"]["w"], -(g0 + g1) / 2, rtol=1e-6)
        np.testing.assert_allclose(rank["sum"]["w"], -(g0 + g1), rtol=1e-6)
        np.testing.assert_allclose(rank["fp16"]["w"], -(g0 + g1) / 2, rtol=1e-3)
        # two backward passes, one exchange: mean over ranks of the mean over the passes
        acc = (grads_for(0, 0) + grads_for(0, 1) + grads_for(1, 0) + grads_for(1, 1)) / 4
        np.testing.assert_allclose(rank["accumulate"]["w"], -acc, rtol=1e-6)


def test_adasum_under_mpi(results):
    a, b = grads_for(0).ravel(), grads_for(1).ravel()
    dot = a @ b
    expected = (1 - dot / (2 * a @ a)) * a + (1 - dot / (2 * b @ b)) * b
    for rank in results["mpirun"]:
        np.testing.assert_allclose(np.ravel(rank["adasum"]["w"]), -expected, rtol=1e-5)


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_topk_with_error_feedback(results, launcher):
    w, residual = topk_by_hand(0.25, steps=2)
    for r, rank in enumerate(results[launcher]):
        np.testing.assert_allclose(rank["topk"]["w"], w, rtol=1e-6)
        np.testing.assert_allclose(rank["topk"]["residual"], residual[r], rtol=1e-6)


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_randomk_conserves_gradient_mass(results, launcher):
    r0, r1 = results[launcher]
    np.testing.assert_array_equal(r0["randomk"]["w"], r1["randomk"]["w"])
    # same random choice on both ranks: residuals are zero in the same places
    z0 = np.asarray(r0["randomk"]["residual"]) == 0
    z1 = np.asarray(r1["randomk"]["residual"]) == 0
    np.testing.assert_array_equal(z0, z1)
    # error feedback: what was applied plus what is still held equals everything fed in
    fed = sum(grads_for(r, s) for r in (0, 1) for s in (0, 1))
    held = np.asarray(r0["randomk"]["residual"]) + np.asarray(r1["randomk"]["residual"])
    np.testing.assert_allclose(-np.asarray(r0["randomk"]["w"]) * 2 + held, fed, rtol=1e-5)


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_settings_made_after_hvdtrain_init_take_effect(results, launcher):
    """Horovod scripts set TensorFlow's threads and devices after ``init()``."""
    assert_settings_took_effect(results[launcher])


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_powersgd_follows_the_numpy_reference_on_two_ranks(results, launcher):
    r0, r1 = results[launcher]
    assert r0["powersgd"]["q0"] == r1["powersgd"]["q0"]  # the same first Q everywhere
    w, error = powersgd_by_hand(np.asarray(r0["powersgd"]["q0"], "float32"), steps=3)
    for r, rank in enumerate((r0, r1)):
        np.testing.assert_allclose(rank["powersgd"]["w"], w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rank["powersgd"]["error"], error[r], rtol=1e-4, atol=1e-5)
    assert np.abs(np.asarray(error[0])).max() > 1e-2  # rank 1 of a 2x4 matrix drops a part
