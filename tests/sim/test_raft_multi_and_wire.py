"""Many groups per node (one persist batch, one ticker, small idle groups), the wire codec, and
the linearizability checker itself."""

from __future__ import annotations

import tracemalloc

import pytest

from hutch.raft.group import RaftConfig
from hutch.raft.linearizability import CAS, READ, WRITE, Op, check_register
from hutch.raft.messages import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    RequestVote,
    Snapshot,
    SnapshotMeta,
    TimeoutNow,
    VoteResponse,
    decode,
    decode_envelope,
    encode,
    encode_envelope,
)
from hutch.raft.multi import MultiRaft
from hutch.raft.storage import bootstrap_memory_storage


def _hosts(n_groups: int, nodes=(1, 2, 3)) -> dict[int, MultiRaft]:
    cfg = RaftConfig()
    hosts = {i: MultiRaft(i, cfg) for i in nodes}
    for h in hosts.values():
        for gid in range(n_groups):
            h.add_group(f"q{gid}", bootstrap_memory_storage(nodes))
    return hosts


def _loop(hosts: dict[int, MultiRaft], fsyncs: list[int]) -> None:
    for _ in range(100):
        moved = False
        for h in hosts.values():
            mr = h.ready()
            if mr is None:
                continue
            moved = True
            if mr.must_sync_plainly():
                fsyncs.append(len(mr.groups))
            for to, gid, m in mr.messages():
                hosts[to].step(gid, decode(encode(m)))  # through the wire codec on the way
            h.advance(mr)
        if not moved:
            return


def test_multiraft_persists_all_groups_in_one_batch_per_loop_and_elects_every_group():
    hosts = _hosts(50)
    fsyncs: list[int] = []
    for _ in range(40):
        for h in hosts.values():
            h.tick()
        _loop(hosts, fsyncs)
    leaders = {gid for h in hosts.values() for gid, g in h.groups.items() if g.is_leader}
    assert leaders == {f"q{i}" for i in range(50)}
    assert max(fsyncs) > 1  # several groups' writes shared one fsync
    h1 = hosts[1]
    led = [gid for gid, g in h1.groups.items() if g.is_leader]
    for gid in led:
        h1.propose(gid, b"x")
    batches: list[int] = []
    _loop(hosts, batches)
    assert batches[0] == len(led)  # every proposal of this iteration in the same batch
    for gid in led:
        assert all(hosts[i].groups[gid].commit == h1.groups[gid].commit for i in hosts)


def idle_group_bytes(n_groups: int = 2000) -> float:
    """Bytes per idle follower group (RaftGroup + its MemoryStorage after bootstrap)."""
    h = MultiRaft(1, RaftConfig())
    storages = [bootstrap_memory_storage((1, 2, 3)) for _ in range(n_groups)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for gid, st in enumerate(storages):
        h.add_group(gid, st)
    for _ in range(3):
        mr = h.ready()
        if mr is None:
            break
        h.advance(mr)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    storage_bytes = _storage_bytes(n_groups)
    return grown / n_groups + storage_bytes


def _storage_bytes(n: int) -> float:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    keep = [bootstrap_memory_storage((1, 2, 3)) for _ in range(n)]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert len(keep) == n
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / n


def test_an_idle_group_costs_under_two_kilobytes():
    per_group = idle_group_bytes()
    print(f"bytes per idle group: {per_group:.0f}")
    assert per_group < 2048


def test_every_message_round_trips_through_msgpack():
    snap = Snapshot(SnapshotMeta(7, 3, ConfState((1, 2, 3), (4,))), b"state")
    msgs = [
        AppendEntries(3, 1, 2, 5, 2, [Entry(3, 6, 0, b"a"), Entry(3, 7, 1, b"b")], 5),
        AppendResponse(3, 2, 1, 7),
        AppendResponse(3, 2, 1, 5, True, 4),
        Heartbeat(3, 1, 2, 5, 9),
        HeartbeatResponse(3, 2, 1, 9),
        RequestVote(4, 2, 1, 7, 3, True, False),
        VoteResponse(4, 1, 2, True, True),
        InstallSnapshot(3, 1, 2, snap),
        TimeoutNow(3, 1, 2),
    ]
    for m in msgs:
        assert decode(encode(m)) == m
    env = decode_envelope(encode_envelope("orders", msgs[0]))
    assert env.group == "orders" and env.msg == msgs[0]
    assert len(encode(msgs[3])) < 12  # small: arrays, integer tags


def test_linearizability_checker_accepts_a_concurrent_history_and_rejects_a_stale_read():
    ok = [Op(0, WRITE, 0, 10, 1), Op(1, READ, 1, 2, None, None), Op(2, READ, 3, 4, None, 1),
          Op(2, CAS, 11, 12, (1, 2), True), Op(1, READ, 13, 14, None, 2)]
    assert check_register(ok) is True
    stale = [Op(0, WRITE, 0, 1, 1), Op(1, READ, 2, 3, None, None)]
    assert check_register(stale) is False


def test_linearizability_checker_lets_an_unacknowledged_write_take_effect_or_not():
    assert check_register([Op(0, WRITE, 0, None, 5), Op(1, READ, 9, 10, None, 5)]) is True
    assert check_register([Op(0, WRITE, 0, None, 5), Op(1, READ, 9, 10, None, None)]) is True
    flip = [Op(0, WRITE, 0, None, 5), Op(1, READ, 9, 10, None, 5), Op(1, READ, 11, 12, None, None)]
    assert check_register(flip) is False


def test_linearizability_checker_rejects_a_cas_that_succeeded_against_the_wrong_value():
    h = [Op(0, WRITE, 0, 1, 1), Op(1, CAS, 2, 3, (7, 8), True)]
    assert check_register(h) is False


@pytest.mark.parametrize("n", [60])
def test_linearizability_checker_is_fast_on_many_concurrent_writes(n):
    ops = [Op(i % 5, WRITE, i, i + 5, i) for i in range(n)] + [Op(9, READ, n + 10, n + 11, None, n - 1)]
    assert check_register(ops) is True
