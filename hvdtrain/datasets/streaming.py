"""Streaming IDX files through ``tf.data`` instead of loading them into memory.

TensorFlow is imported only when a pipeline is built, so importing this module stays cheap.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from hvdtrain.datasets.idx import IMAGES_MAGIC, LABELS_MAGIC, find_idx, idx_dims
from hvdtrain.datasets.sources import PathLike, not_found, search_locations


def idx_tf_dataset(images: PathLike, labels: PathLike):
    """Streams ``(x, y)`` pairs from an IDX image file and its label file with ``tf.data``.

    The files (``.gz`` or raw) are read record by record as training consumes them; only
    the headers are checked up front. ``x`` is float32 of shape ``(rows * cols,)`` in
    [0, 1], ``y`` int32.

    Raises:
        ValueError: a header that is not IDX, or image and label counts that differ.
    """
    import tensorflow as tf

    images, labels = Path(images), Path(labels)
    dims, (count,) = idx_dims(images, IMAGES_MAGIC), idx_dims(labels, LABELS_MAGIC)
    if dims[0] != count:
        raise ValueError(f"{images} holds {dims[0]} images but {labels} holds {count} labels; "
                         "expected equal counts")
    size = int(np.prod(dims[1:]))

    def records(path: Path, record_bytes: int, header: int):
        return tf.data.FixedLengthRecordDataset(
            str(path), record_bytes, header_bytes=header,
            compression_type="GZIP" if path.suffix == ".gz" else "")

    # Decoding whole blocks of records amortizes tf.data's per-element cost.
    xs = records(images, size, 4 + 4 * len(dims)).batch(1024).map(
        lambda r: tf.reshape(tf.cast(tf.io.decode_raw(r, tf.uint8), tf.float32),
                             [-1, size]) / 255.0).unbatch()
    ys = records(labels, 1, 8).batch(1024).map(
        lambda r: tf.cast(tf.io.decode_raw(r, tf.uint8)[:, 0], tf.int32)).unbatch()
    ds = tf.data.Dataset.zip((xs, ys))
    return ds.apply(tf.data.experimental.assert_cardinality(count))


def fashion_mnist_files(path: Optional[PathLike] = None) -> tuple:
    """The four Fashion-MNIST IDX files (train images, train labels, test images, test
    labels), found where :func:`load_fashion_mnist_dataset` looks; nothing is downloaded.

    Raises:
        FileNotFoundError: naming every place looked in.
    """
    looked = []
    for loc in [Path(path).expanduser()] if path is not None else search_locations("fashion-mnist"):
        files, reason = find_idx(loc)
        if files:
            return tuple(files)
        looked.append(reason)
    raise not_found("Fashion-MNIST", looked, "not attempted (files only)",
                    "On Debian/Ubuntu: apt-get install dataset-fashion-mnist.")
