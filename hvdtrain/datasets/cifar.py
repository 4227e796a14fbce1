"""The CIFAR-10 loader: the ``cifar-10-batches-py`` pickle batches, read with an unpickler
that accepts nothing but numpy arrays, downloaded and safely extracted when found nowhere."""
from __future__ import annotations

import logging
import os
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hvdtrain.datasets.shaping import check_shape, to_float
from hvdtrain.datasets.sources import (CIFAR_DIR, ENV_DATA_DIR, NET_ERRORS, PathLike, cache_dir,
                                       download_disabled, fetch, not_found, record_source,
                                       search_locations)

logger = logging.getLogger("hvdtrain")

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the globals a CIFAR-10 batch (a dict of numpy arrays) needs."""

    _ALLOWED = {("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
                ("numpy._core.numeric", "_frombuffer"), ("numpy", "ndarray"), ("numpy", "dtype"),
                ("_codecs", "encode")}

    def find_class(self, module, name):
        module = module.replace("numpy.core", "numpy._core", 1) if module.startswith("numpy.core") else module
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")
        return super().find_class(module, name)


def _load_cifar_batch(path: Path):
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
        batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a CIFAR-10 batch ({type(e).__name__}: {e}); expected a pickled dict "
                         "with b'data' (N, 3072) uint8 and b'labels'") from e
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
        raise ValueError(f"{path}: data {data.shape}, labels {labels.shape}; expected (N, 3072) and (N,)")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels outside 0..9")
    return data, labels


def _extract_cifar(archive: Path, dest_parent: Path) -> None:
    """Extract only ``cifar-10-batches-py/`` regular files, via a temp folder renamed when complete."""
    tmp = Path(tempfile.mkdtemp(dir=dest_parent, prefix=".extract-"))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if Path(m.name).is_absolute() or ".." in parts or parts[:1] != (CIFAR_DIR,) \
                        or not (m.isfile() or m.isdir()):
                    raise ValueError(f"{archive}: refusing unsafe or unexpected member {m.name!r}")
                members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        os.replace(tmp / CIFAR_DIR, dest_parent / CIFAR_DIR)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_cifar10_dataset(shape: Sequence[int] = (-1, 32, 32, 3), path: Optional[PathLike] = None,
                         plotable: bool = False, *, download: bool = True):
    """Load CIFAR-10 as TensorLayer does (no validation split).

    Args:
        shape: Shape the NHWC image splits are reshaped to, e.g. ``(-1, 3072)``.
        path: ``cifar-10-batches-py`` folder or its parent; searched alone.
        plotable: Show the first training images with matplotlib (if installed).
        download: Whether to download into ``~/.cache/hvdtrain/datasets/cifar10`` if not found.

    Returns:
        ``X_train, y_train, X_test, y_test``; X float32 in [0, 1], y int32.
    """
    shape = check_shape(shape)
    if path is not None:
        p = Path(path).expanduser()
        locations = [p] if p.name == CIFAR_DIR else [p / CIFAR_DIR, p]
    else:
        locations = []
        for loc in search_locations("cifar10"):
            locations += [loc] if loc.name == CIFAR_DIR else [loc / CIFAR_DIR, loc]
    looked, found = [], None
    for loc in locations:
        missing = [n for n in CIFAR_FILES if not (loc / n).is_file()]
        if not missing:
            found = loc
            break
        looked.append(f"{loc} (does not exist)" if not loc.is_dir() else f"{loc} (missing {', '.join(missing)})")
    if found is None:
        note = "not attempted (an explicit path was given)" if path is not None else download_disabled(download)
        if note is None:
            cache = cache_dir("cifar10")
            archive = cache / "cifar-10-python.tar.gz"
            try:
                logger.info("Downloading %s to %s", CIFAR10_URL, cache)
                fetch(CIFAR10_URL, archive)
                _extract_cifar(archive, cache)
                archive.unlink()
                found = cache / CIFAR_DIR
            except (*NET_ERRORS, tarfile.TarError) as e:
                note = f"failed: {CIFAR10_URL}: {e}"
        if found is None:
            raise not_found("CIFAR-10", looked, note,
                            f"Extract cifar-10-python.tar.gz ({CIFAR10_URL}) and pass path=<folder holding "
                            f"{CIFAR_DIR}>, or put it in ${ENV_DATA_DIR}/cifar10/.")
    batches = [_load_cifar_batch(found / n) for n in CIFAR_FILES]
    record_source("cifar10", str(found))
    logger.info("Loaded CIFAR-10 from %s", found)

    def nhwc(data: np.ndarray) -> np.ndarray:
        return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)

    x_tr = nhwc(np.concatenate([b[0] for b in batches[:5]]))
    y_tr = np.concatenate([b[1] for b in batches[:5]]).astype(np.int32)
    x_te, y_te = nhwc(batches[5][0]), batches[5][1].astype(np.int32)
    if plotable:
        _plot(x_tr)
    return to_float(x_tr, shape, "training images"), y_tr, to_float(x_te, shape, "test images"), y_te


def _plot(x: np.ndarray) -> None:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("plotable=True but matplotlib is not installed; not plotting")
        return
    fig = plt.figure(figsize=(6, 6))
    for i in range(min(36, len(x))):
        ax = fig.add_subplot(6, 6, i + 1)
        ax.imshow(x[i])
        ax.axis("off")
    plt.show()
