"""Learning-rate scaling for data-parallel training (linear, sqrt, warmup), and the
optimizer a Trainer is given (class + args, name + args, or an instance)."""
from __future__ import annotations

import logging
import math

import keras

from hvdtrain import checks
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")

SCALING_RULES = ("linear", "sqrt", "none")


def make_optimizer(optimizer, optimizer_args) -> keras.optimizers.Optimizer:
    """An optimizer instance from a class + args, an instance, or a name + args."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        if optimizer_args:
            raise ValueError("optimizer_args must be empty when optimizer is an instance")
        return optimizer
    if optimizer_args is None or not isinstance(optimizer_args, dict):
        raise ValueError("optimizer_args must be a dict holding at least 'learning_rate' when "
                         f"optimizer is a class or name, got {optimizer_args!r}")
    if "learning_rate" not in optimizer_args:
        raise ValueError("optimizer_args must hold 'learning_rate', got keys "
                         f"{sorted(optimizer_args)}")
    if isinstance(optimizer, str):
        cls = type(keras.optimizers.get(optimizer))
    elif isinstance(optimizer, type) and issubclass(optimizer, keras.optimizers.Optimizer):
        cls = optimizer
    else:
        raise TypeError("optimizer must be a Keras optimizer class (e.g. keras.optimizers.Adam), "
                        f"an instance, or a name, got {optimizer!r}")
    try:
        return cls(**optimizer_args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"optimizer_args do not fit {cls.__name__}: {err}") from err


def lr_scale_factor(world_size: int, rule: str = "linear") -> float:
    """How much to multiply the learning rate by for ``world_size`` workers.

    Args:
        world_size: number of data-parallel workers.
        rule: ``"linear"`` (Goyal et al.), ``"sqrt"`` or ``"none"``.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"lr scaling rule must be one of {SCALING_RULES}, got {rule!r}")
    if rule == "linear":
        return float(world_size)
    if rule == "sqrt":
        return math.sqrt(world_size)
    return 1.0


@keras.saving.register_keras_serializable(package="hvdtrain")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule multiplied by a constant factor."""

    def __init__(self, schedule, factor: float):
        self.schedule = schedule
        self.factor = float(factor)

    def __call__(self, step):
        return self.schedule(step) * self.factor

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "factor": self.factor}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["factor"])


@keras.saving.register_keras_serializable(package="hvdtrain")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Goyal et al.'s gradual warmup: ``start_factor * lr`` rising linearly to ``lr``.

    Args:
        schedule: the learning rate after warmup (a number or a schedule).
        warmup_steps: optimizer steps the ramp takes.
        start_factor: fraction of the rate at step 0 (``1 / scale`` gives the
            single-worker rate).
    """

    def __init__(self, schedule, warmup_steps: int, start_factor: float):
        self.schedule = schedule
        self.warmup_steps = int(warmup_steps)
        self.start_factor = float(start_factor)

    def __call__(self, step):
        target = self.schedule(step) if callable(self.schedule) else self.schedule
        progress = keras.ops.minimum(keras.ops.cast(step, "float32") / self.warmup_steps, 1.0)
        return target * (self.start_factor + (1.0 - self.start_factor) * progress)

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "warmup_steps": self.warmup_steps, "start_factor": self.start_factor}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]),
                   config["warmup_steps"], config["start_factor"])


def scale_learning_rate(optimizer: keras.optimizers.Optimizer, factor: float, *,
                        warmup_steps: int = 0) -> None:
    """Multiplies an optimizer's learning rate (a number or a schedule) by ``factor``.

    With ``warmup_steps``, the rate starts at the unscaled value and reaches the scaled
    one after that many steps (Goyal et al.).
    """
    checks.integer(warmup_steps, "warmup_steps", minimum=0)
    lr = keras_private.learning_rate_slot(optimizer)  # the float variable or the schedule
    if factor != 1.0:
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            keras_private.set_learning_rate_slot(optimizer, ScaledSchedule(lr, factor))
        elif callable(lr) and not hasattr(lr, "assign"):
            keras_private.set_learning_rate_slot(optimizer, lambda: lr() * factor)
        else:
            optimizer.learning_rate = current_learning_rate(optimizer) * factor
    if warmup_steps:
        lr = keras_private.learning_rate_slot(optimizer)
        if not isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = current_learning_rate(optimizer)
        keras_private.set_learning_rate_slot(optimizer, WarmupSchedule(lr, warmup_steps, 1.0 / factor))


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate the optimizer would use at its current iteration (also for a
    variable mirrored by a ``tf.distribute`` strategy, which ``float()`` refuses)."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def inner_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer inside a ``LossScaleOptimizer`` (the optimizer itself otherwise)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def configured_rate(optimizer: keras.optimizers.Optimizer) -> float | None:
    """The learning rate held in a variable (after scaling), or ``None`` for a schedule."""
    lr = keras_private.learning_rate_slot(inner_optimizer(optimizer))
    return float(lr.numpy()) if hasattr(lr, "assign") else None


def set_configured_rate(optimizer: keras.optimizers.Optimizer, value: float) -> float:
    """Puts ``value`` back into the learning-rate variable; returns the value it held."""
    lr = keras_private.learning_rate_slot(inner_optimizer(optimizer))
    previous = float(lr.numpy())
    lr.assign(value)
    return previous


def keep_configured_rate(optimizer: keras.optimizers.Optimizer, configured: float | None,
                         saved_world_size: int | None, size: int, rule: str) -> None:
    """After a restore, the configured (scaled) learning rate wins over the checkpoint's;
    says so when the checkpoint was written by another number of ranks."""
    if configured is None:
        return
    saved = set_configured_rate(optimizer, configured)
    if saved_world_size not in (None, size):
        logger.info("checkpoint written by %d ranks, resuming on %d: learning rate %g -> %g "
                    "(%s scaling)", saved_world_size, size, saved, configured, rule)


def agree_configured_rate(optimizer: keras.optimizers.Optimizer, allgather_object,
                          rank: int) -> None:
    """Every rank takes rank 0's configured learning rate (a callback, such as Keras's
    ``ReduceLROnPlateau``, may have changed it on some ranks only). A collective; the
    Trainer runs it at each epoch's start.

    Args:
        optimizer: this rank's optimizer.
        allgather_object: the backend's all-gather of a Python object.
        rank: this rank (rank 0 logs a change).
    """
    rate = configured_rate(optimizer)
    if rate is None:  # a schedule (the same on every rank): nothing to agree
        return
    rates = allgather_object(rate)
    if any(r != rates[0] for r in rates):
        set_configured_rate(optimizer, rates[0])
        if rank == 0:
            logger.info("learning rate set to rank 0's %g on every rank (ranks had %s)",
                        rates[0], sorted(set(rates)))
