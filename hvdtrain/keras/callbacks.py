"""Keras 3 callbacks with the names and meaning of ``horovod.tensorflow.keras.callbacks``.

Horovod's callbacks (broadcast, metric average, learning-rate schedule and warmup) also
hand their model's ``fit`` step to hvdtrain (:func:`keras_steps.attach`), so a model built
at its first batch is broadcast before its first update and ``jit_compile=True`` compiles
the forward and backward pass with the exchange outside it.
"""
from __future__ import annotations

from typing import Callable

import keras

from hvdtrain import learning_rate
from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import keras_steps


class _StepCallback(keras.callbacks.Callback):
    """A callback that hands its model's ``fit`` step to hvdtrain when Keras gives it the
    model (before ``fit`` makes its step)."""

    def set_model(self, model):
        super().set_model(model)
        keras_steps.attach(model)


class BroadcastGlobalVariablesCallback(_StepCallback):
    """Sets the model's and optimizer's variables to ``root_rank``'s at the start of
    training, so every rank starts identical (also after rank 0 restored a checkpoint).

    A model that Keras builds at its first batch (no ``Input``) is built from that batch
    and broadcast before its first update, inside ``fit``'s first step (with a hvdtrain
    ``DistributedOptimizer``; with another optimizer, after the first batch, as Horovod).

    Args:
        root_rank: the rank whose values win.
        device, local_variables: accepted for Horovod's signature. ``local_variables``
            (variables each rank keeps as its own) are left out of the broadcast.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None) -> None:
        super().__init__()
        del device
        self.root_rank = root_rank
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        if keras_steps.model_built(self.model):
            keras_steps.broadcast_model(self.model, self.root_rank, self.local_variables)
            self.broadcast_done = True
        else:
            keras_steps.broadcast_at_first_step(self.model, self.root_rank, self.local_variables)

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        pending = keras_steps.take_pending_broadcast(self.model)
        if pending is not None:  # the step did not do it: not a hvdtrain optimizer
            keras_steps.broadcast_model(self.model, *pending)
        self.broadcast_done = True


class MetricAverageCallback(_StepCallback):
    """Replaces each epoch's logs by their mean over all ranks (names reduced in sorted
    order, so every rank reduces the same vector). Put it before callbacks that read logs.

    Args:
        device: accepted for Horovod's signature; TensorFlow places the reduction.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        del device

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            numeric = {k: float(v) for k, v in logs.items() if _is_number(v)}
            logs.update(dist.allreduce_dict(numeric))


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class LearningRateScheduleCallback(_StepCallback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``; with ``staircase=False`` the epoch is fractional and
    the rate changes every batch.

    Args:
        initial_lr: the (already scaled) base learning rate.
        multiplier: a number, or a function of the (fractional) epoch.
        start_epoch, end_epoch: where the schedule applies.
        staircase: change once per epoch (True) or every batch (False).
        momentum_correction: accepted for Horovod's signature; not applied (Keras 3 bakes
            an optimizer's ``momentum`` into the compiled step as a constant).
        steps_per_epoch: batches per epoch (taken from ``fit``'s params when omitted).
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: float = 0, end_epoch: float | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if not isinstance(initial_lr, (int, float)) or initial_lr <= 0:
            raise ValueError(f"initial_lr must be a positive number, got {initial_lr!r}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        if self._in_range(epoch):
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase:
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if not self.staircase and self.steps_per_epoch:
            self._set(self._epoch + batch / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = learning_rate.current_learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Goyal et al.'s warmup: the rate rises from ``initial_lr / size`` to ``initial_lr``
    over ``warmup_epochs``, batch by batch.

    Args:
        initial_lr: the scaled learning rate reached after warmup.
        warmup_epochs: epochs the ramp takes.
        momentum_correction: accepted for Horovod's signature (see the schedule callback).
        steps_per_epoch: batches per epoch (taken from ``fit``'s params when omitted).
        verbose: print the rate reached at the end of the warmup (rank 0).
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        if not isinstance(warmup_epochs, (int, float)) or warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be a positive number, got {warmup_epochs!r}")
        size = dist.size()

        def ramp(epoch: float) -> float:
            return (1.0 + epoch * (size - 1) / warmup_epochs) / size

        super().__init__(initial_lr, ramp, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if epoch >= self.warmup_epochs:  # warmup over: exactly the target rate from here
            self.model.optimizer.learning_rate = self.initial_lr

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == int(self.warmup_epochs) - 1 and self.verbose and dist.is_root():
            print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{learning_rate.current_learning_rate(self.model.optimizer):g}.")


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ``ModelCheckpoint`` that writes on rank 0 only (every rank may add it).

    Overrides Keras's private save hook, ``keras_private.CHECKPOINT_SAVE_HOOK``.
    """

    def _save_model(self, epoch, batch, logs):
        if dist.is_root():
            super()._save_model(epoch, batch, logs)


_UNSET = "<set BestModelCheckpoint.filepath>"


class BestModelCheckpoint(ModelCheckpoint):
    """Horovod's ``BestModelCheckpoint``: keeps the best model seen so far by ``monitor``,
    written by rank 0 only (every rank may add it).

    Horovod's signature has no ``filepath`` (its Spark estimator sets ``.filepath``); here
    it may be passed or set before ``fit``. Keras 3 wants ``.keras`` (or ``.weights.h5``
    with ``save_weights_only``).

    Raises:
        ValueError: at ``fit``, when no ``filepath`` was given or set.
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto", save_freq="epoch",
                 filepath: str | None = None) -> None:
        placeholder = _UNSET + (".weights.h5" if save_weights_only else ".keras")
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)

    def on_train_begin(self, logs=None):
        if str(self.filepath).startswith(_UNSET):
            raise ValueError("BestModelCheckpoint needs a filepath: pass filepath='best.keras' "
                             "or set .filepath before fit")
        super().on_train_begin(logs)
