"""``load_once_per_host`` on 2 real ranks of one host: one download, both ranks get the data.

The ranks download from an HTTP mirror this test serves, which counts the requests.
"""
from __future__ import annotations

import collections
import gzip
import http.server
import struct
import threading

import numpy as np
import pytest

from conftest import WORKERS, read_ranks, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(150)]
WORKER = str(WORKERS / "download_worker.py")
N_TRAIN, N_TEST = 20, 5


def idx_gz(arr: np.ndarray, magic: int | None = None) -> bytes:
    """``arr`` (uint8) as a gzipped IDX file."""
    magic = (0x08 << 8 | arr.ndim) if magic is None else magic
    header = struct.pack(">i", magic) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return gzip.compress(header + arr.astype(np.uint8).tobytes())


def fake_mnist() -> dict:
    rng = np.random.default_rng(7)
    return {"train-images-idx3-ubyte": rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8),
            "train-labels-idx1-ubyte": rng.integers(0, 10, N_TRAIN, dtype=np.uint8),
            "t10k-images-idx3-ubyte": rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8),
            "t10k-labels-idx1-ubyte": rng.integers(0, 10, N_TEST, dtype=np.uint8)}


@pytest.fixture
def mirror():
    """(base URL, request counts per path, the raw arrays) of a mirror on 127.0.0.1."""
    raw = fake_mnist()
    files = {f"/mnist/{stem}.gz": idx_gz(arr) for stem, arr in raw.items()}
    files.update({f"/corrupt/{stem}.gz": idx_gz(arr) for stem, arr in raw.items()})
    files["/corrupt/train-images-idx3-ubyte.gz"] = idx_gz(raw["train-images-idx3-ubyte"], 0x1234)
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            with lock:
                counts[self.path] += 1
            body = files.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", counts, raw
    server.shutdown()
    server.server_close()


def test_each_host_downloads_once_and_every_rank_gets_the_data(launcher, mirror, tmp_path):
    base, counts, raw = mirror
    run_job(launcher, 2, [WORKER, base, str(tmp_path)], timeout=90)
    ranks = read_ranks(tmp_path, 2)
    first = next(r for r in ranks if r["local_rank"] == 0)
    other = next(r for r in ranks if r["local_rank"] == 1)

    # One request per file, from local rank 0 alone: rank 1 read its copy.
    assert {p: n for p, n in counts.items() if p.startswith("/mnist/")} == {
        f"/mnist/{stem}.gz": 1 for stem in raw}
    for r in ranks:
        assert "error" not in r["ok"], r["ok"]
        assert r["ok"]["source"] == str(tmp_path / "home/.cache/hvdtrain/datasets/mnist")
    assert first["ok"] == other["ok"]
    image = [28, 28, 1]
    assert first["ok"]["shapes"] == [[15, *image], [15], [5, *image], [5], [5, *image], [5]]
    assert first["ok"]["y_train"] == raw["train-labels-idx1-ubyte"][:15].tolist()
    pixels = raw["train-images-idx3-ubyte"][:15].sum() / 255
    assert first["ok"]["pixel_sum"] == pytest.approx(pixels, rel=1e-5)

    # Nothing to download: local rank 0 tried the one file once, and rank 1 did not try
    # its own download but failed with local rank 0, as a FileNotFoundError naming it.
    assert {p: n for p, n in counts.items() if p.startswith("/missing/")} == {
        "/missing/train-images-idx3-ubyte.gz": 1}
    assert first["missing"]["error"] == other["missing"]["error"] == "FileNotFoundError"
    assert "Download: failed" in first["missing"]["message"]
    assert (f"local rank 0 of host {first['host']} (rank {first['rank']}) could not load it: "
            "FileNotFoundError: MNIST not found") in other["missing"]["message"]

    # A corrupt download is a ValueError there, and not a FileNotFoundError on rank 1
    # (which would send a caller's fallback down another branch than local rank 0's).
    assert {p: n for p, n in counts.items() if p.startswith("/corrupt/")} == {
        f"/corrupt/{stem}.gz": 1 for stem in raw}
    assert first["corrupt"]["error"] == "ValueError"
    assert other["corrupt"]["error"] == "RuntimeError"
    assert f"local rank 0 of host {first['host']}" in other["corrupt"]["message"]
    assert "ValueError" in other["corrupt"]["message"]
