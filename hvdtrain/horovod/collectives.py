"""Every collective hvdtrain uses, behind one small interface.

The rest of hvdtrain talks about broadcasts and reductions through the functions here
(and about ranks through :mod:`hvdtrain.horovod.runtime`, whose names this
module re-exports for its callers), so the launcher (``horovodrun``, ``mpirun`` or a
plain ``python``) never leaks into the training code. Horovod is imported only inside
``hvdtrain.horovod``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

from hvdtrain.horovod import sparse_exchange, watchdog
from hvdtrain.horovod.runtime import alone, is_initialized
from hvdtrain.horovod.runtime import (  # noqa: F401 - re-exported for callers
    init, is_root, local_rank, local_size, mpi_enabled, rank, size)
from hvdtrain.internals import tensorflow_private

Average = hvd.Average
Sum = hvd.Sum
Adasum = hvd.Adasum
Compression = hvd.Compression

Min = hvd.Min
Max = hvd.Max
Product = hvd.Product

_OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum, "min": hvd.Min,
        "max": hvd.Max, "product": hvd.Product}
_COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}


_GRADIENT_OPS = ("average", "sum", "adasum")


def resolve_op(op, *, any_reduction: bool = False):
    """Turns ``"average"``/``"sum"``/``"adasum"`` or a Horovod op into a Horovod op; with
    ``any_reduction`` (Horovod's own API) also ``"min"``/``"max"``/``"product"``.

    Raises:
        ValueError: for anything else, naming the accepted values.
    """
    names = list(_OPS) if any_reduction else list(_GRADIENT_OPS)
    if isinstance(op, str) and op.lower() in names:
        return _OPS[op.lower()]
    if not isinstance(op, (bool, str)) and op in [_OPS[n] for n in names]:
        return op
    raise ValueError(f"op must be one of {', '.join(repr(n) for n in names)} (or hvdtrain."
                     f"{'/'.join(n.capitalize() for n in names)}), got {op!r}")


def resolve_compression(compression):
    """Turns ``None``/``"none"``/``"fp16"`` or a Horovod compressor into a compressor.

    Raises:
        ValueError: for anything else, naming the accepted values.
    """
    if compression is None:
        return hvd.Compression.none
    if isinstance(compression, str) and compression.lower() in _COMPRESSIONS:
        return _COMPRESSIONS[compression.lower()]
    if compression in _COMPRESSIONS.values():
        return compression
    raise ValueError(f"compression must be one of {sorted(_COMPRESSIONS)} (or hvdtrain."
                     f"Compression.none/fp16), got {compression!r}")


def reduce_gradients(grads: Sequence, *, op=hvd.Average, compression=hvd.Compression.none,
                     sparse_as_dense: bool = False, prescale: float = 1.0,
                     postscale: float = 1.0, groups: Sequence[Sequence[int]] | None = None,
                     process_set=None) -> list:
    """All-reduces a list of gradients (``None`` entries stay ``None``).

    Dense gradients go through one ``grouped_allreduce`` (or one per entry of ``groups``,
    lists of positions in ``grads``; positions in no group are reduced one by one, as
    Horovod's ``groups`` argument means); ``tf.IndexedSlices`` are densified when
    ``sparse_as_dense`` and otherwise reduced by Horovod's allgather path.
    ``process_set`` (a Horovod ``ProcessSet``) limits the reduction to its ranks.
    """
    check_not_in_xla("the gradient exchange")
    where = {} if process_set is None else {"process_set": process_set}
    alone_here = alone() if process_set is None else process_set.size() == 1
    if alone_here and op is not hvd.Adasum and prescale * postscale == 1.0:
        return list(grads)
    scale = dict(prescale_factor=prescale, postscale_factor=postscale, **where)
    out = list(grads)
    dense_idx, dense = [], []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                out[i] = _watched_in_graph(
                    "the gradient exchange", lambda g=g: sparse_exchange.reduce_indexed_slices(
                        g, op=op, prescale=prescale, postscale=postscale,
                        process_set=process_set))
                continue
        dense_idx.append(i)
        dense.append(g)
    if dense and op is hvd.Adasum:
        # Horovod 0.28.1's grouped_allreduce fails for Adasum (an unbound name on its
        # Adasum path), so Adasum reduces tensor by tensor.
        buckets = [[k] for k in range(len(dense))]
    elif groups is None:
        buckets = [list(range(len(dense)))] if dense else []
    else:
        slot = {i: k for k, i in enumerate(dense_idx)}
        buckets = [[slot[i] for i in group if i in slot] for group in groups]
        grouped = {k for bucket in buckets for k in bucket}
        buckets = [b for b in buckets if b] + [[k] for k in range(len(dense)) if k not in grouped]
    reduced: dict[int, tf.Tensor] = {}
    for bucket in buckets:
        if len(bucket) == 1:
            def run(bucket=bucket):
                return [hvd.allreduce(dense[bucket[0]], op=op, compression=compression, **scale)]
        else:
            def run(bucket=bucket):
                return hvd.grouped_allreduce([dense[k] for k in bucket], op=op,
                                             compression=compression, **scale)
        reduced.update(zip(bucket, _watched_in_graph("the gradient exchange", run)))
    for k, i in enumerate(dense_idx):
        out[i] = reduced[k]
    return out


def _watched_in_graph(label: str, run):
    """``run()``'s collectives, marked for the watchdog as they start and end when they
    run inside a ``tf.function`` (a tape loop's exchange). Just ``run()`` eagerly, with no
    watchdog, or when traced inside a step already marked from Python (the Trainer's and
    ``fit``'s), whose marks cover it at no cost per step."""
    if tf.executing_eagerly() or not watchdog.running() or watchdog.marked():
        return run()
    token = tf.py_function(lambda: np.int64(watchdog.enter(label)), [], tf.int64)
    with tf.control_dependencies([token]):
        results = run()
    flat = tf.nest.flatten(results, expand_composites=True)
    with tf.control_dependencies(flat):
        left = tf.py_function(lambda t: np.int64(watchdog.leave(int(t)) or 0), [token],
                              tf.int64)
    with tf.control_dependencies([left]):
        flat = [tf.identity(t) for t in flat]
    return tf.nest.pack_sequence_as(results, flat, expand_composites=True)


def watched(fn):
    """``fn`` (one of Horovod's collectives) marked for the watchdog: eagerly while it
    waits, labelled with its name and caller; inside a ``tf.function`` as it runs."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not watchdog.running():
            return fn(*args, **kwargs)
        if not tf.executing_eagerly():
            return _watched_in_graph(f"hvd.{fn.__name__}", lambda: fn(*args, **kwargs))
        with _watched(fn.__name__):
            return fn(*args, **kwargs)

    return call


def check_not_in_xla(what: str) -> None:
    """Refuses to trace a Horovod collective inside an XLA-compiled function.

    Raises:
        ValueError: naming the fix (Horovod's ops have no XLA kernels).
    """
    if tensorflow_private.in_xla_context():
        raise ValueError(f"{what} cannot run inside a tf.function(jit_compile=True): Horovod's "
                         "collectives have no XLA kernels. Compile only the forward and backward "
                         "pass (a jit_compile=True function that returns the gradients) and "
                         "exchange and apply them outside it. Trainer(jit_compile=True) does "
                         "this for you, and so does model.fit for a model given to one of "
                         "hvdtrain's Keras callbacks (pass BroadcastGlobalVariablesCallback(0) "
                         "to fit, as Horovod scripts do) or compile with jit_compile=False")


def process_set_or_none(process_set):
    """``None`` for every rank (``None`` or Horovod's global set), else ``process_set``."""
    if process_set is None or process_set.process_set_id == 0:
        return None
    return process_set


def allgather(tensor: tf.Tensor) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along the first axis, in rank order."""
    if alone():
        return tensor
    return hvd.allgather(tensor)


def start_timeline(path: str, mark_cycles: bool = False) -> None:
    """Starts writing Horovod's timeline (a Chrome trace) to ``path`` (call on every rank).

    Raises:
        ValueError: the job was started with a fixed timeline file (``horovodrun
            --timeline-filename`` / ``HOROVOD_TIMELINE``), or Horovod was initialized
            before hvdtrain could enable run-time timelines.
    """
    check_timeline_possible(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    hvd.start_timeline(path, mark_cycles=mark_cycles)


def check_timeline_possible(path: str) -> None:
    """Raises a ValueError naming the fix when :func:`start_timeline` cannot record ``path``."""
    fixed = os.environ.get("HOROVOD_TIMELINE")
    if fixed and fixed != "DYNAMIC":
        raise ValueError(f"timeline={path!r}: this job already records Horovod's timeline to "
                         f"{fixed!r}; drop one of the two")
    if is_initialized() and fixed != "DYNAMIC":
        raise ValueError(f"timeline={path!r}: Horovod was started without run-time timelines; "
                         "call hvdtrain.init(timeline=True) before the first Trainer (or let "
                         "the Trainer start Horovod)")


def stop_timeline() -> None:
    """Stops writing Horovod's timeline."""
    hvd.stop_timeline()


def check_same_variables(variables: Sequence, root_rank: int = 0, process_set=None) -> None:
    """Checks that every rank holds the same variables (names, shapes, dtypes) as
    ``root_rank``, so a broadcast cannot hang or fail on mismatched models.

    Args:
        variables: this rank's variables.
        root_rank: the rank (of the job) whose variables are the reference.
        process_set: a Horovod ``ProcessSet`` to check over (default: every rank).

    Raises:
        ValueError: on every rank, listing the first differences by the job's ranks.
    """
    ranks = list(range(hvd.size())) if process_set is None else list(process_set.ranks)
    if len(ranks) == 1:
        return
    mine = [(str(getattr(v, "path", v.name)), tuple(v.shape), str(v.dtype)) for v in variables]
    everyone = (allgather_object(mine) if process_set is None
                else hvd.allgather_object(mine, process_set=process_set))
    reference = everyone[ranks.index(root_rank)]
    problems = []
    for r, theirs in zip(ranks, everyone):
        if theirs == reference:
            continue
        if len(theirs) != len(reference):
            problems.append(f"rank {r} has {len(theirs)} variables, rank {root_rank} has "
                            f"{len(reference)}")
        for a, b in zip(reference, theirs):
            if a != b:
                problems.append(f"rank {r} has {b[0]} {b[1]} {b[2]} where rank {root_rank} has "
                                f"{a[0]} {a[1]} {a[2]}")
                break
    if problems:
        raise ValueError("the ranks built different models, so their variables cannot be "
                         "broadcast: " + "; ".join(problems[:5]))


def broadcast_variables(variables: Iterable, root_rank: int = 0, *, process_set=None,
                        inplace: bool = False):
    """Sets every variable (Keras 3 or ``tf.Variable``) to rank ``root_rank``'s value.

    Works eagerly and inside ``tf.function``. Called eagerly, it first checks that all
    ranks hold the same variables (:func:`check_same_variables`).

    Args:
        variables: the variables to set.
        root_rank: the rank whose values win.
        process_set: a Horovod ``ProcessSet`` to broadcast over (default: every rank).
        inplace: Horovod's in-place broadcast.

    Returns:
        Horovod's broadcast op inside a ``tf.function``, else None.
    """
    variables = list(variables)
    members = hvd.size() if process_set is None else process_set.size()
    if members == 1 or not variables:
        return None
    tf_vars = [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in variables]
    where = {} if process_set is None else {"process_set": process_set}
    eager = tf.executing_eagerly()  # inside a tf.function the step's own label holds
    with _watched("broadcast_variables") if eager else contextlib.nullcontext():
        if eager:
            check_same_variables(variables, root_rank, process_set)
        return hvd.broadcast_variables([v for v in tf_vars if isinstance(v, tf.Variable)],
                                       root_rank=root_rank, inplace=inplace, **where)


def _watched(name: str):
    """Marks this rank as waiting in a collective for the watchdog, labelled with the
    outermost function of this module on the stack and its caller (``"barrier in main"``:
    the same text on every rank that arrives)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        name, frame = frame.f_code.co_name, frame.f_back
    return watchdog.waiting(f"{name} in {frame.f_code.co_name}")


def allreduce_mean(tensor: tf.Tensor) -> tf.Tensor:
    """The mean of ``tensor`` over all ranks (works inside ``tf.function``)."""
    if alone():
        return tensor
    return hvd.allreduce(tensor, op=hvd.Average)


def allreduce_total(tensor: tf.Tensor) -> tf.Tensor:
    """The sum of ``tensor`` over all ranks (works inside ``tf.function``)."""
    if alone():
        return tensor
    return hvd.allreduce(tensor, op=hvd.Sum)


def size_now() -> tf.Tensor:
    """The number of ranks as a tensor read when the graph runs, not when it is traced
    (an elastic job's traced steps outlive a resize)."""
    return hvd.size_op()


def broadcast_object(obj, root_rank: int = 0):
    """Returns rank ``root_rank``'s copy of a picklable Python object."""
    if alone():
        return obj
    with _watched("broadcast_object"):
        return hvd.broadcast_object(obj, root_rank=root_rank)


def broadcast_ints(values: Sequence[int], root_rank: int = 0) -> list[int]:
    """Rank ``root_rank``'s integers (the same count on every rank), in one broadcast of
    an int64 tensor: half what :func:`broadcast_object` costs (its size, then its bytes)."""
    if alone():
        return [int(v) for v in values]
    with _watched("broadcast_ints"):
        out = hvd.broadcast(tf.constant(list(values), tf.int64), root_rank=root_rank)
    return [int(v) for v in out.numpy()]


def allgather_object(obj) -> list:
    """Returns the list of every rank's ``obj``, in rank order."""
    if alone():
        return [obj]
    with _watched("allgather_object"):
        return hvd.allgather_object(obj)


def allreduce_sum(values: Sequence[float]) -> np.ndarray:
    """Sums a vector of numbers over all ranks (float64)."""
    arr = np.asarray(values, dtype=np.float64)
    if alone():
        return arr
    with _watched("allreduce_sum"):
        return hvd.allreduce(tf.constant(arr), op=hvd.Sum, name=None).numpy()


def allreduce_dict(values: Mapping[str, float], *, weight: float | None = 1.0) -> dict[str, float]:
    """Named numbers over ranks, in one all-reduce: their weighted mean, or with
    ``weight=None`` their sum. Keys are sorted so all ranks agree.

    Args:
        values: this rank's numbers by name (every rank must pass the same names).
        weight: this rank's weight, e.g. its sample count; ``None``: sum, no weights.
    """
    names = sorted(values)
    vec = [float(values[k]) * (1.0 if weight is None else weight) for k in names]
    total = allreduce_sum(vec if weight is None else vec + [float(weight)])
    denom = 1.0 if weight is None or not total[-1] else total[-1]
    return {k: float(total[i] / denom) for i, k in enumerate(names)}


def agree_any(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one rank."""
    return bool(allreduce_sum([1.0 if flag else 0.0])[0] > 0)


def barrier() -> None:
    """Waits until every rank gets here."""
    allreduce_sum([0.0])

