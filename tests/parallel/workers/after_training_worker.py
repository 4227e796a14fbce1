"""The Trainer after training, with Keras metrics and callbacks, for
tests/parallel/test_after_training.py.

Usage: after_training_worker.py SCENARIO OUT_DIR [STRATEGY]
Scenarios:
  all     Fashion-MNIST (1200 training, 1001 test images): trains up to 4 epochs with
          metrics=[AUC, Precision, Recall, MeanIoU] and Keras callbacks (CSVLogger,
          ModelCheckpoint, TensorBoard and a LambdaCallback on every rank; EarlyStopping on
          rank 1 only, ReduceLROnPlateau on rank 0 only), then evaluate, predict, save and
          export. Rank 0 also writes what one process computes from the predictions.
  backup  trains NUM_EPOCHS (argv[4]) epochs of a small regression with a Keras
          BackupAndRestore in OUT_DIR/backup.
Every rank writes OUT_DIR/rank<R>.json.
"""
import contextlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402
import worker_start  # noqa: E402  (beside this script)
from hvdtrain import datasets  # noqa: E402

METRICS = ("auc", "precision", "recall", "iou")
LEARNING_RATE = 0.05


def metrics():
    return [keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
            keras.metrics.MeanIoU(num_classes=10, sparse_y_true=False, sparse_y_pred=False,
                                  name="iou")]


def fashion():
    x_train, y_train, _, _, x_test, y_test = datasets.load_fashion_mnist_dataset(download=False)
    one_hot = lambda y: np.eye(10, dtype="float32")[y]  # noqa: E731
    return (x_train[:1200], one_hot(y_train[:1200])), (x_test[:1001], one_hot(y_test[:1001]))


def scenario_all(out, rank, strategy):
    (x, y), (x_test, y_test) = fashion()
    with (hvdtrain.get_strategy(strategy).scope() if strategy != "horovod"
          else contextlib.nullcontext()):  # tf.distribute's variables are made in its scope
        network = keras.Sequential([keras.Input((784,)),
                                    keras.layers.Dense(32, activation="relu"),
                                    keras.layers.Dense(10, activation="softmax")])
    epochs_seen = []
    callbacks = [
        keras.callbacks.CSVLogger(os.path.join(out, "log.csv")),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "w-{epoch}.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.TensorBoard(os.path.join(out, "tb")),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: epochs_seen.append(e)),
    ]
    if rank == 1:  # loss never improves by 10: stops after the third epoch (index 2)
        callbacks.append(keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=2))
    else:  # halves the rate at the end of epochs 1 and 2 (epoch 0 sets the best)
        callbacks.append(keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10,
                                                           factor=0.5, patience=0))
    trainer = hvdtrain.Trainer(
        tf.data.Dataset.from_tensor_slices((x, y)), model=network,
        loss="categorical_crossentropy", optimizer="sgd",
        optimizer_args={"learning_rate": LEARNING_RATE}, batch_size=25, num_epochs=4,
        metrics=metrics(), callbacks=callbacks, strategy=strategy, log_step_size=6)
    history = trainer.train_to_end()
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test))
    results = trainer.evaluate(test)
    predictions = trainer.predict(test)
    trainer.save(os.path.join(out, "network.keras"))
    trainer.export(os.path.join(out, "saved_model"))
    record = {"global_step": trainer.global_step, "steps_per_epoch": trainer.steps_per_epoch,
              "history": history.history, "epochs": history.epoch, "epochs_seen": epochs_seen,
              "evaluate": results, "lr_scale": trainer.lr_scale,
              "weights": [w.tolist() for w in network.get_weights()]}
    if rank == 0:
        one = {}  # one process, the whole test set at once, from the same predictions
        for m in metrics():
            m.update_state(y_test, predictions)
            one[m.name] = float(m.result())
        one["loss"] = float(np.mean(keras.losses.categorical_crossentropy(y_test, predictions)))
        record["one_process"] = one
        direct = keras.ops.convert_to_numpy(network(x_test, training=False))  # not a collective
        record["direct_max_diff"] = float(np.abs(direct - predictions).max())
        np.save(os.path.join(out, "x_test.npy"), x_test[:64])
        np.save(os.path.join(out, "predictions.npy"), predictions[:64])
    return record


def scenario_backup(out, rank, strategy, num_epochs):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    keras.utils.set_random_seed(1)
    network = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = hvdtrain.Trainer(
        tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))), model=network,
        loss="mse", optimizer="sgd", optimizer_args={"learning_rate": 0.01}, batch_size=16,
        num_epochs=num_epochs, strategy=strategy,
        callbacks=[keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))])
    history = trainer.train_to_end()
    return {"global_step": trainer.global_step, "restored_from": trainer.restored_from,
            "epochs": history.epoch, "weights": [w.tolist() for w in network.get_weights()]}


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    strategy = sys.argv[3] if len(sys.argv) > 3 else "horovod"
    os.makedirs(out, exist_ok=True)
    rank = worker_start.start(strategy)
    keras.utils.set_random_seed(1)
    if scenario == "all":
        record = scenario_all(out, rank, strategy)
    elif scenario == "backup":
        record = scenario_backup(out, rank, strategy, int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
