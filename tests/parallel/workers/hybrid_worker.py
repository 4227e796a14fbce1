"""Hybrid-parallel Trainer scenarios on 2 logical CPU devices per process; every rank
writes ``rank<R>.json`` to the out dir.

Usage: hybrid_worker.py SCENARIO OUT_DIR [--batch-size B] [--steps N]

Scenarios:
    ranks      2-stage model given as a list of stages, ``model_parallel=2``, seeds per rank
    reference  the same network as one Sequential on one device (the parity baseline)
    single     one process: model_parallel vs none, devices of variables, slots and
               gradient ops, and a checkpoint resume with stages on several devices
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the scenarios run on 2 logical CPU devices, GPUs or not

import hvdtrain  # noqa: E402  (sets the thread variables before TensorFlow starts)
from hvdtrain.horovod import hybrid  # noqa: E402

hybrid.use_cpu_devices(2)  # before any op: the runtime starts with 2 CPU devices

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def regression_data(n=256, d=10, seed=123):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    w = rng.normal(size=(d, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def stages(seeded):
    """Two stages; seeded initializers make every call build the same weights."""
    init = (lambda i: keras.initializers.GlorotUniform(seed=i)) if seeded else (lambda i: "glorot_uniform")
    first = keras.Sequential([
        keras.layers.Dense(16, activation="tanh", kernel_initializer=init(1),
                           kernel_regularizer=keras.regularizers.L2(1e-2)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=init(2))], name="first")
    return [first, keras.layers.Dense(1, kernel_initializer=init(3), name="head")]


def sequential():
    """The same network as one built Sequential (three layers; built by its Input)."""
    first, head = stages(seeded=True)
    return keras.Sequential([keras.Input((10,)), *first.layers, head])


def weights(network):
    return [w.tolist() for w in network.get_weights()]


def stage_devices(trainer):
    """Per stage: its device and the devices of its floating-point variables."""
    return [{"device": s.device,
             "variables": {v.path: v.value.device for v in s.variables if "float" in str(v.dtype)}}
            for s in trainer._program.stages]


def trainer(ds, model, batch_size, steps, mp, optimizer=None, **kw):
    return hvdtrain.Trainer(ds, model=model, loss="mse",
                            optimizer=optimizer or keras.optimizers.SGD,
                            optimizer_args=None if optimizer else {"learning_rate": 0.05},
                            batch_size=batch_size, scaling_learning_rate=False, log_step_size=1000,
                            max_iteration=steps * hvdtrain.size(), model_parallel=mp, **kw)


def scenario_ranks(args, out):
    keras.utils.set_random_seed(1000 + hvdtrain.rank())
    t = trainer(regression_data(), stages(seeded=False), args.batch_size, args.steps, 2)
    out["initial_weights_seen"] = weights(t.training_network)
    out["stages"] = stage_devices(t)
    t.train_to_end()
    out["weights"] = weights(t.training_network)
    out["global_step"] = t.global_step


def scenario_reference(args, out):
    keras.utils.set_random_seed(1000)
    t = trainer(regression_data(), keras.Sequential(stages(seeded=False)), args.batch_size,
                args.steps, None)
    out["initial_weights_seen"] = weights(t.training_network)
    t.train_to_end()
    out["weights"] = weights(t.training_network)
    out["global_step"] = t.global_step


def momentum():
    return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def scenario_single(args, out):
    ds, b, n = regression_data(), args.batch_size, args.steps
    staged = trainer(ds, sequential(), b, n, 2, optimizer=momentum())
    out["split_layers"] = [len(s.layers) for s in staged._program.stages]
    out["initial_staged"] = weights(staged.training_network)
    out["stages"] = stage_devices(staged)
    owner = {}
    for i, s in enumerate(staged._program.stages):
        for v in s.variables:
            owner[v.path] = i
    staged.train_to_end()
    out["staged"] = weights(staged.training_network)
    out["slots"] = [[s.path, s.value.device] for s in staged.optimizer.variables
                    if "momentum" in s.path]
    out["owner_of_path"] = owner
    x, y = next(iter(ds.batch(b)))
    graph = staged._train_step.compiled.get_concrete_function(((x, y),), tf.constant(0.0)).graph
    out["gradient_op_devices"] = sorted({op.device for op in graph.get_operations()
                                         if op.name.startswith("gradient_tape")})

    plain = trainer(ds, sequential(), b, n, None, optimizer=momentum())
    out["initial_plain"] = weights(plain.training_network)
    plain.train_to_end()
    out["plain"] = weights(plain.training_network)

    ckpt = os.path.join(args.out, "ckpt")
    first = trainer(ds, sequential(), b, n // 2, 2, optimizer=momentum(), checkpoint_dir=ckpt)
    first.train_to_end()
    resumed = trainer(ds, sequential(), b, n, 2, optimizer=momentum(), checkpoint_dir=ckpt)
    out["resumed_from_step"] = int(resumed.global_step)
    out["resumed_devices"] = stage_devices(resumed)
    resumed.train_to_end()
    out["resumed"] = weights(resumed.training_network)
    out["resumed_step"] = resumed.global_step
    # The checkpoint written with stages restores into the same model without them.
    back = trainer(ds, sequential(), b, n, None, optimizer=momentum(), checkpoint_dir=ckpt)
    out["restored_without_stages"] = weights(back.training_network)
    out["restored_step"] = back.global_step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["ranks", "reference", "single"])
    p.add_argument("out")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    hvdtrain.init()
    out = {"rank": hvdtrain.rank(), "size": hvdtrain.size()}
    globals()[f"scenario_{args.scenario}"](args, out)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
