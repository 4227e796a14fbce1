"""commit()'s check for host changes in one broadcast of three integers
(horovod_private.check_host_updates) decides as Horovod's own State.check_host_updates
does, on the same notifications (one process: the broadcast is rank 0's own values; the
elastic jobs run in tests/parallel/test_elastic.py and test_horovod_dropin.py)."""
import pytest

from hvdtrain.horovod import elastic_runtime, horovod_private, keras_state
from hvdtrain.horovod.horovod_private import HostUpdateResult, HostsUpdatedInterrupt

REMOVED, ADDED = HostUpdateResult.removed, HostUpdateResult.added
# each case: the notifications queued before each of three commits
CASES = {
    "none": [[], [], []],
    "added": [[], [(100, ADDED)], []],
    "removed": [[(100, REMOVED)], [], []],
    "both in one commit": [[(100, REMOVED), (101, ADDED)], [], []],
    "an old notification again": [[(100, ADDED)], [(100, ADDED)], [(99, REMOVED)]],
    "newer after older": [[(100, REMOVED)], [(101, REMOVED)], [(102, ADDED)]],
}


class _Horovods(horovod_private.ElasticStateBase):
    def __init__(self, log):
        super().__init__(bcast_object=lambda obj: log.append(obj) or obj, get_rank=lambda: 0)


class _Ours(elastic_runtime.OneBroadcastHostCheck, horovod_private.ElasticStateBase):
    def __init__(self, log):
        super().__init__(bcast_object=None, get_rank=lambda: 0)
        self.log = log

    def check_host_updates(self):
        horovod_private.check_host_updates(self, lambda v: self.log.append(v) or v)


def _decisions(state, commits):
    out = []
    for messages in commits:
        for timestamp, update in messages:
            state.on_hosts_updated(timestamp, update)
        try:
            state.check_host_updates()
            out.append("go on")
        except HostsUpdatedInterrupt as e:
            out.append(f"restart, skip_sync={e.skip_sync}")
    return out, state._last_updated_timestamp


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_decision_is_horovods_with_one_broadcast_a_commit(case):
    horovods, ours = [], []
    assert _decisions(_Ours(ours), CASES[case]) == _decisions(_Horovods(horovods), CASES[case])
    assert len(ours) == len(horovods) == 3  # one broadcast of three integers a commit
    assert all(len(v) == 3 and all(type(x) is int for x in v) for v in ours)


def test_the_states_hvdtrain_gives_scripts_use_it():
    for cls in (elastic_runtime.ElasticState, keras_state.TensorFlowState,
                keras_state.TensorFlowKerasState):
        assert cls.check_host_updates is elastic_runtime.OneBroadcastHostCheck.check_host_updates
