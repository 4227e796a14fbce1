"""The start-up protocol (hvdtrain.trainer.startup): the constructor, an elastic rejoin and
the checkpoint hand-shake run one list of steps, and the same collectives in the same order
(the elastic jobs themselves run in tests/parallel/test_elastic.py)."""
import keras
import pytest

from hvdtrain import Trainer
from hvdtrain.horovod import collectives
from hvdtrain.trainer import startup

#: the collectives a start-up may run, recorded by name
RECORDED = ("broadcast_object", "allgather_object", "allreduce_sum", "broadcast_variables")


@pytest.fixture
def recorder(monkeypatch):
    """Records, in order, the start-up steps run (with whether it was a rejoin) and the
    collectives they ran."""
    calls: list = []
    for name in RECORDED:
        original = getattr(collectives, name)

        def wrapped(*args, _name=name, _original=original, **kwargs):
            calls.append(("collective", _name))
            return _original(*args, **kwargs)

        monkeypatch.setattr(collectives, name, wrapped)

    def recording(step):
        def run(trainer, given):
            calls.append(("step", step.name, given is None))
            step.run(trainer, given)
        return startup.Step(step.name, run)

    def record(steps):
        monkeypatch.setattr(startup, "STEPS", tuple(recording(s) for s in steps))
        return calls

    return record


def _trainer(dataset, build, tmp_path):
    return Trainer(dataset, build, keras.optimizers.SGD, {"learning_rate": 0.1}, batch_size=16,
                   checkpoint_dir=str(tmp_path), save_checkpoint_steps=2, log_step_size=1000,
                   max_iteration=20)


def _split(calls):
    steps = [c[1] for c in calls if c[0] == "step"]
    return steps, [c for c in calls if c[0] == "collective"]


def test_constructor_and_rejoin_run_the_same_steps_and_collectives(dataset, build, tmp_path,
                                                                   recorder):
    calls = recorder(startup.STEPS)
    trainer = _trainer(dataset, build, tmp_path)
    started = list(calls)
    for _ in range(3):
        trainer.train_on_batch()
    calls.clear()
    trainer.rejoin()
    rejoined = list(calls)

    names = [s.name for s in startup.STEPS]
    assert _split(started)[0] == names and _split(rejoined)[0] == names
    assert all(not c[2] for c in started if c[0] == "step")
    assert all(c[2] for c in rejoined if c[0] == "step")
    # the same collectives, in the same order: a joining worker meets the others
    assert _split(started)[1] == _split(rejoined)[1]
    # the checkpoint hand-shakes are among them: the directory check, then the restore
    kinds = [c[1] for c in _split(started)[1]]
    assert kinds.count("broadcast_object") >= 2 and "broadcast_variables" in kinds, kinds
    # a rejoin reads no checkpoint and keeps the state it trained to
    assert trainer.global_step == 3 and trainer.restored_from is None


def test_a_step_added_to_the_list_reaches_the_constructor_the_rejoin_and_the_handshake(
        dataset, build, tmp_path, recorder):
    seen = []

    def probe(trainer, given):
        seen.append("rejoin" if given is None else "start")
        collectives.broadcast_object("probe")  # a new start-up collective

    steps = list(startup.STEPS)
    at = [s.name for s in steps].index("restore")  # between the two checkpoint hand-shakes
    steps.insert(at, startup.Step("probe", probe))
    calls = recorder(steps)
    trainer = _trainer(dataset, build, tmp_path)
    started = _split(calls)
    calls.clear()
    trainer.rejoin()
    rejoined = _split(calls)

    assert seen == ["start", "rejoin"]
    assert started[0] == rejoined[0] and started[0][at:at + 2] == ["probe", "restore"]
    assert started[1] == rejoined[1]


def test_a_restarted_run_restores_in_the_restore_step(dataset, build, tmp_path, recorder):
    first = _trainer(dataset, build, tmp_path)
    for _ in range(4):
        first.train_on_batch()
    calls = recorder(startup.STEPS)
    second = _trainer(dataset, build, tmp_path)
    assert second.restored_from is not None and second.restored_from.endswith("ckpt-00000004")
    assert second.global_step == 4
    assert [c[1] for c in calls if c[0] == "step"] == [s.name for s in startup.STEPS]
