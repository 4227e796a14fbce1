"""Checks hvdtrain.tensorflow's Horovod API on real ranks; writes rank<R>.json.

Run on 2 ranks: ``dropin_worker.py OUT_DIR``. Each check records what it saw; the test
compares the ranks and the values.
"""
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow as hvd
import hvdtrain.tensorflow.keras as hvk
import init_settings

out_dir = sys.argv[1]
own_sets = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(process_sets=own_sets)
settings = init_settings.set_after_init(hvd.local_rank())
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size, "mpi": bool(hvd.mpi_enabled()),
          "gloo": bool(hvd.gloo_enabled()), "local_size": hvd.local_size(),
          "cross_size": hvd.cross_size(), "homogeneous": bool(hvd.is_homogeneous())}


def model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(3)])


x_all = np.random.RandomState(0).rand(8 * size, 6).astype("float32")
x = x_all[rank::size]


def grads_with(**tape_kwargs):
    net = model(7)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(net(x)))
    tape = hvd.DistributedGradientTape(tape, **tape_kwargs)
    return net, [g.numpy() for g in tape.gradient(loss, net.trainable_variables)]


# The tape's average equals the gradient of the whole batch, whatever the grouping.
net, plain = grads_with()
with tf.GradientTape() as tape:
    whole = tf.reduce_mean(tf.square(net(x_all)))
reference = [g.numpy() for g in tape.gradient(whole, net.trainable_variables)]
result["tape_vs_whole_batch"] = max(float(np.abs(a - b).max()) for a, b in zip(plain, reference))
for name, kwargs in {"num_groups": {"num_groups": 2},
                     "groups": {"groups": [net.trainable_variables[:2]]},
                     "predivide": {"gradient_predivide_factor": 2.0},
                     "fp16": {"compression": hvd.Compression.fp16},
                     "sum": {"op": hvd.Sum}}.items():
    _, got = grads_with(**kwargs)
    scale = size if name == "sum" else 1.0
    result[f"tape_{name}"] = max(float(np.abs(a - scale * b).max()) for a, b in zip(got, plain))

# A process set of this rank alone: the tape reduces over it only (the local gradient).
net = model(7)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(net(x)))
local_only = [g.numpy() for g in tape.gradient(loss, net.trainable_variables)]
_, got = grads_with(process_set=own_sets[rank])
result["tape_own_process_set"] = max(float(np.abs(a - b).max()) for a, b in zip(got, local_only))
result["own_set_size"] = own_sets[rank].size()

# Partial tape: the local layer's gradient stays this rank's own, divided by the size.
net = model(7)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(net(x)))
local_grads = [g.numpy() for g in tape.gradient(loss, net.trainable_variables)]
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(net(x)))
ptape = hvd.PartialDistributedGradientTape(tape, local_layers=[net.layers[1]])
partial = [g.numpy() for g in ptape.gradient(loss, net.trainable_variables)]
result["partial_local"] = max(float(np.abs(partial[i] - local_grads[i] / size).max())
                              for i in (2, 3))
result["partial_global"] = max(float(np.abs(partial[i] - plain[i]).max()) for i in (0, 1))

# Collectives: Horovod's own objects, Min/Max, objects, barrier, alltoall, reducescatter.
result["min"] = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Min).numpy())
result["max"] = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Max).numpy())
result["allgather_object"] = hvd.allgather_object({"r": rank})
result["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=size - 1)
hvd.barrier()
result["alltoall"] = hvd.alltoall(tf.constant([rank * 10 + i for i in range(size)])).numpy().tolist()
result["reducescatter"] = hvd.reducescatter(tf.ones([size * 2]), op=hvd.Sum).numpy().tolist()
result["join"] = int(hvd.join())
result["keras_allreduce"] = float(hvk.allreduce(np.float32(rank), op=hvd.Sum).numpy())

# broadcast_variables of Keras 3 variables, eagerly and inside tf.function.
net = model(100 + rank)
hvd.broadcast_variables(net.variables, root_rank=0)
result["broadcast_sum"] = float(sum(np.sum(v.numpy()) for v in net.variables))
net2 = model(200 + rank)


@tf.function
def broadcast_in_graph():
    hvd.broadcast_variables(net2.variables, root_rank=1)


broadcast_in_graph()
result["broadcast_graph_sum"] = float(sum(np.sum(v.numpy()) for v in net2.variables))

# The callback's local_variables stay each rank's own; the rest come from rank 0.
net3 = model(300 + rank)
net3.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
net3.layers[-1].bias.assign(np.full([3], float(rank + 1), "float32"))  # differs by rank
callback = hvk.callbacks.BroadcastGlobalVariablesCallback(
    0, local_variables=[net3.layers[-1].bias])
callback.set_model(net3)
callback.on_train_begin()
result["local_kept_kernel_sum"] = float(np.sum(net3.layers[-1].kernel.numpy()))
result["local_kept_bias"] = net3.layers[-1].bias.numpy().tolist()

# Mismatched models: a clear error on every rank, not a hang.
odd = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5 + rank)])
try:
    hvd.broadcast_variables(odd.variables, root_rank=0)
    result["mismatch_error"] = None
except ValueError as err:
    result["mismatch_error"] = str(err)

# SyncBatchNormalization: statistics of the global batch.
keras.utils.set_random_seed(3)
bn = hvd.SyncBatchNormalization(momentum=0.0)
feats = np.random.RandomState(1).rand(4 * size, 3).astype("float32") * 5
out = bn(feats[rank::size], training=True).numpy()
result["sync_bn_moving_mean"] = bn.moving_mean.numpy().tolist()
result["sync_bn_global_mean"] = feats.mean(axis=0).tolist()
result["sync_bn_global_var"] = feats.var(axis=0).tolist()
result["sync_bn_moving_var"] = bn.moving_variance.numpy().tolist()

result["global_set_size"] = hvd.global_process_set.size()

# DistributedOptimizer with backward_passes_per_step=2: Horovod sums the passes.
net = model(11)
opt = hvk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
before = [v.numpy() for v in net.trainable_variables]
for _ in range(2):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(net(x)))
    opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(11)(x_all)))
net_ref = model(11)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(net_ref(x_all)))
ref_grads = tape.gradient(loss, net_ref.trainable_variables)
result["bpps_sum"] = max(float(np.abs((b - v.numpy()) - 2 * g.numpy()).max())
                         for b, v, g in zip(before, net.trainable_variables, ref_grads))

# load_model: a saved model comes back with a distributed optimizer.
path = os.path.join(out_dir, f"saved{rank}.keras")
net = model(5)
net.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
net.fit(x, x[:, :3], epochs=1, verbose=0)
net.save(path)
loaded = hvk.load_model(path)
result["loaded_optimizer"] = type(loaded.optimizer).__name__
loaded.fit(x, x[:, :3], epochs=1, verbose=0,
           callbacks=[hvk.callbacks.BroadcastGlobalVariablesCallback(0)])
result["loaded_sum"] = float(sum(np.sum(v) for v in loaded.get_weights()))

result["settings"] = {**settings, **init_settings.read_back()}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
