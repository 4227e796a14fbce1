"""Keras 3 private APIs that hvdtrain uses, each with its reason (checked by
``tests/unit/test_private_apis.py``)."""
from __future__ import annotations

import keras
import tensorflow as tf

# ---------------------------------------------------------------------- optimizers

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


def passes_counter(optimizer: keras.optimizers.Optimizer):
    """``optimizer._iterations``: the count of ``apply`` calls. With
    ``gradient_accumulation_steps`` the public ``iterations`` is that count divided by the
    steps, so an update that accumulates passes itself (the sharded one) counts them here."""
    return optimizer._iterations


def gradient_accumulators(optimizer: keras.optimizers.Optimizer) -> list:
    """``optimizer._accumulated_gradients``: with ``gradient_accumulation_steps``, the sums
    of the passes since the last update, one per variable (this rank's own)."""
    return list(optimizer._accumulated_gradients)


OPTIMIZER_HOOKS = ("_backend_apply_gradients", "_clip_gradients")
"""The ``keras.optimizers.Optimizer`` methods hvdtrain's distributed optimizer overrides:
``apply`` calls the first with the gradients (after unscaling), and it calls the second
once the local accumulation is done, just before clipping; Keras has no public hook there."""

SHARDED_HOOKS = ("_apply_weight_decay", "_use_weight_decay")
"""The methods the sharded optimizer (``hvdtrain.horovod.sharded``) also overrides or
calls: ``apply`` calls the first with the variables to decay (the slices), and the second
tells which model variables ``exclude_from_weight_decay`` excluded."""


def missing_optimizer_hooks(optimizer) -> list[str]:
    """The names of :data:`OPTIMIZER_HOOKS` and :data:`SHARDED_HOOKS` that ``optimizer``
    (or optimizer class) lacks."""
    return [name for name in OPTIMIZER_HOOKS + SHARDED_HOOKS
            if not callable(getattr(optimizer, name, None))]


def uses_weight_decay(optimizer: keras.optimizers.Optimizer, variable) -> bool:
    """``optimizer._use_weight_decay(variable)``: False when ``variable`` was excluded
    from weight decay (``exclude_from_weight_decay``, by variable or by name)."""
    return bool(optimizer._use_weight_decay(variable))


def extend_class_in_place(obj, mixin: type) -> None:
    """Makes ``obj`` an instance of a new class ``(mixin, type(obj))`` named like its own.

    ``obj.__class__ = ...`` (it relies on Keras optimizers allowing the swap): Keras has no
    way to wrap an optimizer and keep the same object, with its variables, schedule and
    tracking, usable in ``model.compile`` and serialized under its own class name.
    """
    base = type(obj)
    obj.__class__ = type(base.__name__, (mixin, base), {"__module__": base.__module__})


def set_untracked(obj, name: str, value) -> None:
    """Sets ``obj.name`` past Keras's attribute tracking (``object.__setattr__``): a
    Keras optimizer's or layer's ``__setattr__`` would add the variables in a list it is
    given to its own ``variables``."""
    object.__setattr__(obj, name, value)


# ---------------------------------------------------------------------- layers, variables

def flatten_layers(layer: keras.layers.Layer) -> list:
    """``layer._flatten_layers(include_self=True)``: the layer and every nested sublayer;
    the public ``Model.layers`` lists direct children only (and plain layers have none)."""
    return layer._flatten_layers(include_self=True)


def last_call_outputs(layer: keras.layers.Layer) -> list:
    """``layer._inbound_nodes[-1].output_tensors``: the symbolic outputs of the layer's
    latest call on symbolic tensors. The build function returns its network and a loss
    computed from ``network(x)``; Keras keeps no public record of that call, and the
    Trainer's metrics need its output (``[]`` when the layer was never called so)."""
    nodes = getattr(layer, "_inbound_nodes", None) or []
    return list(nodes[-1].output_tensors) if nodes else []


def metric_direction(metric: keras.metrics.Metric) -> str | None:
    """``metric._direction``: ``"up"`` when larger is better, ``"down"``, or ``None``.
    Keras's monitoring callbacks (``EarlyStopping``, ``ReduceLROnPlateau``,
    ``ModelCheckpoint``) read it from a compiled model's metrics for ``mode="auto"``; the
    Trainer's network is not compiled, so it tells them itself."""
    return getattr(metric, "_direction", None)


def seed_generator_states(model: keras.Model) -> list:
    """The ``tf.Variable``s behind the model's seed generators (dropout and the like).
    Keras names them ``.../seed_generator_state`` and keeps them out of the model's
    checkpoint trackables, so they are saved beside it for an exact resume."""
    return [v.value for v in model.variables if "seed_generator_state" in v.path]


def reinitialize_variable(variable, value) -> None:
    """``Variable._initialize(value)``: gives a Keras variable a new backing ``tf.Variable``
    made from ``value`` under the current device scope (Keras's own initialization path);
    the public ``assign`` would keep it on the device it already lives on."""
    variable._initialize(value)


# ---------------------------------------------------------------------- callbacks

CHECKPOINT_SAVE_HOOK = "_save_model"
"""``keras.callbacks.ModelCheckpoint._save_model(epoch, batch, logs)``, which every save
goes through and which hvdtrain's rank-0-only ``ModelCheckpoint`` overrides: overriding
it keeps Keras's ``save_freq`` / ``save_best_only`` logic (there is no public hook)."""


def has_checkpoint_save_hook(cls: type = keras.callbacks.ModelCheckpoint) -> bool:
    """True when ``cls`` still has :data:`CHECKPOINT_SAVE_HOOK` as a method."""
    return callable(getattr(cls, CHECKPOINT_SAVE_HOOK, None))


# ---------------------------------------------------------------------- model.fit

def route_make_train_function(model: keras.Model, wrapper) -> None:
    """Routes this one model's ``make_train_function`` through
    ``wrapper(original, model, force)`` (once per model; other models are untouched).

    Keras builds ``fit``'s compiled step there, reading ``model.train_step`` and
    ``model.jit_compile`` as it does (Keras 3.15), and ``fit`` calls it as
    ``self.make_train_function()``, so an attribute on the instance takes its place. There
    is no public hook between ``compile`` and the step's tracing where a distributed
    optimizer could move its exchange out of an XLA cluster or broadcast the variables of
    a model built at its first batch.
    """
    if routes_make_train_function(model):
        return
    original = type(model).make_train_function

    def make_train_function(force=False):
        return wrapper(original, model, force)

    make_train_function._hvdtrain = wrapper
    make_train_function.__doc__ = original.__doc__
    set_untracked(model, "make_train_function", make_train_function)


def routes_make_train_function(model: keras.Model) -> bool:
    """True when :func:`route_make_train_function` was applied to ``model``."""
    return routed_wrapper(model) is not None


def routed_wrapper(model: keras.Model):
    """The ``wrapper`` given to :func:`route_make_train_function` for ``model``, or None
    (it keeps what the rerouted step needs, so nothing else is set on the model)."""
    return getattr(model.__dict__.get("make_train_function"), "_hvdtrain", None)


def build_from_batch(model: keras.Model, data) -> None:
    """``model._symbolic_build(data_batch=...)``: builds a model that creates its variables
    at its first batch (and its compiled loss, metrics and optimizer) from that batch's
    shapes, as Keras does for a distribution strategy; there is no public way to build
    from data without running a step."""
    model._symbolic_build(data_batch=data)


BATCH_NORM_MOMENTS_HOOK = "_moments"
"""``keras.layers.BatchNormalization._moments(inputs, mask)``: where Keras 3 computes the
batch's mean and variance when training, overridden by ``SyncBatchNormalization`` to use
every rank's batch (the public ``synchronized=True`` works only under a tf.distribute
strategy)."""


def check_batch_norm_moments_hook(cls: type) -> None:
    """Fails (when the layer is made) if Keras no longer has the hook ``cls`` overrides,
    rather than letting it normalize each rank's batch alone.

    Raises:
        NotImplementedError: naming the Keras version and the missing method.
    """
    if not callable(getattr(keras.layers.BatchNormalization, BATCH_NORM_MOMENTS_HOOK, None)):
        raise NotImplementedError(f"{cls.__name__} overrides keras.layers.BatchNormalization."
                          f"{BATCH_NORM_MOMENTS_HOOK}, which Keras {keras.__version__} lacks")
