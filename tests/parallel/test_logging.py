"""hvdtrain's lines go to the user's logging configured after ``import hvdtrain`` and after
a Trainer was built: real 2-rank jobs under horovodrun and mpirun."""
import pytest

from conftest import WORKERS, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]
WORKER = str(WORKERS / "logging_worker.py")


def test_basic_config_after_the_trainer_gets_the_step_lines(launcher, tmp_path):
    proc = run_job(launcher, 2, [WORKER, str(tmp_path)], timeout=90)
    text = proc.stdout + proc.stderr
    # Before the user's configuration: hvdtrain's own lines on stderr, ranks told apart.
    assert "[hvdtrain] before the user's configuration" in text, text[-3000:]
    assert "[hvdtrain rank 1] rank 1 warns before the user's configuration" in text
    # After it: the user's files only.
    rank0 = (tmp_path / "rank0.log").read_text().splitlines()
    assert [ln.split(":")[0] for ln in rank0 if ln.startswith("INFO")] == [
        f"INFO hvdtrain step {n}" for n in (1, 2, 3, 4)], rank0
    assert rank0[-1] == "WARNING hvdtrain rank 0 finished at step 4"
    assert "before the user's configuration" not in "\n".join(rank0)
    assert "step 1:" not in text and "finished at step" not in text
    rank1 = (tmp_path / "rank1.log").read_text().splitlines()
    assert rank1 == ["WARNING hvdtrain rank 1 finished at step 4"]
