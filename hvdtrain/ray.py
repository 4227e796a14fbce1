"""Horovod jobs on a Ray cluster: ``hvdtrain.ray.run(train_fn, num_workers=N)``.

Runs ``train_fn`` on ``N`` Ray workers through Horovod's own ``horovod.ray.RayExecutor``
(core Ray; no Ray Train). Inside ``train_fn``, ``hvdtrain.Trainer(...)`` works as under
``horovodrun``: the executor hands every worker its rank and the Gloo rendezvous.

Example::

    import hvdtrain, hvdtrain.ray

    def train():
        trainer = hvdtrain.Trainer(dataset, build, "sgd", {"learning_rate": 0.01})
        trainer.train_to_end()
        return trainer.global_step

    steps = hvdtrain.ray.run(train, num_workers=2, address="auto")  # rank 0 first

Needs Ray (``pip install ray==RAY_VERSION``, pinned in requirements.txt). This module
imports neither Ray nor Horovod until :func:`run` is called.
"""
from __future__ import annotations

from hvdtrain.horovod.ray_executor import RAY_VERSION, run

__all__ = ["RAY_VERSION", "run"]
