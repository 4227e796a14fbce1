"""Training runs that go wrong on purpose, for the fault tests.

Usage: fault_worker.py SCENARIO OUT_DIR [DOOR]
Scenarios: raise, sigkill, sigstop (rank 1 freezes), nan, nan_skip, models, bad_records,
and the fault matrix's (``scripts/fault_matrix.py``): the faults ``FAULTS`` through the
front door DOOR (``trainer``, the default; ``fit`` via ``hvdtrain.tensorflow.keras``;
``tape``, a ``DistributedGradientTape`` loop), each made by rank 1 as its step 5 begins,
and ``clean``, the run without a fault (run on a fault's OUT_DIR, the Trainer resumes from
its checkpoint). The rank that causes the fault writes ``fault_time`` (epoch seconds) to
OUT_DIR just before, so the test can time the exit; every rank writes ``pid<R>``. For
``cut`` rank 1 writes ``cut_ready`` instead and the steps from there on take
``PACE_S`` longer, so the link can be cut from outside mid-training.

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
FAULTS = ("raise", "sigkill", "sigstop", "cut", "nan_record", "inf_record")
DOORS = ("trainer", "fit", "tape")
RECORDS = {"nan_record": np.nan, "inf_record": np.inf}
EPOCHS, STEPS_PER_EPOCH, PACE_S = 3, 32, 0.2


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


def write(out, name, value):
    with open(os.path.join(out, name), "w") as f:
        f.write(str(value))


def before_step(out, fault, step, rank):
    """What a matrix cell does before its step ``step`` (from 1) on ``rank``: rank 1 makes
    ``fault`` at FAULT_STEP (a bad record is in its data already: it only notes the time;
    a cut is made from outside once ``cut_ready`` exists)."""
    if fault == "cut" and step >= FAULT_STEP:
        time.sleep(PACE_S)
    if step != FAULT_STEP or rank != 1 or fault == "clean":
        return
    write(out, "fault_pid", os.getpid())
    write(out, "cut_ready" if fault == "cut" else "fault_time", time.time())
    if fault == "raise":
        raise RuntimeError(f"boom at step {FAULT_STEP}")
    if fault in ("sigkill", "sigstop"):
        os.kill(os.getpid(), signal.SIGSTOP if fault == "sigstop" else signal.SIGKILL)


class Fault(hvdtrain.Callback):
    can_stop = False

    def __init__(self, out, action):
        self.out, self.action = out, action

    def on_train_batch_begin(self, batch, logs=None):
        before_step(self.out, self.action, batch + 1, self.trainer.rank)


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


def tape_step(hvd, model, opt):
    """Horovod's idiom: the model built and broadcast, and a traced step that wraps a new
    DistributedGradientTape each call."""
    model.build((None, 4))
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return step


def tape_with(value):
    import hvdtrain.tensorflow as hvd
    x, y = arrays(8 * (FAULT_STEP - 1) + 3, value)
    model, opt = relu_net(), keras.optimizers.SGD(0.01)
    step = tape_step(hvd, model, opt)

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


def tanh_net():
    return keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


def rank_arrays(fault):
    """Rank's own 256 rows, for fit and the tape loop (rank 1's batch 5 poisoned for a
    record fault)."""
    value = RECORDS.get(fault)
    x, y = arrays(None if value is None else 8 * (FAULT_STEP - 1) + 3, value)
    return x[:256], y[:256]


def trainer_cell(fault, out):
    value = RECORDS.get(fault)
    t = hvdtrain.Trainer(data(None if value is None else FAULT_STEP, value), build(8), "sgd",
                         {"learning_rate": 0.01}, callbacks=[Fault(out, fault)], batch_size=8,
                         log_step_size=1, checkpoint_dir=os.path.join(out, "ckpt"),
                         save_checkpoint_steps=2, num_epochs=EPOCHS)
    while not t.should_stop():
        t.train_on_batch()
    return t.training_network


def fit_cell(fault, out):
    import hvdtrain.tensorflow.keras as hvd

    class FitFault(keras.callbacks.Callback):
        step = 0

        def on_train_batch_begin(self, batch, logs=None):
            FitFault.step += 1
            before_step(out, fault, FitFault.step, hvd.rank())

    x, y = rank_arrays(fault)
    model = tanh_net()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    model.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), FitFault()])
    return model


def tape_cell(fault, out):
    import hvdtrain.tensorflow as hvd
    x, y = rank_arrays(fault)
    model, opt = tanh_net(), keras.optimizers.SGD(0.01)
    step = tape_step(hvd, model, opt)

    for k in range(EPOCHS * STEPS_PER_EPOCH):
        before_step(out, fault, k + 1, hvd.rank())
        i = 8 * (k % STEPS_PER_EPOCH)
        step(x[i:i + 8], y[i:i + 8])
    return model


def matrix_cell(fault, out, door):
    """One cell of the fault matrix; ``clean`` writes each rank's final weights."""
    if door == "trainer":
        hvdtrain.init()
    else:  # a Horovod script's own start-up, through the drop-in
        import hvdtrain.tensorflow as hvd
        hvd.init()
    write(out, f"pid{hvdtrain.rank()}", os.getpid())
    keras.utils.set_random_seed(0)  # a restart's run and the uninterrupted one start alike
    model = {"trainer": trainer_cell, "fit": fit_cell, "tape": tape_cell}[door](fault, out)
    with open(os.path.join(out, f"rank{hvdtrain.rank()}.json"), "w") as f:
        json.dump({"weights": [w.tolist() for w in model.get_weights()]}, f)


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if scenario in FAULTS + ("clean",) or len(sys.argv) > 3:
        door = sys.argv[3] if len(sys.argv) > 3 else "trainer"
        if door not in DOORS or scenario not in FAULTS + ("clean",):
            raise SystemExit(f"usage: fault_worker.py FAULT OUT_DIR [DOOR]: FAULT one of "
                             f"{FAULTS + ('clean',)}, DOOR one of {DOORS}")
        return matrix_cell(scenario, out, door)
    hvdtrain.init()
    if scenario == "bad_records":
        return bad_records(out)
    # Checkpoints every 2 steps where a test checks what survives the fault.
    ckpt = None if scenario == "nan_skip" else os.path.join(out, "ckpt")
    kw = dict(batch_size=8, log_step_size=1, checkpoint_dir=ckpt, save_checkpoint_steps=2,
              num_epochs=3)
    if scenario in ("nan", "nan_skip"):
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
