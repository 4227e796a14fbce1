"""Loads datasets with ``load_once_per_host`` from a test's HTTP mirror; writes ``rank<R>.json``.

Usage: download_worker.py BASE_URL OUT_DIR

The mirror serves ``BASE_URL/mnist/`` (the four IDX files), ``BASE_URL/corrupt/`` (the
same but a bad training-images file) and nothing under ``BASE_URL/missing/``. Every rank
gets ``OUT_DIR/home`` as its home, so the download cache is the ranks' shared,
empty ``OUT_DIR/home/.cache/hvdtrain/datasets``.
"""
import hashlib
import json
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for _var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    os.environ.pop(_var, None)  # the mirror is on this machine

import hvdtrain  # noqa: E402
from hvdtrain import datasets  # noqa: E402
from hvdtrain.datasets import mnist, sources  # noqa: E402


def attempt(loader, **kwargs):
    """The loader's outcome on this rank: the error, or a digest of the splits."""
    try:
        splits = datasets.load_once_per_host(loader, n_validation=5, **kwargs)
    except Exception as err:  # noqa: BLE001 - the test checks which error each rank got
        return {"error": type(err).__name__, "message": str(err)}
    return {"sha256": [hashlib.sha256(a.tobytes()).hexdigest() for a in splits],
            "shapes": [list(a.shape) for a in splits],
            "y_train": splits[1].tolist(), "pixel_sum": float(splits[0].sum())}


def main():
    base, out = sys.argv[1], Path(sys.argv[2])
    home = out / "home"
    os.environ["HOME"] = str(home)
    os.environ["KERAS_HOME"] = str(home / ".keras")
    os.environ.pop(sources.ENV_DATA_DIR, None)
    os.environ.pop(sources.ENV_NO_DOWNLOAD, None)
    sources.FASHION_MNIST_SYSTEM_DIRS = (out / "no-system-dir",)
    hvdtrain.init()
    result = {"rank": hvdtrain.rank(), "local_rank": hvdtrain.local_rank(),
              "host": socket.gethostname()}

    mnist.MNIST_URLS = (f"{base}/missing/",)
    result["missing"] = attempt(datasets.load_mnist_dataset)
    mnist.FASHION_MNIST_URLS = (f"{base}/corrupt/",)  # its own cache folder: fashion-mnist
    result["corrupt"] = attempt(datasets.load_fashion_mnist_dataset)
    mnist.MNIST_URLS = (f"{base}/mnist/",)
    result["ok"] = attempt(datasets.load_mnist_dataset, shape=(-1, 28, 28, 1))
    result["ok"]["source"] = datasets.describe_source("mnist")

    (out / f"rank{hvdtrain.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
