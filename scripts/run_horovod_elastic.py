#!/usr/bin/env python
"""Runs Horovod's own elastic integration tests against hvdtrain's drop-in.

Horovod checks its elastic driver with ``test/integration/test_elastic_tensorflow2.py``:
a training script (``test/integration/data/elastic_tensorflow2_main.py``) is started by the
real elastic driver (``horovod.runner.launch._run_elastic``, in the pytest process) with a
discovery script and an exit schedule, and the epochs it logs are checked (world sizes,
start ranks, rendezvous counts, the blacklist and its exponential back-off). Here that
training script has only its ``import horovod.tensorflow as hvd`` line pointed at
``hvdtrain.tensorflow``; the tests, their helpers and their assertions are Horovod's, as
they are at ``--commit``. Two modes, as ``scripts/run_corpus.py``'s:

* ``a``: only the ``import horovod.tensorflow`` line swapped. The script then stops at its
  first reset: its reset callback calls ``optimizer.lr.assign(...)``, and Keras 3
  optimizers have no ``lr`` (``AttributeError``), whatever the Horovod layer;
* ``b`` (the default): the script as ``hvdtrain upgrade`` rewrites it (the import, and
  ``optimizer.lr`` -> ``optimizer.learning_rate``).

Nothing of Horovod's is in this repository: ``--snapshot DIR`` is a git directory of
``horovod/horovod`` (or a folder holding ``horovod+horovod``), read with ``git show``. The
files go to a temporary directory with their layout kept; Horovod's tests import the
``mock`` package, which this venv does not install: a one-line ``mock.py`` there re-exports
``unittest.mock``. Each test runs under ``pytest --timeout``; ``horovodrun``'s workers
start as ``python`` from this venv (its ``bin`` leads ``PATH``).

    .venv/bin/python scripts/run_horovod_elastic.py --snapshot DIR [--mode a|b] [-k EXPR]
        [--repeat N] [--keep DIR]

Slow (each test starts several TensorFlow workers: 10-60 s a test on 2 cores) and not part
of ``make test``; ``tests/parallel/test_elastic.py`` holds hvdtrain's own checks of the
same behaviour.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_corpus import BIN, snapshot_dir, swap_imports  # noqa: E402

#: The Horovod commit these files are read at (its main branch, 2025).
COMMIT = "2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a"
SUITES = {
    "tensorflow2": ("test/integration/test_elastic_tensorflow2.py",
                    "test/integration/data/elastic_tensorflow2_main.py"),
}
#: What the tests import besides their own file and training script.
HELPERS = ("test/conftest.py", "test/utils/common.py", "test/integration/elastic_common.py")


def git_show(git_dir: Path, commit: str, path: str) -> str:
    """The file ``path`` at ``commit`` of the snapshot ``git_dir``."""
    proc = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise FileNotFoundError(f"horovod/horovod@{commit[:10]}:{path}: {proc.stderr.strip()}")
    return proc.stdout


def upgrade(text: str, work: Path) -> str:
    """``text`` as ``hvdtrain upgrade`` rewrites it."""
    original, upgraded = work / "original.py", work / "upgraded.py"
    original.write_text(text)
    proc = subprocess.run([shutil.which("hvdtrain", path=str(BIN)) or "hvdtrain", "upgrade",
                           str(original), "-o", str(upgraded)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not upgraded.is_file():
        raise RuntimeError(f"hvdtrain upgrade failed: {(proc.stderr or proc.stdout).strip()}")
    return upgraded.read_text()


def prepare(git_dir: Path, commit: str, suite: str, mode: str, work: Path) -> Path:
    """Writes the suite's tests, helpers and training script (mode ``a``: import swapped;
    ``b``: upgraded) under ``work``; returns the test file's path."""
    test_file, script = SUITES[suite]
    for path in (*HELPERS, test_file, script):
        text = git_show(git_dir, commit, path)
        if path == script:
            text = swap_imports(text) if mode == "a" else upgrade(text, work)
        out = work / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    (work / "test" / "mock.py").write_text("from unittest.mock import *  # noqa: F401,F403\n")
    return work / test_file


def run(test: Path, expr: str | None, timeout: float) -> tuple[int, float, str]:
    """Runs pytest on ``test`` (``-k expr``); returns its exit code, seconds and output."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(test.parents[1]), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-rA", "-p", "no:cacheprovider",
           f"--timeout={timeout:g}", "-o", "addopts=", "--log-level=DEBUG",
           "--log-format=%(asctime)s.%(msecs)03d %(levelname)s %(filename)s: %(message)s",
           "--log-date-format=%H:%M:%S"]
    if expr:
        cmd += ["-k", expr]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=test.parents[1], env=env, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - start, proc.stdout + proc.stderr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", type=Path, required=True,
                   help="a git directory of horovod/horovod, or a folder holding horovod+horovod")
    p.add_argument("--commit", default=COMMIT, help="the Horovod commit to read (default: %(default)s)")
    p.add_argument("--suite", choices=sorted(SUITES), default="tensorflow2")
    p.add_argument("--mode", choices=("a", "b"), default="b",
                   help="a: the import line swapped; b: hvdtrain upgrade (default)")
    p.add_argument("-k", dest="expr", help="pytest -k expression (default: every test)")
    p.add_argument("--repeat", type=int, default=1, help="runs of the selection (default 1)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a test may take")
    p.add_argument("--keep", type=Path, help="write each run's whole output to DIR/run-N.log")
    args = p.parse_args(argv)
    git_dir = args.snapshot
    if not ((git_dir / "HEAD").is_file() and (git_dir / "objects").is_dir()):
        git_dir = snapshot_dir(args.snapshot, "horovod/horovod")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="hvdtrain-horovod-elastic-") as work:
        test = prepare(git_dir, args.commit, args.suite, args.mode, Path(work))
        for i in range(args.repeat):
            rc, secs, output = run(test, args.expr, args.timeout)
            failed += rc != 0
            lines = [ln for ln in output.splitlines()
                     if ln.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))]
            print(f"run {i + 1}: pytest exit {rc} in {secs:.1f} s", flush=True)
            for ln in lines:
                print(f"  {ln}", flush=True)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"run-{i + 1}.log").write_text(output)
            if rc != 0:
                print(output[-6000:], flush=True)
    print(f"{args.repeat - failed} of {args.repeat} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
