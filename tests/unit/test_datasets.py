"""Tests for hvdtrain.datasets on small synthetic files (no network, no TensorFlow)."""
import functools
import gzip
import io
import pickle
import struct
import sys
import tarfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from hvdtrain import datasets
from hvdtrain.datasets import cifar, mnist, sources

REAL_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
N_TRAIN, N_TEST = 20, 5


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Point HOME at an empty folder, disable downloads, hide system folders and the real mirrors.

    Each constant is patched on the module that reads it at call time (the copies that
    ``hvdtrain.datasets`` re-exports are only for reading)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("HVDTRAIN_DATA_DIR", raising=False)
    monkeypatch.delenv("KERAS_HOME", raising=False)
    monkeypatch.setenv("HVDTRAIN_NO_DOWNLOAD", "1")
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIRS", (tmp_path / "no-system-dir",))
    unreachable = (tmp_path / "no-mirror").as_uri() + "/"
    monkeypatch.setattr(mnist, "MNIST_URLS", (unreachable,))
    monkeypatch.setattr(mnist, "FASHION_MNIST_URLS", (unreachable,))
    monkeypatch.setattr(cifar, "CIFAR10_URL", unreachable + "cifar-10-python.tar.gz")
    return home


# ----------------------------------------------------------------------------- writers
def idx_bytes(arr, magic=None):
    """Serialise a uint8 array in IDX format (big-endian header)."""
    arr = np.asarray(arr, np.uint8)
    magic = (0x08 << 8 | arr.ndim) if magic is None else magic
    return struct.pack(">i", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(path, arr, magic=None, gz=True, cut=0):
    data = idx_bytes(arr, magic)
    if cut:
        data = data[:-cut]
    path = Path(str(path) + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def make_mnist(folder, n_train=N_TRAIN, n_test=N_TEST, gz=True, seed=0):
    """Write the four IDX files into ``folder``; return the raw arrays."""
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    raw["train-images-idx3-ubyte"][0, 0, 0] = 255
    for name, arr in raw.items():
        write_idx(folder / name, arr, gz=gz)
    return raw


def write_cifar(folder, per_batch=4, n_test=3, protocol=2, seed=0):
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        batch = {b"batch_label": name.encode(), b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n)], b"filenames": [b"x.png"] * n}
        data = pickle.dumps(batch, protocol=protocol)
        if protocol == 2:  # the published batches were pickled before numpy.core became numpy._core
            data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / name).write_bytes(data)
        out[name] = batch
    return out


# ----------------------------------------------------------------------------- MNIST-style, happy paths
def test_idx_gz_splits_shapes_dtypes(tmp_path):
    raw = make_mnist(tmp_path / "m")
    X_train, y_train, X_val, y_val, X_test, y_test = datasets.load_mnist_dataset(path=tmp_path / "m", n_validation=5)
    assert X_train.shape == (15, 784) and X_val.shape == (5, 784) and X_test.shape == (5, 784)
    assert y_train.shape == (15,) and y_val.shape == (5,) and y_test.shape == (5,)
    for x in (X_train, X_val, X_test):
        assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 1.0
    for y in (y_train, y_val, y_test):
        assert y.dtype == np.int32
    assert X_train.max() == 1.0
    images = raw["train-images-idx3-ubyte"].reshape(-1, 784) / 255.0
    np.testing.assert_allclose(X_train, images[:15], rtol=1e-6)
    np.testing.assert_allclose(X_val, images[15:], rtol=1e-6)  # validation = last n_validation
    np.testing.assert_array_equal(y_val, raw["train-labels-idx1-ubyte"][15:])
    np.testing.assert_array_equal(y_test, raw["t10k-labels-idx1-ubyte"])
    assert datasets.describe_source("mnist") == str(tmp_path / "m")


def test_uncompressed_files_data_subfolder_and_shape(tmp_path):
    make_mnist(tmp_path / "f" / "data", gz=False)
    X_train, _, X_val, _, X_test, _ = datasets.load_fashion_mnist_dataset(
        shape=(-1, 28, 28, 1), path=tmp_path / "f", n_validation=4)
    assert X_train.shape == (16, 28, 28, 1) and X_val.shape == (4, 28, 28, 1) and X_test.shape == (5, 28, 28, 1)
    assert datasets.describe_source("fashion-mnist") == str(tmp_path / "f" / "data")


def test_validation_size_rule(tmp_path):
    make_mnist(tmp_path)
    out = datasets.load_mnist_dataset(path=tmp_path)  # default 10000 >= 20 -> clamped to 20 // 6
    assert [len(a) for a in out] == [17, 17, 3, 3, 5, 5]
    out = datasets.load_mnist_dataset(path=tmp_path, n_validation=0)
    assert [len(a) for a in out] == [20, 20, 0, 0, 5, 5] and out[2].shape == (0, 784)
    with pytest.raises(ValueError, match="n_validation"):
        datasets.load_mnist_dataset(path=tmp_path, n_validation=-1)


@pytest.mark.parametrize("shape", [(-1, 100), (-1, -1), ("a", 784), (3, 784)])
def test_bad_shape(tmp_path, shape):
    make_mnist(tmp_path)
    with pytest.raises(ValueError, match="shape"):
        datasets.load_mnist_dataset(shape=shape, path=tmp_path, n_validation=5)


def test_mnist_npz_file_and_folder(tmp_path):
    rng = np.random.default_rng(1)
    arrays = dict(x_train=rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), y_train=rng.integers(0, 10, 12),
                  x_test=rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), y_test=rng.integers(0, 10, 4))
    np.savez(tmp_path / "mnist.npz", **arrays)
    for path in (tmp_path / "mnist.npz", tmp_path):
        X_train, y_train, X_val, y_val, X_test, y_test = datasets.load_mnist_dataset(path=path, n_validation=2)
        assert X_train.shape == (10, 784) and X_val.shape == (2, 784) and X_test.shape == (4, 784)
        assert y_train.dtype == np.int32 and X_train.dtype == np.float32
        np.testing.assert_array_equal(y_val, arrays["y_train"][10:])
    assert datasets.describe_source("mnist") == str(tmp_path / "mnist.npz")


def test_bad_npz(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="y_train"):
        datasets.load_mnist_dataset(path=tmp_path / "mnist.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.npz"):
        datasets.load_mnist_dataset(path=tmp_path / "junk.npz")


# ----------------------------------------------------------------------------- search order
def test_search_order(tmp_path, monkeypatch, isolated_env):
    home = isolated_env
    make_mnist(home / ".cache" / "hvdtrain" / "datasets" / "fashion-mnist", seed=1)
    datasets.load_fashion_mnist_dataset(n_validation=2)
    assert datasets.describe_source("fashion-mnist") == str(home / ".cache/hvdtrain/datasets/fashion-mnist")

    make_mnist(home / ".keras" / "datasets" / "fashion-mnist", seed=2)
    datasets.load_fashion_mnist_dataset(n_validation=2)
    assert datasets.describe_source("fashion-mnist") == str(home / ".keras/datasets/fashion-mnist")

    monkeypatch.setenv("HVDTRAIN_DATA_DIR", str(tmp_path / "data"))
    make_mnist(tmp_path / "data" / "fashion-mnist", seed=3)
    datasets.load_fashion_mnist_dataset(n_validation=2)
    assert datasets.describe_source("fashion-mnist") == str(tmp_path / "data" / "fashion-mnist")


def test_keras_mnist_npz_and_system_dir(tmp_path, monkeypatch, isolated_env):
    keras = isolated_env / ".keras" / "datasets"
    keras.mkdir(parents=True)
    np.savez(keras / "mnist.npz", x_train=np.zeros((6, 28, 28), np.uint8), y_train=np.zeros(6, np.uint8),
             x_test=np.zeros((2, 28, 28), np.uint8), y_test=np.zeros(2, np.uint8))
    assert len(datasets.load_mnist_dataset()[0]) == 5
    assert datasets.describe_source("mnist") == str(keras / "mnist.npz")

    system = tmp_path / "usr-share-fashion"
    make_mnist(system / "data")
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIRS", (system,))
    datasets.load_fashion_mnist_dataset(n_validation=2)
    assert datasets.describe_source("fashion-mnist") == str(system / "data")


# ----------------------------------------------------------------------------- MNIST-style, errors
def test_wrong_magic(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((20, 28, 28)), magic=2049)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz.*magic number 2049.*expected.*2051"):
        datasets.load_mnist_dataset(path=tmp_path)


def test_truncated_data(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((5, 28, 28)), cut=100)
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte\.gz: truncated.*3920 data bytes, found 3820"):
        datasets.load_mnist_dataset(path=tmp_path)


def test_truncated_gzip_stream(tmp_path):
    make_mnist(tmp_path)
    f = tmp_path / "train-labels-idx1-ubyte.gz"
    f.write_bytes(f.read_bytes()[:-12])
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz.*corrupt or truncated"):
        datasets.load_mnist_dataset(path=tmp_path)


def test_count_mismatch_and_bad_labels(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(19))
    with pytest.raises(ValueError, match=r"holds 20 images but .*train-labels-idx1-ubyte\.gz holds 19 labels"):
        datasets.load_mnist_dataset(path=tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.full(20, 10))
    with pytest.raises(ValueError, match="label 10 out of range"):
        datasets.load_mnist_dataset(path=tmp_path)


def test_missing_files_explicit_path(tmp_path):
    make_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as err:
        datasets.load_mnist_dataset(path=tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "missing t10k-labels-idx1-ubyte" in msg and "explicit path" in msg


def test_missing_everywhere_lists_all_places(tmp_path, monkeypatch, isolated_env):
    monkeypatch.setenv("HVDTRAIN_DATA_DIR", str(tmp_path / "envdata"))
    with pytest.raises(FileNotFoundError) as err:
        datasets.load_fashion_mnist_dataset()
    msg = str(err.value)
    for place in (tmp_path / "envdata" / "fashion-mnist", isolated_env / ".keras/datasets/fashion-mnist",
                  isolated_env / ".cache/hvdtrain/datasets/fashion-mnist", tmp_path / "no-system-dir"):
        assert str(place) in msg
    assert "HVDTRAIN_NO_DOWNLOAD=1" in msg and "apt-get install dataset-fashion-mnist" in msg
    assert "path=" in msg and "HVDTRAIN_DATA_DIR" in msg


# ----------------------------------------------------------------------------- download (file:// mirrors)
def test_download_to_cache(tmp_path, monkeypatch, isolated_env):
    raw = make_mnist(tmp_path / "mirror")
    monkeypatch.delenv("HVDTRAIN_NO_DOWNLOAD")
    mirrors = ((tmp_path / "dead").as_uri() + "/", (tmp_path / "mirror").as_uri() + "/")
    monkeypatch.setattr(mnist, "MNIST_URLS", mirrors)  # first mirror fails, second serves
    X_train, *_ = datasets.load_mnist_dataset(n_validation=5)
    cache = isolated_env / ".cache/hvdtrain/datasets/mnist"
    assert datasets.describe_source("mnist") == str(cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted(n + ".gz" for n in raw)  # no temp files left
    np.testing.assert_allclose(X_train, raw["train-images-idx3-ubyte"][:15].reshape(-1, 784) / 255.0, rtol=1e-6)


def test_download_failure_and_disabled(tmp_path, monkeypatch):
    monkeypatch.delenv("HVDTRAIN_NO_DOWNLOAD")
    with pytest.raises(FileNotFoundError, match=r"(?s)Download: failed: .*no-mirror/train-images-idx3-ubyte\.gz"):
        datasets.load_mnist_dataset()
    with pytest.raises(FileNotFoundError, match=r"download=False"):
        datasets.load_mnist_dataset(download=False)


def test_load_once_per_host_without_horovod_just_loads(tmp_path, monkeypatch, isolated_env):
    """Without Horovod it is the loader itself: it downloads, keeps the caller's arguments
    (``download`` included) and lets the loader's errors through unchanged."""
    make_mnist(tmp_path / "mirror")
    monkeypatch.delenv("HVDTRAIN_NO_DOWNLOAD")
    monkeypatch.setattr(mnist, "MNIST_URLS", ((tmp_path / "mirror").as_uri() + "/",))
    with pytest.raises(FileNotFoundError, match=r"download=False"):
        datasets.load_once_per_host(datasets.load_mnist_dataset, download=False)
    got = datasets.load_once_per_host(datasets.load_mnist_dataset, shape=(-1, 28, 28, 1),
                                      n_validation=5)
    want = datasets.load_mnist_dataset(shape=(-1, 28, 28, 1), n_validation=5)
    assert datasets.describe_source("mnist") == str(isolated_env / ".cache/hvdtrain/datasets/mnist")
    assert len(got) == 6 and got[0].shape == (15, 28, 28, 1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    calls = []
    assert datasets.load_once_per_host(lambda **kw: calls.append(kw) or "x", path="p") == "x"
    assert calls == [{"path": "p"}]  # called once, with no download=False added


# ----------------------------------------------------------------------------- CIFAR-10
def test_cifar10_layout_and_nhwc(tmp_path):
    batches = write_cifar(tmp_path / "cifar-10-batches-py")
    for path in (tmp_path, tmp_path / "cifar-10-batches-py"):
        X_train, y_train, X_test, y_test = datasets.load_cifar10_dataset(path=path)
        assert X_train.shape == (20, 32, 32, 3) and X_test.shape == (3, 32, 32, 3)
        assert X_train.dtype == np.float32 and y_train.dtype == np.int32 and y_test.shape == (3,)
        assert 0.0 <= X_train.min() and X_train.max() <= 1.0
    data = batches["data_batch_2"][b"data"]  # images 4..7 of the training split
    r, c, ch = 5, 17, 2
    assert X_train[4 + 1, r, c, ch] == np.float32(data[1, ch * 1024 + r * 32 + c] / 255.0)
    np.testing.assert_array_equal(y_test, batches["test_batch"][b"labels"])
    flat = datasets.load_cifar10_dataset(shape=(-1, 3072), path=tmp_path)[0]
    assert flat.shape == (20, 3072)
    with pytest.raises(ValueError, match="shape"):
        datasets.load_cifar10_dataset(shape=(-1, 784), path=tmp_path)


def test_cifar10_keras_dir_highest_protocol(tmp_path, isolated_env):
    folder = isolated_env / ".keras/datasets/cifar-10-batches-py"
    write_cifar(folder, protocol=pickle.HIGHEST_PROTOCOL)
    datasets.load_cifar10_dataset()
    assert datasets.describe_source("cifar10") == str(folder)


def test_cifar10_errors(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))
    with pytest.raises(ValueError, match=r"data_batch_3: not a CIFAR-10 batch"):
        datasets.load_cifar10_dataset(path=tmp_path)
    (folder / "data_batch_3").write_bytes(pickle.dumps(OrderedDict(data=1)))
    with pytest.raises(ValueError, match=r"collections.OrderedDict is not allowed"):
        datasets.load_cifar10_dataset(path=tmp_path)
    (folder / "data_batch_3").write_bytes(pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}))
    with pytest.raises(ValueError, match=r"expected \(N, 3072\)"):
        datasets.load_cifar10_dataset(path=tmp_path)
    (folder / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match=r"(?s)cifar-10-batches-py \(missing test_batch\).*explicit path"):
        datasets.load_cifar10_dataset(path=tmp_path)


def _tar_gz(dest, members):
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_cifar10_download_and_safe_extract(tmp_path, monkeypatch, isolated_env):
    monkeypatch.delenv("HVDTRAIN_NO_DOWNLOAD")
    write_cifar(tmp_path / "src")
    members = {f"cifar-10-batches-py/{p.name}": p.read_bytes() for p in (tmp_path / "src").iterdir()}
    _tar_gz(tmp_path / "bad.tar.gz", {**members, "../evil": b"x"})
    monkeypatch.setattr(cifar, "CIFAR10_URL", (tmp_path / "bad.tar.gz").as_uri())
    with pytest.raises(FileNotFoundError, match="unsafe or unexpected member '../evil'"):
        datasets.load_cifar10_dataset()
    assert not (tmp_path / "evil").exists()

    _tar_gz(tmp_path / "good.tar.gz", members)
    monkeypatch.setattr(cifar, "CIFAR10_URL", (tmp_path / "good.tar.gz").as_uri())
    X_train, *_ = datasets.load_cifar10_dataset()
    cache = isolated_env / ".cache/hvdtrain/datasets/cifar10"
    assert X_train.shape == (20, 32, 32, 3)
    assert datasets.describe_source("cifar10") == str(cache / "cifar-10-batches-py")
    assert [p.name for p in cache.iterdir()] == ["cifar-10-batches-py"]  # archive and temp folders removed


# ----------------------------------------------------------------------------- misc
def test_module_does_not_import_tensorflow():
    import subprocess
    code = "import sys, hvdtrain.datasets; assert 'tensorflow' not in sys.modules and 'horovod' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_package_keeps_its_public_names():
    for name in ("load_mnist_dataset", "load_fashion_mnist_dataset", "load_cifar10_dataset",
                 "describe_source", "idx_tf_dataset", "fashion_mnist_files", "PathLike",
                 "ENV_DATA_DIR", "ENV_NO_DOWNLOAD", "DOWNLOAD_TIMEOUT_S", "MNIST_URLS",
                 "FASHION_MNIST_URLS", "CIFAR10_URL", "FASHION_MNIST_SYSTEM_DIRS", "IDX_FILES",
                 "IMAGES_MAGIC", "LABELS_MAGIC", "CIFAR_DIR", "CIFAR_FILES"):
        assert hasattr(datasets, name), name
    assert datasets.__all__ == ["load_mnist_dataset", "load_fashion_mnist_dataset",
                                "load_cifar10_dataset", "describe_source", "load_once_per_host"]


def test_real_fashion_mnist(monkeypatch):
    # make install installs Debian's dataset-fashion-mnist, so the real data is always here
    assert REAL_FASHION_DIR.is_dir(), f"{REAL_FASHION_DIR} missing: run make install"
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIRS", (REAL_FASHION_DIR,))
    X_train, y_train, X_val, y_val, X_test, y_test = datasets.load_fashion_mnist_dataset()
    assert datasets.describe_source("fashion-mnist") in (str(REAL_FASHION_DIR), str(REAL_FASHION_DIR / "data"))
    assert (len(X_train), len(X_val), len(X_test)) == (50000, 10000, 10000)
    assert X_train.shape[1:] == (784,) and X_train.dtype == np.float32 and y_train.dtype == np.int32
    for y in (y_train, y_val, y_test):
        assert sorted(np.unique(y).tolist()) == list(range(10))
    assert 0.0 <= X_train.min() and X_train.max() == 1.0


# ----------------------------------------------------------------------------- streaming with tf.data
def _pairs(ds, limit=None):
    """``(x, y)`` arrays of the first ``limit`` elements of ``ds`` (all when ``None``)."""
    ds = ds if limit is None else ds.take(limit)
    xs, ys = zip(*ds.batch(100_000).as_numpy_iterator())
    return np.concatenate(xs), np.concatenate(ys)


def _assert_same(a, b, limit=None):
    for got, want in zip(_pairs(a, limit), _pairs(b, limit)):
        np.testing.assert_array_equal(got, want)


@pytest.fixture
def idx_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "idx"


def test_stream_shard_hook_equals_shard_on_real_files(tmp_path_factory, monkeypatch):
    from hvdtrain import data
    from hvdtrain.datasets.streaming import idx_tf_dataset
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIRS", (REAL_FASHION_DIR,))
    monkeypatch.setenv("HVDTRAIN_CACHE", str(tmp_path_factory.mktemp("real-cache")))
    ds = idx_tf_dataset(*datasets.fashion_mnist_files()[:2])
    assert int(ds.cardinality()) == 60000
    for i in (0, 1):
        hooked, plain = data.shard(ds, 2, i), ds.shard(2, i)
        assert not hasattr(plain, data.SHARD_HOOK)
        assert int(hooked.cardinality()) == int(plain.cardinality()) == 30000
        _assert_same(hooked, plain, limit=300)
    x, y = _pairs(ds, limit=5)
    assert x.shape == (5, 784) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_stream_matches_arrays_and_shards_every_way(tmp_path, idx_cache, monkeypatch):
    from hvdtrain import data
    from hvdtrain.datasets import streaming
    from hvdtrain.datasets.streaming import idx_tf_dataset
    monkeypatch.setattr(streaming, "BLOCK", 2)  # whole blocks and a block left over
    raw = make_mnist(tmp_path / "m", n_train=11)
    ds = idx_tf_dataset(*sorted((tmp_path / "m").glob("train-*")))
    x, y = _pairs(ds)
    np.testing.assert_array_equal(x, raw["train-images-idx3-ubyte"].reshape(11, 784) / np.float32(255))
    np.testing.assert_array_equal(y, raw["train-labels-idx1-ubyte"])
    # a remainder of 2 records; 12 shards: one record per shard, and an empty last shard
    for n, indices in ((3, range(3)), (12, (0, 10, 11))):
        hooked = [data.shard(ds, n, i) for i in indices]
        plain = [ds.shard(n, i) for i in indices]
        assert [int(d.cardinality()) for d in hooked] == [int(d.cardinality()) for d in plain]
        _assert_same(functools.reduce(lambda a, b: a.concatenate(b), hooked),
                     functools.reduce(lambda a, b: a.concatenate(b), plain))


def test_take_keeps_the_hook_and_map_drops_it(tmp_path, idx_cache):
    from hvdtrain import data
    from hvdtrain.datasets.streaming import idx_tf_dataset
    make_mnist(tmp_path / "m", n_train=11)
    ds = idx_tf_dataset(*sorted((tmp_path / "m").glob("train-*")))
    taken = ds.take(8)
    assert hasattr(taken, data.SHARD_HOOK)
    for i in range(3):
        _assert_same(data.shard(taken, 3, i), taken.shard(3, i))
    mapped = ds.map(lambda x, y: (x * 2.0, y))
    assert not hasattr(mapped, data.SHARD_HOOK)
    _assert_same(data.shard(mapped, 2, 1), mapped.shard(2, 1))
    batches = data.shard_and_batch(mapped, num_shards=2, index=1, batch_size=4, prefetch_size=0)
    assert [len(b[1]) for b in batches.as_numpy_iterator()] == [4, 1]


def test_gz_is_decompressed_once_per_machine(tmp_path, idx_cache):
    from hvdtrain.datasets import streaming
    make_mnist(tmp_path / "m")
    src = tmp_path / "m" / "train-images-idx3-ubyte.gz"
    first = streaming.raw_copy(src)
    assert first.parent == idx_cache and first.read_bytes() == gzip.decompress(src.read_bytes())
    mtime = first.stat().st_mtime_ns
    streaming.idx_tf_dataset(src, tmp_path / "m" / "train-labels-idx1-ubyte.gz")
    assert streaming.raw_copy(src) == first and first.stat().st_mtime_ns == mtime
    assert len([p for p in idx_cache.iterdir() if not p.name.startswith(".")]) == 2  # + labels


def test_unwritable_cache_streams_the_gzip(tmp_path, monkeypatch, caplog):
    import logging
    from hvdtrain import data
    from hvdtrain.datasets import streaming
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HVDTRAIN_CACHE", str(tmp_path / "a-file"))  # no folder can be made there
    raw = make_mnist(tmp_path / "m", n_train=7)
    with caplog.at_level(logging.INFO, logger="hvdtrain"):
        ds = streaming.idx_tf_dataset(*sorted((tmp_path / "m").glob("train-*")))
    assert "streaming the gzip instead" in caplog.text
    _, y = _pairs(ds)
    np.testing.assert_array_equal(y, raw["train-labels-idx1-ubyte"])
    _assert_same(data.shard(ds, 2, 1), ds.shard(2, 1))


def test_stream_rejects_corrupt_and_truncated_files(tmp_path, idx_cache):
    from hvdtrain.datasets.streaming import idx_tf_dataset
    make_mnist(tmp_path)
    images, labels = tmp_path / "train-images-idx3-ubyte.gz", tmp_path / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:-12])
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz.*corrupt or truncated"):
        idx_tf_dataset(images, labels)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((20, 28, 28)), cut=10, gz=False)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte: truncated"):
        idx_tf_dataset(tmp_path / "train-images-idx3-ubyte", tmp_path / "train-labels-idx1-ubyte.gz")
