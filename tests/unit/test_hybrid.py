"""Hybrid parallelism: stage splitting, bad input, and a real 2-device run in a subprocess."""
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
from hvdtrain.horovod import hybrid

pytestmark = pytest.mark.timeout(300)
WORKER = Path(__file__).resolve().parents[1] / "parallel" / "workers" / "hybrid_worker.py"
TWO_CPUS = ["/device:CPU:0", "/device:CPU:1"]
SPEC = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))


# ---------------------------------------------------------------- balanced split
@pytest.mark.parametrize("counts, k, starts", [
    ([176, 136, 9], 2, [1]),
    ([100, 0, 100], 2, [2]),         # a layer without parameters stays with the one before
    ([5, 5, 5, 5], 2, [2]),
    ([5, 5, 5, 5], 4, [1, 2, 3]),
    ([7, 1, 1, 1, 7], 3, [1, 4]),
    ([3, 4], 1, []),
])
def test_balanced_split(counts, k, starts):
    assert hybrid.balanced_split(counts, k) == starts


def test_balanced_split_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        k = int(rng.integers(1, n + 1))
        counts = [int(c) for c in rng.integers(0, 50, size=n)]
        starts = hybrid.balanced_split(counts, k)
        assert len(starts) == k - 1 and starts == sorted(set(starts))
        assert all(0 < s < n for s in starts)

        def largest(cut):
            b = [0, *cut, n]
            return max(sum(counts[i:j]) for i, j in zip(b, b[1:]))
        best = min(largest(c) for c in itertools.combinations(range(1, n), k - 1))
        assert largest(starts) == best, (counts, k, starts)


def test_balanced_split_needs_a_layer_per_stage():
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 non-empty stages"):
        hybrid.balanced_split([1, 1], 3)


# ---------------------------------------------------------------- the argument
def test_resolve_forms():
    assert hybrid.resolve(None) is None
    assert hybrid.resolve(2) == hvdtrain.ModelParallel(devices=2)
    mp = hybrid.resolve(["/CPU:0", "/CPU:1"])
    assert mp.devices == ("/CPU:0", "/CPU:1") and mp.num_stages == 2 and mp.split is None
    given = hvdtrain.ModelParallel(devices=3, split=[1, 4])
    assert hybrid.resolve(given) is given and given.split == (1, 4)


@pytest.mark.parametrize("value, error, match", [
    (True, TypeError, "model_parallel must be None, a number"),
    ("/GPU:0", TypeError, "model_parallel must be None, a number"),
    (0, ValueError, "devices must be at least 1, got 0"),
    ([], ValueError, "non-empty list of device names"),
    (["/CPU:0", 1], ValueError, "non-empty list of device names"),
    (hvdtrain.ModelParallel, TypeError, "model_parallel must be None"),
])
def test_resolve_rejects(value, error, match):
    with pytest.raises(error, match=match):
        hybrid.resolve(value)


def test_model_parallel_rejects_bad_split():
    with pytest.raises(TypeError, match="split must be a list of layer indices, got"):
        hvdtrain.ModelParallel(devices=2, split=[1.5])
    with pytest.raises(TypeError, match="split must be a list of layer indices"):
        hvdtrain.ModelParallel(devices=2, split=1)


@pytest.mark.parametrize("mp, gpus", [
    (None, 1), (3, 3), (["/GPU:0", "/GPU:1"], 2), (["/CPU:0", "/CPU:1"], 1), (["/GPU:0", "/CPU:0"], 1)])
def test_gpus_per_rank(mp, gpus):
    assert hybrid.gpus_per_rank(hybrid.resolve(mp)) == gpus


# ---------------------------------------------------------------- devices (this process: 1 CPU)
@pytest.fixture
def started():
    tf.constant(0.0)  # the runtime has started: logical devices are fixed from here
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("these cases expect a process without GPUs (their errors name CPU devices)")
    assert len(tf.config.list_logical_devices("CPU")) == 1


def test_local_devices_canonical(started):
    assert hybrid.local_devices(hybrid.resolve(["cpu:0"])) == ["/device:CPU:0"]
    assert hybrid.local_devices(hybrid.resolve(1)) == ["/device:CPU:0"]


@pytest.mark.parametrize("devices, match", [
    (2, r"model_parallel=2 needs 2 local devices, but this rank has 1 CPU device\(s\): make "
        r"logical CPU devices with hvdtrain.hybrid.use_cpu_devices\(2\)"),
    (["/CPU:0", "/CPU:5"], "model_parallel device '/CPU:5' does not exist on this rank"),
    (["/GPU:0"], "model_parallel device '/GPU:0' does not exist on this rank"),
    (["/CPU:0", "/device:CPU:0"], "lists device '/device:CPU:0' more than once"),
    (["CPU"], "must name a device type and number"),
    (["/job:worker/task:1/device:CPU:0"], "must be a local device of this rank"),
    (["/nonsense:x:y:z"], "is not a device name like '/GPU:0'"),
])
def test_local_devices_rejects(started, devices, match):
    with pytest.raises(ValueError, match=match):
        hybrid.local_devices(hybrid.resolve(devices))


def test_use_cpu_devices_after_start(started):
    assert hybrid.use_cpu_devices(1) == ["/device:CPU:0"]
    with pytest.raises(RuntimeError, match=r"cannot make 3 logical CPU devices: TensorFlow already "
                                           r"started with 1; call hvdtrain.hybrid.use_cpu_devices"):
        hybrid.use_cpu_devices(3)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        hybrid.use_cpu_devices(0)


# ---------------------------------------------------------------- stages
def dense(n=4, **kw):
    return keras.layers.Dense(n, **kw)


def plan(model, devices=TWO_CPUS, **mp):
    return hybrid.plan(model, hvdtrain.ModelParallel(devices=len(devices), **mp), devices, SPEC)


def test_plan_sequential_balanced_builds_on_the_host():
    model = keras.Sequential([dense(32), keras.layers.Dropout(0.1), dense(2), dense(1)])
    network, stages = plan(model)
    assert network is model and model.built
    assert [len(s.layers) for s in stages] == [2, 2]      # 160 | 66 + 3 parameters
    assert [s.device for s in stages] == TWO_CPUS
    assert {v.value.device for v in model.variables} == {"/job:localhost/replica:0/task:0/device:CPU:0"}


def test_plan_explicit_split_and_list_of_stages():
    layers = [dense(), dense(), dense(), dense(1)]
    _, stages = plan(keras.Sequential([keras.Input((4,)), *layers]), split=[3])
    assert [s.layers for s in stages] == [tuple(layers[:3]), (layers[3],)]
    first, head = keras.Sequential([dense(), dense()]), dense(1)
    network, stages = plan([first, head])
    assert isinstance(network, keras.Sequential) and network.layers == [first, head]
    assert [s.layers for s in stages] == [(first,), (head,)]
    assert stages[0].variables == first.variables


@pytest.mark.parametrize("make, error, match", [
    (lambda: [dense(), dense(), dense(1)], ValueError,
     r"model has 3 stages but model_parallel gives 2 device\(s\)"),
    (lambda: [dense(), "relu"], TypeError, r"model\[1\] must be a Keras layer or model \(a stage\)"),
    (lambda: [dense(), keras.Sequential([])], ValueError, r"model\[1\] is an empty stage"),
    (lambda: keras.Sequential([dense(1)]), ValueError,
     r"model has 1 layer\(s\), too few for 2 stages"),
    (lambda: keras.Sequential([]), ValueError, "model is an empty keras.Sequential"),
    (lambda: keras.Model(*(lambda i: (i, dense(1)(i)))(keras.Input((4,)))), TypeError,
     "model_parallel needs model= as a keras.Sequential .* got Functional"),
])
def test_plan_rejects_models(make, error, match):
    with pytest.raises(error, match=match):
        plan(make())


@pytest.mark.parametrize("split", [[0], [3], [2, 1], [2, 2], [1]])
def test_plan_rejects_splits(split):
    devices = TWO_CPUS + ["/device:CPU:2"] if split in ([2, 1], [2, 2], [1]) else TWO_CPUS
    with pytest.raises(ValueError, match=r"split must be \d increasing layer indices in 1..2"):
        plan(keras.Sequential([dense(), dense(), dense(1)]), devices, split=split)


def test_plan_rejects_split_for_a_list_and_shared_variables():
    with pytest.raises(ValueError, match="split applies to a keras.Sequential model"):
        plan([dense(), dense(1)], split=[1])
    shared = dense()
    with pytest.raises(ValueError, match=r"variable .*kernel is shared by stages 0 and 1: put the "
                                         "layers that share it in one stage"):
        plan(keras.Sequential([keras.Input((4,)), shared, shared]))


def test_trainer_rejects_model_parallel_without_model(started, dataset, build):
    with pytest.raises(ValueError, match="model_parallel needs model=... .* the build-function "
                                         "path builds one graph"):
        hvdtrain.Trainer(dataset, build, "sgd", {"learning_rate": 0.1}, model_parallel=1)
    with pytest.raises(ValueError, match=r"model_parallel only work\(s\) with strategy='horovod'"):
        hvdtrain.Trainer(dataset, build, "sgd", {"learning_rate": 0.1}, strategy="mirrored",
                         model_parallel=2)
    with pytest.raises(ValueError, match=r"model_parallel=2 needs 2 local devices"):
        hvdtrain.Trainer(dataset, model=keras.Sequential([dense(), dense(2)]),
                         loss="sparse_categorical_crossentropy", optimizer="sgd",
                         optimizer_args={"learning_rate": 0.1}, model_parallel=2)


# ---------------------------------------------------------------- a real run on 2 devices
def test_two_devices_match_one_device_and_resume(tmp_path):
    """One process with 2 logical CPU devices: Sequential split over both (momentum SGD,
    an L2 regularizer in stage 0) against the same model on one device, then a resume."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(WORKER), "single", str(tmp_path), "--steps", "8"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "rank0.json").read_text())

    # Balanced by parameters: Dense(16) 176 | Dense(8) 136 + Dense(1) 9.
    assert r["split_layers"] == [1, 2]
    for i, stage in enumerate(r["stages"]):
        assert stage["device"] == TWO_CPUS[i] and len(stage["variables"]) == 2 * r["split_layers"][i]
        for path, device in stage["variables"].items():
            assert device.endswith(f"device:CPU:{i}"), (path, device)
    # The optimizer's slots live next to their variables.
    assert len(r["slots"]) == 6
    for path, device in r["slots"]:
        owner = [i for p, i in r["owner_of_path"].items() if p.replace("/", "_") in path]
        assert owner and device.endswith(f"device:CPU:{owner[0]}"), (path, device)
    # Every backward op runs on a stage's device (none left to the default placement).
    assert r["gradient_op_devices"] == TWO_CPUS

    for a, b in zip(r["initial_staged"], r["initial_plain"]):
        np.testing.assert_array_equal(a, b)
    for a, b, c in zip(r["staged"], r["plain"], r["initial_plain"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(a, c) for a, c in zip(r["staged"], r["initial_plain"]))

    # 4 steps, a checkpoint, a new Trainer resuming with stages on both devices, 4 more
    # steps: the same weights as 8 uninterrupted steps.
    assert r["resumed_from_step"] == 4 and r["resumed_step"] == 8
    for i, stage in enumerate(r["resumed_devices"]):
        assert all(d.endswith(f"device:CPU:{i}") for d in stage["variables"].values())
    for a, b in zip(r["resumed"], r["staged"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # That checkpoint restores into the same model trained without stages.
    assert r["restored_step"] == 8
    for a, b in zip(r["restored_without_stages"], r["resumed"]):
        np.testing.assert_array_equal(a, b)


def test_one_stage_trains_like_no_stages_and_checks_the_loss(started, dataset):
    def run(mp):
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((6,)), dense(8, activation="relu"), dense(2)])
        t = hvdtrain.Trainer(dataset, model=model, loss="sparse_categorical_crossentropy",
                             optimizer="adam", optimizer_args={"learning_rate": 0.01},
                             batch_size=16, log_step_size=1000, model_parallel=mp)
        t.train_to_end()
        return t
    staged, plain = run(["/CPU:0"]), run(None)
    assert staged.global_step == plain.global_step == 6
    assert isinstance(staged._program, hybrid.StagedProgram)
    for a, b in zip(staged.training_network.get_weights(), plain.training_network.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="loss must be a Keras loss, its name, or a callable"):
        hvdtrain.Trainer(dataset, model=keras.Sequential([dense(2)]), loss="no_such_loss",
                         optimizer="sgd", optimizer_args={"learning_rate": 0.1}, model_parallel=1)
