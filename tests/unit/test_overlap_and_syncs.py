"""Gradient buckets, the step flags read only at logging steps, and steps_per_execution
(one process; the 2-rank parity of buckets and steps_per_execution is in
tests/parallel/test_trainer_parallel.py)."""
import logging
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import Trainer, options
from hvdtrain.horovod import buckets


class _Var:
    def __init__(self, *shape, dtype="float32"):
        self.shape, self.dtype = shape, dtype


def test_buckets_start_from_the_last_layer_and_hold_every_gradient_once():
    variables = [_Var(784, 800), _Var(800), _Var(800, 800), _Var(800), _Var(800, 10), _Var(10)]
    plan = buckets.plan(variables, 1.0)
    assert plan == [[5, 4, 3, 2], [1, 0]]  # closed once a bucket holds >= 1 MiB
    assert buckets.plan(variables, math.inf) == [[5, 4, 3, 2, 1, 0]]  # one all-reduce
    tiny = buckets.plan(variables, 1e-9)
    assert tiny == [[i] for i in reversed(range(6))]
    assert buckets.tensor_bytes(_Var(10, 10, dtype="float16")) == 200
    assert buckets.describe(variables, plan).startswith("2 gradient bucket(s), last layers first: 2.48 MiB, 2.40 MiB")
    assert buckets.describe([_Var(10)], [[0]]).endswith("first: 40 bytes")


def test_the_first_bucket_closes_early_so_the_exchange_starts_in_the_backward_pass():
    # 784-800-800-10 (5.1 MB): with the default 25 MiB it would all be one bucket, sent
    # only once the backward pass ends; the first closes at FIRST_BUCKET_MB instead.
    variables = [_Var(784, 800), _Var(800), _Var(800, 800), _Var(800), _Var(800, 10), _Var(10)]
    assert buckets.FIRST_BUCKET_MB == 1.0
    assert buckets.plan(variables, 25.0) == [[5, 4, 3, 2], [1, 0]]
    assert buckets.plan(variables, 25.0, first_bucket_mb=0.01) == [[5, 4], [3, 2, 1, 0]]
    assert buckets.plan(variables, 0.01) == [[5, 4], [3, 2], [1, 0]]  # bucket_mb the smaller
    wide = [_Var(1024, 1024) for _ in range(12)]  # 4 MiB each, 48 MiB
    assert buckets.plan(wide, 25.0) == [[11], [10, 9, 8, 7, 6, 5, 4], [3, 2, 1, 0]]


@pytest.mark.parametrize("kwargs, match", [
    (dict(bucket_mb=0), "bucket_mb must be a positive number of MiB"),
    (dict(bucket_mb=True), "bucket_mb must be a positive number of MiB"),
    (dict(steps_per_execution=0), "steps_per_execution must be a positive integer, got 0"),
])
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        options.parse("horovod", **kwargs)


def test_defaults_do_not_read_back_every_step():
    parsed = options.parse("horovod")
    assert parsed.logging.log_step_size == options.DEFAULT_LOG_STEP_SIZE > 1
    assert parsed.reduction.bucket_mb == options.DEFAULT_BUCKET_MB
    assert parsed.steps_per_execution == 1


def _data(bad_rows=()):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    x[list(bad_rows)] = np.nan
    y = x.sum(axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((x, y))


def _build(x, y):
    net = keras.Sequential([keras.layers.Dense(1, kernel_initializer="ones")])
    return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}


def _trainer(ds, **kwargs):
    return Trainer(ds, _build, "sgd", {"learning_rate": 0.01}, batch_size=16, **kwargs)


def test_stop_policy_raises_at_the_next_read_with_the_weights_from_before_the_bad_step():
    t = _trainer(_data(bad_rows=[2 * 16 + 1]), nan_policy="stop")  # step 3's batch
    for _ in range(5):  # no read between logging steps: steps 3..5 run on
        t.train_on_batch()
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 3 on rank\(s\) \[0\]"):
        t.should_stop() or t.train_to_end()
    clean = _trainer(_data(), max_iteration=2)
    clean.train_to_end()
    for a, b in zip(t.training_network.get_weights(), clean.training_network.get_weights()):
        np.testing.assert_array_equal(a, b)  # steps 3.. applied nothing


def test_skip_policy_counts_every_skipped_step_and_warns_once_per_read(caplog):
    t = _trainer(_data(bad_rows=[2 * 16, 4 * 16]), nan_policy="skip", log_step_size=6)
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        t.train_to_end()
    assert t.skipped_steps == 2 and t.global_step == 8
    warned = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(warned) == 1 and "step 3" in warned[0] and "1 more step(s) skipped" in warned[0]


def test_steps_per_execution_stops_at_the_epoch_end_and_logs_at_crossed_log_steps(caplog):
    calls = []
    with caplog.at_level(logging.INFO, logger="hvdtrain"):
        t = _trainer(_data(), steps_per_execution=3, log_step_size=4, num_epochs=2)
        while not t.should_stop():
            t.train_on_batch()
            calls.append(t.global_step)
    assert calls == [3, 6, 8, 11, 14, 16]  # 8 steps an epoch: 3 + 3 + 2
    logged = [r.getMessage().split(":")[0] for r in caplog.records
              if r.getMessage().startswith("step ")]
    assert logged == ["step 6", "step 8", "step 14", "step 16"]
    # The first line names the backend and whether Horovod reduces on GPUs (NCCL).
    first = caplog.records[0].getMessage()
    assert first.startswith("strategy='horovod': 1 ranks, 0 GPU(s)") and "GPU operations: " in first
    assert len(t.history.epoch) == 2


def test_no_read_from_the_device_between_logging_steps():
    from hvdtrain.internals.tensorflow_private import count_host_reads
    t = _trainer(_data(), log_step_size=5, num_epochs=2)
    t.train_on_batch()  # traces the step
    with count_host_reads() as between:
        for _ in range(3):  # steps 2..4
            t.train_on_batch()
    with count_host_reads() as at_log:
        t.train_on_batch()  # step 5: the flags and the logs are read
    assert between.count == 0
    assert at_log.count >= 2


def test_timeline_summary_finds_an_exchange_that_starts_before_the_backward_pass_ends(tmp_path):
    from hvdtrain_bench import timeline
    names = {1: "HorovodGroupedAllreduce_last_layers_1of1", 2: "HorovodGroupedAllreduce_first_1of1",
             3: "HorovodAllgather"}
    events = [{"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}}
              for p, n in names.items()]
    for step, t0 in enumerate((0, 100_000, 200_000)):
        # step 2: the last layers' bucket is exchanged while the first layer's is computed
        late = 4_000 if step == 2 else 10
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t0, "pid": 1},
                   {"ph": "B", "name": "ALLREDUCE", "ts": t0 + 500, "pid": 1},
                   {"ph": "E", "ts": t0 + 1500, "pid": 1},
                   {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t0 + late, "pid": 2},
                   {"ph": "B", "name": "ALLREDUCE", "ts": t0 + late + 900, "pid": 2},
                   {"ph": "B", "name": "NEGOTIATE_ALLGATHER", "ts": t0, "pid": 3}]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(map(str, events)).replace("'", '"') + ",")  # left open
    got = timeline.summary(timeline.load_events(path))
    assert got["steps"] == 2 and got["tensors"] == 2  # the first (tracing) step left out
    assert got["share_overlapping"] == 0.5  # step 2 only
    assert got["median_first_exchange_us"] == 500
    assert got["median_phase_us"] == {"ALLREDUCE": 1000}  # the only phase that ended
