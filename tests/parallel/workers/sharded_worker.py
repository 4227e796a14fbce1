"""Trains the same model sharded and unsharded (Trainer and fit); writes rank<R>.json.

Usage: sharded_worker.py OUT_DIR [STEPS [COMBOS COMBO_STEPS [FIT_COMBOS]]]
For Adam and AdamW (weight decay), each front door trains twice from the same start and
data, once with ``shard_optimizer=True``: the test compares the final weights and the
optimizer-state bytes on each rank. So does the Trainer for each of COMBOS (names of
:data:`COMBOS`, comma-separated; default none), COMBO_STEPS steps: clipping, local
accumulation, fp16 compression and mixed precision's loss scaling; and ``fit`` for each
of FIT_COMBOS (the same names; their optimizer and ``hvdtrain.DistributedOptimizer``
settings, default none), for at least COMBO_STEPS batches.
"""
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
import hvdtrain.keras  # noqa: E402
from hvdtrain.horovod import sharded_state  # noqa: E402
from hvdtrain.internals import keras_private  # noqa: E402
from trainer_worker import regression_data  # noqa: E402  (the same data as the Trainer's tests)

OPTIMIZERS = {"adam": (keras.optimizers.Adam, {"learning_rate": 0.01}),
              "adamw": (keras.optimizers.AdamW, {"learning_rate": 0.01, "weight_decay": 0.05})}
#: name -> (optimizer class, its arguments, hvdtrain.Horovod's, the Trainer's); one bucket
#: of all 109 entries (fewer collectives a step: a shorter job), the first kernel split
#: between the ranks' slices
ONE = {"bucket_mb": 1e-3}
COMBOS = {
    "clipnorm": (keras.optimizers.Adam, {"learning_rate": 0.01, "clipnorm": 0.05}, ONE, {}),
    "global_clipnorm": (keras.optimizers.SGD, {"learning_rate": 0.05, "momentum": 0.5,
                                               "global_clipnorm": 0.05}, ONE, {}),
    "passes": (keras.optimizers.SGD, {"learning_rate": 0.05, "momentum": 0.5},
               {"backward_passes_per_step": 2, **ONE}, {}),
    "fp16": (keras.optimizers.Adam, {"learning_rate": 0.01}, {"compression": "fp16", **ONE},
             {}),
    "mixed": (keras.optimizers.Adam, {"learning_rate": 0.01}, ONE,
              {"mixed_precision": "mixed_float16"}),
}


def build_regression(x, y):
    # 99 + 10 entries: two buckets for the Trainer (bucket_mb=3e-5), one for fit
    net = keras.Sequential([keras.layers.Dense(9, activation="tanh"),
                            keras.layers.Dense(1)], name="net")
    pred = net(x)
    return net, keras.ops.mean(keras.ops.square(pred - y)), {}


class StateLines(logging.Handler):
    """The Trainer's "optimizer state: ..." log lines (rank 0 logs them)."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        if record.getMessage().startswith("optimizer state:"):
            self.lines.append(record.getMessage())


def trainer_run(name, shard, steps):
    keras.utils.set_random_seed(7 + hvdtrain.rank())  # rank 0's start is broadcast
    lines = StateLines()
    logging.getLogger("hvdtrain").addHandler(lines)
    x, y = regression_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    cls, args, how, extra = COMBOS[name] if name in COMBOS else (*OPTIMIZERS[name], {}, {})
    t = hvdtrain.Trainer(ds, build_regression, cls, dict(args), batch_size=8,
                         scaling_learning_rate=False, num_epochs=10_000,
                         max_iteration=steps * hvdtrain.size(), log_step_size=10_000,
                         strategy=hvdtrain.Horovod(**{"shard_optimizer": shard, "bucket_mb": 3e-5,
                                                      **how}),
                         **extra)
    t.train_to_end()
    logging.getLogger("hvdtrain").removeHandler(lines)
    return {"weights": [w.tolist() for w in t.training_network.get_weights()],
            "steps": t.global_step, "state_bytes": sharded_state.state_bytes(t.optimizer),
            "state_log": lines.lines}


def fit_run(name, shard, steps):
    keras.utils.set_random_seed(7)
    x, y = regression_data()
    r, n = hvdtrain.rank(), hvdtrain.size()
    x, y = x[r::n], y[r::n]
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(9, activation="tanh"),
                              keras.layers.Dense(1)])
    cls, args, how = (*COMBOS[name][:3],) if name in COMBOS else (*OPTIMIZERS[name], {})
    opt = hvdtrain.DistributedOptimizer(cls(**args), shard_optimizer=shard, **how)  # one bucket
    model.compile(optimizer=opt, loss="mse")
    per_epoch = len(x) // 8
    model.fit(x, y, batch_size=8, epochs=-(-steps // per_epoch), shuffle=False, verbose=0,
              callbacks=[hvdtrain.keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    return {"weights": [w.tolist() for w in model.get_weights()],
            "steps": int(opt.iterations.numpy()), "state_bytes": sharded_state.state_bytes(opt),
            # the batches (backward passes) applied; steps counts the updates
            "passes": int(keras_private.passes_counter(opt).numpy())}


def main():
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    combos = [c for c in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if c]
    combo_steps = int(sys.argv[4]) if len(sys.argv) > 4 else steps
    fit_combos = [c for c in (sys.argv[5] if len(sys.argv) > 5 else "").split(",") if c]
    hvdtrain.init()
    out = {"rank": hvdtrain.rank(), "size": hvdtrain.size()}
    for door, run, names in (("trainer", trainer_run, [*OPTIMIZERS, *combos]),
                             ("fit", fit_run, [*OPTIMIZERS, *fit_combos])):
        for name in names:
            for shard in (False, True):
                out[f"{door}/{name}/{'sharded' if shard else 'plain'}"] = run(
                    name, shard, combo_steps if name in COMBOS else steps)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
