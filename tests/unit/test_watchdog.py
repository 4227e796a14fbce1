"""The collective watchdog's judgement (the whole watchdog runs on real ranks in
tests/parallel/test_no_hang.py)."""
import pytest

from hvdtrain.horovod import watchdog


def report(rank, kind, label="", for_s=0.0, step=3):
    return {"rank": rank, "kind": kind, "label": label, "for_s": for_s, "step": step}


def test_a_rank_that_left_the_loop_is_named():
    key, message = watchdog.verdict({0: report(0, "collective", "training step 4", 12),
                                     1: report(1, None, for_s=11)}, 2, limit=10)
    assert message.startswith("collective 'training step 4' waited 12 s on rank 0 (limit 10 s")
    assert "rank 1 did not arrive: rank 1 is in no collective (last step 3" in message
    assert key == ("training step 4", (0,), (1, (None, "")))


@pytest.mark.parametrize("reports", [
    # under the limit
    {0: report(0, "collective", "training step 4", 9), 1: report(1, None)},
    # every rank in the same collective: a slow step or compile, not a mismatch
    {0: report(0, "collective", "training step 1", 60),
     1: report(1, "collective", "training step 1", 60)},
    # rank 0 saves a checkpoint while rank 1 waits for it in the next step
    {0: report(0, "busy", "saving a checkpoint", 30),
     1: report(1, "collective", "training step 5", 30)},
    # rank 1 has joined (hvd.join()): it takes part in rank 0's exchange with zeros
    {0: report(0, "collective", "the gradient exchange", 30),
     1: report(1, "joined", "join", 30)},
])
def test_nothing_is_stuck(reports):
    assert watchdog.verdict(reports, 2, limit=10) is None


def test_the_judged_collective_does_not_flip_between_rounds():
    a = watchdog.verdict({0: report(0, "collective", "barrier in main", 12),
                          1: report(1, "collective", "training step 4", 14)}, 2, limit=10)
    b = watchdog.verdict({0: report(0, "collective", "barrier in main", 15),
                          1: report(1, "collective", "training step 4", 13)}, 2, limit=10)
    assert a[0] == b[0] and "rank 1 waits in 'training step 4'" in a[1]


def test_marks_nest_and_clear():
    with watchdog.waiting("outer", step=7):
        with watchdog.busy("inner"):
            assert watchdog._mark.label == "outer"  # a collective keeps its label
        assert watchdog._mark.report(0)["step"] == 7
    assert watchdog._mark.kind is None


def test_bad_timeout_is_named(monkeypatch):
    monkeypatch.setenv(watchdog.ENV_TIMEOUT, "soon")
    with pytest.raises(ValueError, match="HVDTRAIN_COLLECTIVE_TIMEOUT must be a number"):
        watchdog.timeout_from_env()
    monkeypatch.setenv(watchdog.ENV_TIMEOUT, "0")
    assert watchdog.timeout_from_env() == 0


def test_a_collective_inside_a_graph_is_reported_until_it_leaves():
    assert watchdog.report_now(0)["kind"] is None
    first = watchdog.enter("the gradient exchange")
    second = watchdog.enter("the gradient exchange")
    assert watchdog.report_now(0)["kind"] == "collective"
    assert watchdog.report_now(0)["label"] == "the gradient exchange"
    watchdog.leave(first)
    assert watchdog.report_now(0)["kind"] == "collective"  # the second is still in flight
    with watchdog.waiting("fit training step 3", step=3):  # the Python-side mark wins
        assert watchdog.report_now(0)["label"] == "fit training step 3"
    watchdog.leave(second)
    assert watchdog.report_now(0)["kind"] is None


def test_a_rank_without_steps_is_named_by_how_long_it_is_away():
    _, message = watchdog.verdict({0: report(0, "collective", "the gradient exchange", 12),
                                   1: report(1, None, for_s=20, step=0)}, 2, limit=10)
    assert "rank 1 is in no collective (for 20 s: it stopped training" in message
