"""hvdtrain: data-parallel training of TensorFlow 2 / Keras 3 models with Horovod.

The front door is :class:`Trainer`, which mirrors TensorLayer's distributed Trainer.
Importing the package is cheap; TensorFlow and Horovod load on first use of a name
that needs them.
"""
from __future__ import annotations

import importlib

from hvdtrain import threads

__version__ = "0.1.0"


threads.share_cores_before_tensorflow_starts()

_LAZY = {
    "Trainer": "hvdtrain.trainer",
    "Callback": "hvdtrain.callbacks",
    "Preempted": "hvdtrain.preemption",
    "PREEMPTED_EXIT_CODE": "hvdtrain.preemption",
    "DistributedOptimizer": "hvdtrain.horovod.optimizer",
    "Average": "hvdtrain.horovod.collectives",
    "Sum": "hvdtrain.horovod.collectives",
    "Adasum": "hvdtrain.horovod.collectives",
    "Compression": "hvdtrain.horovod.collectives",
    "init": "hvdtrain.horovod.runtime",
    "rank": "hvdtrain.horovod.runtime",
    "size": "hvdtrain.horovod.runtime",
    "local_rank": "hvdtrain.horovod.runtime",
    "is_root": "hvdtrain.horovod.runtime",
    "ModelParallel": "hvdtrain.horovod.hybrid",
    "get_strategy": "hvdtrain.backends.tfdist.strategies",
    "TaskSpecDef": "hvdtrain.backends.ps.cluster",
    "TaskSpec": "hvdtrain.backends.ps.cluster",
    "DistributedSession": "hvdtrain.backends.ps.session",
    "StopAtTimeHook": "hvdtrain.backends.ps.session",
    "ParameterServerTrainer": "hvdtrain.trainer",
    "Horovod": "hvdtrain.options",
    "ParameterServer": "hvdtrain.options",
}
#: Submodules reachable as attributes (``hvdtrain.keras``, ``hvdtrain.tfdist.get_strategy``);
#: the short names of modules that live inside a backend are kept for users' scripts.
_SUBMODULES = {
    "datasets": "hvdtrain.datasets", "keras": "hvdtrain.keras", "trainer": "hvdtrain.trainer",
    "tensorflow": "hvdtrain.tensorflow", "ray": "hvdtrain.ray",
    "data": "hvdtrain.data", "program": "hvdtrain.program", "checkpoint": "hvdtrain.checkpoint",
    "callbacks": "hvdtrain.callbacks", "options": "hvdtrain.options",
    "preemption": "hvdtrain.preemption", "agreement": "hvdtrain.trainer.agreement",
    "learning_rate": "hvdtrain.learning_rate", "precision": "hvdtrain.precision",
    "backends": "hvdtrain.backends", "cli": "hvdtrain.cli",
    "dist": "hvdtrain.horovod.collectives",
    "elastic": "hvdtrain.horovod.elastic",
    "hybrid": "hvdtrain.horovod.hybrid",
    "compression": "hvdtrain.horovod.compression",
    "tfdist": "hvdtrain.backends.tfdist",
    "cluster": "hvdtrain.backends.ps.cluster",
    "ps": "hvdtrain.backends.ps",
}

__all__ = sorted(_LAZY) + ["datasets", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")
