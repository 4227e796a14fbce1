"""``DistributedGradientTape`` and ``PartialDistributedGradientTape`` for Keras 3 variables.

Horovod 0.28.1's tapes key gradients by ``Variable.ref()``, which Keras 3 variables do not
have, so ``tape.gradient(loss, model.trainable_variables)`` fails at the first step. These
tapes wrap the user's ``tf.GradientTape`` (after it recorded, as Horovod's idiom does, or
as the ``with`` block itself), compute its gradients and all-reduce them with the same
arguments and meaning as Horovod's.

hvdtrain's stateful compressions (``"topk"``, ``"randomk"``, ``"powersgd"``) work here
too: Horovod's idiom makes a new tape every step, so their state (residuals, PowerSGD's Q
and errors) lives in one Exchanger per compression and set of sources, kept across tapes
(:func:`exchanger_for`).
"""
from __future__ import annotations

from typing import Iterable

import keras
import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod import exchange, exchange_settings, finite
from hvdtrain.horovod import compression as compression_lib
from hvdtrain.horovod.exchange_settings import variable_key

#: Exchangers whose strategy keeps state between steps, by settings and sources
_KEPT: dict[tuple, exchange.Exchanger] = {}


def exchanger_for(how: exchange_settings.ExchangeSettings, sources) -> exchange.Exchanger:
    """The Exchanger that reduces ``sources``' gradients as ``how`` says: a new one for a
    stateless exchange, else the one kept for these settings and sources (a tape lives
    one step; residuals and PowerSGD's Q and errors must live on)."""
    if not isinstance(how.compression, (compression_lib.Sparsifier, compression_lib.PowerSGD)):
        return exchange.Exchanger(how)
    key = (repr(how), tuple(variable_key(v) for v in sources))
    if key not in _KEPT:
        _KEPT[key] = exchange.Exchanger(how)
    return _KEPT[key]


class DistributedTape:
    """A ``tf.GradientTape`` whose ``gradient`` is all-reduced over the ranks.

    Everything but ``gradient`` is the wrapped tape's (``watch``, ``jacobian``, ``with``...).
    Built by :func:`DistributedGradientTape`; see there for the arguments.
    """

    def __init__(self, tape: tf.GradientTape, how: exchange_settings.ExchangeSettings,
                 scale_local_gradients: bool, nan_policy: str = "ignore") -> None:
        self._tape = tape
        self._exchanger = exchange.Exchanger(how)
        self.nan_policy = nan_policy
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: set[int] = set()

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def register_local_source(self, source) -> None:
        """Marks ``source`` as this rank's own: its gradient is not exchanged (only
        divided by the number of ranks when ``scale_local_gradients``)."""
        self._local_sources.add(variable_key(source))

    def _members(self) -> int:
        members = self._exchanger.settings.process_set
        return dist.size() if members is None else members.size()

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        """The wrapped tape's gradients of ``target`` for ``sources`` (any nesting),
        all-reduced over the ranks except for registered local sources."""
        del use_generic_names  # Horovod names its ops with it; hvdtrain's ops are unnamed
        grads = self._tape.gradient(target, sources, output_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        shared = [i for i, s in enumerate(flat_sources)
                  if variable_key(s) not in self._local_sources]
        shared_vars = [flat_sources[i] for i in shared]
        self._exchanger = exchanger_for(self._exchanger.settings, shared_vars)
        reduced = self._reduce_checked([flat_grads[i] for i in shared], shared_vars)
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self.scale_local_gradients and self._local_sources:
            members = float(self._members())
            for i, s in enumerate(flat_sources):
                if i not in shared and out[i] is not None:
                    g = out[i]
                    out[i] = (tf.IndexedSlices(g.values / members, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / members)
        return tf.nest.pack_sequence_as(grads, out)

    def _reduce_checked(self, grads: list, variables: list) -> list:
        """The exchange, with this rank's non-finite-gradients flag riding along
        (:mod:`hvdtrain.horovod.finite`): under ``"stop"`` it raises when a rank's gradients
        are not finite, under ``"skip"`` every rank gets zero gradients for that call."""
        if self.nan_policy == "ignore" or not grads:
            return self._exchanger.reduce(grads, variables)[0]
        flag = finite.local_flag(grads)
        reduced, (count,) = self._exchanger.reduce(grads, variables,
                                                   [exchange.Rider(flag, exact=True)])
        ok = finite.apply_if_finite(self.nan_policy, count, flag, None, lambda: None,
                                    what="tape.gradient raised instead of returning them")
        if self.nan_policy == "skip":
            return [None if g is None else _where(ok, g) for g in reduced]
        with tf.control_dependencies([ok]):  # the check runs before the gradients are used
            return [g if g is None or isinstance(g, tf.IndexedSlices) else tf.identity(g)
                    for g in reduced]

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """``(local, global)`` lists of ``(variable, gradient)`` pairs, as Horovod's."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for s, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if variable_key(s) in self._local_sources else shared).append((s, g))
        return local, shared


def _where(ok, g):
    """``g`` when ``ok``, else zeros like it."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(tf.where(ok, g.values, tf.zeros_like(g.values)), g.indices,
                                g.dense_shape)
    return tf.where(ok, g, tf.zeros_like(g))


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression=None,
                            sparse_as_dense: bool = False, op=None,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups=None, process_set=None,
                            scale_local_gradients: bool = True) -> DistributedTape:
    """Horovod's ``DistributedGradientTape``, for Keras 3 and ``tf.Variable`` sources.

    Args:
        gradtape: the ``tf.GradientTape`` to wrap (usually after its ``with`` block).
        device_dense, device_sparse: accepted for Horovod's signature; TensorFlow places
            the exchange with the gradients.
        compression: Horovod's ``Compression.none`` / ``Compression.fp16`` (or their names);
            an hvdtrain extension: ``"topk"`` / ``"randomk"`` (1% of the entries),
            ``"powersgd"`` (rank 8), ``hvdtrain.compression.TopK(ratio)`` or
            ``PowerSGD(rank, start_step)``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before the all-reduce.
        op: ``Average`` (default), ``Sum``, ``Adasum``, ``Min``, ``Max`` or ``Product``.
        gradient_predivide_factor: with ``Average``, divide by this before the sum and by
            ``size / factor`` after it.
        num_groups, groups: fusion groups (a number of contiguous groups, or lists of
            variables each reduced in one call); default one fused call.
        process_set: a Horovod ``ProcessSet`` to reduce over (default: every rank).
        scale_local_gradients: divide registered local sources' gradients by the size.

    Raises:
        TypeError: ``gradtape`` is not a ``tf.GradientTape``.
        ValueError: a bad ``op``, ``compression``, factor or group specification.
    """
    del device_dense, device_sparse
    dist.init()
    if not isinstance(gradtape, (tf.GradientTape, DistributedTape)):
        raise TypeError("DistributedGradientTape wraps a tf.GradientTape, got "
                        f"{type(gradtape).__name__}")
    hvd_op = dist.resolve_op(dist.Average if op is None else op, any_reduction=True)
    fusion = exchange_settings.check_groups(groups, num_groups)
    hvd_op, prescale, postscale = exchange_settings.predivide(gradient_predivide_factor, hvd_op,
                                                     process_set)
    if hvd_op is dist.Adasum and process_set is not None:
        raise ValueError("op Adasum reduces over every rank; it takes no process_set")
    inner = gradtape._tape if isinstance(gradtape, DistributedTape) else gradtape
    how = exchange_settings.ExchangeSettings(
        op=hvd_op, compression=compression_lib.resolve(compression),
        sparse_as_dense=bool(sparse_as_dense), prescale=prescale, postscale=postscale,
        groups=fusion, process_set=dist.process_set_or_none(process_set))
    # Horovod's signature, unchanged: the tape's nan_policy is $HVDTRAIN_NAN_POLICY (default
    # "stop": raise from gradient naming the ranks; "skip": zero gradients on every rank
    # for that call, so momentum still moves; DistributedOptimizer skips exactly).
    return DistributedTape(inner, how, scale_local_gradients=bool(scale_local_gradients),
                           nan_policy=finite.resolve_policy(None))


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression=None,
                                   sparse_as_dense: bool = False, op=None,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients: bool = True) -> DistributedTape:
    """A :func:`DistributedGradientTape` that leaves the gradients of ``local_layers``'
    trainable weights unexchanged (each rank keeps its own; see ``register_local_source``).

    Raises:
        ValueError: ``local_layers`` holds something that is not a Keras layer.
    """
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    layers: Iterable = ([] if local_layers is None else
                        [local_layers] if isinstance(local_layers, keras.layers.Layer)
                        else list(local_layers))
    for layer in layers:
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError("local_layers must be Keras layers, got "
                             f"{type(layer).__name__}")
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
