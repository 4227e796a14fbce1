"""Trains the same model sharded and unsharded (Trainer and fit); writes rank<R>.json.

Usage: sharded_worker.py OUT_DIR [STEPS]
For Adam and AdamW (weight decay), each front door trains twice from the same start and
data, once with ``shard_optimizer=True``: the test compares the final weights and the
optimizer-state bytes on each rank.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
import hvdtrain.keras  # noqa: E402
from hvdtrain.horovod import sharded  # noqa: E402
from trainer_worker import regression_data  # noqa: E402  (the same data as the Trainer's tests)

OPTIMIZERS = {"adam": (keras.optimizers.Adam, {"learning_rate": 0.01}),
              "adamw": (keras.optimizers.AdamW, {"learning_rate": 0.01, "weight_decay": 0.05})}


def build_regression(x, y):
    # 99 + 10 entries: two buckets for the Trainer (bucket_mb=3e-5), one for fit
    net = keras.Sequential([keras.layers.Dense(9, activation="tanh"),
                            keras.layers.Dense(1)], name="net")
    pred = net(x)
    return net, keras.ops.mean(keras.ops.square(pred - y)), {}


def trainer_run(name, shard, steps):
    keras.utils.set_random_seed(7 + hvdtrain.rank())  # rank 0's start is broadcast
    x, y = regression_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    cls, args = OPTIMIZERS[name]
    t = hvdtrain.Trainer(ds, build_regression, cls, dict(args), batch_size=8,
                         scaling_learning_rate=False, num_epochs=10_000,
                         max_iteration=steps * hvdtrain.size(), log_step_size=10_000,
                         strategy=hvdtrain.Horovod(shard_optimizer=shard, bucket_mb=3e-5))
    t.train_to_end()
    return {"weights": [w.tolist() for w in t.training_network.get_weights()],
            "steps": t.global_step, "state_bytes": sharded.state_bytes(t.optimizer)}


def fit_run(name, shard, steps):
    keras.utils.set_random_seed(7)
    x, y = regression_data()
    r, n = hvdtrain.rank(), hvdtrain.size()
    x, y = x[r::n], y[r::n]
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(9, activation="tanh"),
                              keras.layers.Dense(1)])
    cls, args = OPTIMIZERS[name]
    opt = hvdtrain.DistributedOptimizer(cls(**args), shard_optimizer=shard)  # one bucket
    model.compile(optimizer=opt, loss="mse")
    per_epoch = len(x) // 8
    model.fit(x, y, batch_size=8, epochs=-(-steps // per_epoch), shuffle=False, verbose=0,
              callbacks=[hvdtrain.keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    return {"weights": [w.tolist() for w in model.get_weights()],
            "steps": int(opt.iterations.numpy()), "state_bytes": sharded.state_bytes(opt)}


def main():
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    hvdtrain.init()
    out = {"rank": hvdtrain.rank(), "size": hvdtrain.size()}
    for door, run in (("trainer", trainer_run), ("fit", fit_run)):
        for name in OPTIMIZERS:
            for shard in (False, True):
                out[f"{door}/{name}/{'sharded' if shard else 'plain'}"] = run(name, shard, steps)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
