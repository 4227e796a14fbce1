"""Where the datasets' files are looked for, and how missing ones are fetched.

Knows the search order (``$HVDTRAIN_DATA_DIR``, Keras's cache, hvdtrain's cache, the
system folders), the download switch and the atomic download; also remembers where
each dataset was last loaded from (:func:`describe_source`).
"""
from __future__ import annotations

import http.client
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

ENV_DATA_DIR = "HVDTRAIN_DATA_DIR"
ENV_NO_DOWNLOAD = "HVDTRAIN_NO_DOWNLOAD"
DOWNLOAD_TIMEOUT_S = 10.0
FASHION_MNIST_SYSTEM_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
#: The folder inside the CIFAR-10 archive, which is also its name in Keras's cache.
CIFAR_DIR = "cifar-10-batches-py"

#: The errors a failed download raises (unreachable host, bad URL, broken response).
NET_ERRORS = (OSError, ValueError, http.client.HTTPException)

_last_source: dict = {}


def describe_source(name: str) -> Optional[str]:
    """Return where dataset ``name`` (``mnist``, ``fashion-mnist``, ``cifar10``) was last loaded from."""
    return _last_source.get(name)


def record_source(name: str, source: str) -> None:
    """Remember that dataset ``name`` was just loaded from ``source`` (see :func:`describe_source`)."""
    _last_source[name] = source


def _keras_datasets_dir() -> Path:
    return Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "datasets"


def cache_dir(name: str) -> Path:
    """hvdtrain's own download folder for dataset ``name``."""
    return Path.home() / ".cache" / "hvdtrain" / "datasets" / name


def search_locations(name: str) -> list:
    """The places dataset ``name`` is looked for when no path is given, in order."""
    locs = []
    if os.environ.get(ENV_DATA_DIR):
        locs.append(Path(os.environ[ENV_DATA_DIR]) / name)
    keras = {"mnist": "mnist.npz", "fashion-mnist": "fashion-mnist", "cifar10": CIFAR_DIR}[name]
    locs += [_keras_datasets_dir() / keras, cache_dir(name)]
    if name == "fashion-mnist":
        locs += list(FASHION_MNIST_SYSTEM_DIRS)
    return locs


def download_disabled(download: bool) -> Optional[str]:
    """Why downloading is off (the ``download`` argument or ``$HVDTRAIN_NO_DOWNLOAD``), or None."""
    if not download:
        return "download disabled (download=False)"
    if os.environ.get(ENV_NO_DOWNLOAD, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"download disabled ({ENV_NO_DOWNLOAD}={os.environ[ENV_NO_DOWNLOAD]})"
    return None


def fetch(url: str, dest: Path) -> None:
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


def not_found(title: str, looked: list, download_note: str, hint: str) -> FileNotFoundError:
    """The error for a dataset found nowhere: every place looked, the download outcome, a hint."""
    lines = "\n".join(f"  - {entry}" for entry in looked)
    return FileNotFoundError(f"{title} not found. Looked in:\n{lines}\nDownload: {download_note}\n{hint}")
