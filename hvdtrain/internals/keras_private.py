"""Keras 3 private APIs that hvdtrain uses, each with its reason (checked by
``tests/unit/test_private_apis.py``)."""
from __future__ import annotations

import keras
import tensorflow as tf


def learning_rate_slot(optimizer: keras.optimizers.Optimizer):
    """``optimizer._learning_rate``: the variable or schedule object itself. The public
    ``learning_rate`` evaluates a schedule, so scaling a schedule (not its current value)
    needs the slot."""
    return optimizer._learning_rate


def set_learning_rate_slot(optimizer: keras.optimizers.Optimizer, value) -> None:
    """Replaces ``optimizer._learning_rate`` with a schedule or callable (the public
    setter only accepts numbers once the optimizer holds a variable)."""
    optimizer._learning_rate = value


def make_iterations_atomic(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes ``optimizer.iterations`` count every asynchronous (parameter-server) step.

    Keras 3 (3.15) increments it with ``Variable.assign_add``, which is ``assign(self +
    value)``: a read and a write, so two workers stepping at once lose a count (measured:
    ~290 of 376 steps counted with 2 workers). The weights and slots are updated through
    the ``tf.Variable``'s own atomic ``assign_add``/``assign_sub`` and do not race. Here the
    counter's increment goes to its backing ``tf.Variable`` (``.value``) the same way."""
    counter = optimizer.iterations
    counter.assign_add = lambda value: counter.value.assign_add(
        tf.cast(value, counter.value.dtype))
