"""Turns the user's build functions (or a Keras model and loss) into reusable programs.

TensorLayer's contract was graph-mode: ``build_training_func(x, y)`` got the dataset's
tensors and returned ``(network, loss, log_tensors)``. hvdtrain keeps that contract in
TensorFlow 2 by calling the build function **once** with symbolic ``keras.Input``
placeholders shaped like the dataset's elements. What it returns is wrapped into one
functional Keras model ``(x, y) -> {"loss": ..., **log_tensors}``, so the network is
built once and the same layers run every step inside one compiled ``tf.function``.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Callable

import keras
import tensorflow as tf

LOSS_KEY = "loss"
#: The network's output, in programs that also feed the Trainer's metrics.
PREDICTION_KEY = "\0prediction"
# functional training program -> (inputs, outputs, network) it was built from
_BUILT_FROM: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

_SYMBOLIC_HINT = (
    "x and y are symbolic keras.Input tensors: build the loss and log tensors with Keras "
    "layers and keras.ops (e.g. keras.ops.mean, keras.losses.sparse_categorical_crossentropy), "
    "not tf.* functions; or pass model=... and loss=... instead")


def symbolic_inputs(element_spec) -> tuple:
    """``keras.Input`` placeholders matching an unbatched ``(x, y)`` element spec."""
    def one(spec, name):
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(f"dataset element {name} must be a tensor, got {spec}")
        return keras.Input(shape=tuple(spec.shape), dtype=spec.dtype.name, name=name)
    x_spec, y_spec = element_spec
    return one(x_spec, "x"), one(y_spec, "y")


def _named(tensors, what: str, prefix: str) -> dict:
    if tensors is None:
        return {}
    if isinstance(tensors, dict):
        items = list(tensors.items())
    elif isinstance(tensors, (list, tuple)):
        items = [(f"{prefix}_{i}", t) for i, t in enumerate(tensors)]
    else:
        raise TypeError(f"{what} must be a dict of name -> tensor or a list of tensors, got "
                        f"{type(tensors).__name__}")
    out = {}
    for name, t in items:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what} names must be non-empty strings, got {name!r}")
        if not keras.backend.is_keras_tensor(t):
            raise TypeError(f"{what}[{name!r}] must be a tensor computed from x and y, got "
                            f"{type(t).__name__} (Python operators such as == on symbolic "
                            "tensors give constants: use keras.ops.equal and friends)")
        if name == LOSS_KEY and what == "log_tensors":
            raise ValueError(f"{what} may not use the name {LOSS_KEY!r}, which is reserved")
        out[name] = t
    return out


def _call_build(func: Callable, args: tuple, name: str):
    try:
        return func(*args)
    except (TypeError, ValueError, NotImplementedError) as err:
        if "KerasTensor" in str(err) or "symbolic" in str(err).lower():
            raise TypeError(f"{name} failed on symbolic inputs: {err}\n{_SYMBOLIC_HINT}") from err
        raise


def build_training_program(build_training_func: Callable, element_spec) -> tuple:
    """Calls ``build_training_func(x, y)`` once and wraps the result.

    Returns:
        ``(network, program)``: the user's network, and a functional model mapping
        ``[x, y]`` to ``{"loss": scalar, **log_tensors}``.

    Raises:
        TypeError: the build function returned something other than
            ``(network, loss, log_tensors)``, with what it did return.
    """
    if not callable(build_training_func):
        raise TypeError("build_training_func must be callable as build_training_func(x, y), got "
                        f"{type(build_training_func).__name__}")
    x, y = symbolic_inputs(element_spec)
    result = _call_build(build_training_func, (x, y), "build_training_func")
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        raise TypeError("build_training_func(x, y) must return (network, loss, log_tensors), got "
                        f"{type(result).__name__}"
                        + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
    network, loss, log_tensors = result
    if not isinstance(network, keras.layers.Layer):
        raise TypeError("build_training_func must return a Keras model or layer as its network, "
                        f"got {type(network).__name__}")
    if not keras.backend.is_keras_tensor(loss):
        raise TypeError("build_training_func must return the loss as a tensor computed from x and "
                        f"y, got {type(loss).__name__}. {_SYMBOLIC_HINT}")
    if len(loss.shape) != 0:
        raise ValueError(f"the loss from build_training_func must be a scalar, got shape "
                         f"{tuple(loss.shape)}; reduce it, e.g. with keras.ops.mean")
    outputs = {LOSS_KEY: loss, **_named(log_tensors, "log_tensors", "tensor")}
    program = _program([x, y], outputs, "hvdtrain_training")
    _BUILT_FROM[program] = ([x, y], outputs, network)
    return network, program


def build_validation_program(build_validation_func: Callable, element_spec, network) -> keras.Model:
    """Calls ``build_validation_func(x, y)`` (or ``(x, y, network)``) once and wraps it.

    Returns:
        A functional model mapping ``[x, y]`` to ``{name: scalar metric}``.
    """
    if not callable(build_validation_func):
        raise TypeError("build_validation_func must be callable as build_validation_func(x, y), "
                        f"got {type(build_validation_func).__name__}")
    x, y = symbolic_inputs(element_spec)
    try:
        n_params = len(inspect.signature(build_validation_func).parameters)
    except (TypeError, ValueError):
        n_params = 2
    args = (x, y, network) if n_params >= 3 else (x, y)
    result = _call_build(build_validation_func, args, "build_validation_func")
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError("build_validation_func must return (network, metrics), got "
                        f"{type(result).__name__}")
    metrics = _named(result[1], "validation metrics", "metric")
    if not metrics:
        raise ValueError("build_validation_func returned no metrics")
    for name, t in metrics.items():
        if len(t.shape) != 0:
            raise ValueError(f"validation metric {name!r} must be a scalar (a batch mean), got "
                             f"shape {tuple(t.shape)}")
    return _program([x, y], metrics, "hvdtrain_validation")


class ModelWithLoss(keras.Model):
    """``[x, y] -> {"loss": mean(loss(y, model(x)))}`` around a ready Keras model."""

    def __init__(self, model: keras.Model, loss_fn: Callable, predicting: bool = False) -> None:
        super().__init__(name="hvdtrain_training")
        self.model = model
        self.loss_fn = loss_fn
        self.output_keys = [LOSS_KEY]
        self.predicting = predicting  # also return the model's output (PREDICTION_KEY)

    def call(self, inputs, training=False):
        x, y = inputs
        y_pred = self.model(x, training=training)
        outs = {LOSS_KEY: keras.ops.mean(self.loss_fn(y, y_pred))}
        return dict(outs, **{PREDICTION_KEY: y_pred}) if self.predicting else outs


class MeasuredProgram(keras.Model):
    """A training program that also feeds the Trainer's metrics with ``(y, network
    output)`` from the same forward pass, and returns the program's own outputs.

    It shares every layer and variable with the program it was made from; the Trainer
    checkpoints that one, so adding ``metrics=`` leaves checkpoints as they were.
    """

    def __init__(self, predicting: keras.Model, metrics, output_keys: list) -> None:
        super().__init__(name="hvdtrain_measured")
        self.predicting = predicting
        self.output_keys = list(output_keys)
        object.__setattr__(self, "_metric_set", metrics)  # not the program's variables

    def call(self, inputs, training=False):
        outs = dict(self.predicting(inputs, training=training))
        self._metric_set.update(inputs[1], outs.pop(PREDICTION_KEY))
        return outs


def with_metrics(program: keras.Model, metrics) -> keras.Model:
    """``program`` feeding ``metrics`` (a :class:`hvdtrain.metrics.MetricSet`) each step.

    Raises:
        ValueError: the network's output cannot be found (the build function called it
            more than once, or not on symbolic inputs), or the program is split over
            devices (``model_parallel``).
    """
    from hvdtrain.internals import keras_private
    if isinstance(program, ModelWithLoss):
        predicting = ModelWithLoss(program.model, program.loss_fn, predicting=True)
    elif program in _BUILT_FROM:
        inputs, outputs, network = _BUILT_FROM[program]
        found = keras_private.last_call_outputs(network)
        if len(found) != 1:
            raise ValueError("metrics=... needs the network's output, but the network returned "
                             f"by build_training_func has {len(found)} outputs from its last call "
                             "on x; call it once, with one output, or pass model=... and loss=...")
        predicting = keras.Model(inputs, dict(outputs, **{PREDICTION_KEY: found[0]}),
                                 name="hvdtrain_training")
    else:
        raise ValueError("metrics=... is not supported with model_parallel: evaluate them after "
                         "training with Trainer.evaluate")
    return MeasuredProgram(predicting, metrics, program.output_keys)


def model_program(model: keras.Model, loss, element_spec) -> keras.Model:
    """Wraps a ready Keras ``model`` and a ``loss`` into the same program form.

    Unlike a build function, the loss here may be any callable ``loss(y_true, y_pred)``
    (a Keras loss object, its name, or a function using ``tf.*``): it runs on real tensors.
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(f"model must be a Keras model, got {type(model).__name__}")
    try:
        loss_fn = keras.losses.get(loss)
    except (ValueError, TypeError) as err:
        raise ValueError(f"loss must be a Keras loss, its name, or a callable loss(y_true, "
                         f"y_pred), got {loss!r}") from err
    if loss_fn is None or not callable(loss_fn):
        raise ValueError(f"loss must be given with model=..., got {loss!r}")
    if not model.built:
        x, _ = symbolic_inputs(element_spec)
        model(x)  # creates the variables so the optimizer and broadcast can see them
    return ModelWithLoss(model, loss_fn)


def _program(inputs: list, outputs: dict, name: str) -> keras.Model:
    """A functional model with dict outputs; ``output_keys`` lists them sorted."""
    program = keras.Model(inputs=inputs, outputs=outputs, name=name)
    program.output_keys = sorted(outputs)
    return program


def total_loss(program: keras.Model, outputs: dict) -> tf.Tensor:
    """The loss to differentiate: the program's loss output plus the network's
    regularization losses, in float32."""
    loss = tf.cast(outputs[LOSS_KEY], tf.float32)
    if program.losses:
        loss = loss + tf.cast(tf.add_n(program.losses), tf.float32)
    return loss
