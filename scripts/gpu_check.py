"""What the GPU check proves beyond speed: Horovod's collectives on GPU tensors agree with
the same collectives on the CPU, and the Trainer and ``hvdtrain.tensorflow.keras`` ``fit``
train on the GPU, with and without XLA.

Run by ``scripts/gpu_check.sh`` (one process per GPU under ``horovodrun`` when there are
several). Rank 0 writes one JSON object to ``--out``: each check's name, whether it passed,
and what it measured. ``--allow-cpu`` runs the same checks on the CPU (how the tests run
this script on machines without a GPU); without it, a process that sees no GPU fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


def _device_of(tensor) -> str:
    return "GPU" if "GPU" in tensor.device.upper() else "CPU"


def check_collectives(device: str) -> dict:
    """All-reduce, broadcast and all-gather of tensors on ``device`` against the CPU's."""
    import numpy as np
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    rank, size = hvd.rank(), hvd.size()
    found = {}
    for dtype in (tf.float32, tf.float16):
        with tf.device("/CPU:0"):
            x_cpu = tf.cast(tf.random.stateless_normal([4096, 64], seed=[rank, 7]), dtype)
        with tf.device(device):
            x_dev = tf.identity(x_cpu)
            results = {"allreduce": hvd.allreduce(x_dev, op=hvd.Sum),
                       "broadcast": hvd.broadcast(x_dev, root_rank=0),
                       "allgather": hvd.allgather(x_dev)}
        with tf.device("/CPU:0"):
            expected = {"allreduce": hvd.allreduce(x_cpu, op=hvd.Sum),
                        "broadcast": hvd.broadcast(x_cpu, root_rank=0),
                        "allgather": hvd.allgather(x_cpu)}
        for name, value in results.items():
            diff = float(np.max(np.abs(value.numpy().astype(np.float64)
                                       - expected[name].numpy().astype(np.float64))))
            tolerance = 1e-5 if dtype == tf.float32 else 1e-2
            found[f"{name}_{dtype.name}"] = {"max_abs_diff": diff, "on": _device_of(value),
                                             "ok": diff <= tolerance * size}
    if size > 1:  # the all-gather really holds every rank's rows
        with tf.device(device):
            gathered = hvd.allgather(tf.fill([2, 1], float(rank)))
        found["allgather_ranks"] = {"ok": gathered.numpy()[::2, 0].tolist()
                                    == [float(r) for r in range(size)]}
    return found


def _synthetic(n: int = 2048):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 32)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def _mlp():
    import keras

    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(2)])


def check_trainer(jit: bool) -> dict:
    """The Trainer on this rank's device: the loss falls and the weights live there."""
    import keras

    import hvdtrain

    model = _mlp()
    trainer = hvdtrain.Trainer(
        _synthetic(), model=model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam, optimizer_args={"learning_rate": 1e-2},
        batch_size=64, num_epochs=3, log_step_size=10**9, progress_bar=False,
        jit_compile=jit, seed=0)
    losses = []
    while not trainer.session.should_stop():
        logs = trainer.train_on_batch()
        if logs is not None:
            losses.append(float(logs["loss"]))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    return {"steps": trainer.global_step, "first_loss": first, "last_loss": last,
            "on": _device_of(model.trainable_variables[0].value), "ok": last < 0.8 * first}


def check_fit(jit: bool) -> dict:
    """``hvdtrain.tensorflow.keras`` ``fit`` as a Horovod script writes it."""
    import keras

    import hvdtrain.tensorflow.keras as hvd

    model = _mlp()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2 * hvd.size()))
    model.compile(optimizer=opt, jit_compile=jit,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = _synthetic().shard(hvd.size(), hvd.rank()).batch(64)
    history = model.fit(data, epochs=3, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    loss = history.history["loss"]
    return {"epoch_losses": loss, "on": _device_of(model.trainable_variables[0].value),
            "ok": loss[-1] < 0.8 * loss[0]}


def main(argv=None) -> int:
    """Runs every check on this rank; rank 0 writes the results; exits 1 if one failed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="rank 0 writes the JSON results here")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run on the CPU where no GPU is visible instead of failing")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.horovod import runtime

    hvdtrain.init()
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus and not args.allow_cpu:
        raise SystemExit(f"rank {hvdtrain.rank()} sees no GPU (pass --allow-cpu to run on CPU)")
    device = "/GPU:0" if gpus else "/CPU:0"
    checks: dict[str, Callable[[], dict]] = {
        "collectives": lambda: check_collectives(device),
        "trainer": lambda: check_trainer(False), "trainer_xla": lambda: check_trainer(True),
        "fit": lambda: check_fit(False), "fit_xla": lambda: check_fit(True)}
    results = {"device": device, "ranks": hvdtrain.size(), "build": runtime.build_info(),
               "gpus": [tf.config.experimental.get_device_details(g).get("device_name", g.name)
                        for g in gpus]}
    passed = True
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            found = check()
            ok = all(v.get("ok", True) for v in found.values() if isinstance(v, dict)) \
                and found.get("ok", True)
        except Exception as err:  # noqa: BLE001 - every check runs; the failure is reported
            found, ok = {"error": f"{type(err).__name__}: {err}",
                         "traceback": traceback.format_exc()[-3000:]}, False
        found.update(passed=ok, seconds=round(time.perf_counter() - start, 2))
        results[name] = found
        passed = passed and ok
        if hvdtrain.rank() == 0:
            print(f"gpu_check: {name}: {'ok' if ok else 'FAILED'} "
                  f"({found.get('error', found.get('on', ''))})", flush=True)
    if hvdtrain.rank() == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
