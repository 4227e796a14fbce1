"""The Trainer after training, with Keras metrics and callbacks, on real ranks: 2-rank
jobs under horovodrun and mpirun, and 2 MultiWorkerMirrored workers."""
import subprocess
import sys
import textwrap

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from conftest import ROOT, WORKERS, read_ranks, run_job
from hvdtrain.checkpoint import committed
from test_tfdist_parallel import run_workers

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]
WORKER = str(WORKERS / "after_training_worker.py")
METRICS = ("auc", "precision", "recall", "iou")
LEARNING_RATE = 0.05  # the worker's, before scaling by 2


def _check_all(out):
    """What scenario ``all`` must have produced, whatever ran the 2 workers."""
    r0, r1 = read_ranks(out, 2)
    spe = r0["steps_per_epoch"]
    # EarlyStopping on rank 1 only stopped both after the third of 4 epochs
    assert r0["epochs"] == r1["epochs"] == [0, 1, 2] == r0["epochs_seen"]
    assert r0["global_step"] == r1["global_step"] == 3 * spe
    # ReduceLROnPlateau on rank 0 only halved the rate after epoch 1, for both ranks
    lr = LEARNING_RATE * r0["lr_scale"]
    assert r0["history"]["learning_rate"] == pytest.approx([lr, lr, lr / 2])
    assert r0["weights"] == r1["weights"]  # the same rate was applied on both
    # History: epoch means over both ranks and the training metrics, the same everywhere
    assert r0["history"] == r1["history"]
    for name in ("loss", *METRICS):
        assert len(r0["history"][name]) == 3, name
    assert r0["history"]["loss"][2] < r0["history"]["loss"][0]
    # metrics over 2 ranks equal one process's over the same 1001 predictions
    assert r0["evaluate"] == r1["evaluate"]
    for name in ("loss", *METRICS):
        assert r0["evaluate"][name] == pytest.approx(r0["one_process"][name], abs=1e-6), name
    assert 0.5 < r0["evaluate"]["auc"] <= 1 and 0 < r0["evaluate"]["iou"] < 1
    # predict gives the network's outputs in dataset order
    assert r0["direct_max_diff"] < 1e-5
    return r0


def _load_in_a_fresh_process(out):
    """Plain Keras and TensorFlow (no hvdtrain) read what save and export wrote."""
    script = textwrap.dedent(f"""
        import os, numpy as np
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import keras, tensorflow as tf
        x = np.load({str(out / 'x_test.npy')!r}); expected = np.load({str(out / 'predictions.npy')!r})
        net = keras.models.load_model({str(out / 'network.keras')!r})
        loaded = tf.saved_model.load({str(out / 'saved_model')!r})  # kept: its variables live in it
        served = loaded.serve(tf.constant(x)).numpy()
        print(float(np.abs(net.predict(x, verbose=0) - expected).max()),
              float(np.abs(served - expected).max()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keras_diff, served_diff = map(float, proc.stdout.split()[-2:])
    assert keras_diff < 1e-5 and served_diff < 1e-5


def test_metrics_callbacks_evaluate_predict_save_export(launcher, tmp_path):
    run_job(launcher, 2, [WORKER, "all", str(tmp_path)], timeout=240)
    r0 = _check_all(tmp_path)
    _load_in_a_fresh_process(tmp_path)
    # the file-writing callbacks ran on rank 0 only
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("epoch,auc,")
    assert sorted(p.name for p in tmp_path.glob("w-*.weights.h5")) == [
        "w-1.weights.h5", "w-2.weights.h5", "w-3.weights.h5"]
    events = list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    tb = EventAccumulator(str(events[0]), size_guidance={"tensors": 0})
    tb.Reload()
    assert [e.step for e in tb.Tensors("epoch_loss")] == [0, 1, 2]
    logged = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in tb.Tensors("epoch_loss")]
    assert logged == pytest.approx(r0["history"]["loss"], rel=1e-6)


def test_backup_and_restore_is_the_trainers_checkpoint(tmp_path):
    run_job("horovodrun", 2, [WORKER, "backup", str(tmp_path), "horovod", "2"], timeout=150)
    first = read_ranks(tmp_path, 2)[0]
    assert first["epochs"] == [0, 1] and first["restored_from"] is None
    spe = first["global_step"] // 2
    assert sorted(step for step, _ in committed(str(tmp_path / "backup"))) == [spe, 2 * spe]
    run_job("mpirun", 2, [WORKER, "backup", str(tmp_path), "horovod", "3"], timeout=150)
    second, other = read_ranks(tmp_path, 2)
    assert second["restored_from"].endswith(f"ckpt-{2 * spe:08d}")
    assert second["epochs"] == other["epochs"] == [2]  # only the missing epoch ran
    assert second["global_step"] == 3 * spe and second["weights"] == other["weights"]


def test_multi_worker_mirrored(tmp_path):
    codes, outputs, _ = run_workers([WORKER, "all", str(tmp_path), "multi_worker_mirrored"],
                                    timeout=240)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    _check_all(tmp_path)
    _load_in_a_fresh_process(tmp_path)
