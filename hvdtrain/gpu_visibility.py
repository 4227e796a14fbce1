"""hvdtrain's one line when this machine has NVIDIA GPUs that TensorFlow does not list.

hvdtrain's quiet start-up (``_hvdtrain_startup``) hides TensorFlow's start-up INFO lines, and
on a machine without NVIDIA GPUs its failed ``cuInit``. Where the machine has GPUs
(``/dev/nvidia<N>``), a GPU that fails to initialise is an error the user must act on: this
module says so in one line of hvdtrain's own, beside TensorFlow's error.
"""
from __future__ import annotations

import os

from _hvdtrain_startup import SWITCH, nvidia_gpu_files


def gpus_hidden_by_user() -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` hides every GPU (set empty, or to ``-1``...)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and (not value.strip() or value.strip().startswith("-"))


def unusable_gpus_warning(listed_gpus: int, dev: str = "/dev") -> str | None:
    """The warning when the machine has NVIDIA GPUs but TensorFlow lists none.

    Args:
        listed_gpus: the GPUs TensorFlow lists (``len(tf.config.list_physical_devices("GPU"))``).
        dev: where the device files are (tests point it elsewhere).

    Returns:
        One line, or None: TensorFlow lists a GPU, the machine has none, or
        ``CUDA_VISIBLE_DEVICES`` hides them.
    """
    if listed_gpus or gpus_hidden_by_user():
        return None
    files = nvidia_gpu_files(dev)
    if not files:
        return None
    import tensorflow as tf

    shown = ", ".join(files[:4]) + (", ..." if len(files) > 4 else "")
    if not tf.test.is_built_with_cuda():
        why = ("this TensorFlow is built without CUDA: install tensorflow[and-cuda] "
               "(make install does where nvidia-smi lists a GPU)")
    else:
        why = ("the GPU failed to initialise (TensorFlow's error above says why: the driver, "
               f"CUDA libraries or device permissions; {SWITCH}=1 shows its whole start-up log)")
    return (f"this machine has NVIDIA GPUs ({shown}) but TensorFlow lists none, so training "
            f"runs on the CPU: {why}")
