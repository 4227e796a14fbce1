"""``model.fit``'s compiled step when the model's optimizer is distributed.

Two things Keras 3 cannot do by itself with a Horovod exchange in the step (done for the
models handed to hvdtrain -- through its Keras callbacks, ``KerasState`` or ``load_model``
-- and only those; no global patch of ``keras.Model``):

* **A model built at its first batch.** Keras builds a model that has no ``Input``
  (``keras.Sequential([Dense(16), Dense(1)])``) when ``fit`` traces its first step, after
  the callbacks' ``on_train_begin``, so ``BroadcastGlobalVariablesCallback`` has nothing to
  broadcast then. The callback asks for the broadcast here instead: when the step is
  traced, the model (and its optimizer) are built from the batch's shapes and every
  variable is broadcast before the first update, so all ranks start from rank 0's values.
* **XLA.** Horovod's ops have no XLA kernels (``No registered 'HorovodGroupedAllreduce'
  OpKernel for XLA_CPU_JIT``). With ``jit_compile=True`` (Keras's ``"auto"`` turns it on
  when a GPU is visible) the forward and backward pass -- the whole of the user's
  ``train_step`` -- are compiled by XLA, the optimizer's ``apply`` there only hands the
  gradients out, and the exchange and the update run in the enclosing ``tf.function``.
"""
from __future__ import annotations

import functools

import tensorflow as tf

from hvdtrain import reporting
from hvdtrain.horovod import collectives, exchange, keras_epochs, step
from hvdtrain.horovod import optimizer as distributed
from hvdtrain.internals import keras_private


class _FitStep:
    """What ``fit``'s rerouted step keeps for one model (held by the routed
    ``make_train_function``, so nothing is set on the model): a broadcast still to be
    done, the XLA-compiled pass, and the :class:`~keras_epochs.EvenEpochs`."""

    def __init__(self) -> None:
        self.pending: tuple[int, list] | None = None
        self.xla = None  # (optimizer, compiled pass, capture)
        self.even: keras_epochs.EvenEpochs | None = None

    def __call__(self, original, model, force):
        return _make_train_function(self, original, model, force)


def attach(model) -> None:
    """Routes ``model``'s ``fit`` step through this module (once per model): hvdtrain's
    Keras callbacks, ``KerasState`` and ``load_model`` do it for the model they are given. Other models,
    and this one while its optimizer is not distributed, get Keras's step unchanged."""
    keras_private.route_make_train_function(model, _FitStep())


def _state(model) -> _FitStep | None:
    routed = keras_private.routed_wrapper(model)
    return routed if isinstance(routed, _FitStep) else None


def xla_compiled(model) -> bool:
    """True when ``fit``'s step compiled ``model``'s pass by XLA on its own."""
    state = _state(model)
    return state is not None and state.xla is not None


def model_built(model) -> bool:
    """True when every layer of ``model`` has created its variables."""
    return all(layer.built for layer in keras_private.flatten_layers(model))


def broadcast_model(model, root_rank: int, exclude=()) -> None:
    """Sets the model's and its optimizer's variables to ``root_rank``'s (eagerly), but
    for those in ``exclude`` (variables each rank keeps as its own)."""
    opt = getattr(model, "optimizer", None)
    if opt is not None and not opt.built:
        opt.build(model.trainable_variables)
    variables = list(model.variables) + (list(opt.variables) if opt is not None else [])
    step.broadcast_start(variables, root_rank, exclude)


def broadcast_at_first_step(model, root_rank: int, exclude=()) -> None:
    """Asks ``fit``'s first step to build ``model`` and broadcast its variables."""
    attach(model)
    _state(model).pending = (root_rank, list(exclude))


def take_pending_broadcast(model) -> tuple[int, list] | None:
    """``(root rank, excluded variables)`` of a broadcast still to be done (and forgets
    it), or None."""
    state = _state(model)
    if state is None:
        return None
    pending, state.pending = state.pending, None
    return pending


def _make_train_function(state: _FitStep, original, model, force):
    if model.train_function is not None and not force:
        return model.train_function
    if not distributed.is_distributed(getattr(model, "optimizer", None)):
        return original(model, force)
    xla = bool(model.jit_compile) and not model.run_eagerly
    train_step = functools.partial(_train_step, state, model, type(model).train_step, xla)
    # Keras reads both while it makes the function (3.15: before it returns).
    keras_private.set_untracked(model, "train_step", train_step)
    if xla:
        model.jit_compile = False
    try:
        function = original(model, force)
    finally:
        del model.__dict__["train_step"]
        if xla:
            model.jit_compile = True
    even = keras_epochs.EvenEpochs(model, function if function is not None else model.train_function)
    state.even = even
    model.train_function = even
    return even


def _train_step(state: _FitStep, model, user_step, xla: bool, data):
    pending = take_pending_broadcast(model)
    if pending is not None:  # traced on every rank at the first step: build, broadcast
        with tf.init_scope():
            if not model_built(model):
                keras_private.build_from_batch(model, data)
            broadcast_model(model, *pending)
    even, opt = state.even, model.optimizer
    last_batch = exchange.Rider(even.last_batch.value(), exact=True)
    # The epoch-end flag rides in the exchange of the optimizer's apply (the user's
    # train_step computes the gradients and calls it; the optimizer's exchanger reduces).
    with distributed.riding(opt, [last_batch], even.riders_sum):
        if not xla:
            return user_step(model, data)
        forward_backward, capture = _xla_step(state, model, user_step)
        logs, grads = forward_backward(data)
        distributed.apply(opt, grads, capture.variables, reduced=False)
        return logs


def _xla_step(state: _FitStep, model, user_step):
    """The user's ``train_step`` compiled by XLA, returning its logs and the gradients it
    gave the optimizer (one compiled function per model and optimizer)."""
    opt = model.optimizer
    cached = state.xla
    if cached is not None and cached[0] is opt:
        return cached[1], cached[2]
    capture = step.Capture()

    def forward_backward(data):
        with distributed.capturing(opt, capture):
            logs = user_step(model, data)
        if capture.grads is None:
            raise ValueError(f"{type(model).__name__}.train_step did not call its optimizer's "
                             "apply/apply_gradients: hvdtrain's XLA step hands the gradients "
                             "from there to the exchange")
        return logs, capture.grads

    reporting.setup_logging(collectives.rank())
    compiled = step.compile_pass(forward_backward, model.name)
    state.xla = (opt, compiled, capture)
    return compiled, capture
