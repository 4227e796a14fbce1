"""hvdtrain: data-parallel training of TensorFlow 2 / Keras 3 models with Horovod.

The front door is :class:`Trainer`, which mirrors TensorLayer's distributed Trainer.
Importing the package is cheap; TensorFlow and Horovod load on first use of a name
that needs them.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Trainer": "hvdtrain.trainer",
    "DistributedOptimizer": "hvdtrain.optim",
    "Callback": "hvdtrain.callbacks",
    "Average": "hvdtrain.dist",
    "Sum": "hvdtrain.dist",
    "Adasum": "hvdtrain.dist",
    "Compression": "hvdtrain.dist",
    "init": "hvdtrain.dist",
    "rank": "hvdtrain.dist",
    "size": "hvdtrain.dist",
    "local_rank": "hvdtrain.dist",
    "is_root": "hvdtrain.dist",
}

__all__ = sorted(_LAZY) + ["datasets", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in ("datasets", "dist", "optim", "trainer", "data", "building", "checkpoint",
                "callbacks", "cli", "bench"):
        return importlib.import_module(f"hvdtrain.{name}")
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")
