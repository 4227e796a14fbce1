"""``scripts/gpu_check.py`` on the CPU (``--allow-cpu``): every check it makes on a GPU
machine runs here through real Horovod ranks, so the prepared GPU check is known to work
before a GPU is lent; only the device differs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_command

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.parallel

CHECKS = ("collectives", "trainer", "trainer_xla", "fit", "fit_xla")


@pytest.mark.timeout(300)
def test_gpu_check_passes_every_check_on_two_cpu_ranks(tmp_path):
    out = tmp_path / "check.json"
    command = launch_command("horovodrun", 2, [str(ROOT / "scripts" / "gpu_check.py"),
                                               "--allow-cpu", "--out", str(out)])
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["ranks"] == 2 and results["device"] == "/CPU:0"
    assert results["build"]["gloo_built"]
    for name in CHECKS:
        assert results[name]["passed"] is True, (name, results[name])
    collectives = results["collectives"]
    for op in ("allreduce", "broadcast", "allgather"):
        for dtype in ("float32", "float16"):
            assert collectives[f"{op}_{dtype}"]["max_abs_diff"] <= 1e-2
    assert collectives["allgather_ranks"]["ok"]
    for name in ("trainer", "trainer_xla"):
        assert results[name]["last_loss"] < results[name]["first_loss"]
    assert results["fit"]["epoch_losses"][-1] < results["fit"]["epoch_losses"][0]


@pytest.mark.timeout(60)
def test_gpu_check_refuses_to_run_without_a_gpu_unless_told(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out",
                           str(tmp_path / "x.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "sees no GPU" in proc.stderr
    assert not (tmp_path / "x.json").exists()
