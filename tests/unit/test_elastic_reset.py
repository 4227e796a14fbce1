"""The elastic reset guard's judgement and when collectives may be skipped (the elastic
jobs themselves run in tests/parallel/test_elastic.py)."""
import pytest

from hvdtrain.horovod import elastic_runtime, runtime


def test_a_reset_past_its_limit_names_the_worker_and_the_stage():
    exits = []
    guard = elastic_runtime.ResetGuard(10, rendezvous_limit=30, exit=exits.append)
    guard.arm("localhost[1] (rank 1 of 2 before the reset)")
    start = guard._since
    guard.stage("the reset callbacks and the sync of the state from rank 0")
    assert guard.check(now=start + 9) is None
    message = guard.check(now=start + 12)
    assert message.startswith("elastic worker localhost[1] (rank 1 of 2 before the reset) "
                              "stuck in an elastic reset for 12 s (limit 10 s, "
                              "HVDTRAIN_ELASTIC_RESET_TIMEOUT), in the reset callbacks")
    guard.disarm()
    assert guard.check(now=start + 100) is None
    assert exits == []


def test_the_rendezvous_may_wait_as_long_as_the_driver():
    guard = elastic_runtime.ResetGuard(10, rendezvous_limit=30, exit=lambda code: None)
    guard.arm("localhost[0]")
    guard.stage("the rendezvous of the new world")
    assert guard.check(now=guard._since + 25) is None
    assert "in the rendezvous of the new world" in guard.check(now=guard._since + 31)
    guard.disarm()


@pytest.mark.parametrize("text", ["0", "-3", "soon"])
def test_a_bad_reset_timeout_is_named(monkeypatch, text):
    monkeypatch.setenv("HVDTRAIN_ELASTIC_RESET_TIMEOUT", text)
    with pytest.raises(ValueError, match="HVDTRAIN_ELASTIC_RESET_TIMEOUT"):
        elastic_runtime.reset_timeout_from_env()


def test_collectives_are_skipped_alone_but_not_in_an_elastic_world_of_one(monkeypatch):
    runtime.init()
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    assert runtime.alone()
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")  # a world of one that a host may join
    assert not runtime.alone()
