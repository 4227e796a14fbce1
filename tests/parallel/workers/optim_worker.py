"""Applies known per-rank gradients through DistributedOptimizer; writes rank<R>.json.

Usage: optim_worker.py OUT_DIR
Every case starts a variable at zero and applies plain SGD with learning rate 1, so the
variable afterwards is minus the reduced gradient, which the test recomputes by hand.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.horovod.optimizer import exchanger_of  # noqa: E402
import init_settings  # noqa: E402


def grads_for(rank, step=0):
    """The gradient rank ``rank`` feeds at ``step`` (test recomputes the same)."""
    base = np.array([[1.0, -4.0, 0.5, 3.0], [2.0, 0.25, -1.0, -6.0]], dtype="float32")
    return base * (rank + 1) + step * np.float32(0.5) * (-1) ** rank


def run_case(steps=1, **kwargs):
    var = keras.Variable(np.zeros((2, 4), "float32"), name="w")
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(1.0), **kwargs)
    opt.build([var])
    strategy = exchanger_of(opt).strategy
    low_rank = getattr(strategy, "state", None)
    q0 = low_rank.qs[0].numpy().tolist() if low_rank is not None else None

    @tf.function
    def step(g):
        opt.apply([g], [var])

    for s in range(steps):
        step(tf.constant(grads_for(hvdtrain.rank(), s)))
    out = {"w": np.asarray(var.numpy()).tolist()}
    residuals = getattr(exchanger_of(opt).strategy, "residuals", None)
    if residuals:
        out["residual"] = residuals[0].numpy().tolist()
    if low_rank is not None:
        out.update(q0=q0, error=low_rank.errors[0].numpy().tolist())
    return out


def main():
    out_dir = sys.argv[1]
    hvdtrain.init()
    settings = init_settings.set_after_init(hvdtrain.local_rank())
    results = {"rank": hvdtrain.rank(), "size": hvdtrain.size()}
    cases = {
        "average": dict(op="average"),
        "sum": dict(op="sum"),
        "fp16": dict(compression="fp16"),
        "topk": dict(compression="topk", compression_ratio=0.25, steps=2),
        "randomk": dict(compression="randomk", compression_ratio=0.5, steps=2),
        "accumulate": dict(backward_passes_per_step=2, steps=2),
        "powersgd": dict(compression=hvdtrain.compression.PowerSGD(rank=1, min_compression=0),
                         steps=3),
    }
    if os.environ.get("OMPI_COMM_WORLD_RANK") is not None:  # Adasum needs MPI
        cases["adasum"] = dict(op="adasum")
    for name, kw in cases.items():
        results[name] = run_case(**kw)
    results["settings"] = {**settings, **init_settings.read_back()}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
