"""What the Horovod training steps of every front door share around the exchange.

Each step reads: compute the gradients, ``exchanger.reduce(...)``
(:class:`hvdtrain.horovod.exchange.Exchanger`), apply them
(:func:`hvdtrain.horovod.optimizer.apply`). The Trainer's step (``backends/horovod.py``)
and Keras ``fit``'s step (``keras_steps.py``) also share, from here:

* **the XLA split**: :func:`compile_pass` compiles the forward and backward pass, the
  exchange and the update stay outside (Horovod's ops have no XLA kernels); a user's
  ``train_step`` hands its gradients out through :class:`Capture`;
* **the start**: :func:`broadcast_start` sets every rank's variables to the root's before
  the first update (at the first step for a model built from its first batch).
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod.exchange_settings import variable_key

logger = logging.getLogger("hvdtrain")


# ---------------------------------------------------------------------- XLA

def compile_pass(forward_backward: Callable, what: str) -> Callable:
    """The forward and backward pass compiled by XLA (``jit_compile=True``); whoever calls
    it runs the exchange and the update outside the compiled cluster. Logs that once on
    rank 0, naming ``what`` is compiled."""
    if dist.rank() == 0:
        logger.info("XLA compiles %s's forward and backward pass; hvdtrain's gradient "
                    "exchange and the update run outside the compiled cluster", what)
    return tf.function(forward_backward, jit_compile=True, reduce_retracing=True)


class Capture:
    """Holds the gradients a distributed optimizer was given inside an XLA-compiled step
    (``fit``'s XLA step), to apply them outside it."""

    def __init__(self) -> None:
        self.grads: list | None = None
        self.variables: list | None = None

    def take(self, grads, variables, optimizer):
        self.grads = list(grads)
        self.variables = None if variables is None else list(variables)
        return optimizer.iterations


# ---------------------------------------------------------------------- the start

def broadcast_start(variables: Sequence, root_rank: int = 0, exclude: Sequence = ()) -> None:
    """Sets ``variables`` to ``root_rank``'s values on every rank, but those in ``exclude``
    (variables each rank keeps as its own)."""
    own = {variable_key(v) for v in exclude}
    dist.broadcast_variables([v for v in variables if variable_key(v) not in own],
                             root_rank=root_rank)
