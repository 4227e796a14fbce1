"""What a Horovod script does right after ``hvd.init()``: TensorFlow's thread and device
settings, which TensorFlow refuses once its context exists. Workers call
:func:`set_after_init` straight after their front door's ``init()`` and, once TensorFlow
runs, :func:`read_back`; the tests compare the two.

Every value differs from TensorFlow's default and from hvdtrain's own choice (one intra-op
thread per rank on two cores, two inter-op threads).
"""
import tensorflow as tf

from hvdtrain.horovod import watchdog
from hvdtrain.internals import tensorflow_private

WANTED = {"intra_op_threads": 2, "inter_op_threads": 3, "soft_device_placement": False,
          "logical_cpus": 2, "visible_gpus": 0}


def set_after_init(local_rank: int) -> dict:
    """Makes each setting, in the order Horovod's scripts do (the GPU block first); returns
    whether init() had started TensorFlow and the error of any setting refused."""
    started = tensorflow_private.context_started()
    refused = {}

    def attempt(name, setting):
        try:
            setting()
        except (RuntimeError, ValueError) as err:
            refused[name] = f"{type(err).__name__}: {err}"

    # Horovod's canonical GPU block, as written in its examples (empty on a CPU host)
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        attempt("memory_growth", lambda gpu=gpu: tf.config.experimental.set_memory_growth(gpu, True))
    if gpus:
        attempt("visible_gpu", lambda: tf.config.experimental.set_visible_devices(
            gpus[local_rank], "GPU"))
    attempt("visible_gpus", lambda: tf.config.set_visible_devices([], "GPU"))
    attempt("inter_op_threads", lambda: tf.config.threading.set_inter_op_parallelism_threads(
        WANTED["inter_op_threads"]))
    cpu = tf.config.list_physical_devices("CPU")[0]
    attempt("logical_cpus", lambda: tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * WANTED["logical_cpus"]))
    attempt("soft_device_placement", lambda: tf.config.set_soft_device_placement(
        WANTED["soft_device_placement"]))
    attempt("intra_op_threads", lambda: tf.config.threading.set_intra_op_parallelism_threads(
        WANTED["intra_op_threads"]))
    return {"context_started_by_init": started, "refused": refused, "wanted": WANTED}


def read_back() -> dict:
    """The settings TensorFlow runs with (call after it started)."""
    return {"intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "soft_device_placement": tf.config.get_soft_device_placement(),
            "logical_cpus": len(tf.config.list_logical_devices("CPU")),
            "visible_gpus": len(tf.config.list_logical_devices("GPU")),
            "context_started": tensorflow_private.context_started(),
            "watchdog": watchdog.running()}
