"""TensorFlow private APIs that hvdtrain uses, each with its reason (checked by
``tests/unit/test_private_apis.py``)."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import tensorflow as tf


def num_workers(strategy) -> int:
    """``ParameterServerStrategy.extended._num_workers``: the number of workers the
    coordinator schedules on, which the public API does not expose (it is set from the
    cluster spec)."""
    return int(strategy.extended._num_workers)


def dataset_to_graph(dataset: tf.data.Dataset) -> tf.Tensor:
    """The serialized graph of ``dataset`` (``DatasetToGraphV2``): the master builds the
    user's pipeline once and every parameter-server worker rebuilds it from the graph, so a
    pipeline made from Python objects need not be re-created on the workers."""
    return tf.raw_ops.DatasetToGraphV2(input_dataset=tf.data.experimental.to_variant(dataset),
                                       external_state_policy=0,  # 0: warn on state
                                       strip_device_assignment=True)


def dataset_from_graph(graph: tf.Tensor, element_spec) -> tf.data.Dataset:
    """The dataset :func:`dataset_to_graph` serialized (``DatasetFromGraph``)."""
    return tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph),
                                             element_spec)


def in_xla_context() -> bool:
    """``control_flow_util.GraphOrParentsInXlaContext``: True while tracing inside a
    ``tf.function(jit_compile=True)`` (or a function it calls). Horovod's ops have no XLA
    kernels, so an exchange traced there would fail at run time with a bare "No registered
    OpKernel"; the public API has no way to ask."""
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def context_started() -> bool:
    """``context.context()._initialized``: True once TensorFlow's eager context exists
    (its first op, or anything that lists logical devices). After that, TensorFlow refuses
    thread counts, visible devices, memory growth and virtual devices, so ``hvd.init()``
    must not get there; the public API can only tell by making a setting fail."""
    from tensorflow.python.eager import context

    return bool(context.context()._initialized)


class HostReadCounter:
    """How many device-to-host reads :func:`count_host_reads` has seen so far."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        """Counts one read."""
        with self._lock:
            self.count += 1


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReadCounter]:
    """``ops._EagerTensorBase._numpy``: counts the device-to-host reads of eager tensors
    while the block runs. Every ``float()``, ``int()``, ``bool()``, ``.numpy()``, index
    use and ``repr()`` of an eager tensor (a variable's too) goes through it, and each is
    a host sync; the public API has no hook to count them. ``hvdtrain bench`` reports the
    reads per step of each loop with it. Not seen: ``np.array()`` / ``np.asarray()`` /
    ``memoryview()`` of a tensor, which take the C buffer protocol (Keras converts its
    logs that way), so a count is a lower bound where those are used.

    Yields:
        The counter; its ``count`` grows with each read until the block ends.
    """
    from tensorflow.python.framework import ops

    base = ops._EagerTensorBase
    original = vars(base)["_numpy"]  # a KeyError if TensorFlow renamed or moved it
    counter = HostReadCounter()

    def counted(self):
        counter.add()
        return original(self)

    base._numpy = counted
    try:
        yield counter
    finally:
        base._numpy = original
