"""The Trainer under real 2-rank horovodrun (Gloo) and mpirun jobs."""
import re
import shutil

import numpy as np
import pytest

from conftest import LAUNCHERS, WORKERS, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]
WORKER = str(WORKERS / "trainer_worker.py")


def _weights(result):
    return [np.asarray(w) for w in result["weights"]]


@pytest.fixture(scope="module", params=LAUNCHERS)
def parity(request, tmp_path_factory):
    """The "parity" scenario on 2 ranks with batch 16 under each launcher, run once for
    the tests that read it: (ranks' results, the job, its out dir)."""
    out = tmp_path_factory.mktemp(f"parity-{request.param}")
    proc = run_job(request.param, 2, [WORKER, "parity", str(out), "--batch-size", "16"])
    return read_ranks(out, 2), proc, out, request.param


@pytest.fixture(scope="module")
def parity_one_rank(tmp_path_factory):
    """The same scenario in one process with batch 32."""
    out = tmp_path_factory.mktemp("parity-np1")
    run_job("python", 1, [WORKER, "parity", str(out), "--batch-size", "32"])
    (single,) = read_ranks(out, 1)
    return single


def test_two_ranks_match_one_rank_with_double_batch(parity, parity_one_rank):
    (r0, r1), single = parity[0], parity_one_rank

    # Ranks were seeded differently, yet saw rank 0's initial weights after the broadcast.
    for a, b in zip(r0["initial_weights_seen"], r1["initial_weights_seen"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(r0["initial_weights_seen"], single["initial_weights_seen"]):
        np.testing.assert_array_equal(a, b)
    # Identical weights on both ranks after training.
    for a, b in zip(_weights(r0), _weights(r1)):
        np.testing.assert_array_equal(a, b)
    # Same steps: 256 examples, 2 epochs, global batch 32 -> 16 steps on every rank.
    assert r0["global_step"] == r1["global_step"] == single["global_step"] == 16
    # Two ranks with batch B == one rank with batch 2B (plain SGD, averaged gradients).
    for a, b in zip(_weights(r0), _weights(single)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # The loss went down, and the learning rate was scaled only when asked.
    assert r0["losses"][-1] < r0["losses"][0]
    assert r0["lr"] == pytest.approx(0.05)
    assert r0["scaled_lr"] == pytest.approx(0.1) and single["scaled_lr"] == pytest.approx(0.05)


def test_each_rank_gets_its_share_of_the_cores_when_the_script_sets_no_threads(parity):
    """hvdtrain.init()'s own thread settings hold where the script makes none."""
    for r in parity[0]:
        share = max(1, r["threads"]["cores"] // 2)
        assert r["threads"] == {**r["threads"], "intra": share, "inter": max(2, share)}


def test_buckets_and_steps_per_execution_train_exactly_the_same(parity):
    """The exchange split into one bucket per tensor, and 3 steps per compiled call (8
    steps an epoch: calls of 3, 3 and 2), give the same weights and epoch losses."""
    (r0, r1), proc = parity[0], parity[1]
    assert "gradient exchange: 4 gradient bucket(s), last layers first" in proc.stdout + proc.stderr
    for name in ("buckets", "spe"):
        for r in (r0, r1):
            got = r["variants"][name]
            assert got["global_step"] == 16, name
            for a, b in zip(_weights(r0), [np.asarray(w) for w in got["weights"]]):
                np.testing.assert_array_equal(a, b, err_msg=name)
            assert got["epoch_loss"] == pytest.approx(r0["epoch_loss"], rel=1e-6), name


def test_xla_compiled_steps_match_the_uncompiled_run(tmp_path, parity_one_rank):
    proc = run_job("horovodrun", 2, [WORKER, "parity", str(tmp_path), "--batch-size", "16",
                                     "--jit"], env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    r0, r1 = read_ranks(tmp_path, 2)
    assert "Compiled cluster using XLA" in proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    assert "forward and backward pass; hvdtrain's gradient exchange and the update run " \
        "outside the compiled cluster" in log, log[-3000:]
    for a, b in zip(_weights(r0), _weights(r1)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_weights(r0), _weights(parity_one_rank)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_only_rank0_checkpoints_and_logs(parity):
    _, proc, out, launcher = parity
    rank0_dir, rank1_dir = out / "ckpt" / "rank0", out / "ckpt" / "rank1"
    assert (rank0_dir / "latest").read_text().strip() == "ckpt-00000016"
    assert (rank0_dir / "ckpt-00000016" / "manifest.json").is_file()
    assert not rank1_dir.exists()
    log_lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "[hvdtrain] step" in ln]
    assert log_lines, "rank 0 logged nothing"
    prefixes = {"horovodrun": ("[0]",), "mpirun": ("[1,0]",)}[launcher]
    assert all(ln.startswith(prefixes) for ln in log_lines), log_lines
    assert any("samples/s" in ln for ln in log_lines)
    # Horovod's timeline of the run, with the gradient all-reduces in it.
    timeline = (out / "timeline.json").read_text()
    assert "ALLREDUCE" in timeline


@pytest.fixture(scope="module", params=LAUNCHERS)
def uneven_and_validation(request, tmp_path_factory):
    """The "uneven" and "validation" scenarios, one after the other in one 2-rank job."""
    out = tmp_path_factory.mktemp(f"uneven-{request.param}")
    run_job(request.param, 2, [WORKER, "uneven+validation", str(out)], timeout=180)
    return read_ranks(out, 2)


def test_uneven_shards_take_the_same_steps_without_hanging(uneven_and_validation):
    r0, r1 = uneven_and_validation
    # Rank 1 holds 90 examples -> shard of 45 -> 6 batches of 8; rank 0 has far more.
    assert r0["known_steps"] == r1["known_steps"] == 6
    # Unknown length (a filter): rank 1 keeps 50 -> 25 in its shard -> 4 batches.
    assert r0["unknown_steps_per_epoch"] is None
    assert r0["unknown_steps"] == r1["unknown_steps"] == 4
    for a, b in zip(_weights(r0), _weights(r1)):
        np.testing.assert_array_equal(a, b)


def test_validation_metric_is_the_mean_over_the_whole_set(uneven_and_validation):
    r0, r1 = uneven_and_validation
    assert r0["metrics"] == r1["metrics"]
    for name in ("y_mean", "mse"):
        assert r0["metrics"][name] == pytest.approx(r0["expected"][name], rel=1e-5, abs=1e-6)


def test_every_compression_still_converges(tmp_path):
    run_job("horovodrun", 2, [WORKER, "compression", str(tmp_path), "--epochs", "1"],
            timeout=280)
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0 == {**r1, "rank": 0}  # identical models on both ranks
    # 1 epoch on 12,000 images: full gradients reach ~0.82 (fp16 the same); sparsified ones
    # learn too, a little behind (~0.77; Top-K sends 5% of the entries, random-K 50%).
    assert r0["none"] > 0.79 and abs(r0["fp16"] - r0["none"]) < 0.02, r0
    assert r0["topk"] > 0.72 and r0["randomk"] > 0.72, r0


@pytest.mark.parametrize("case, np_, match", [
    ("adasum3", 3, "power of two"),
    ("topk_ratio", 2, r"ratio must be in \(0, 1\]"),
    ("no_learning_rate", 2, "optimizer_args must hold 'learning_rate'"),
    ("unwritable_checkpoint_dir", 2, "not a writable directory"),
])
def test_bad_input_fails_on_every_rank(tmp_path, case, np_, match):
    proc = run_job("mpirun", np_, [WORKER, "bad_input", str(tmp_path), "--case", case],
                   timeout=120, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    # Every rank raised the same clear error (each wrote it down before any rank exited) ...
    for rank in range(np_):
        error = tmp_path / f"error-rank{rank}.txt"
        assert error.is_file(), f"rank {rank} did not fail: {text[-3000:]}"
        assert error.read_text().startswith("ValueError: ") and re.search(match, error.read_text())
    # ... and hvdtrain's failure line (one write per rank, so mpirun never splits it) names
    # the rank and the cause; mpirun may end the others before they print theirs.
    lines = re.findall(r"hvdtrain: rank \d+ of \d+ failed: ValueError: .*", text)
    assert lines and all(re.search(match, line) for line in lines), text[-3000:]


@pytest.fixture(scope="module")
def resume(tmp_path_factory):
    """An uninterrupted run of 40 iterations, and one stopped at 22 and resumed to 40, on 2
    ranks; the checkpoint of the stopped run is also copied aside for a 1-rank resume, and
    sharded_mixed's for an unsharded mixed_float16 run (mixed_from_sharded) that resumes
    from it beside the others. Under horovodrun only: test_no_hang.py resumes a preempted
    run under both launchers."""
    launcher = "horovodrun"
    out = tmp_path_factory.mktemp(f"resume-{launcher}")
    straight, split, aside = out / "straight", out / "split", out / "aside"
    variants = ["--variants", "plain,powersgd,sharded,sharded_mixed,passes,sharded_passes"]
    run_job(launcher, 2, [WORKER, "resume", str(straight), "--max-iteration", "40", *variants])
    run_job(launcher, 2, [WORKER, "resume", str(split), "--max-iteration", "22", *variants])
    first = read_ranks(split, 2)
    shutil.copytree(split / "ckpt", aside / "ckpt")
    shutil.copytree(split / "ckpt-sharded_mixed", split / "ckpt-mixed_from_sharded")
    shutil.copytree(split / "ckpt-sharded_passes", split / "ckpt-passes_from_sharded")
    proc = run_job(launcher, 2, [WORKER, "resume", str(split), "--max-iteration", "40",
                                 variants[0],
                                 f"{variants[1]},mixed_from_sharded,passes_from_sharded"])
    return {"first": first, "resumed": read_ranks(split, 2), "full": read_ranks(straight, 2),
            "proc": proc, "aside": aside}


def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(resume):
    first, resumed, full = resume["first"], resume["resumed"], resume["full"]
    assert first[0]["global_step"] == 11
    assert resumed[0]["start_step"] == 11 and resumed[0]["global_step"] == 20 == full[0]["global_step"]
    assert "resumed from" in resume["proc"].stdout + resume["proc"].stderr
    for r in (0, 1):  # every rank, dropout streams and shuffled data position included
        for a, b in zip(_weights(resumed[r]), _weights(full[r])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_powersgd_state_is_checkpointed_so_a_resumed_run_equals_an_uninterrupted_one(resume):
    """The checkpoint holds the ranks' mean error, Q and the exchange count (only the sum
    of the errors shapes training): the resumed run's weights are the uninterrupted run's
    on every rank, up to summation order."""
    resumed = [r["variants"]["powersgd"] for r in resume["resumed"]]
    full = [r["variants"]["powersgd"] for r in resume["full"]]
    plain = [r["variants"]["plain"] for r in resume["full"]]
    assert resumed[0]["start_step"] == 11 and resumed[0]["global_step"] == 20
    text = resume["proc"].stdout + resume["proc"].stderr
    assert "not an exact resume" not in text and "holds no powersgd state" not in text
    for r in (0, 1):
        for a, b in zip(_weights(resumed[r]), _weights(full[r])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the compression did act: its run is not the uncompressed one
    assert any(not np.allclose(a, b, rtol=1e-3) for a, b in zip(_weights(full[0]),
                                                                  _weights(plain[0])))


def test_sharded_optimizer_state_is_saved_whole_so_a_resumed_run_equals_an_uninterrupted_one(
        resume):
    """Each rank's slice of Adam's moments is gathered into the unsharded format on save
    and cut back into slices on restore: exact resume on both ranks, and the sharded run
    trains as the unsharded one does."""
    for r in (0, 1):
        resumed = resume["resumed"][r]["variants"]["sharded"]
        full = resume["full"][r]["variants"]["sharded"]
        plain = resume["full"][r]["variants"]["plain"]
        assert resumed["start_step"] == 11 and resumed["global_step"] == 20
        for a, b, c in zip(_weights(resumed), _weights(full), _weights(plain)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(b, c, rtol=1e-4, atol=1e-5)
    assert "not an exact resume" not in resume["proc"].stdout + resume["proc"].stderr
    saved = resume["aside"].parent / "split" / "ckpt-sharded"
    assert any(saved.glob("ckpt-*/manifest.json"))


def test_a_checkpoint_between_two_accumulated_passes_resumes_the_pending_sum(resume):
    """backward_passes_per_step=2 stopped at step 11, after the first pass of an update:
    the ranks' pending sums are averaged into the checkpoint, so the resumed run (unsharded,
    sharded, and unsharded from the sharded run's checkpoint) ends where the uninterrupted
    one does on every rank (up to summation order)."""
    for r in (0, 1):
        full = resume["full"][r]["variants"]
        for name, like in (("passes", "passes"), ("sharded_passes", "sharded_passes"),
                           ("passes_from_sharded", "sharded_passes")):
            resumed = resume["resumed"][r]["variants"][name]
            assert resumed["start_step"] == 11 and resumed["global_step"] == 20
            assert resumed["iterations"] == full[like]["iterations"] == 10
            for a, b in zip(_weights(resumed), _weights(full[like])):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        # the accumulation did act: its run is not the one-pass run
        assert any(not np.allclose(a, b, rtol=1e-3) for a, b in zip(
            _weights(full["passes"]), _weights(full["plain"])))


def test_sharded_mixed_float16_resumes_exactly_and_an_unsharded_run_reads_its_checkpoint(
        resume):
    """mixed_float16 around the sharded Adam: the loss scaler skips the first steps
    (its scale halves) before the stop at step 11, so a resume that lost the scale, its
    step counter or the update count would skip again and part from the uninterrupted
    run. Resumed sharded, and resumed unsharded from a copy of the same checkpoint, both
    end where the uninterrupted sharded run does."""
    for r in (0, 1):
        full = resume["full"][r]["variants"]["sharded_mixed"]
        assert full["loss_scale"] < 2.0**15 and full["iterations"] < full["global_step"]
        for name in ("sharded_mixed", "mixed_from_sharded"):
            resumed = resume["resumed"][r]["variants"][name]
            assert resumed["start_step"] == 11 and resumed["global_step"] == 20, name
            for key in ("loss_scale", "scale_steps", "iterations"):
                assert resumed[key] == full[key], (name, key)
            exact = name == "sharded_mixed"  # unsharded: the sums in another order
            for a, b in zip(_weights(resumed), _weights(full)):
                np.testing.assert_allclose(a, b, rtol=1e-5 if exact else 1e-4,
                                           atol=1e-6 if exact else 1e-5, err_msg=name)
    text = resume["proc"].stdout + resume["proc"].stderr
    assert "not an exact resume" not in text
    assert f"resumed from {resume['aside'].parent / 'split' / 'ckpt-mixed_from_sharded'}" in text


def test_the_sharded_mixed_float16_checkpoint_is_in_the_unsharded_format(resume):
    """The last checkpoint the sharded run wrote and the one the unsharded run wrote at
    the same step hold the same names, shapes and (up to summation order) values: the
    scaler's scale and counter, the inner Adam's moments, full size, one per variable."""
    import tensorflow as tf  # only here: the other tests need no TensorFlow

    split = resume["aside"].parent / "split"
    sharded, unsharded = (str(split / folder / "ckpt-00000020" / "state")
                          for folder in ("ckpt-sharded_mixed", "ckpt-mixed_from_sharded"))
    names = dict(tf.train.list_variables(sharded))
    assert names == dict(tf.train.list_variables(unsharded))
    assert "optimizer/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE" in names
    weights = [s for n, s in names.items() if n.startswith("optimizer/_trainable_variables/")]
    slots = [s for n, s in names.items() if n.startswith("optimizer/inner_optimizer/_variables/")]
    assert len(weights) == 4 and sorted(slots) == sorted(weights * 2)  # Adam: 2 kinds, full
    a, b = tf.train.load_checkpoint(sharded), tf.train.load_checkpoint(unsharded)
    for name in names:
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_allclose(a.get_tensor(name), b.get_tensor(name), rtol=1e-4,
                                       atol=1e-5, err_msg=name)


def test_resume_with_a_different_world_size_rescales_the_learning_rate(resume):
    aside = resume["aside"]
    proc = run_job("python", 1, [WORKER, "resume", str(aside), "--max-iteration", "13"])
    (single,) = read_ranks(aside, 1)
    assert single["start_step"] == 11 and single["global_step"] == 13
    assert single["lr"] == pytest.approx(0.01)
    assert ("checkpoint written by 2 ranks, resuming on 1: learning rate 0.02 -> 0.01 "
            "(linear scaling)") in proc.stderr
