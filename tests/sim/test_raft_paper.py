"""Scripted scenarios named after the sections of the Raft paper (and thesis) they check."""

from __future__ import annotations

import dataclasses

import pytest

from hutch.raft.group import (
    CANDIDATE,
    FOLLOWER,
    LEADER,
    PRE_CANDIDATE,
    NotLeader,
    ProposalRejected,
    RaftConfig,
)
from hutch.raft.messages import (
    CONF_ADD_LEARNER,
    CONF_PROMOTE,
    CONF_REMOVE,
    AppendEntries,
    AppendResponse,
    ConfChange,
    Heartbeat,
    InstallSnapshot,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)
from hutch.raft.storage import MemoryStorage
from tests.sim.harness import QUIET, Cluster, storage_with_log

NO_PREVOTE = dataclasses.replace(QUIET, pre_vote=False, check_quorum=False)


def leader_cluster(ids=(1, 2, 3), cfg=QUIET, leader=1) -> Cluster:
    c = Cluster(ids, cfg)
    c.elect(leader)
    return c


# ---- §5.1 terms ---------------------------------------------------------------------------


def test_5_1_node_seeing_a_higher_term_adopts_it_and_leader_steps_down():
    c = leader_cluster()
    c[1].step(Heartbeat(term=c[1].term + 5, frm=2, to=1, commit=0))
    assert c[1].role == FOLLOWER and c[1].term == c[2].term + 5 and c[1].leader == 2


def test_5_1_messages_from_a_stale_term_are_rejected_with_the_current_term():
    c = leader_cluster()
    term = c[2].term
    c.drop_inbox()
    c[2].step(AppendEntries(term=term - 1, frm=3, to=2, prev_index=0, prev_term=0, entries=[], commit=0))
    c.process()
    (reply,) = c.inbox
    assert isinstance(reply, AppendResponse) and reply.term == term and reply.reject
    assert c[2].leader == 1


# ---- §5.2 leader election -----------------------------------------------------------------


def test_5_2_follower_becomes_candidate_after_election_timeout_and_requests_votes():
    c = Cluster(cfg=NO_PREVOTE)
    term = c[1].term
    c.tick(ids=[1], n=2 * NO_PREVOTE.election_timeout_ticks)
    assert c[1].role == CANDIDATE and c[1].term == term + 1 and c[1].vote == 1
    requests = [m for m in c.inbox if isinstance(m, RequestVote)]
    assert {m.to for m in requests} == {2, 3} and all(not m.pre_vote for m in requests)


def test_5_2_candidate_with_votes_from_a_majority_becomes_leader():
    c = Cluster(cfg=NO_PREVOTE)
    c.cut |= {(1, 3), (3, 1)}  # one vote short of everyone is still a majority
    c.elect(1)
    assert c.leaders() == [1] and c[2].leader == 1


def test_5_2_each_node_votes_for_at_most_one_candidate_per_term():
    c = Cluster(cfg=NO_PREVOTE)
    term = c[3].term + 1
    c[3].step(RequestVote(term=term, frm=1, to=3, last_index=1, last_term=1))
    c[3].step(RequestVote(term=term, frm=2, to=3, last_index=1, last_term=1))
    c.process()
    votes = {m.to: m.granted for m in c.inbox if isinstance(m, VoteResponse)}
    assert votes == {1: True, 2: False}


def test_5_2_candidate_returns_to_follower_on_append_from_leader_of_its_term():
    c = Cluster(cfg=NO_PREVOTE)
    c.tick(ids=[2], n=2 * NO_PREVOTE.election_timeout_ticks)
    assert c[2].role == CANDIDATE
    c[2].step(AppendEntries(term=c[2].term, frm=3, to=2, prev_index=1, prev_term=1, entries=[], commit=1))
    assert c[2].role == FOLLOWER and c[2].leader == 3


def test_5_2_election_timeouts_are_randomized_between_one_and_two_timeouts():
    timeouts = {Cluster(ids=(1,), cfg=dataclasses.replace(QUIET, seed=s))[1].timeout for s in range(50)}
    assert len(timeouts) > 3
    assert all(QUIET.election_timeout_ticks <= t < 2 * QUIET.election_timeout_ticks for t in timeouts)


def test_5_2_split_vote_is_resolved_by_a_later_election():
    c = Cluster(cfg=NO_PREVOTE)
    for i in (1, 2, 3):  # everyone campaigns at once: nobody can win this term
        c[i].elapsed = c[i].timeout - 1
    c.tick()
    c.deliver()
    for _ in range(100):
        if c.leaders():
            break
        c.stabilize()
    assert len(c.leaders()) == 1


# ---- §5.3 log replication -----------------------------------------------------------------


def test_5_3_leader_replicates_a_command_and_everyone_applies_it_once_committed():
    c = leader_cluster()
    idx = c[1].propose(b"x")
    c.deliver()
    assert c[1].commit >= idx
    c.stabilize()  # the heartbeat carries the commit index to followers
    assert all(c.data(i) == [b"x"] for i in (1, 2, 3))


def test_5_3_entry_is_committed_when_stored_on_a_majority_only():
    c = leader_cluster()
    c.isolate(3)
    c.cut.discard((1, 2)), c.cut.discard((2, 1))
    idx = c[1].propose(b"x")
    c.deliver()
    assert c[1].commit >= idx and c[3].last_index() < idx
    c.isolate(1)
    c.cut -= {(2, 3), (3, 2)}
    idx2 = c[1].propose(b"y")
    c.deliver()
    assert c[1].commit < idx2  # only the leader has it


def test_5_3_follower_rejects_append_whose_previous_entry_does_not_match():
    c = Cluster()
    c.drop_inbox()
    c[2].step(AppendEntries(term=5, frm=1, to=2, prev_index=1, prev_term=3, entries=[], commit=1))
    c.process()
    (reply,) = c.inbox
    assert reply.reject and reply.index == 1


def test_5_3_leader_overwrites_a_conflicting_follower_suffix():
    stores = {1: storage_with_log([2, 4], 4), 2: storage_with_log([2, 3, 3, 3], 3), 3: storage_with_log([2], 2)}
    c = Cluster(storages=stores)
    c.elect(1)
    c[1].propose(b"z")
    c.deliver()
    c.stabilize()
    logs = {i: [c[i].storage.term(j) for j in range(1, c[i].last_index() + 1)] for i in (1, 2, 3)}
    assert logs[1] == logs[2] == logs[3]
    assert logs[2][2] == 4  # the uncommitted term-3 entries were replaced


def test_5_3_lagging_follower_catches_up_as_leader_backs_off_next_index():
    c = leader_cluster()
    c.isolate(3)
    for k in range(30):
        c[1].propose(b"%d" % k)
        c.deliver()
    c.heal()
    c.stabilize(3)
    assert c[3].last_index() == c[1].last_index() and len(c.data(3)) == 30


def test_5_3_appends_are_batched_up_to_entries_per_message_max():
    cfg = dataclasses.replace(QUIET, entries_per_message_max=4, inflight_messages_max=100)
    c = leader_cluster(cfg=cfg)
    c.drop_inbox()
    for k in range(10):
        c[1].propose(b"%d" % k)
    c.process()
    appends = [m for m in c.inbox if isinstance(m, AppendEntries) and m.to == 2]
    assert [len(m.entries) for m in appends] == [4, 4, 2]  # pipelined, none waits for an ack


def test_5_3_pipeline_stops_at_inflight_messages_max_and_resumes_on_ack():
    cfg = dataclasses.replace(QUIET, entries_per_message_max=1, inflight_messages_max=2)
    c = leader_cluster(cfg=cfg)
    c.drop_inbox()
    for k in range(5):
        c[1].propose(b"%d" % k)
    c.process()
    assert len([m for m in c.inbox if isinstance(m, AppendEntries) and m.to == 2]) == 2
    c.deliver()
    assert c[2].last_index() == c[1].last_index()


def test_5_3_uncommitted_proposals_beyond_the_limit_are_refused():
    c = leader_cluster(cfg=dataclasses.replace(QUIET, uncommitted_entries_max=3))
    c.isolate(1)
    for k in range(3):
        c[1].propose(b"%d" % k)
    with pytest.raises(ProposalRejected):
        c[1].propose(b"too many")


def test_5_3_only_the_leader_takes_proposals():
    c = leader_cluster()
    with pytest.raises(NotLeader) as e:
        c[2].propose(b"x")
    assert e.value.leader == 1


# ---- §5.4.1 election restriction ----------------------------------------------------------


@pytest.mark.parametrize("voter_log,candidate_log", [([3], [2]), ([2, 2], [2])])
def test_5_4_1_vote_is_denied_to_a_candidate_whose_log_is_less_up_to_date(voter_log, candidate_log):
    c = Cluster(storages={1: storage_with_log(voter_log, 3), 2: storage_with_log(candidate_log, 3)}, cfg=NO_PREVOTE)
    c.drop_inbox()
    last = 1 + len(candidate_log)
    c[1].step(RequestVote(term=4, frm=2, to=1, last_index=last, last_term=candidate_log[-1]))
    c.process()
    (reply,) = [m for m in c.inbox if isinstance(m, VoteResponse)]
    assert not reply.granted


def test_5_4_1_stale_candidate_cannot_win_even_with_a_higher_term():
    stores = {1: storage_with_log([2], 9), 2: storage_with_log([2, 3], 3), 3: storage_with_log([2, 3], 3)}
    c = Cluster(storages=stores, cfg=NO_PREVOTE)
    c[1].elapsed = c[1].timeout - 1
    c[1].tick()
    c.deliver()
    assert not c[1].is_leader


# ---- §5.4.2 committing entries from previous terms ----------------------------------------


def _figure_8_cluster(bugs=frozenset()):
    """Node 1 holds an entry of term 2 that nobody else has and becomes leader of term 4."""
    cfg = dataclasses.replace(QUIET, entries_per_message_max=1, inflight_messages_max=1, _unsafe_bugs=bugs)
    stores = {1: storage_with_log([2], 3), 2: storage_with_log([], 3), 3: storage_with_log([], 3)}
    c = Cluster(storages=stores, cfg=cfg)
    c.isolate(3)
    c.cut -= {(1, 2), (2, 1)}
    g = c[1]
    g.elapsed = g.timeout - 1
    g.tick()
    # Deliver until node 2 has acknowledged the old entry, but hold back the no-op of term 4
    # once node 2 could accept it (the first probe carrying it is rejected for the gap).
    c.deliver(pred=lambda m: not (isinstance(m, AppendEntries) and m.prev_index >= 2 and c[2].last_index() >= 2))
    assert g.is_leader and g.term == 4 and c[2].storage.term(2) == 2 and c[2].last_index() == 2
    return c


def test_5_4_2_leader_does_not_commit_a_previous_term_entry_by_counting_replicas():
    c = _figure_8_cluster()
    assert c[1].commit == 1  # entry 2 (term 2) is on a majority but is not committed


def test_5_4_2_previous_term_entry_commits_once_an_entry_of_the_current_term_does():
    c = _figure_8_cluster()
    c.deliver()
    assert c[1].commit == 3


def test_5_4_2_unsafe_hook_commits_by_counting_which_the_simulator_must_catch():
    c = _figure_8_cluster(bugs=frozenset({"commit_previous_term"}))
    assert c[1].commit == 2


# ---- §6 cluster membership changes --------------------------------------------------------


def test_6_new_member_joins_as_learner_catches_up_and_is_then_promoted():
    c = Cluster(ids=(1, 2, 3, 4), members=(1, 2, 3), cfg=dataclasses.replace(QUIET, auto_promote_learners=False))
    c.elect(1)
    for k in range(5):
        c[1].propose(b"%d" % k)
    c.deliver()
    c[1].propose_conf_change(ConfChange(CONF_ADD_LEARNER, (4,)))
    c.deliver()
    c.stabilize(2)
    assert c[4].learners == (4,) and c[4].voters == (1, 2, 3)
    assert c.data(4) == c.data(1)
    c[1].propose_conf_change(ConfChange(CONF_PROMOTE, (4,)))
    c.deliver()
    c.stabilize(2)
    assert c[1].voters == (1, 2, 3, 4) and c[4].voters == (1, 2, 3, 4)


def test_6_learner_never_campaigns_and_does_not_count_towards_commit():
    c = Cluster(ids=(1, 2, 3), members=(1, 2), cfg=dataclasses.replace(QUIET, auto_promote_learners=False))
    c.elect(1)
    c[1].propose_conf_change(ConfChange(CONF_ADD_LEARNER, (3,)))
    c.deliver()
    c.stabilize(2)
    assert c[3].learners == (3,)
    c.tick(ids=[3], n=5 * QUIET.election_timeout_ticks)
    assert c[3].role == FOLLOWER and not [m for m in c.inbox if isinstance(m, RequestVote)]
    c.isolate(2)
    idx = c[1].propose(b"x")
    c.deliver()
    assert c[3].last_index() >= idx and c[1].commit < idx  # the learner has it, but it does not count


def test_6_leader_promotes_a_learner_automatically_once_caught_up():
    c = Cluster(ids=(1, 2, 3, 4), members=(1, 2, 3))
    c.elect(1)
    c[1].propose_conf_change(ConfChange(CONF_ADD_LEARNER, (4,)))
    c.deliver()
    for _ in range(10):
        c.stabilize()
    assert c[1].voters == (1, 2, 3, 4) and c[1].learners == ()


def test_6_only_one_membership_change_at_a_time():
    c = leader_cluster(ids=(1, 2, 3, 4, 5))
    c[1].propose_conf_change(ConfChange(CONF_REMOVE, (5,)))
    with pytest.raises(ProposalRejected):
        c[1].propose_conf_change(ConfChange(CONF_REMOVE, (4,)))
    c.deliver()
    c[1].propose_conf_change(ConfChange(CONF_REMOVE, (4,)))  # the first one is applied now
    c.deliver()
    assert c[1].voters == (1, 2, 3)


def test_6_new_leader_makes_no_membership_change_before_committing_in_its_term():
    c = Cluster()
    c[1].elapsed = c[1].timeout - 1
    c[1].tick()
    c.deliver(pred=lambda m: not isinstance(m, AppendEntries))
    assert c[1].is_leader
    with pytest.raises(ProposalRejected):
        c[1].propose_conf_change(ConfChange(CONF_REMOVE, (3,)))


def test_6_removed_leader_steps_down_and_the_rest_elect_a_new_one():
    c = leader_cluster()
    c[1].propose_conf_change(ConfChange(CONF_REMOVE, (1,)))
    c.deliver()
    assert c[1].role == FOLLOWER and c[2].voters == (2, 3)
    for _ in range(40):
        c.stabilize()
        if any(c[i].is_leader for i in (2, 3)):
            break
    assert [i for i in (2, 3) if c[i].is_leader]


# ---- §7 log compaction --------------------------------------------------------------------


def test_7_follower_behind_the_compacted_log_receives_a_snapshot_then_entries():
    cfg = dataclasses.replace(QUIET, snapshot_trailing_entries=0)
    c = leader_cluster(cfg=cfg)
    c.isolate(3)
    for k in range(10):
        c[1].propose(b"%d" % k)
    c.deliver()
    snap = c[1].compact(c[1].applied, b"state-at-%d" % c[1].applied)
    assert c[1].storage.first_index() == snap.meta.index + 1
    c.heal()
    c.stabilize(3)
    assert any(isinstance(m, InstallSnapshot) and m.to == 3 for m in c.delivered)
    assert c.snapshots[3] and c.snapshots[3][-1].data == snap.data
    c[1].propose(b"after")
    c.deliver()
    c.stabilize()
    assert c[3].last_index() == c[1].last_index() and c.data(3)[-1] == b"after"
    assert c[3].voters == (1, 2, 3)


def test_7_ready_asks_for_a_snapshot_once_the_log_exceeds_the_threshold():
    c = leader_cluster(cfg=dataclasses.replace(QUIET, snapshot_after_entries=5))
    wanted = []
    for k in range(8):
        c[1].propose(b"%d" % k)
        c.deliver()
        if c[1].has_ready():
            rd = c[1].ready()
            wanted.append(rd.snapshot_wanted)
            c[1].advance(rd)
    g = c[1]
    assert g.applied - g.storage.first_index() + 1 >= 5
    c[1].propose(b"more")
    c[1].ready_out is None and c.process()
    rd = g.ready() if g.has_ready() else None
    assert rd is None or rd.snapshot_wanted


def test_7_compaction_keeps_trailing_entries_for_slow_followers():
    c = leader_cluster(cfg=dataclasses.replace(QUIET, snapshot_trailing_entries=3))
    for k in range(10):
        c[1].propose(b"%d" % k)
    c.deliver()
    snap = c[1].compact(c[1].applied, b"s")
    assert c[1].storage.first_index() == snap.meta.index + 1 - 3


# ---- §8 client interaction: read index ----------------------------------------------------


def test_8_read_index_is_answered_after_a_majority_confirms_leadership():
    c = leader_cluster()
    c.deliver()
    c[1].read_index(b"r1")
    c.process()
    assert c.read_states[1] == []
    c.deliver()
    (rs,) = c.read_states[1]
    assert rs.ctx == b"r1" and rs.index == c[1].commit


def test_8_partitioned_leader_cannot_answer_read_index():
    c = leader_cluster()
    c.isolate(1)
    c[1].read_index(b"r1")
    c.deliver()
    assert c.read_states[1] == []


def test_8_read_index_waits_until_the_leader_has_committed_in_its_term():
    c = Cluster()
    c[1].elapsed = c[1].timeout - 1
    c[1].tick()
    c.deliver(pred=lambda m: not isinstance(m, (AppendEntries, Heartbeat)))
    assert c[1].is_leader and c[1].storage.term(c[1].commit) != c[1].term
    c[1].read_index(b"early")
    c.deliver(pred=lambda m: isinstance(m, Heartbeat) or type(m).__name__ == "HeartbeatResponse")
    assert c.read_states[1] == []
    c.deliver()
    (rs,) = c.read_states[1]
    assert rs.index >= 2


def test_8_followers_refuse_read_index_and_name_the_leader():
    c = leader_cluster()
    with pytest.raises(NotLeader) as e:
        c[2].read_index(b"x")
    assert e.value.leader == 1


# ---- pre-vote (thesis §9.6) ---------------------------------------------------------------


def test_prevote_partitioned_node_does_not_increase_its_term():
    c = leader_cluster()
    term = c[3].term
    c.isolate(3)
    c.tick(ids=[3], n=10 * QUIET.election_timeout_ticks)
    c.deliver()
    assert c[3].term == term and c[3].role == PRE_CANDIDATE


def test_prevote_rejoining_node_does_not_disrupt_a_stable_leader():
    c = leader_cluster()
    term = c[1].term
    c.isolate(3)
    for _ in range(5 * QUIET.election_timeout_ticks):
        c.stabilize()
    c.heal()
    for _ in range(3 * QUIET.election_timeout_ticks):
        c.stabilize()
    assert c.leaders() == [1] and c[1].term == term and c[3].leader == 1


def test_without_prevote_a_rejoining_node_forces_a_new_term():
    c = leader_cluster(cfg=NO_PREVOTE)
    term = c[1].term
    c.isolate(3)
    c.tick(ids=[3], n=4 * QUIET.election_timeout_ticks)
    c.drop_inbox()
    c.heal()
    for _ in range(3 * QUIET.election_timeout_ticks):
        c.stabilize()
    assert c[1].term > term  # the disruption pre-vote exists to prevent


# ---- check-quorum (thesis §6.2) -----------------------------------------------------------


def test_check_quorum_leader_cut_off_from_a_majority_steps_down():
    c = leader_cluster()
    c.isolate(1)
    for _ in range(2 * QUIET.election_timeout_ticks):
        c.stabilize()
    assert c[1].role != LEADER


def test_check_quorum_followers_ignore_vote_requests_while_their_leader_is_live():
    c = leader_cluster()
    term = c[2].term
    c.drop_inbox()
    c[2].step(RequestVote(term=term + 1, frm=3, to=2, last_index=99, last_term=term))
    c.process()
    assert c[2].term == term and not c.inbox


# ---- leadership transfer (thesis §3.10) ---------------------------------------------------


def test_transfer_to_an_up_to_date_follower_sends_timeout_now_and_it_wins():
    c = leader_cluster()
    c.deliver()
    c[1].transfer_leadership(2)
    c.deliver()
    assert c.leaders() == [2] and any(isinstance(m, TimeoutNow) for m in c.delivered)


def test_transfer_to_a_lagging_follower_first_brings_its_log_up_to_date():
    c = leader_cluster()
    c.isolate(3)
    for k in range(5):
        c[1].propose(b"%d" % k)
    c.deliver()
    c.heal()
    c[1].transfer_leadership(3)
    c.deliver()
    assert c.leaders() == [3] and c[3].last_index() >= 7


def test_transfer_refuses_proposals_until_done_or_abandoned():
    c = leader_cluster()
    c.isolate(2)
    c[1].transfer_leadership(2)
    with pytest.raises(ProposalRejected):
        c[1].propose(b"x")
    c.cut -= {(1, 3), (3, 1)}
    for _ in range(QUIET.election_timeout_ticks + 1):
        c.stabilize()
    assert c[1].is_leader
    c[1].propose(b"x")  # the transfer was abandoned after an election timeout


# ---- restarts and storage -----------------------------------------------------------------


def test_restarted_node_recovers_term_vote_and_log_from_storage():
    c = leader_cluster()
    c[1].propose(b"x")
    c.deliver()
    st = c[2].storage
    c.add(2, MemoryStorage.restore(st.hard_state(), st.snapshot(), st.entries(st.first_index(),
                                                                              st.last_index() + 1, 1 << 30)))
    g = c[2]
    assert g.term == c[1].term and g.last_index() == c[1].last_index() and g.role == FOLLOWER
    c.stabilize(2)
    assert c.data(2) == [b"x"]  # re-applied from the log after the restart


def test_a_member_that_lost_its_log_and_came_back_under_its_id_catches_up_without_committing_past_its_log():
    c = leader_cluster()
    for i in range(5):
        c[1].propose(f"x{i}".encode())
    c.deliver()
    assert c[1].progress[3].match == c[1].last_index()
    c.add(3, MemoryStorage())  # node 3 was reset and joined again before it was forgotten
    c.tick([1])  # a heartbeat carrying the leader's commit, which node 3 no longer holds
    c.deliver()
    c.stabilize(3)
    g = c[3]
    assert g.commit <= g.last_index() and g.last_index() == c[1].last_index()
    assert c.data(3) == [f"x{i}".encode() for i in range(5)]


def test_a_node_that_knows_no_configuration_does_not_vote():
    c = Cluster((1, 2, 3), NO_PREVOTE, storages={3: MemoryStorage()})
    c[1].elapsed = c[1].timeout - 1
    c[1].tick()
    c.process()
    requests = [m for m in c.inbox if isinstance(m, RequestVote) and m.to == 3]
    c.inbox.clear()
    for m in requests:
        c[3].step(m)
    c.process()
    assert [m.granted for m in c.inbox if isinstance(m, VoteResponse) and m.frm == 3] == [False]
    assert c[3].vote is None


def test_config_validates_limits_and_rejects_unknown_unsafe_bugs():
    with pytest.raises(ValueError):
        RaftConfig(election_timeout_ticks=2, heartbeat_interval_ticks=2)
    with pytest.raises(ValueError):
        RaftConfig(_unsafe_bugs=frozenset({"no_such_bug"}))
