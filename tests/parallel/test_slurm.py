"""A real Slurm cluster on one machine: ``scripts/slurm_cluster.sh`` installs Debian's
slurm-wlm and munge if missing, runs slurmctld here and one slurmd in each of the network
namespace hosts of ``scripts/netns_hosts.sh`` (hvdtn1, hvdtn2; one CPU each). The
example batch script ``examples/slurm/train.sbatch`` trains examples/mnist.py with
``srun --mpi=pmix`` on both nodes; a SIGUSR1 (``scancel --signal=USR1``, as
``--signal=USR1@60`` or preemption sends it) makes hvdtrain checkpoint and exit 75, the
script requeues the job, and the requeued run resumes from the checkpoint. Needs root;
skipped, with the reason, only where that or the Slurm install is impossible.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, launch_command

# One timeout per test; the xdist group is set on each test (closer than the file's group
# that conftest adds): the cluster's nodes are the namespaces of test_multihost.py.
pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]
netns_group = pytest.mark.xdist_group("netns")

SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
MNIST = str(ROOT / "examples" / "mnist.py")
SLURM_DIR = Path(os.environ.get("HVDT_SLURM_DIR", "/var/tmp/hvdt-slurm"))
PREEMPTED = 75  # hvdtrain.PREEMPTED_EXIT_CODE
# The example's MLP: each step all-reduces this many gradient bytes (see test_multihost).
GRADIENT_BYTES = 4 * (784 * 800 + 800 + 800 * 800 + 800 + 800 * 10 + 10)
STEPS = 120
FLAGS = ["--dataset", "fashion_mnist", "--epochs", "1", "--max-steps", str(STEPS), "--seed", "0",
         "--log-step-size", "10"]
# One intra-op thread per rank in every run (as test_multihost): the same float sums.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", HVDTRAIN_THREADS="1",
           SLURM_CONF=str(SLURM_DIR / "slurm.conf"), PYTHON=sys.executable)


def slurm(*args: str, timeout: float = 30) -> str:
    proc = subprocess.run(list(args), env=ENV, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def cluster():
    """The running cluster: {"nodes": [...], "netns": bool}; stopped afterwards."""
    if os.geteuid() != 0:
        pytest.skip("starting slurmd / slurmctld and network namespaces needs root")
    try:
        proc = subprocess.run(["sh", str(SCRIPT), "start"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0 and ("apt-get is not available" in proc.stderr
                                     or "apt-get update failed" in proc.stderr):
            pytest.skip(f"Slurm cannot be installed here: {proc.stderr.strip()}")
        assert proc.returncode == 0, f"slurm_cluster.sh start: {proc.stdout}{proc.stderr}"
        netns = "refused network namespaces" not in proc.stderr
        yield {"nodes": ["hvdtn1", "hvdtn2"] if netns else ["hvdtn1"], "netns": netns}
    finally:
        stop = subprocess.run(["sh", str(SCRIPT), "stop"], capture_output=True, text=True,
                              timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        ps = subprocess.run(["ps", "-eo", "pid=,stat=,comm="], capture_output=True, text=True,
                            timeout=30)
        left = [line for line in ps.stdout.splitlines()  # zombies are not running
                if re.search(r"\s(slurmd|slurmctld|slurmstepd)$", line)
                and not line.split()[1].startswith("Z")]
        assert left == [], f"daemons left running: {left}"


class Reference:
    """The same training on 2 local ranks under plain mpirun, started in the background."""

    def __init__(self, out: Path) -> None:
        self.out = out / "local.json"
        command = launch_command("mpirun", 2, [MNIST, *FLAGS, "--metrics-out", str(self.out)])
        command[1:1] = ["-x", "HVDTRAIN_THREADS"]
        self.proc = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

    def metrics(self) -> dict:
        output, _ = self.proc.communicate(timeout=240)
        assert self.proc.returncode == 0, output[-4000:]
        return json.loads(self.out.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    ref = Reference(tmp_path_factory.mktemp("local"))
    yield ref
    ref.kill()


def submit(cluster: dict, out: Path) -> str:
    """sbatch the example with small settings; returns the job id."""
    extra = [] if cluster["netns"] else ["--nodes", "1", "--ntasks-per-node", "2"]
    return slurm("sbatch", "--parsable", "--chdir", str(ROOT), "--output", str(out / "job.log"),
                 *extra, str(SBATCH), *FLAGS, "--checkpoint-dir", str(out / "ckpt"),
                 "--metrics-out", str(out / "metrics.json")).strip().split(";")[0]


def job_fields(job: str) -> dict:
    text = slurm("scontrol", "show", "job", "-o", job)
    return dict(re.findall(r"(\w+)=(\S*)", text))


def log_of(out: Path) -> str:
    path = out / "job.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for_end(job: str, out: Path, timeout: float) -> dict:
    """Polls the job until it completes, fails or is cancelled; a hang fails the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = job_fields(job)
        if fields["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                  "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
            return fields
        time.sleep(1)
    subprocess.run(["scancel", job], env=ENV, timeout=30)
    raise AssertionError(f"job {job} did not end in {timeout} s: {job_fields(job)}\n"
                         f"{log_of(out)[-4000:]}")


def wait_for_log(job: str, out: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_of(out):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=ENV, timeout=30)
            raise AssertionError(f"no '{text}' in job {job}'s log after {timeout} s\n"
                                 f"{log_of(out)[-4000:]}")
        time.sleep(0.1)


def veth_received() -> dict[str, int]:
    """Bytes each namespace host received (the root end of its veth sent them)."""
    return {f"hvdtn{i}": int(Path(f"/sys/class/net/hvdtv{i}/statistics/tx_bytes").read_text())
            for i in (1, 2)}


def assert_same_result(metrics: dict, expected: dict) -> None:
    assert metrics["world_size"] == expected["world_size"] == 2
    assert metrics["global_step"] == expected["global_step"] == STEPS
    for key in ("test_accuracy", "test_loss"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key
    for key in expected["validation"]:
        assert metrics["validation"][key] == pytest.approx(expected["validation"][key], abs=1e-5)


# ----------------------------------------------------------------------------- tests
@netns_group
def test_cluster_runs_one_task_per_node_and_offers_pmix(cluster):
    """Two tasks land on the two nodes, each with its own host name; Debian's Slurm offers
    pmix, the flavour Debian's Open MPI (and so Horovod) starts with."""
    assert re.search(r"^\s*pmix$", slurm("srun", "--mpi=list"), re.M)
    n = len(cluster["nodes"])
    names = slurm("srun", "-N", str(n), "-n", "2", "hostname", timeout=60).split()
    if cluster["netns"]:
        assert sorted(names) == ["hvdtn1", "hvdtn2"]


@netns_group
def test_sbatch_example_on_two_nodes_matches_local_mpirun(cluster, reference, tmp_path):
    """The example job trains on both nodes (every step's gradients cross both veths) and
    ends exactly where 2 local ranks under mpirun end."""
    before = veth_received() if cluster["netns"] else None
    job = submit(cluster, tmp_path)
    fields = wait_for_end(job, tmp_path, 150)
    log = log_of(tmp_path)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log[-4000:])
    assert "training exited with 0" in log
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    if cluster["netns"]:
        assert fields["NodeList"] == "hvdtn[1-2]"
        assert f"job {job} on hvdtn[1-2], restart 0" in log
        after = veth_received()
        for host in before:  # to learn the sum, each rank receives the other's gradients
            assert after[host] - before[host] >= STEPS * GRADIENT_BYTES, (host, before, after)
    assert_same_result(metrics, reference.metrics())


@netns_group
def test_preempted_job_requeues_itself_and_resumes_from_the_checkpoint(cluster, reference,
                                                                       tmp_path):
    """SIGUSR1 to the job's tasks: every rank stops after the same step, the job exits 75
    and requeues itself; the second run resumes from the checkpoint and ends with the
    result of an uninterrupted run."""
    job = submit(cluster, tmp_path)
    wait_for_log(job, tmp_path, "[hvdtrain] step 20:", 120)
    slurm("scancel", "--signal=USR1", job)
    fields = wait_for_end(job, tmp_path, 150)
    log = log_of(tmp_path)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log[-4000:])
    assert fields["Restarts"] == "1", (fields, log[-4000:])
    assert f"training exited with {PREEMPTED}" in log and "requeueing job" in log, log[-4000:]
    stopped = int(re.search(r"every rank stopped after step (\d+)", log).group(1))
    assert 20 <= stopped < STEPS
    assert f"restart 1" in log
    assert f"resumed from {tmp_path / 'ckpt'}/ckpt-{stopped:08d} at step {stopped}" in log
    assert log.rstrip().endswith("training exited with 0")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == STEPS - stopped  # only the missing steps
    assert_same_result(metrics, reference.metrics())
