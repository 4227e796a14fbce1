"""TensorLayer's MNIST MLP on a Fashion-MNIST subset with ``strategy="parameter_server"``.

Runs on every task of a ``scripts/launch_ps.py`` job; ps and worker tasks serve inside
``Trainer(...)``, the master trains and writes ``result.json`` to OUT_DIR.

Usage: ps_mnist.py OUT_DIR [--examples N] [--epochs E] [--batch-size B]
       [--ps-exit-after S]   (ps task 0 exits with code 7 S seconds into training)
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


class CountBatches(hvdtrain.Callback):
    """Counts the hooks the Trainer calls (the same loop runs every backend)."""

    can_stop = False

    def __init__(self) -> None:
        self.calls = {"train_begin": 0, "batch_end": 0, "epoch_end": 0, "train_end": 0}

    def on_train_begin(self, logs=None):
        self.calls["train_begin"] += 1

    def on_train_batch_end(self, batch, logs=None):
        self.calls["batch_end"] += 1

    def on_epoch_end(self, epoch, logs=None):
        self.calls["epoch_end"] += 1

    def on_train_end(self, logs=None):
        self.calls["train_end"] += 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--examples", type=int, default=12000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--ps-exit-after", type=float, default=None)
    p.add_argument("--no-lr-scaling", action="store_true")
    p.add_argument("--log-dir", default=None, help="TensorBoard scalars (the master writes)")
    p.add_argument("--strategy", default="parameter_server",
                   help="'horovod' runs the same model data-parallel, for comparison")
    args = p.parse_args()

    spec = hvdtrain.TaskSpec() or hvdtrain.TaskSpecDef()
    started = Path(args.out_dir) / "training_started"
    if args.ps_exit_after is not None and spec.is_ps() and spec.index == 0:
        def exit_during_training():
            while not started.exists():
                time.sleep(0.1)
            time.sleep(args.ps_exit_after)
            os._exit(7)
        threading.Thread(target=exit_during_training, daemon=True).start()
    keras.utils.set_random_seed(0)
    x_train, y_train, x_val, y_val, x_test, y_test = datasets.load_fashion_mnist_dataset(
        shape=(-1, 784), download=False)
    x_train, y_train = x_train[:args.examples], y_train[:args.examples]
    x_val, y_val = x_val[:2000], y_val[:2000]
    build_training_func, build_validation_func = mnist.make_build_functions((0.1, 0.2, 0.2))
    seen = CountBatches()
    trainer = hvdtrain.Trainer(
        mnist.to_dataset(x_train, y_train), build_training_func, keras.optimizers.Adam,
        {"learning_rate": 1e-3}, batch_size=args.batch_size, log_step_size=50,
        validation_dataset=mnist.to_dataset(x_val, y_val),
        build_validation_func=build_validation_func, num_epochs=args.epochs,
        shuffle_buffer_size=10000, seed=0, strategy=args.strategy,
        scaling_learning_rate=not args.no_lr_scaling, log_dir=args.log_dir, callbacks=[seen])
    # Only the master gets here: ps and worker tasks serve inside Trainer(...).
    t0 = time.perf_counter()
    if args.ps_exit_after is not None:
        for _ in range(5):
            trainer.train_on_batch()
        trainer.join()
        started.parent.mkdir(parents=True, exist_ok=True)
        started.write_text("5 rounds done\n")
    history = trainer.train_and_validate_to_end(validate_step_size=10**9)
    validation = {k[len("val_"):]: v[-1] for k, v in history.history.items() if k.startswith("val_")}
    seconds = time.perf_counter() - t0
    test = mnist.to_dataset(x_test, y_test)  # the network reads its variables from the PS
    logits, evaluated = trainer.predict(test, batch_size=1000), trainer.evaluate(test, 1000)
    result = {
        "task": spec.tf_config()["task"], "size": trainer.size, "global_step": trainer.global_step,
        "steps_per_epoch": trainer.steps_per_epoch, "total_steps": getattr(trainer, "total_steps", None),
        "worker_steps": trainer.worker_steps,
        "optimizer_iterations": int(trainer.optimizer.iterations.numpy()),
        "learning_rate": float(trainer.optimizer.learning_rate.numpy()),
        "validation": validation, "test_accuracy": float(np.mean(logits.argmax(-1) == y_test)),
        "evaluate": evaluated,
        "variable_devices": getattr(trainer, "variable_devices", {}), "train_seconds": seconds,
        "tf_version": tf.__version__, "callback": seen.calls,
    }
    if trainer.rank != 0:
        return
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"validation {validation} test accuracy {result['test_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
