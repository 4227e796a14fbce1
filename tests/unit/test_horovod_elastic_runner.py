"""scripts/run_horovod_elastic.py, the runner of Horovod's own elastic tests, on a small
git repository laid out as Horovod's (the real run needs a snapshot of Horovod and takes
minutes: it is not part of the suite)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "import horovod.tensorflow as hvd\nimport psutil\nhvd.init()\n"


def _runner():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(
            "run_horovod_elastic", ROOT / "scripts" / "run_horovod_elastic.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def snapshot(tmp_path):
    runner = _runner()
    repo = tmp_path / "horovod"
    test_file, script = runner.SUITES["tensorflow2"]
    for path in (*runner.HELPERS, test_file, script):
        out = repo / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(SCRIPT if path == script else f"# {path}\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "files")
    return runner, repo / ".git", _git(repo, "rev-parse", "HEAD")


def test_the_tests_are_read_at_the_commit_with_only_the_import_swapped(snapshot, tmp_path):
    runner, git_dir, commit = snapshot
    work = tmp_path / "work"
    test = runner.prepare(git_dir, commit, "tensorflow2", "a", work)
    assert test == work / "test/integration/test_elastic_tensorflow2.py"
    assert test.read_text() == "# test/integration/test_elastic_tensorflow2.py\n"
    main = work / "test/integration/data/elastic_tensorflow2_main.py"
    assert main.read_text() == SCRIPT.replace("horovod.tensorflow", "hvdtrain.tensorflow")
    for helper in runner.HELPERS:
        assert (work / helper).read_text() == f"# {helper}\n"
    assert (work / "test/mock.py").read_text().startswith("from unittest.mock import *")


def test_a_file_missing_at_the_commit_is_named(snapshot, tmp_path):
    runner, git_dir, commit = snapshot
    with pytest.raises(FileNotFoundError, match=r"horovod/horovod@\w{10}:test/nowhere\.py"):
        runner.git_show(git_dir, commit, "test/nowhere.py")
