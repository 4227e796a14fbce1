"""The IDX format of the MNIST-style files: finding the four files and checking and
parsing them (``*-ubyte.gz`` or uncompressed)."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot decompress ({e}); the file is corrupt or truncated") from e


def parse_idx(path: Path, magic: int) -> np.ndarray:
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


def idx_dims(path: Path, magic: int) -> tuple:
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


def find_idx(location: Path):
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


def load_idx_arrays(files: Sequence[Path]):
    """The four uint8 arrays (train images and labels, test images and labels) of ``files``,
    checked to be 28x28 images with one label 0..9 each."""
    x_tr, y_tr = parse_idx(files[0], IMAGES_MAGIC), parse_idx(files[1], LABELS_MAGIC)
    x_te, y_te = parse_idx(files[2], IMAGES_MAGIC), parse_idx(files[3], LABELS_MAGIC)
    for x, y, fx, fy in ((x_tr, y_tr, files[0], files[1]), (x_te, y_te, files[2], files[3])):
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise ValueError(f"{fx}: images have shape {x.shape[1:]}; expected 28x28")
        if len(x) != len(y):
            raise ValueError(f"{fx} holds {len(x)} images but {fy} holds {len(y)} labels; expected equal counts")
        if y.size and y.max() > 9:
            raise ValueError(f"{fy}: label {int(y.max())} out of range; expected labels 0..9")
    return x_tr, y_tr, x_te, y_te
