"""Replica digests (hutch.control.digest): copies that applied the same operations in the same
order give the same digest, a copy that missed or reordered one does not, and `compare` judges
only copies that reached the same point (a follower behind its leader has not diverged)."""

from __future__ import annotations

from hutch.control.copies import compare
from hutch.control.digest import hash_ints, mirror_digest, quorum_digest, stream_digest
from hutch.quorum.fifo import Checkout, Enqueue, QuorumConfig, QuorumQueueState, Settle
from hutch.store.stream_log import StreamLog

PROPS = b"\x00\x00"


def enq(body: str) -> Enqueue:
    return Enqueue("", "q", PROPS, body.encode())


def replica(commands) -> QuorumQueueState:
    s = QuorumQueueState(QuorumConfig(name="q"))
    for c in commands:
        s.apply(c)
    return s


COMMANDS = [enq("a"), enq("b"), enq("c"), Checkout("n1/c1", prefetch=1), Settle("n1/c1", [1]), enq("d")]


def test_quorum_members_that_applied_the_same_commands_have_the_same_digest():
    a, b = quorum_digest(replica(COMMANDS), 6), quorum_digest(replica(COMMANDS), 6)
    assert a == b
    assert a["counters"]["ready"] == 2 and a["counters"]["unacked"] == 1  # a settled, b checked out, c and d ready
    assert compare({"n1": a, "n2": b}) == []


def test_a_quorum_member_that_missed_a_command_disagrees_at_the_same_applied_index():
    good = quorum_digest(replica(COMMANDS), 6)
    missed = quorum_digest(replica(COMMANDS[:4] + COMMANDS[5:]), 6)  # the settle never applied
    problems = compare({"n1": good, "n2": missed})
    assert len(problems) == 1 and "n1 and n2 at applied 6" in problems[0]
    assert "unacked_hash" in problems[0] and "state_hash" in problems[0]


def test_a_follower_behind_its_leader_is_not_compared():
    leader = quorum_digest(replica(COMMANDS), 6)
    behind = quorum_digest(replica(COMMANDS[:3]), 3)
    assert compare({"n1": leader, "n2": behind}) == []


def test_ready_order_is_part_of_the_digest():
    assert hash_ints([1, 2]) != hash_ints([2, 1])
    a = mirror_digest([3, 1, 2], 3, "leader")
    assert a == {**mirror_digest([1, 2, 3], 3, "mirror"), "role": "leader"}  # a set of seqs: held in order


def test_a_mirror_holding_a_message_its_leader_removed_disagrees():
    leader = mirror_digest([5, 6], 6, "leader")
    mirror = mirror_digest([4, 5, 6], 6, "mirror")
    [problem] = compare({"hutch-1@localhost": leader, "hutch-2@localhost": mirror})
    assert "held_hash" in problem and "'messages': 2" in problem and "'messages': 3" in problem


def _stream(tmp_path, name, chunks):
    with StreamLog(tmp_path / name, fsync=False) as lg:
        for i, data in enumerate(chunks):
            lg.append(data, lg.next_offset, 2, 1000 + i, 1)
        return [(c.chunk_id, c.num_records, bytes(d)) for c, d in lg.read(0, 1 << 20)], lg.next_offset


def test_stream_replicas_compare_the_chunks_of_their_common_committed_range(tmp_path):
    full, end = _stream(tmp_path, "a", [b"one", b"two", b"three"])
    short, short_end = _stream(tmp_path, "b", [b"one", b"two"])
    assert (end, short_end) == (6, 4)
    # the common committed end is 4: both hash the same two chunks
    a, b = stream_digest(full, end, 0, 0, 4), stream_digest(short, short_end, 0, 0, 4)
    assert a["chunks_hash"] == b["chunks_hash"] and a["counters"] == {"chunks": 2}
    assert compare({"n1": a, "n2": b}, key="range") == []
    other, _ = _stream(tmp_path, "c", [b"one", b"TWO"])
    c = stream_digest(other, 4, 0, 0, 4)
    assert compare({"n1": a, "n3": c}, key="range") != []
