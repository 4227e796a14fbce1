"""hvdtrain's lines reach the user's logging configured after a Trainer exists, for
tests/parallel/test_logging.py.

Usage: logging_worker.py OUT_DIR
Each rank logs a line through the ``hvdtrain`` logger (stderr: no configuration yet),
builds a Trainer, then calls ``logging.basicConfig(filename=OUT_DIR/rank<R>.log)``, trains
4 steps logging every step, and logs a warning.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hvdtrain  # noqa: E402  (first: the user's configuration comes later)

import logging  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 4


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    hvdtrain.init()
    rank, size = hvdtrain.rank(), hvdtrain.size()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = hvdtrain.Trainer(ds, model=model, loss="mse", optimizer="sgd",
                               optimizer_args={"learning_rate": 0.01}, batch_size=8,
                               log_step_size=1, max_iteration=STEPS * size,
                               save_checkpoint_secs=None, progress_bar=False)
    log = logging.getLogger("hvdtrain")
    log.info("before the user's configuration")
    log.warning("rank %d warns before the user's configuration", rank)
    logging.basicConfig(filename=os.path.join(out, f"rank{rank}.log"), level=logging.INFO,
                        format="%(levelname)s %(name)s %(message)s")
    trainer.train_to_end()
    log.warning("rank %d finished at step %d", rank, trainer.global_step)


if __name__ == "__main__":
    main()
