"""examples/kubernetes/: the MPIJob manifest and the image recipe hold what the MNIST
example needs (no cluster is reachable here, so the fields are checked, not run)."""
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "kubernetes"


@pytest.fixture(scope="module")
def job():
    return yaml.safe_load((HERE / "mpijob.yaml").read_text())


@pytest.fixture(scope="module")
def mnist():
    spec = importlib.util.spec_from_file_location("mnist_example", ROOT / "examples" / "mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _container(job, role):
    return job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]


def _split_command(command):
    """(mpirun options, the program and its arguments) of the launcher's command."""
    python = command.index("python")
    return command[:python], command[python + 1:]


def test_it_is_an_mpijob_of_the_v2_operator(job):
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert job["spec"]["mpiImplementation"] == "OpenMPI"
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1


def test_the_rank_count_matches_workers_times_slots(job):
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    slots = job["spec"]["slotsPerWorker"]
    mpirun, _ = _split_command(_container(job, "Launcher")["command"])
    assert mpirun[0] == "mpirun"
    assert int(mpirun[mpirun.index("-np") + 1]) == workers * slots
    cpus = float(_container(job, "Worker")["resources"]["limits"]["cpu"])
    assert cpus >= slots, "each rank needs a CPU of its own"


def test_the_command_is_one_the_example_accepts(job, mnist):
    _, program = _split_command(_container(job, "Launcher")["command"])
    assert program[0] == "examples/mnist.py" and (ROOT / program[0]).is_file()
    args = mnist.parse_args(program[1:])  # exits on an unknown or bad flag
    assert args.strategy == "horovod"
    mounts = [m["mountPath"] for m in _container(job, "Worker")["volumeMounts"]]
    for path in (args.checkpoint_dir, args.metrics_out, args.save):  # written by rank 0
        assert any(path.startswith(m + "/") for m in mounts), f"{path} is on no shared volume"


def test_launcher_and_workers_run_the_same_image_built_by_the_recipe(job):
    assert _container(job, "Launcher")["image"] == _container(job, "Worker")["image"]
    recipe = (HERE / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", recipe, re.M)  # the Python the venv is made with
    for package in ("openmpi-bin", "openssh-server"):  # mpi-operator v2 reaches sshd
        assert package in recipe
    assert "bash scripts/install.sh" in recipe and (ROOT / "scripts" / "install.sh").is_file()
    assert "/opt/hvdtrain/.venv/bin" in recipe  # mpirun's `python` is the venv's


def test_workers_have_time_to_checkpoint_when_preempted(job):
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 30
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1  # exit 75 is retried, and resumes
