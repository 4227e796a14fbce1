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
"""
from __future__ import annotations

import gzip
import http.client
import logging
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

__all__ = [
    "load_mnist_dataset",
    "load_fashion_mnist_dataset",
    "load_cifar10_dataset",
    "describe_source",
]

logger = logging.getLogger("hvdtrain")

PathLike = Union[str, "os.PathLike[str]"]

ENV_DATA_DIR = "HVDTRAIN_DATA_DIR"
ENV_NO_DOWNLOAD = "HVDTRAIN_NO_DOWNLOAD"
DOWNLOAD_TIMEOUT_S = 10.0
MNIST_URLS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
FASHION_MNIST_URLS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
)
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
FASHION_MNIST_SYSTEM_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

_last_source: dict = {}


def describe_source(name: str) -> Optional[str]:
    """Return where dataset ``name`` (``mnist``, ``fashion-mnist``, ``cifar10``) was last loaded from."""
    return _last_source.get(name)


# ----------------------------------------------------------------------------- locations
def _keras_datasets_dir() -> Path:
    return Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "datasets"


def _cache_dir(name: str) -> Path:
    return Path.home() / ".cache" / "hvdtrain" / "datasets" / name


def _search_locations(name: str) -> list:
    locs = []
    if os.environ.get(ENV_DATA_DIR):
        locs.append(Path(os.environ[ENV_DATA_DIR]) / name)
    keras = {"mnist": "mnist.npz", "fashion-mnist": "fashion-mnist", "cifar10": CIFAR_DIR}[name]
    locs += [_keras_datasets_dir() / keras, _cache_dir(name)]
    if name == "fashion-mnist":
        locs += list(FASHION_MNIST_SYSTEM_DIRS)
    return locs


def _download_disabled(download: bool) -> Optional[str]:
    if not download:
        return "download disabled (download=False)"
    if os.environ.get(ENV_NO_DOWNLOAD, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"download disabled ({ENV_NO_DOWNLOAD}={os.environ[ENV_NO_DOWNLOAD]})"
    return None


def _fetch(url: str, dest: Path) -> None:
    """Download ``url`` to ``dest`` through a temporary file renamed only when complete."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_NET_ERRORS = (OSError, ValueError, http.client.HTTPException)


def _not_found(title: str, looked: list, download_note: str, hint: str) -> FileNotFoundError:
    lines = "\n".join(f"  - {entry}" for entry in looked)
    return FileNotFoundError(f"{title} not found. Looked in:\n{lines}\nDownload: {download_note}\n{hint}")


# ----------------------------------------------------------------------------- IDX / npz
def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot decompress ({e}); the file is corrupt or truncated") from e


def _parse_idx(path: Path, magic: int) -> np.ndarray:
    """Parse an unsigned-byte IDX file, checking magic number and data length."""
    kind = "images" if magic == IMAGES_MAGIC else "labels"
    data = _read_bytes(path)
    got = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if got != magic:
        found = "a file shorter than the 4-byte header" if got is None else f"magic number {got} (0x{got:08x})"
        raise ValueError(f"{path}: found {found}; expected an IDX {kind} file "
                         f"with magic number {magic} (0x{magic:08x})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header; expected {header} header bytes, found {len(data)}")
    dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims, dtype=np.int64))
    found = len(data) - header
    if found != expected:
        what = "truncated" if found < expected else "has trailing data"
        raise ValueError(f"{path}: {what}; header declares dims {dims} = {expected} data bytes, found {found}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _find_idx(location: Path):
    """Return ``(files, None)`` for a folder holding the four IDX files, else ``(None, reason)``."""
    if not location.is_dir():
        return None, f"{location} ({'not a folder' if location.exists() else 'does not exist'})"
    missing = []
    for folder in (location, location / "data"):
        files, missing_here = [], []
        for stem in IDX_FILES:
            alt = stem.replace("-idx", ".idx")  # some mirrors ship e.g. train-images.idx3-ubyte
            cands = [folder / n for n in (stem + ".gz", stem, alt + ".gz", alt)]
            hit = next((c for c in cands if c.is_file()), None)
            files.append(hit)
            if hit is None:
                missing_here.append(stem + "[.gz]")
        if not missing_here:
            return files, None
        if folder == location:
            missing = missing_here
    return None, f"{location} (missing {', '.join(missing)})"


def _load_idx_arrays(files: Sequence[Path]):
    x_tr, y_tr = _parse_idx(files[0], IMAGES_MAGIC), _parse_idx(files[1], LABELS_MAGIC)
    x_te, y_te = _parse_idx(files[2], IMAGES_MAGIC), _parse_idx(files[3], LABELS_MAGIC)
    for x, y, fx, fy in ((x_tr, y_tr, files[0], files[1]), (x_te, y_te, files[2], files[3])):
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise ValueError(f"{fx}: images have shape {x.shape[1:]}; expected 28x28")
        if len(x) != len(y):
            raise ValueError(f"{fx} holds {len(x)} images but {fy} holds {len(y)} labels; expected equal counts")
        if y.size and y.max() > 9:
            raise ValueError(f"{fy}: label {int(y.max())} out of range; expected labels 0..9")
    return x_tr, y_tr, x_te, y_te


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


# ----------------------------------------------------------------------------- shaping
def _check_shape(shape) -> tuple:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"shape={shape!r} must be a sequence of ints") from e
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise ValueError(f"shape={shape!r} may contain at most one -1 and no other negative sizes")
    return dims


def _to_float(x: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    out = x.astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    try:
        return out.reshape(shape)
    except ValueError as e:
        per = int(np.prod(x.shape[1:]))
        raise ValueError(f"shape={shape!r} is not compatible with the {what}: {len(x)} images of "
                         f"{per} values ({x.size} values in total)") from e


def _validation_size(n_train: int, n_validation: int) -> int:
    if n_validation < 0:
        raise ValueError(f"n_validation={n_validation} must be >= 0")
    if n_validation >= n_train:
        clamped = n_train // 6  # same 1/6 ratio as the real 10000 of 60000
        logger.warning("n_validation=%d >= %d training images; using the last %d as validation",
                       n_validation, n_train, clamped)
        return clamped
    return n_validation


# ----------------------------------------------------------------------------- MNIST-style
def _load_mnist_like(name, title, shape, path, n_validation, download, urls, hint):
    shape = _check_shape(shape)
    allow_npz = name == "mnist"
    looked, found = [], None
    locations = [Path(path).expanduser()] if path is not None else _search_locations(name)
    for loc in locations:
        if allow_npz and loc.suffix == ".npz":
            if loc.is_file():
                found = ("npz", loc)
                break
            looked.append(f"{loc} (does not exist)")
            continue
        files, reason = _find_idx(loc)
        if files:
            found = ("idx", files, files[0].parent)
            break
        if allow_npz and (loc / "mnist.npz").is_file():
            found = ("npz", loc / "mnist.npz")
            break
        looked.append(reason + (" and no mnist.npz" if allow_npz and loc.is_dir() else ""))
    if found is None:
        note = "not attempted (an explicit path was given)" if path is not None else _download_disabled(download)
        if note is None:
            cache = _cache_dir(name)
            errors = []
            for base in urls:
                try:
                    for stem in IDX_FILES:
                        url = f"{base}{stem}.gz"
                        if not (cache / (stem + ".gz")).is_file():
                            logger.info("Downloading %s to %s", url, cache)
                            _fetch(url, cache / (stem + ".gz"))
                    break
                except _NET_ERRORS as e:
                    errors.append(f"{url}: {e}")
            files, _ = _find_idx(cache)
            if files and len(errors) < len(urls):
                found = ("idx", files, files[0].parent)
            note = "failed: " + "; ".join(errors)
        if found is None:
            raise _not_found(title, looked, note, hint)
    if found[0] == "npz":
        x_tr, y_tr, x_te, y_te = _load_npz_arrays(found[1])
    else:
        x_tr, y_tr, x_te, y_te = _load_idx_arrays(found[1])
    source = str(found[1] if found[0] == "npz" else found[2])
    _last_source[name] = source
    logger.info("Loaded %s from %s", title, source)
    n_val = _validation_size(len(x_tr), n_validation)
    split = len(x_tr) - n_val
    return (_to_float(x_tr[:split], shape, "training images"), y_tr[:split].astype(np.int32),
            _to_float(x_tr[split:], shape, "validation images"), y_tr[split:].astype(np.int32),
            _to_float(x_te, shape, "test images"), y_te.astype(np.int32))


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


# ----------------------------------------------------------------------------- CIFAR-10
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
    shape = _check_shape(shape)
    if path is not None:
        p = Path(path).expanduser()
        locations = [p] if p.name == CIFAR_DIR else [p / CIFAR_DIR, p]
    else:
        locations = []
        for loc in _search_locations("cifar10"):
            locations += [loc] if loc.name == CIFAR_DIR else [loc / CIFAR_DIR, loc]
    looked, found = [], None
    for loc in locations:
        missing = [n for n in CIFAR_FILES if not (loc / n).is_file()]
        if not missing:
            found = loc
            break
        looked.append(f"{loc} (does not exist)" if not loc.is_dir() else f"{loc} (missing {', '.join(missing)})")
    if found is None:
        note = "not attempted (an explicit path was given)" if path is not None else _download_disabled(download)
        if note is None:
            cache = _cache_dir("cifar10")
            archive = cache / "cifar-10-python.tar.gz"
            try:
                logger.info("Downloading %s to %s", CIFAR10_URL, cache)
                _fetch(CIFAR10_URL, archive)
                _extract_cifar(archive, cache)
                archive.unlink()
                found = cache / CIFAR_DIR
            except (*_NET_ERRORS, tarfile.TarError) as e:
                note = f"failed: {CIFAR10_URL}: {e}"
        if found is None:
            raise _not_found("CIFAR-10", looked, note,
                             f"Extract cifar-10-python.tar.gz ({CIFAR10_URL}) and pass path=<folder holding "
                             f"{CIFAR_DIR}>, or put it in ${ENV_DATA_DIR}/cifar10/.")
    batches = [_load_cifar_batch(found / n) for n in CIFAR_FILES]
    _last_source["cifar10"] = str(found)
    logger.info("Loaded CIFAR-10 from %s", found)

    def nhwc(data: np.ndarray) -> np.ndarray:
        return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)

    x_tr = nhwc(np.concatenate([b[0] for b in batches[:5]]))
    y_tr = np.concatenate([b[1] for b in batches[:5]]).astype(np.int32)
    x_te, y_te = nhwc(batches[5][0]), batches[5][1].astype(np.int32)
    if plotable:
        _plot(x_tr)
    return _to_float(x_tr, shape, "training images"), y_tr, _to_float(x_te, shape, "test images"), y_te


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


# ----------------------------------------------------------------------------- tf.data
def _idx_dims(path: Path, magic: int) -> tuple:
    """The dimensions an IDX file's header declares (its data is not read)."""
    kind = "images" if magic == IMAGES_MAGIC else "labels"
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            got = int.from_bytes(head, "big") if len(head) == 4 else None
            if got != magic:
                raise ValueError(f"{path}: found {'a short header' if got is None else got}; "
                                 f"expected an IDX {kind} file with magic number {magic}")
            raw = f.read(4 * head[3])
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot decompress ({e}); the file is corrupt or truncated") from e
    if len(raw) < 4 * head[3]:
        raise ValueError(f"{path}: truncated IDX header")
    return tuple(int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in range(head[3]))


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
    dims, (count,) = _idx_dims(images, IMAGES_MAGIC), _idx_dims(labels, LABELS_MAGIC)
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
    for loc in [Path(path).expanduser()] if path is not None else _search_locations("fashion-mnist"):
        files, reason = _find_idx(loc)
        if files:
            return tuple(files)
        looked.append(reason)
    raise _not_found("Fashion-MNIST", looked, "not attempted (files only)",
                     "On Debian/Ubuntu: apt-get install dataset-fashion-mnist.")
