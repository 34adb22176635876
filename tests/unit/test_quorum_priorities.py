"""RabbitMQ 4.0's quorum queue message priorities in the state machine (hutch.quorum.fifo,
`TwoLevelQueue`), and the 4.0 default delivery limit as the effective settings resolve it.

The rules checked, from RabbitMQ's quorum queue guide ("Message Priorities", 4.0): no
x-max-priority is needed; a `priority` above 4 is high, 0..4 or none is normal; high is
favoured two to one while both levels have messages ready; a high message published before a
normal one is always delivered first, even on normal's turn. And "Poison Message Handling":
from 4.0 the delivery limit defaults to 20, and -1 restores 3.13's unlimited default.
"""

from __future__ import annotations

import zlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.queues.effective import DEFAULT_DELIVERY_LIMIT, resolve
from hutch.quorum.fifo import (
    SNAP_COMPRESSED,
    Deliver,
    Enqueue,
    Get,
    GetResult,
    QuorumConfig,
    QuorumQueueState,
    Return,
    _encoder,
)

PROPS = b"\x00\x00"
SNAPSHOT_V1_FIELDS = 17  # the fields of a version 1 snapshot (one priority level)


def enq(body: str, priority: int = 0) -> Enqueue:
    return Enqueue("", "q", PROPS, body.encode(), priority=priority)


def delivered(effects) -> list[str]:
    return [e.body.decode() for e in effects if isinstance(e, Deliver)]


def drain(s: QuorumQueueState) -> list[str]:
    """Every ready message, one basic.get at a time (no-ack)."""
    out = []
    while True:
        (r,) = [e for e in s.apply(Get("n1/g", no_ack=True)) if isinstance(e, GetResult)]
        if r.message is None:
            return out
        out.append(r.message.body.decode())


def test_priorities_above_4_are_high_and_get_two_deliveries_to_normals_one():
    s = QuorumQueueState(QuorumConfig(name="q"))
    for i in range(3):
        s.apply(enq(f"n{i}", priority=i))  # 0, 1, 2: normal
    s.apply(enq("n3"))  # no priority: normal
    for i in range(6):
        s.apply(enq(f"h{i}", priority=5 + i))
    assert drain(s) == ["h0", "h1", "n0", "h2", "h3", "n1", "h4", "h5", "n2", "n3"]
    s.check_invariants()


def test_a_high_message_published_before_a_normal_one_goes_first_even_on_normals_turn():
    s = QuorumQueueState(QuorumConfig(name="q"))
    for i in range(3):
        s.apply(enq(f"h{i}", priority=9))
    s.apply(enq("n0", priority=4))  # 4 is still normal
    assert drain(s) == ["h0", "h1", "h2", "n0"]


def test_without_priorities_the_queue_stays_fifo():
    s = QuorumQueueState(QuorumConfig(name="q"))
    for i in range(5):
        s.apply(enq(f"m{i}"))
    assert drain(s) == [f"m{i}" for i in range(5)]


def test_a_returned_message_goes_back_to_its_place_in_its_own_level():
    s = QuorumQueueState(QuorumConfig(name="q"))
    s.apply(enq("h0", priority=7))
    s.apply(enq("h1", priority=7))
    s.apply(enq("n0"))
    (r,) = [e for e in s.apply(Get("n1/x")) if isinstance(e, GetResult)]
    assert r.message.body == b"h0"
    s.apply(Return("n1/x", [r.message.msg_id]))  # h0 is high again, ahead of h1
    (again,) = [e for e in s.apply(Get("n1/g", no_ack=True)) if isinstance(e, GetResult)]
    assert again.message.body == b"h0" and again.message.redelivered and again.message.delivery_count == 1
    assert drain(s) == ["h1", "n0"]
    s.check_invariants()


def test_the_snapshot_carries_both_levels_and_the_dequeue_counter():
    s = QuorumQueueState(QuorumConfig(name="q"))
    for i in range(4):
        s.apply(enq(f"n{i}"))
        s.apply(enq(f"h{i}", priority=8))
    (r,) = [e for e in s.apply(Get("n1/g", no_ack=True)) if isinstance(e, GetResult)]
    assert r.message.body == b"h0"  # the counter is now 1
    restored = QuorumQueueState.restore(s.snapshot())
    assert restored.snapshot() == s.snapshot()
    assert drain(restored) == drain(s) == ["h1", "n0", "h2", "h3", "n1", "n2", "n3"]


def test_a_version_1_snapshot_still_loads_with_its_messages_normal():
    s = QuorumQueueState(QuorumConfig(name="q"))
    for i in range(3):
        s.apply(enq(f"m{i}", priority=9 if i == 1 else 0))
    stored = s.snapshot()
    assert stored[:1] == SNAP_COMPRESSED
    fields = msgspec.msgpack.decode(zlib.decompress(stored[1:]))
    assert fields[0] == 3
    normal_fifo, high_fifo = fields[4], fields[-2]
    v1_entries = sorted(e[:10] for e in normal_fifo + high_fifo)  # version 3 added each entry's index and size
    v1 = [1, *fields[1:4], v1_entries, *fields[5:SNAPSHOT_V1_FIELDS]]
    old = QuorumQueueState.restore(_encoder.encode(v1))
    assert drain(old) == ["m0", "m1", "m2"]  # one level, in publish order


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["pub", "get", "ret"]), st.integers(0, 9)), max_size=60),
       st.integers(0, 60))
def test_every_member_and_a_snapshot_restore_deliver_the_same_order(ops, cut):
    """Determinism: two states fed the same commands, and a third restored from a snapshot
    taken part-way, give the same effects; nothing is lost or duplicated."""
    a, b = QuorumQueueState(QuorumConfig(name="q")), QuorumQueueState(QuorumConfig(name="q"))
    restored = None
    published, got = 0, []
    for n, (op, prio) in enumerate(ops):
        if n == cut:
            restored = QuorumQueueState.restore(a.snapshot())
        if op == "pub":
            cmd = enq(f"m{published}", priority=prio)
            published += 1
        elif op == "get":
            cmd = Get("n1/g", no_ack=prio % 2 == 0)
        else:
            holder = a.consumers.get("n1/g")
            if holder is None or not holder.checked_out:
                continue
            cmd = Return("n1/g", [next(iter(holder.checked_out))])
        ea = a.apply(cmd)
        assert b.apply(cmd) == ea
        if restored is not None:
            assert restored.apply(cmd) == ea
        for e in ea:
            if isinstance(e, GetResult) and e.message is not None and cmd.no_ack:
                got.append(e.message.body)
        a.check_invariants()
    assert a.snapshot() == b.snapshot()
    if restored is not None:
        assert restored.snapshot() == a.snapshot()
    rest = [e.message.body for e in a.queue.ready()] + [e.message.body for e in a.queue.unacked.values()]
    assert sorted(got + rest) == sorted(f"m{i}".encode() for i in range(published))


# ---- the default delivery limit (RabbitMQ 4.0)


def test_a_quorum_queue_without_a_limit_gets_the_default_of_20():
    assert DEFAULT_DELIVERY_LIMIT == 20
    assert resolve("quorum", {}).delivery_limit == 20
    assert resolve("quorum", {}, default_delivery_limit=None).delivery_limit is None  # 3.13's default
    assert resolve("quorum", {}, default_delivery_limit=5).delivery_limit == 5
    assert resolve("classic", {}).delivery_limit is None


@pytest.mark.parametrize("arg, policy, expected", [
    (3, None, 3), (None, 7, 7), (3, 7, 3), (30, 7, 7),  # the stricter of argument and policy
    (-1, None, None), (None, -1, None), (-1, -1, None),  # -1: no limit, not the default
    (-1, 7, 7), (5, -1, 5),  # -1 on one side never lifts the other's limit
])
def test_argument_and_policy_win_over_the_default(arg, policy, expected):
    args = {} if arg is None else {"x-delivery-limit": arg}
    definition = None if policy is None else {"delivery-limit": policy}
    assert resolve("quorum", args, definition).delivery_limit == expected


def test_operator_policy_minus_one_does_not_lift_a_policy_limit():
    assert resolve("quorum", {}, {"delivery-limit": 4}, {"delivery-limit": -1}).delivery_limit == 4
    assert resolve("quorum", {}, {"delivery-limit": 4}, {"delivery-limit": 2}).delivery_limit == 2


def test_consumer_timeout_from_argument_and_policy_the_smaller_wins():
    assert resolve("classic", {}).consumer_timeout_ms is None
    assert resolve("quorum", {"x-consumer-timeout": 5000}).consumer_timeout_ms == 5000
    assert resolve("classic", {}, {"consumer-timeout": 9000}).consumer_timeout_ms == 9000
    assert resolve("quorum", {"x-consumer-timeout": 5000}, {"consumer-timeout": 2000}).consumer_timeout_ms == 2000
    assert resolve("classic", {}, {"consumer-timeout": 9000}).unsupported == ()
