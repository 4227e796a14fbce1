"""``hvdtrain.init(comm=...)``'s checks and world facts, without starting MPI (the
sub-communicator jobs themselves run in tests/parallel/test_subcomm.py)."""
import logging

import pytest

from hvdtrain import reporting, threads
from hvdtrain.horovod import communicator, runtime


@pytest.mark.parametrize("comm", [[], [0, 0], [-1, 2], [True, 1], "0,2", 3, None])
def test_anything_but_a_rank_list_or_communicator_is_refused_naming_comm(comm):
    with pytest.raises(ValueError, match=r"comm="):
        communicator.check(comm)


def test_a_list_of_distinct_world_ranks_is_accepted_without_mpi():
    communicator.check([1, 3])
    communicator.check((0, 2))


def test_gloo_which_ignores_comm_is_refused_after_init():
    with pytest.raises(ValueError, match=r"needs Horovod's MPI controller .*mpirun.*Gloo, "
                                         r"which ignores comm= and started Horovod on all 4"):
        communicator.check_started([0, 2], size=4, mpi_enabled=False)
    with pytest.raises(ValueError, match="comm= holds 2 ranks but Horovod started on 4"):
        communicator.check_started([0, 2], size=4, mpi_enabled=True)
    communicator.check_started([0, 2], size=2, mpi_enabled=True)


def test_messages_name_the_world_rank_and_the_sub_job():
    m = communicator.Membership(world_ranks=(1, 3), world_rank=3, world_size=4)
    assert m.describe() == "world ranks 1, 3 of 4"
    assert m.where(1, 2) == "rank 1 of 2 (world rank 3; sub-communicator of world ranks 1, 3 of 4)"


@pytest.mark.parametrize("env, size, rank", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 4, 3),
    ({"MPI_LOCALNRANKS": "6", "MPI_LOCALRANKID": "5"}, 6, 5),
    ({}, 2, 1),  # no launcher said: Horovod's own numbers
])
def test_host_sharing_counts_the_whole_jobs_processes(monkeypatch, env, size, rank):
    for key in threads._LOCAL_SIZE_KEYS + threads._LOCAL_RANK_KEYS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert communicator.host_processes(local_size=2) == size
    assert communicator.host_local_rank(local_rank=1) == rank


def test_init_again_on_another_communicator_is_refused(monkeypatch):
    monkeypatch.setattr(runtime, "_initialized", True)
    monkeypatch.setattr(runtime, "_comm", [0, 2])
    runtime.init()               # the Trainer's own init keeps the sub-communicator
    runtime.init(comm=(0, 2))    # the same ranks again
    with pytest.raises(ValueError, match=r"init\(comm=\[1, 3\]\): Horovod already runs on "
                                         r"\[0, 2\]"):
        runtime.init(comm=[1, 3])


def test_the_log_prefix_names_the_sub_job():
    handler = reporting._fallback
    try:
        reporting.setup_logging(0)
        reporting.set_job_label("world ranks 1, 3 of 4")
        record = logging.LogRecord("hvdtrain", logging.INFO, __file__, 1, "step 4", None, None)
        assert handler.format(record) == "[hvdtrain world ranks 1, 3 of 4] step 4"
        reporting.setup_logging(1)
        assert handler.format(record) == "[hvdtrain rank 1, world ranks 1, 3 of 4] step 4"
    finally:
        reporting.set_job_label("")
        reporting.setup_logging(0)
    assert handler.format(record) == "[hvdtrain] step 4"
