"""Trainers on sub-communicators of one ``mpirun`` job (``hvdtrain.init(comm=...)``).

Usage: subcomm_worker.py SCENARIO OUT_DIR
Scenarios:
  sweep  (4 ranks) two sub-jobs, world ranks 0, 2 and 1, 3, each trains with its own
         learning rate; even ranks pass an mpi4py communicator (``COMM_WORLD.Split``, which
         every rank calls), odd ranks a list of world ranks: one job covers both forms.
  alone  (2 ranks) sub-job 0's training on a plain 2-rank job, for the parity check.
  fail   (4 ranks) world rank 3 raises mid-training while sub-job 0 keeps training; it
         writes ``fault_time`` (epoch seconds) to OUT_DIR just before.
  gloo   (horovodrun --gloo) init(comm=[0]), which Gloo would ignore: refused.
Each rank writes ``world<R>.json`` to OUT_DIR.
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.horovod import runtime, watchdog  # noqa: E402

LEARNING_RATES = (0.05, 0.02)  # per sub-job (colour = world rank % 2)


def regression_data(n=256, d=10, seed=123):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    w = rng.normal(size=(d, 1)).astype("float32")
    return x, (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")


def build(x, y):
    net = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}


def make_trainer(out, colour, world_rank, **kw):
    """The sub-job's Trainer: rank 0 alone gets the checkpoint and log dirs (Horovod's
    idiom); the learning rate is scaled by the sub-job's size."""
    keras.utils.set_random_seed(1000 + world_rank)  # differs per rank until the broadcast
    chief = hvdtrain.rank() == 0
    x, y = regression_data()
    return hvdtrain.Trainer(
        tf.data.Dataset.from_tensor_slices((x, y)), build, keras.optimizers.SGD,
        {"learning_rate": LEARNING_RATES[colour]}, batch_size=16, log_step_size=4,
        checkpoint_dir=os.path.join(out, f"ckpt{colour}") if chief else None,
        log_dir=os.path.join(out, f"logs{colour}") if chief else None, **kw)


def weights(trainer):
    return [w.tolist() for w in trainer.training_network.get_weights()]


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    if scenario == "gloo":
        hvdtrain.init(comm=[0])
        return
    from mpi4py import MPI  # initializes MPI before Horovod, as users do
    world = MPI.COMM_WORLD
    world_rank = world.Get_rank()
    colour = 0 if scenario == "alone" else world_rank % 2
    if scenario == "alone":
        hvdtrain.init()
    else:
        sub = world.Split(colour, world_rank)  # a collective of the world: every rank calls it
        if colour == 0:
            hvdtrain.init(comm=sub)
        else:
            hvdtrain.init(comm=[r for r in range(world.Get_size()) if r % 2 == 1])
    hvdtrain.init()  # what the Trainer's backend does: keeps the sub-communicator
    result = {"world_rank": world_rank, "rank": hvdtrain.rank(), "size": hvdtrain.size(),
              "local_size": runtime.local_size(), "host_processes": runtime.host_processes(),
              "world_ranks": runtime.world_ranks()}
    if scenario == "fail":
        t = make_trainer(out, colour, world_rank, num_epochs=1000)
        for step in range(10 ** 6):
            t.train_on_batch()
            if world_rank == 3 and step == 3:
                with open(os.path.join(out, "fault_time"), "w") as f:
                    f.write(str(time.time()))
                raise RuntimeError("sub-job 1 fails on purpose")
        return
    t = make_trainer(out, colour, world_rank, num_epochs=2)
    result["watchdog"] = watchdog.endpoint()
    t.train_to_end()
    result.update(weights=weights(t), global_step=t.global_step,
                  lr=float(t.optimizer.learning_rate), loss=t.history.history["loss"])
    # A second Trainer on the same directories resumes from the sub-job's own checkpoint.
    again = make_trainer(out, colour, world_rank, num_epochs=2)
    result.update(restored_from=again.restored_from, restored_weights=weights(again),
                  restored_step=again.global_step)
    with open(os.path.join(out, f"world{world_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
