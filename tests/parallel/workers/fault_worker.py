"""Training runs that go wrong on purpose, for the fault tests.

Usage: fault_worker.py SCENARIO OUT_DIR
Scenarios: raise, sigkill, sigstop (rank 1 freezes), nan, nan_skip, models, bad_records.
The rank that causes the fault writes ``fault_time`` (epoch seconds) to OUT_DIR just
before, so the test can time the exit.

``bad_records``: one NaN or Inf feature in rank 1's in-memory data (a ReLU MLP, whose
loss can stay finite), once per front door in one job: the Trainer (NaN, Inf), a
``DistributedGradientTape`` loop (NaN) and ``fit`` through ``hvdtrain.tensorflow.keras``
(Inf, then NaN); each must stop at the poisoned step. The first four are caught and
recorded in ``bad_records.json``; the last ends the job.
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402

FAULT_STEP = 5


def build(width):
    def build_fn(x, y):
        net = keras.Sequential([keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(1)])
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}
    return build_fn


def arrays(poison_row=None, value=np.nan):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if poison_row is not None and hvdtrain.rank() == 1:
        x[poison_row, 0] = value
    return x, y


def data(poison_step=None, value=np.nan):
    # rank 1's shard holds every 2nd example; batch 8 -> its step k uses rows 16(k-1)+1...
    row = None if poison_step is None else 16 * (poison_step - 1) + 1
    return tf.data.Dataset.from_tensor_slices(arrays(row, value))


class Fault(hvdtrain.Callback):
    can_stop = False

    def __init__(self, out, action):
        self.out, self.action = out, action

    def on_train_batch_begin(self, batch, logs=None):
        if batch + 1 == FAULT_STEP and self.trainer.rank == 1:
            with open(os.path.join(self.out, "fault_time"), "w") as f:
                f.write(str(time.time()))
            with open(os.path.join(self.out, "fault_pid"), "w") as f:
                f.write(str(os.getpid()))
            if self.action == "raise":
                raise RuntimeError(f"boom at step {FAULT_STEP}")
            os.kill(os.getpid(), signal.SIGSTOP if self.action == "sigstop" else signal.SIGKILL)


def relu_net():
    return keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


def weights_state(weights):
    return {"finite": all(bool(np.isfinite(w).all()) for w in weights),
            "sum": float(sum(float(np.sum(w)) for w in weights))}


def trainer_with(value):
    def build_fn(x, y):
        net = relu_net()
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}
    t = hvdtrain.Trainer(data(FAULT_STEP, value), build_fn, "sgd", {"learning_rate": 0.01},
                         batch_size=8, log_step_size=1, num_epochs=1)
    try:
        while not t.should_stop():
            t.train_on_batch()
    except FloatingPointError as e:
        return {"error": str(e), **weights_state(t.training_network.get_weights())}
    return {"error": None}


def fit_with(value):
    import hvdtrain.tensorflow.keras as hvd
    x, y = arrays(8 * (FAULT_STEP - 1) + 3, value)  # the 5th batch of rank 1's own data
    model = relu_net()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    try:
        model.fit(x[:256], y[:256], batch_size=8, epochs=1,
                  shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    except FloatingPointError as e:
        return {"error": str(e), "iterations": int(model.optimizer.iterations.numpy()),
                **weights_state(model.get_weights())}
    return {"error": None}


def tape_with(value):
    import hvdtrain.tensorflow as hvd
    x, y = arrays(8 * (FAULT_STEP - 1) + 3, value)
    model, opt = relu_net(), keras.optimizers.SGD(0.01)
    model.build((None, 4))
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for k in range(10):
        try:
            step(x[8 * k:8 * k + 8], y[8 * k:8 * k + 8])
        except tf.errors.InvalidArgumentError as e:
            return {"error": str(e), "steps_done": k, **weights_state(model.get_weights())}
    return {"error": None}


def bad_records(out):
    found = {"trainer_nan": trainer_with(np.nan), "trainer_inf": trainer_with(np.inf),
             "tape_nan": tape_with(np.nan), "fit_inf": fit_with(np.inf)}
    with open(os.path.join(out, f"bad_records{hvdtrain.rank()}.json"), "w") as f:
        json.dump(found, f)
    with open(os.path.join(out, "fault_time"), "w") as f:
        f.write(str(time.time()))
    import hvdtrain.tensorflow.keras as hvd
    x, y = arrays(8 * (FAULT_STEP - 1) + 3)
    model = relu_net()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    model.fit(x[:256], y[:256], batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    hvdtrain.init()
    if scenario == "bad_records":
        return bad_records(out)
    # Checkpoints every 2 steps where a test checks what survives the fault.
    ckpt = None if scenario == "nan_skip" else os.path.join(out, "ckpt")
    kw = dict(batch_size=8, log_step_size=1, checkpoint_dir=ckpt, save_checkpoint_steps=2,
              num_epochs=3)
    if scenario in ("raise", "sigkill", "sigstop"):
        t = hvdtrain.Trainer(data(), build(8), "sgd", {"learning_rate": 0.01},
                             callbacks=[Fault(out, scenario)], **kw)
    elif scenario in ("nan", "nan_skip"):
        with open(os.path.join(out, "fault_time"), "w") as f:
            f.write(str(time.time()))
        t = hvdtrain.Trainer(data(poison_step=FAULT_STEP), build(8), "sgd",
                             {"learning_rate": 0.01},
                             nan_policy="stop" if scenario == "nan" else "skip", **kw)
    elif scenario == "models":
        with open(os.path.join(out, "fault_time"), "w") as f:
            f.write(str(time.time()))
        t = hvdtrain.Trainer(data(), build(8 + hvdtrain.rank()), "sgd", {"learning_rate": 0.01},
                             **kw)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    while not t.should_stop():
        t.train_on_batch()
    weights = [w.tolist() for w in t.training_network.get_weights()]
    with open(os.path.join(out, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump({"global_step": t.global_step, "skipped_steps": t.skipped_steps,
                   "weights": weights}, f)


if __name__ == "__main__":
    main()
