"""One small training run, started by ``horovodrun`` or by ``hvdtrain.ray.run``, for
tests/parallel/test_ray.py: both launchers run the same :func:`train`.

Usage:
  ray_worker.py horovod OUT_DIR        (under horovodrun -np 2) every rank writes
                                        OUT_DIR/rank<R>.json
  ray_worker.py ray ADDRESS OUT_DIR    the Ray driver: runs train() on 2 Ray workers of the
                                        cluster at ADDRESS and writes OUT_DIR/ray.json (the
                                        workers' results, rank 0 first)
  ray_worker.py fail ADDRESS OUT_DIR   the Ray driver of a job whose rank 1 raises while
                                        rank 0 waits for it in a barrier: writes
                                        OUT_DIR/error.json (the error the driver got)
Each result: rank, size, global_step and the final weights.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hvdtrain  # noqa: E402  (before TensorFlow: it shares the cores between the ranks)


def train() -> dict:
    """Two epochs of a tiny regression on an in-memory dataset, fixed seed, no dropout."""
    import keras
    import numpy as np
    import tensorflow as tf

    def build(x, y):
        net = keras.Sequential([keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
        return net, keras.ops.mean(keras.ops.square(net(x) - y)), {}

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    keras.utils.set_random_seed(1)  # the same initial weights under every launcher
    trainer = hvdtrain.Trainer(data, build, "sgd", {"learning_rate": 0.05}, batch_size=8,
                               num_epochs=2, save_checkpoint_secs=None)
    while not trainer.should_stop():
        trainer.train_on_batch()
    return {"rank": hvdtrain.rank(), "size": hvdtrain.size(),
            "global_step": int(trainer.global_step),
            "weights": [w.tolist() for w in trainer.training_network.get_weights()]}


def fail() -> None:
    """Rank 1 raises; rank 0 waits in a barrier that rank 1 never joins."""
    hvdtrain.init()
    if hvdtrain.rank() == 1:
        raise ValueError("rank 1 failed on purpose")
    hvdtrain.dist.barrier()


def main():
    mode = sys.argv[1]
    if mode == "horovod":
        out = sys.argv[2]
        result = train()
        path = os.path.join(out, f"rank{result['rank']}.json")
    elif mode == "ray":
        import hvdtrain.ray

        address, out = sys.argv[2], sys.argv[3]
        result = hvdtrain.ray.run(train, num_workers=2, address=address, timeout_s=150)
        path = os.path.join(out, "ray.json")
    elif mode == "fail":
        import time

        import hvdtrain.ray

        address, out = sys.argv[2], sys.argv[3]
        start = time.monotonic()
        try:
            hvdtrain.ray.run(fail, num_workers=2, address=address, timeout_s=120)
            result = {"error": None}
        except Exception as err:  # noqa: BLE001 - the test reads what came back
            result = {"error": f"{type(err).__name__}: {err}", "is_value_error":
                      isinstance(err, ValueError), "seconds": time.monotonic() - start}
        path = os.path.join(out, "error.json")
    else:
        raise SystemExit(f"unknown mode {mode}")
    with open(path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
