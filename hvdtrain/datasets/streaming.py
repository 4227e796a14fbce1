"""Streaming IDX files through ``tf.data`` instead of loading them into memory.

A ``.gz`` file is decompressed once per machine into a cache file; each rank then reads
only its own records from it (see :func:`idx_tf_dataset`). TensorFlow is imported only
when a pipeline is built, so importing this module stays cheap.
"""
from __future__ import annotations

import fcntl
import functools
import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hvdtrain.datasets.idx import IMAGES_MAGIC, LABELS_MAGIC, find_idx, idx_dims
from hvdtrain.datasets.sources import PathLike, not_found, search_locations

logger = logging.getLogger("hvdtrain")

ENV_CACHE = "HVDTRAIN_CACHE"
BLOCK = 1024  # record groups read and decoded as one element: amortizes tf.data's per-element cost


def idx_cache_dir() -> Path:
    """Where decompressed IDX files are kept: ``$HVDTRAIN_CACHE/idx``, else
    ``~/.cache/hvdtrain/idx``."""
    root = os.environ.get(ENV_CACHE)
    return (Path(root) if root else Path.home() / ".cache" / "hvdtrain") / "idx"


@dataclass(frozen=True)
class _Records:
    """Fixed-length records of one IDX file, as ``tf.data`` reads them."""
    path: Path
    header: int
    size: int  # bytes per record
    count: int
    compression: str  # "" or "GZIP"


def idx_tf_dataset(images: PathLike, labels: PathLike):
    """Streams ``(x, y)`` pairs from an IDX image file and its label file with ``tf.data``.

    The files (``.gz`` or raw) are read block by block as training consumes them; only
    their headers and lengths are checked up front. A ``.gz`` file is first decompressed once per
    machine into :func:`idx_cache_dir` (falling back to streaming the gzip when that
    folder cannot be written). ``x`` is float32 of shape ``(rows * cols,)`` in [0, 1],
    ``y`` int32. The dataset shards itself before decoding
    (:func:`hvdtrain.data.shardable`), so each rank reads and decodes only its records.

    Raises:
        ValueError: a header that is not IDX, image and label counts that differ, or a
            file whose length does not match its header.
    """
    from hvdtrain import data

    images, labels = Path(images), Path(labels)
    dims, (count,) = idx_dims(images, IMAGES_MAGIC), idx_dims(labels, LABELS_MAGIC)
    if dims[0] != count:
        raise ValueError(f"{images} holds {dims[0]} images but {labels} holds {count} labels; "
                         "expected equal counts")
    xs = _records(images, int(np.prod(dims[1:])), count, 4 + 4 * len(dims))
    ys = _records(labels, 1, count, 8)
    return data.shardable(_stream(xs, ys, 1, 0), lambda n, i: _stream(xs, ys, n, i))


def _records(path: Path, size: int, count: int, header: int) -> _Records:
    """The records of ``path``, from its raw cache copy when it is gzipped."""
    raw = raw_copy(path) if path.suffix == ".gz" else path
    if raw is None:
        return _Records(path, header, size, count, "GZIP")
    found, expected = raw.stat().st_size - header, size * count
    if found != expected:
        what = "truncated" if found < expected else "has trailing data"
        raise ValueError(f"{path}: {what}; header declares {expected} data bytes, found {found}")
    return _Records(raw, header, size, count, "")


def raw_copy(path: Path) -> Optional[Path]:
    """The decompressed copy of gzip file ``path`` in :func:`idx_cache_dir`, made once per
    machine (named by the source's path, size and mtime; written to a temporary file and
    renamed under a lock, so concurrent ranks are safe); ``None`` when it cannot be written.

    Raises:
        ValueError: ``path`` is not a valid gzip stream.
    """
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    dest = idx_cache_dir() / f"{path.stem}.{key[:16]}"
    if dest.is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not dest.is_file():
                _decompress(path, dest)
    except OSError as e:
        logger.info("cannot cache the decompressed %s in %s (%s); streaming the gzip instead, "
                    "so every rank decompresses all of it", path, dest.parent, e)
        return None
    return dest


def _decompress(src: Path, dest: Path) -> None:
    """Gunzips ``src`` into a temporary file beside ``dest``, renamed to ``dest`` when whole."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)
        os.replace(tmp, dest)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{src}: cannot decompress ({e}); the file is corrupt or truncated") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _stream(xs: _Records, ys: _Records, num_shards: int, index: int):
    """Records ``index``, ``index + num_shards``, ... of both files as ``(x, y)`` pairs,
    exactly ``dataset.shard(num_shards, index)`` of the whole stream; only they are decoded."""
    import tensorflow as tf

    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} out of range for {num_shards} shards")
    groups, tail = divmod(xs.count, num_shards)
    parts = [_strided(xs, ys, 0, groups, num_shards, index)] if groups else []
    if index < tail:  # one record after the last whole group
        parts.append(_strided(xs, ys, groups * num_shards + index, 1, 1, 0))
    if not parts:  # fewer records than shards
        parts.append(tf.data.Dataset.from_tensor_slices(
            (np.zeros((0, 0, xs.size), np.float32), np.zeros((0, 0), np.int32))))
    ds = functools.reduce(tf.data.Dataset.concatenate, parts)
    count = groups + (index < tail)
    return ds.unbatch().apply(tf.data.experimental.assert_cardinality(count))


def _strided(xs: _Records, ys: _Records, first: int, groups: int, stride: int, index: int):
    """Blocks of the decoded pairs ``first + index + k * stride`` for ``k < groups``: each
    file is read in groups of ``stride`` records, of which only the ``index``-th is decoded."""
    import tensorflow as tf

    def raw_blocks(f: _Records):
        """Whole blocks of ``BLOCK`` groups, then one block of the groups left over."""
        whole, left = divmod(groups, BLOCK)
        parts = [(whole, BLOCK, 0)] * bool(whole) + [(1, left, whole * BLOCK)] * bool(left)
        blocks = [tf.data.FixedLengthRecordDataset(
            str(f.path), per_block * stride * f.size,
            header_bytes=f.header + (first + skip * stride) * f.size,
            footer_bytes=(f.count - first - (skip + n * per_block) * stride) * f.size,
            compression_type=f.compression) for n, per_block, skip in parts]
        return functools.reduce(tf.data.Dataset.concatenate, blocks)

    def kept(block, f: _Records):
        return tf.reshape(tf.io.decode_raw(block, tf.uint8), [-1, stride, f.size])[:, index]

    return tf.data.Dataset.zip((raw_blocks(xs), raw_blocks(ys))).map(
        lambda x, y: (tf.cast(kept(x, xs), tf.float32) / 255.0,
                      tf.cast(kept(y, ys)[:, 0], tf.int32)))


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
