"""Runs one Trainer scenario on every rank and writes ``rank<R>.json`` to the out dir.

Usage: trainer_worker.py SCENARIO[+SCENARIO...] OUT_DIR [--batch-size B]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402


def regression_data(n=256, d=10, seed=123):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    w = rng.normal(size=(d, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def build_regression(x, y):
    net = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)],
                           name="net")
    pred = net(x)
    loss = keras.ops.mean(keras.ops.square(pred - y))
    return net, loss, {"mae": keras.ops.mean(keras.ops.abs(pred - y))}


def weights_of(trainer):
    return [w.tolist() for w in trainer.training_network.get_weights()]


def scenario_parity(args, out):
    """Different seeds per rank, SGD, no LR scaling: final weights for the parity check."""
    keras.utils.set_random_seed(1000 + hvdtrain.rank())
    x, y = regression_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ckpt = os.path.join(args.out, "ckpt", f"rank{hvdtrain.rank()}")
    t = hvdtrain.Trainer(ds, build_regression, keras.optimizers.SGD, {"learning_rate": 0.05},
                         batch_size=args.batch_size, scaling_learning_rate=False, log_step_size=2,
                         num_epochs=2, checkpoint_dir=ckpt, jit_compile=args.jit,
                         timeline=os.path.join(args.out, "timeline.json"))
    out["initial_weights_seen"] = weights_of(t)
    losses = []
    while not t.session.should_stop():
        losses.append(float(t.train_on_batch()["loss"]))
    out["losses"] = losses
    out["weights"] = weights_of(t)
    out["global_step"] = t.global_step
    out["lr"] = float(t.optimizer.learning_rate)
    out["epoch_loss"] = t.history.history["loss"]
    # The same training with the exchange in many buckets, and with 3 steps per call.
    out["variants"] = {}
    for name, option in (("buckets", {"bucket_mb": 1e-6}), ("spe", {"steps_per_execution": 3})):
        keras.utils.set_random_seed(1000 + hvdtrain.rank())
        tv = hvdtrain.Trainer(ds, build_regression, keras.optimizers.SGD, {"learning_rate": 0.05},
                              batch_size=args.batch_size, scaling_learning_rate=False,
                              num_epochs=2, jit_compile=args.jit, **option)
        tv.train_to_end()
        out["variants"][name] = {"weights": weights_of(tv), "global_step": tv.global_step,
                                 "epoch_loss": tv.history.history["loss"]}
    # A second trainer with the default scaling, only to read its learning rate.
    t2 = hvdtrain.Trainer(ds, build_regression, keras.optimizers.SGD, {"learning_rate": 0.05},
                          batch_size=args.batch_size)
    out["scaled_lr"] = float(t2.optimizer.learning_rate)


def scenario_uneven(args, out):
    """Each rank holds a differently sized dataset, with known and unknown lengths."""
    r = hvdtrain.rank()
    x, y = regression_data(n=400 if r == 0 else 90)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    t = hvdtrain.Trainer(ds, build_regression, "sgd", {"learning_rate": 0.01}, batch_size=8,
                         log_step_size=1000)
    t.train_to_end()
    out["known_steps"] = t.global_step
    out["known_steps_per_epoch"] = t.steps_per_epoch
    # Unknown cardinality: filter keeps a rank-dependent number of elements.
    keep = 300 if r == 0 else 50
    ds2 = tf.data.Dataset.from_tensor_slices((x, y)).enumerate()
    ds2 = ds2.filter(lambda i, xy: i < keep)
    ds2 = ds2.map(lambda j, pair: pair)
    t2 = hvdtrain.Trainer(ds2, build_regression, "sgd", {"learning_rate": 0.01}, batch_size=8,
                          log_step_size=1000)
    out["unknown_steps_per_epoch"] = t2.steps_per_epoch
    t2.train_to_end()
    out["unknown_steps"] = t2.global_step
    out["weights"] = weights_of(t2)


def scenario_validation(args, out):
    """A validation metric must equal the mean over the whole validation set."""
    x, y = regression_data(n=64)
    vx, vy = regression_data(n=101, seed=7)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    vds = tf.data.Dataset.from_tensor_slices((vx, vy))

    def build_val(x, y, net):
        pred = net(x)
        return net, {"y_mean": keras.ops.mean(y), "mse": keras.ops.mean(keras.ops.square(pred - y))}

    t = hvdtrain.Trainer(ds, build_regression, "sgd", {"learning_rate": 0.01}, batch_size=8,
                         validation_dataset=vds, build_validation_func=build_val, log_step_size=1000)
    history = t.train_and_validate_to_end(validate_step_size=2)
    out["metrics"] = {k[len("val_"):]: v[-1] for k, v in history.history.items()
                      if k.startswith("val_")}
    pred = t.training_network.predict(vx, verbose=0)
    out["expected"] = {"y_mean": float(np.mean(vy)), "mse": float(np.mean((pred - vy) ** 2))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("out")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--jit", action="store_true", help="parity: Trainer(jit_compile=True)")
    p.add_argument("--case", default=None)
    p.add_argument("--max-iteration", type=int, default=10**9)
    p.add_argument("--epochs", type=int, default=2, help="passes of the compression scenario")
    p.add_argument("--variants", default="plain", help="resume: comma-separated RESUME_VARIANTS")
    args = p.parse_args()
    scenarios = args.scenario.split("+")  # "uneven+validation": one job, several checks
    # Only "parity" records Horovod's timeline: its writer thread polls all the time.
    hvdtrain.init(timeline="parity" in scenarios)
    out = {"rank": hvdtrain.rank(), "size": hvdtrain.size()}
    for scenario in scenarios:
        globals()[f"scenario_{scenario}"](args, out)
    out["threads"] = {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                      "inter": tf.config.threading.get_inter_op_parallelism_threads(),
                      "cores": len(os.sched_getaffinity(0))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump(out, f)
    return 0



#: --variants of the resume scenario: the Trainer's extra settings, each its own run
RESUME_VARIANTS = {
    "plain": {},
    # PowerSGD's error feedback and Q, compressed from the third exchange on
    "powersgd": {"compression": hvdtrain.compression.PowerSGD(rank=2, start_step=3)},
    # Adam's moments sharded over the ranks, saved gathered in the unsharded format
    "sharded": {"shard_optimizer": True},
    # the same under mixed_float16: a LossScaleOptimizer around the sharded Adam (its
    # scale and step counter checkpointed with the gathered moments)
    "sharded_mixed": {"shard_optimizer": True, "mixed_precision": "mixed_float16"},
    # unsharded mixed_float16, resumed from a copy of sharded_mixed's checkpoint (the
    # test copies it into ckpt-mixed_from_sharded before the resumed run)
    "mixed_from_sharded": {"mixed_precision": "mixed_float16"},
    # local accumulation over 2 passes: the stop at step 11 falls between them, so the
    # checkpoint holds the pending sum (averaged over the ranks), unsharded and sharded
    "passes": {"backward_passes_per_step": 2},
    "sharded_passes": {"shard_optimizer": True, "backward_passes_per_step": 2},
    # unsharded, resumed from a copy of sharded_passes's checkpoint
    "passes_from_sharded": {"backward_passes_per_step": 2},
}


def optimizer_state(optimizer) -> dict:
    """The counters a resume must carry: the update count and, under a loss scaler, its
    scale and its count of finite steps since the scale last changed."""
    state = {"iterations": int(optimizer.iterations.numpy())}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        state.update(loss_scale=float(optimizer.dynamic_scale.numpy()),
                     scale_steps=int(optimizer.step_counter.numpy()))
    return state


def scenario_resume(args, out):
    """Dropout, shuffling and Adam, checkpointed every 4 steps and at the stop (step 11 of
    an interrupted run: mid-epoch, between two periodic saves), up to --max-iteration;
    once per name in --variants (the first variant's results at the top level, each
    variant's under ``variants``)."""
    x, y = regression_data()

    def build(x, y):
        net = keras.Sequential([keras.layers.Dense(16, activation="tanh"),
                                keras.layers.Dropout(0.3), keras.layers.Dense(1)], name="net")
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}

    variants = args.variants.split(",")
    for name in variants:
        keras.utils.set_random_seed(5 + hvdtrain.rank())
        folder = "ckpt" if name == variants[0] else f"ckpt-{name}"
        t = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, y)), build,
                             keras.optimizers.Adam, {"learning_rate": 0.01}, batch_size=16,
                             num_epochs=4, shuffle_buffer_size=64, seed=3,
                             max_iteration=args.max_iteration,
                             checkpoint_dir=os.path.join(args.out, folder),
                             save_checkpoint_steps=4, log_step_size=1000,
                             **RESUME_VARIANTS[name])
        result = {"start_step": t.global_step, "lr": float(t.optimizer.learning_rate)}
        t.train_to_end()
        result.update(global_step=t.global_step, weights=weights_of(t),
                      **optimizer_state(t.optimizer))
        out.setdefault("variants", {})[name] = result
        if name == variants[0]:
            out.update(result)


def scenario_compression(args, out):
    """The MNIST-style MLP on a Fashion-MNIST subset with each gradient compression."""
    from hvdtrain import datasets

    x_tr, y_tr, _, _, x_te, y_te = datasets.load_fashion_mnist_dataset()
    x_tr, y_tr, x_te, y_te = x_tr[:12000], y_tr[:12000], x_te[:2000], y_te[:2000]

    def build(x, y):
        net = keras.Sequential([keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
        logits = net(x)
        return net, keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True)), {}

    for name, ratio in (("none", None), ("fp16", None), ("topk", 0.05), ("randomk", 0.5)):
        keras.utils.set_random_seed(0)
        t = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x_tr, y_tr)), build,
                             keras.optimizers.Adam, {"learning_rate": 1e-3}, batch_size=64,
                             compression=name, compression_ratio=ratio, log_step_size=10**6,
                             num_epochs=args.epochs, shuffle_buffer_size=4096, seed=1)
        t.train_to_end()
        logits = t.training_network.predict(x_te, verbose=0)
        out[name] = float(np.mean(np.argmax(logits, -1) == y_te))


def scenario_bad_input(args, out):
    """Every rank must raise the same clear error (and the job must end, not hang)."""
    x, y = regression_data(n=32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    blocker = os.path.join(args.out, "a-file")
    os.makedirs(args.out, exist_ok=True)
    open(blocker, "w").close()
    kwargs = {"adasum3": dict(op="adasum"),
              "topk_ratio": dict(compression="topk", compression_ratio=1.5),
              "no_learning_rate": dict(optimizer_args={"momentum": 0.9}),
              "unwritable_checkpoint_dir": dict(checkpoint_dir=os.path.join(blocker, "ckpt"))
              }[args.case]
    call = dict(training_dataset=ds, build_training_func=build_regression, optimizer="sgd",
                optimizer_args={"learning_rate": 0.1})
    call.update(kwargs)
    # The launcher ends the job as soon as one rank exits, so a slower rank could be killed
    # before it speaks: every rank records its error, and they leave together. A rank that
    # did not raise would enter the Trainer's collectives instead and stall the job.
    hvdtrain.dist.barrier()
    try:
        hvdtrain.Trainer(**call)
    except ValueError as err:
        with open(os.path.join(args.out, f"error-rank{hvdtrain.rank()}.txt"), "w") as f:
            f.write(f"{type(err).__name__}: {err}")
        hvdtrain.dist.barrier()
        raise


if __name__ == "__main__":
    sys.exit(main())
