"""Loaded by every Python process of a corpus run (``scripts/run_corpus.py`` copies this file
into the run's temporary directory and puts that directory on ``PYTHONPATH``). It is never
part of the library. It does three things, none of which imports Keras or TensorFlow before
the script does:

1. Serves ``keras.datasets.{mnist,fashion_mnist,cifar10}.load_data`` offline from hvdtrain's
   loaders (``hvdtrain.datasets``), with the arrays Keras returns: uint8 images
   ``(N, 28, 28)`` / ``(N, 32, 32, 3)``, uint8 labels ``(N,)`` / ``(N, 1)``, as
   ``(x_train, y_train), (x_test, y_test)``. Where no MNIST files are found, Fashion-MNIST's
   (same format and shapes) stand in, and a line on stderr says so.
2. Remembers every model ``fit`` trains, and prints each rank's last ``fit`` metrics.
3. At exit, prints a digest of each model's weights, one line per rank, so the runner can
   say whether the ranks ended with the same weights.

Lines it prints start with ``[hvdtrain-corpus]``.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import importlib.abc
import importlib.util
import os
import sys

TAG = "[hvdtrain-corpus]"
_DATASETS = {"keras.src.datasets.mnist": "mnist",
             "keras.src.datasets.fashion_mnist": "fashion_mnist",
             "keras.src.datasets.cifar10": "cifar10"}
_MODEL_MODULE = "keras.src.models.model"
_fitted: list = []


def _rank() -> str:
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "?"


def _say(text: str) -> None:
    print(f"{TAG} rank {_rank()} {text}", file=sys.stderr, flush=True)


def _as_uint8(x):
    import numpy as np
    return np.rint(x * 255.0).astype(np.uint8)


def _mnist_like(name: str):
    import numpy as np
    from hvdtrain.datasets import load_fashion_mnist_dataset, load_mnist_dataset
    from hvdtrain.datasets.sources import FASHION_MNIST_SYSTEM_DIRS
    data_dir = os.environ.get("HVDTRAIN_CORPUS_DATA_DIR")
    if name == "fashion_mnist":
        split = load_fashion_mnist_dataset(shape=(-1, 28, 28), n_validation=0, download=False,
                                           path=os.path.join(data_dir, "fashion-mnist") if data_dir else None)
    else:
        try:
            split = load_mnist_dataset(shape=(-1, 28, 28), n_validation=0, download=False,
                                       path=os.path.join(data_dir, "mnist") if data_dir else None)
        except FileNotFoundError:
            stand_in = next((d for d in FASHION_MNIST_SYSTEM_DIRS if d.is_dir()), None)
            if stand_in is None:
                raise
            _say(f"no MNIST files here: Fashion-MNIST ({stand_in}) stands in for MNIST")
            split = load_mnist_dataset(shape=(-1, 28, 28), n_validation=0, download=False,
                                       path=stand_in)
    x_tr, y_tr, _, _, x_te, y_te = split
    return ((_as_uint8(x_tr), y_tr.astype(np.uint8)), (_as_uint8(x_te), y_te.astype(np.uint8)))


def _cifar10():
    import numpy as np
    from hvdtrain.datasets import load_cifar10_dataset
    data_dir = os.environ.get("HVDTRAIN_CORPUS_DATA_DIR")
    x_tr, y_tr, x_te, y_te = load_cifar10_dataset(
        shape=(-1, 32, 32, 3), download=False,
        path=os.path.join(data_dir, "cifar10") if data_dir else None)
    return ((_as_uint8(x_tr), y_tr.astype(np.uint8).reshape(-1, 1)),
            (_as_uint8(x_te), y_te.astype(np.uint8).reshape(-1, 1)))


def _loader(name: str):
    def load_data(*args, **kwargs):  # Keras's own take path= (mnist) or nothing
        return _cifar10() if name == "cifar10" else _mnist_like(name)
    load_data.__doc__ = f"keras.datasets.{name}.load_data, served offline by hvdtrain.datasets"
    return load_data


def _wrap_fit(model_class) -> None:
    fit = model_class.fit

    def fit_and_report(self, *args, **kwargs):
        _fitted.append(self)
        history = fit(self, *args, **kwargs)
        logs = getattr(history, "history", None) or {}
        last = {k: v[-1] for k, v in logs.items() if v and not k.startswith("val_")}
        if last:
            _say("fit " + " ".join(f"{k}={float(v):.6g}" for k, v in sorted(last.items())))
        return history

    model_class.fit = fit_and_report


class _Patcher(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets Keras's modules load as usual, then patches the few it cares about."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _DATASETS and fullname != _MODEL_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None:
            return None
        self._loaders = getattr(self, "_loaders", {})
        self._loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        self._loaders[module.__name__].exec_module(module)
        if module.__name__ in _DATASETS:
            module.load_data = _loader(_DATASETS[module.__name__])
        else:
            _wrap_fit(module.Model)


def _digest_weights() -> None:
    if "keras" not in sys.modules:
        return
    try:
        import numpy as np
        from keras import Model
        models = list(_fitted)
        models += [o for o in gc.get_objects() if isinstance(o, Model) and o not in models]
        digests = []
        for model in models:
            weights = [np.asarray(w) for w in model.weights]
            if not weights:
                continue
            h = hashlib.sha1()
            for w in weights:
                h.update(np.ascontiguousarray(w).tobytes())
            digests.append(f"{model.name}:{len(weights)}:{h.hexdigest()[:16]}")
        _say("weights " + (" ".join(sorted(digests)) if digests else "none"))
    except Exception as e:  # a digest is a report, never a new failure
        _say(f"weights unavailable ({type(e).__name__}: {e})")


if os.environ.get("HVDTRAIN_CORPUS") == "1":
    sys.meta_path.insert(0, _Patcher())
    atexit.register(_digest_weights)  # registered first, so it runs after the script's own
