"""The README's table of horovod.tensorflow(.keras)'s public names and hvdtrain.tensorflow
agree: every Horovod name is in the table, every name marked supported exists in the
matching hvdtrain module, and none marked unsupported does."""
import inspect
import re
from pathlib import Path

import horovod.tensorflow as H
import horovod.tensorflow.elastic as HE
import horovod.tensorflow.keras as HK
import horovod.tensorflow.keras.callbacks as HKC
import horovod.tensorflow.keras.elastic as HKE
import pytest

import hvdtrain.tensorflow as hvd
import hvdtrain.tensorflow.keras as hvk

README = Path(__file__).resolve().parents[2] / "README.md"
PAIRS = [(H, hvd), (HE, hvd.elastic), (HK, hvk), (HKC, hvk.callbacks), (HKE, hvk.elastic)]


def table() -> dict[str, set]:
    """``{"yes": names, "no": names}`` from the README's table."""
    text = README.read_text()
    start = text.index("| name | supported | notes |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    listed = {"yes": set(), "no": set()}
    for row in rows:
        name_cell, supported = [c.strip() for c in row.strip("|").split("|")][:2]
        assert supported in listed, row
        listed[supported].update(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`", name_cell))
    return listed


def public_names(module) -> set:
    """Horovod's public names: its functions, classes and values, and the submodules it
    documents (``elastic``, ``callbacks``), not the modules it merely imports."""
    return {n for n in dir(module) if not n.startswith("_")
            and (not inspect.ismodule(getattr(module, n)) or n in ("elastic", "callbacks"))}


@pytest.mark.parametrize("horovod_module,ours", PAIRS, ids=lambda m: m.__name__)
def test_every_horovod_name_is_in_the_readme_table(horovod_module, ours):
    listed = table()
    missing = sorted(public_names(horovod_module) - listed["yes"] - listed["no"])
    assert not missing, f"{horovod_module.__name__} names missing from the README table: {missing}"


@pytest.mark.parametrize("horovod_module,ours", PAIRS, ids=lambda m: m.__name__)
def test_the_table_says_what_the_module_has(horovod_module, ours):
    listed = table()
    names = public_names(horovod_module)
    absent = sorted(n for n in names & listed["yes"] if not hasattr(ours, n))
    assert not absent, f"marked supported but missing from {ours.__name__}: {absent}"
    present = sorted(n for n in names & listed["no"] if hasattr(ours, n))
    assert not present, f"marked unsupported but present in {ours.__name__}: {present}"


def test_signatures_accept_horovods_arguments():
    for name in ("DistributedGradientTape", "PartialDistributedGradientTape",
                 "DistributedOptimizer", "broadcast_variables"):
        theirs = list(inspect.signature(getattr(H, name)).parameters)
        mine = list(inspect.signature(getattr(hvd, name)).parameters)
        assert mine == theirs, name
    for name in ("DistributedOptimizer", "load_model", "allreduce", "allgather", "broadcast",
                 "reducescatter"):
        theirs = list(inspect.signature(getattr(HK, name)).parameters)
        mine = list(inspect.signature(getattr(hvk, name)).parameters)
        assert mine == theirs, name
    for name in ("BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
                 "LearningRateWarmupCallback", "BestModelCheckpoint", "MetricAverageCallback"):
        theirs = list(inspect.signature(getattr(HKC, name)).parameters)
        mine = list(inspect.signature(getattr(hvk.callbacks, name)).parameters)
        assert mine[:len(theirs)] == theirs, name
