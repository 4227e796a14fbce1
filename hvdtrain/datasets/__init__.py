"""Loaders for MNIST, Fashion-MNIST and CIFAR-10 that return TensorLayer's splits.

Pure numpy + standard library (no TensorFlow, no Horovod), so importing is cheap.

MNIST / Fashion-MNIST are read from the original IDX files (``*-ubyte.gz`` or
uncompressed), MNIST also from Keras's ``mnist.npz``. CIFAR-10 is read from the
``cifar-10-batches-py`` pickle batches. When ``path`` is None the loaders search,
in order:

1. ``$HVDTRAIN_DATA_DIR/<name>/`` (``mnist``, ``fashion-mnist``, ``cifar10``),
2. Keras's cache ``~/.keras/datasets/`` (``$KERAS_HOME/datasets`` if set):
   ``mnist.npz``, ``fashion-mnist/``, ``cifar-10-batches-py/``,
3. ``~/.cache/hvdtrain/datasets/<name>/``,
4. Fashion-MNIST only: ``/usr/share/datasets/fashion-mnist/`` (Debian package
   ``dataset-fashion-mnist``).

IDX folders may hold the files directly or in a ``data/`` subfolder. If nothing
is found the files are downloaded into ``~/.cache/hvdtrain/datasets/<name>/``
unless ``download=False`` or ``HVDTRAIN_NO_DOWNLOAD=1``; failing that a
``FileNotFoundError`` lists every place looked. An explicit ``path`` is searched
alone and never triggers a download. Corrupt files raise ``ValueError``.

The package is split by job: :mod:`~hvdtrain.datasets.sources` (where files are looked
for and fetched), :mod:`~hvdtrain.datasets.idx` (the IDX format),
:mod:`~hvdtrain.datasets.mnist` and :mod:`~hvdtrain.datasets.cifar` (the loaders),
:mod:`~hvdtrain.datasets.shaping` (the float splits),
:mod:`~hvdtrain.datasets.streaming` (``tf.data`` over IDX files) and
:mod:`~hvdtrain.datasets.per_host` (under Horovod, one download per host:
``load_once_per_host(load_mnist_dataset, shape=...)``). The constants below are
re-exported for reading; to change one (say, in a test) set it on the module that uses
it, e.g. ``hvdtrain.datasets.mnist.MNIST_URLS``.
"""
from __future__ import annotations

from hvdtrain.datasets.cifar import CIFAR10_URL, CIFAR_FILES, load_cifar10_dataset
from hvdtrain.datasets.idx import IDX_FILES, IMAGES_MAGIC, LABELS_MAGIC
from hvdtrain.datasets.mnist import (FASHION_MNIST_URLS, MNIST_URLS, load_fashion_mnist_dataset,
                                     load_mnist_dataset)
from hvdtrain.datasets.per_host import load_once_per_host
from hvdtrain.datasets.sources import (CIFAR_DIR, DOWNLOAD_TIMEOUT_S, ENV_DATA_DIR, ENV_NO_DOWNLOAD,
                                       FASHION_MNIST_SYSTEM_DIRS, PathLike, describe_source)
from hvdtrain.datasets.streaming import fashion_mnist_files, idx_tf_dataset

__all__ = [
    "load_mnist_dataset",
    "load_fashion_mnist_dataset",
    "load_cifar10_dataset",
    "describe_source",
    "load_once_per_host",
]
