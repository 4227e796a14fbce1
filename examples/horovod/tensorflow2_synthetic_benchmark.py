"""Horovod's synthetic-benchmark idiom on Keras 3: a Keras Applications model on random
images, a ``DistributedGradientTape`` step, ``broadcast_variables`` after the first batch,
and images/s per rank and in total.

Horovod 0.28.1's own benchmark stops at its first step on TensorFlow >= 2.16
(``'Variable' object has no attribute 'ref'``); this one runs with the import changed to
``hvdtrain.tensorflow`` and ``opt.variables`` (a property in Keras 3). Run with
``horovodrun -np 2 python examples/horovod/tensorflow2_synthetic_benchmark.py``.
"""
import argparse
import json
import os
import timeit

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow as hvd  # was: import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="ResNet50", help="model to benchmark")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=10)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--out", default=None, help="write rank<R>.json and rank<R>.npz")
args = parser.parse_args()

hvd.init()
if not args.no_cuda:
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

model = getattr(keras.applications, args.model)(
    weights=None, input_shape=(args.image_size, args.image_size, 3))
opt = keras.optimizers.SGD(0.01)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
device = "GPU" if tf.config.list_logical_devices("GPU") and not args.no_cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")

benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(lambda: benchmark_step(first_batch=False),
                         number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

img_sec_mean, img_sec_conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
    f"+-{hvd.size() * img_sec_conf:.1f}")

if args.out:
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"),
             *[v.numpy() for v in model.trainable_variables])
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"size": hvd.size(), "img_sec": float(img_sec_mean)}, f)
