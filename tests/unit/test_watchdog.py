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


class Recorded(watchdog._Watchdog):
    """A watchdog whose verdict is recorded instead of ending this process."""

    def __init__(self, *args, **kwargs):
        self.verdicts = []
        super().__init__(*args, **kwargs)

    def _exit(self, message):
        import threading
        self.verdicts.append(message)
        threading.Event().wait()  # parks the watchdog's thread (a daemon) for good


def wait_for(condition, seconds=10.0):
    import time
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def send(port, rank, kind=None):
    import json
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall((json.dumps({**report(rank, kind), "host": "node7", "pid": 4242})
                      + "\n").encode())
        return json.loads(conn.makefile("r").readline())


@pytest.mark.timeout(30)
def test_rank_0_names_a_rank_gone_silent_with_its_host_and_pid():
    import socket
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    dog = Recorded(0, 3, 300.0, None, server, liveness=1.0)
    send(port, 1)  # rank 1 reports once, then freezes
    send(port, 2, kind="exited")  # rank 2 leaves normally: not a frozen rank
    assert wait_for(lambda: dog.verdicts), "rank 0 did not notice the silent rank"
    message = dog.verdicts[0]
    assert message.startswith("rank 1 of 3 (host node7, pid 4242) has not reported for ")
    assert "HVDTRAIN_LIVENESS_TIMEOUT" in message and "frozen" in message
    assert "cut off" in message and "rank 2" not in message
    server.close()


@pytest.mark.timeout(30)
def test_a_silent_rank_is_named_early_before_the_limit_ends_the_job(capfd):
    """After two missed reports rank 0 names the silent rank once, so a launcher or a
    transport that ends the job first still leaves its name."""
    import socket
    server = socket.create_server(("127.0.0.1", 0))
    dog = Recorded(0, 2, 300.0, None, server, liveness=4.0)
    send(server.getsockname()[1], 1)
    assert wait_for(lambda: dog.verdicts), "rank 0 did not notice the silent rank"
    err = capfd.readouterr().err
    import re
    assert len(re.findall(r"hvdtrain: rank 0 of 2: rank 1 of 2 \(host node7, pid 4242\) has "
                          r"not reported for [23] s", err)) == 1, err
    assert "it may be frozen" in err and "or cut off; the job ends if it stays silent for " \
        "4 s (HVDTRAIN_LIVENESS_TIMEOUT)" in err, err
    server.close()


@pytest.mark.timeout(30)
def test_a_rank_whose_reports_rank_0_never_answers_names_rank_0():
    import socket
    frozen = socket.create_server(("127.0.0.1", 0))  # listens, never answers: a stopped rank 0
    dog = Recorded(1, 2, 300.0, frozen.getsockname(), None, liveness=1.0,
                   root={"host": "node1", "pid": 99})
    assert wait_for(lambda: dog.verdicts, 20), "rank 1 did not notice rank 0's silence"
    assert dog.verdicts[0].startswith("rank 0 of 2 (host node1, pid 99) has not answered for")
    assert "HVDTRAIN_LIVENESS_TIMEOUT" in dog.verdicts[0]
    frozen.close()


@pytest.mark.timeout(30)
def test_a_rank_0_that_exited_is_not_taken_for_a_frozen_one():
    import socket
    import time
    gone = socket.create_server(("127.0.0.1", 0))
    address = gone.getsockname()
    gone.close()  # connections are refused: rank 0's process has ended
    dog = Recorded(1, 2, 300.0, address, None, liveness=0.5)
    time.sleep(2.0)
    assert dog.verdicts == [] and dog.suspects() is None


def test_bad_liveness_timeout_is_named(monkeypatch):
    monkeypatch.setenv(watchdog.ENV_LIVENESS, "-3")
    with pytest.raises(ValueError, match="HVDTRAIN_LIVENESS_TIMEOUT must be a number of "
                                         "seconds >= 0 .0 turns the liveness check off"):
        watchdog.liveness_from_env()
    monkeypatch.delenv(watchdog.ENV_LIVENESS)
    assert watchdog.liveness_from_env() == watchdog.DEFAULT_LIVENESS_S


def test_a_failed_rank_s_line_is_hvdtrain_s_message_inside_a_tensorflow_error():
    """A tape loop's stop comes as TensorFlow's 'Graph execution error:' first: the rank's
    one-line summary must be the line that names the fault."""
    from hvdtrain.horovod import runtime
    wrapped = RuntimeError("Graph execution error:\n\nDetected at node x\n  File a.py\n"
                           "assertion failed: [hvdtrain: non-finite gradients on rank(s) [1]]")
    assert runtime._first_line(wrapped) == ("assertion failed: [hvdtrain: non-finite "
                                            "gradients on rank(s) [1]]")
    assert runtime._first_line(RuntimeError("boom\nmore")) == "boom"
    assert runtime._first_line(RuntimeError("")) == ""
