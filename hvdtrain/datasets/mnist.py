"""MNIST and Fashion-MNIST loaders: from IDX files or Keras's ``mnist.npz``, downloaded
from a mirror when found nowhere."""
from __future__ import annotations

import logging
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hvdtrain.datasets.idx import IDX_FILES, find_idx, load_idx_arrays
from hvdtrain.datasets.shaping import check_shape, to_float, validation_size
from hvdtrain.datasets.sources import (ENV_DATA_DIR, NET_ERRORS, PathLike, cache_dir, download_disabled,
                                       fetch, not_found, record_source, search_locations)

logger = logging.getLogger("hvdtrain")

MNIST_URLS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
FASHION_MNIST_URLS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
)


def _load_npz_arrays(path: Path):
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = tuple(np.asarray(z[k]) for k in ("x_train", "y_train", "x_test", "y_test"))
    except KeyError as e:
        raise ValueError(f"{path}: missing array {e}; expected keys x_train, y_train, x_test, y_test") from e
    except (zipfile.BadZipFile, EOFError, ValueError, zlib.error) as e:
        raise ValueError(f"{path}: not a readable .npz file ({e})") from e
    x_tr, y_tr, x_te, y_te = arrays
    for x, y, split in ((x_tr, y_tr, "train"), (x_te, y_te, "test")):
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{path}: x_{split} {x.shape} / y_{split} {y.shape}; expected (N, 28, 28) and (N,)")
    return x_tr.astype(np.uint8, copy=False), y_tr, x_te.astype(np.uint8, copy=False), y_te


def _load_mnist_like(name, title, shape, path, n_validation, download, urls, hint):
    shape = check_shape(shape)
    allow_npz = name == "mnist"
    looked, found = [], None
    locations = [Path(path).expanduser()] if path is not None else search_locations(name)
    for loc in locations:
        if allow_npz and loc.suffix == ".npz":
            if loc.is_file():
                found = ("npz", loc)
                break
            looked.append(f"{loc} (does not exist)")
            continue
        files, reason = find_idx(loc)
        if files:
            found = ("idx", files, files[0].parent)
            break
        if allow_npz and (loc / "mnist.npz").is_file():
            found = ("npz", loc / "mnist.npz")
            break
        looked.append(reason + (" and no mnist.npz" if allow_npz and loc.is_dir() else ""))
    if found is None:
        note = "not attempted (an explicit path was given)" if path is not None else download_disabled(download)
        if note is None:
            cache = cache_dir(name)
            errors = []
            for base in urls:
                try:
                    for stem in IDX_FILES:
                        url = f"{base}{stem}.gz"
                        if not (cache / (stem + ".gz")).is_file():
                            logger.info("Downloading %s to %s", url, cache)
                            fetch(url, cache / (stem + ".gz"))
                    break
                except NET_ERRORS as e:
                    errors.append(f"{url}: {e}")
            files, _ = find_idx(cache)
            if files and len(errors) < len(urls):
                found = ("idx", files, files[0].parent)
            note = "failed: " + "; ".join(errors)
        if found is None:
            raise not_found(title, looked, note, hint)
    if found[0] == "npz":
        x_tr, y_tr, x_te, y_te = _load_npz_arrays(found[1])
    else:
        x_tr, y_tr, x_te, y_te = load_idx_arrays(found[1])
    source = str(found[1] if found[0] == "npz" else found[2])
    record_source(name, source)
    logger.info("Loaded %s from %s", title, source)
    n_val = validation_size(len(x_tr), n_validation)
    split = len(x_tr) - n_val
    return (to_float(x_tr[:split], shape, "training images"), y_tr[:split].astype(np.int32),
            to_float(x_tr[split:], shape, "validation images"), y_tr[split:].astype(np.int32),
            to_float(x_te, shape, "test images"), y_te.astype(np.int32))


_IDX_HINT = ("Put the four IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
             "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in a folder and pass path=<folder>, "
             f"or put them in ${ENV_DATA_DIR}/{{name}}/.")


def load_mnist_dataset(shape: Sequence[int] = (-1, 784), path: Optional[PathLike] = None, *,
                       n_validation: int = 10000, download: bool = True):
    """Load MNIST as TensorLayer does.

    Args:
        shape: Shape each image split is reshaped to, e.g. ``(-1, 784)`` or ``(-1, 28, 28, 1)``.
        path: Folder with the IDX files (or ``mnist.npz``), or an ``.npz`` file; searched alone.
        n_validation: Trailing training images held out for validation. If it is not smaller
            than the number of training images it is clamped to ``n_train // 6``.
        download: Whether to download into ``~/.cache/hvdtrain/datasets/mnist`` if not found.

    Returns:
        ``X_train, y_train, X_val, y_val, X_test, y_test``; X float32 in [0, 1], y int32.
    """
    hint = _IDX_HINT.format(name="mnist") + " Keras's mnist.npz is accepted too."
    return _load_mnist_like("mnist", "MNIST", shape, path, n_validation, download, MNIST_URLS, hint)


def load_fashion_mnist_dataset(shape: Sequence[int] = (-1, 784), path: Optional[PathLike] = None, *,
                               n_validation: int = 10000, download: bool = True):
    """Load Fashion-MNIST as TensorLayer does; same arguments and returns as `load_mnist_dataset`."""
    hint = ("On Debian/Ubuntu: apt-get install dataset-fashion-mnist. Otherwise: "
            + _IDX_HINT.format(name="fashion-mnist"))
    return _load_mnist_like("fashion-mnist", "Fashion-MNIST", shape, path, n_validation, download,
                            FASHION_MNIST_URLS, hint)
