"""TensorLayer's MNIST MLP on a Fashion-MNIST subset with ``strategy="parameter_server"``.

Runs on every task of a ``scripts/launch_ps.py`` job; ps and worker tasks serve inside
``Trainer(...)``, the master trains and writes ``result.json`` to OUT_DIR.

Usage: ps_mnist.py OUT_DIR [--examples N] [--epochs E] [--batch-size B]
       [--ps-exit-after S]   (ps task 0 exits with code 7 after S seconds)
"""
import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import mnist  # noqa: E402  (the example's model and build functions)

import hvdtrain  # noqa: E402
from hvdtrain import datasets  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--examples", type=int, default=12000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--ps-exit-after", type=float, default=None)
    args = p.parse_args()

    spec = hvdtrain.TaskSpec()
    if args.ps_exit_after and spec.is_ps() and spec.index == 0:
        threading.Timer(args.ps_exit_after, lambda: os._exit(7)).start()
    keras.utils.set_random_seed(0)
    x_train, y_train, x_val, y_val, x_test, y_test = datasets.load_fashion_mnist_dataset(
        shape=(-1, 784), download=False)
    x_train, y_train = x_train[:args.examples], y_train[:args.examples]
    x_val, y_val = x_val[:2000], y_val[:2000]
    build_training_func, build_validation_func = mnist.make_build_functions((0.1, 0.2, 0.2))
    trainer = hvdtrain.Trainer(
        mnist.to_dataset(x_train, y_train), build_training_func, keras.optimizers.Adam,
        {"learning_rate": 1e-3}, batch_size=args.batch_size, log_step_size=50,
        validation_dataset=mnist.to_dataset(x_val, y_val),
        build_validation_func=build_validation_func, num_epochs=args.epochs,
        shuffle_buffer_size=10000, seed=0, strategy="parameter_server")
    # Only the master gets here: ps and worker tasks serve inside Trainer(...).
    t0 = time.perf_counter()
    validation = dict(trainer.train_and_validate_to_end(validate_step_size=10**9))
    seconds = time.perf_counter() - t0
    logits = trainer.training_network.predict(x_test, batch_size=1000, verbose=0)
    result = {
        "task": spec.tf_config()["task"], "size": trainer.size, "global_step": trainer.global_step,
        "steps_per_epoch": trainer.steps_per_epoch, "total_steps": trainer.total_steps,
        "worker_steps": int(trainer._applied.numpy()),
        "optimizer_iterations": int(trainer.optimizer.iterations.numpy()),
        "learning_rate": float(trainer.optimizer.learning_rate.numpy()),
        "validation": validation, "test_accuracy": float(np.mean(logits.argmax(-1) == y_test)),
        "variable_devices": trainer.variable_devices, "train_seconds": seconds,
        "tf_version": tf.__version__,
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"validation {validation} test accuracy {result['test_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
