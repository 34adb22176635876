"""The operations a mirrored queue's leader sends its mirrors (hutch.mirror.replica): each one
survives the wire unchanged, a replica applies a sequence of them as the leader meant, and a
payload that does not fit is refused when it is decoded."""

from __future__ import annotations

import msgspec
import pytest

from hutch.mirror.leader import Leader
from hutch.mirror.placement import ALWAYS, WHEN_SYNCED
from hutch.mirror.replica import (
    CheckedOut,
    Deleted,
    Enqueued,
    MirrorView,
    NewLeaderHead,
    Removed,
    Replica,
    SyncBatch,
    SyncDone,
    SyncItem,
    View,
    decode_ops,
    encode_ops,
)

VIEW = View((MirrorView("b@h|1.1", "b@h", True, 0), MirrorView("c@h|1.2", "c@h", False, 7)), False, ALWAYS,
            WHEN_SYNCED, "a@h|1.1")


def _enq(seq: int, origin: str = "", token: int = 0, **kw) -> Enqueued:
    f = dict(exchange="amq.direct", routing_key="rk", props=b"\x00\x00", body=b"0123456789abcdef",
             persistent=True, priority=0, expiration_ms=None, expires_at_ms=None)
    f.update(kw)
    return Enqueued(seq, origin=origin, token=token, **f)


def _item(seq: int, delivery_count: int, body: bytes = b"synced") -> SyncItem:
    return SyncItem(seq, "", "q", b"\x00\x00", body, False, 3, 5000, 123456, delivery_count)


EVERY_OP = [
    _enq(1),
    _enq(2, origin="b@h", token=42, priority=9, expiration_ms=60000, expires_at_ms=987654321,
         persistent=False),
    CheckedOut([1, 2]),
    Removed([2]),
    SyncBatch((_item(1, 0), _item(3, 2))),
    SyncBatch(()),
    SyncDone(4),
    NewLeaderHead(4, (1, 3)),
    NewLeaderHead(0, ()),
    VIEW,
    View((), True, WHEN_SYNCED, ALWAYS, "a@h|1.1"),
    Deleted(),
]


@pytest.mark.parametrize("op", EVERY_OP, ids=lambda op: type(op).__name__)
def test_each_operation_round_trips(op):
    back = decode_ops(encode_ops([op]))
    assert back == [op] and type(back[0]) is type(op)


def test_a_broadcast_of_every_kind_round_trips_in_order():
    assert decode_ops(encode_ops(EVERY_OP)) == EVERY_OP


def test_operations_are_tagged_arrays():
    wire = msgspec.msgpack.decode(encode_ops([CheckedOut([5]), SyncDone(4), Deleted()]))
    assert wire == [[2, [5]], [5, 4], [8]]


def test_a_replica_applies_a_sequence_of_operations():
    r = Replica()
    assert r.view is None and not r.deleted
    ops = [  # a mirror that joined when the queue's next seq was 4
        _enq(4), _enq(5, origin="b@h", token=7), _enq(6),
        CheckedOut([4, 6]), CheckedOut([4]),
        Removed([5, 2]),  # 2: a seq this mirror does not hold yet
        SyncBatch((_item(1, 1), _item(3, 0), _item(4, 5))),  # 4 is held already: kept as it is
        SyncDone(7),
    ]
    r.apply(decode_ops(encode_ops(ops)))
    assert sorted(r.entries) == [1, 3, 4, 6] and r.max_seq == 6
    assert {s: e.delivery_count for s, e in r.entries.items()} == {1: 1, 3: 0, 4: 2, 6: 1}
    e = r.entries[3]
    assert (e.seq, e.exchange, e.routing_key, e.props, e.body, e.persistent, e.priority, e.expiration_ms,
            e.expires_at_ms) == (3, "", "q", b"\x00\x00", b"synced", False, 3, 5000, 123456)
    e = r.entries[4]
    assert (e.exchange, e.routing_key, e.body, e.persistent, e.expires_at_ms) == (
        "amq.direct", "rk", b"0123456789abcdef", True, None)
    assert list(r.tokens) == [("b@h", 7)]  # local publishes (origin "") and sync items are not remembered

    r.apply(decode_ops(encode_ops([NewLeaderHead(4, (1,)), VIEW])))  # the new leader lacks 3
    assert sorted(r.entries) == [1, 4, 6] and r.view == VIEW and not r.deleted
    assert [e.seq for e in r.in_order()] == [1, 4, 6]

    r.apply(decode_ops(encode_ops([Deleted()])))
    assert r.deleted and r.view == VIEW and len(r) == 3


def test_the_leader_coalesces_consecutive_checkouts_and_removals():
    ld = Leader(None, None, None)  # records operations only: nothing else is touched
    for seq in (1, 2):
        ld.checked_out(seq)
    ld.removed(1)
    ld.removed(2)
    ld.checked_out(3)
    assert ld.ops == [CheckedOut([1, 2]), Removed([1, 2]), CheckedOut([3])]


@pytest.mark.parametrize("payload", [
    msgspec.msgpack.encode([[99, 1]]),  # unknown tag
    msgspec.msgpack.encode([["E", 1]]),  # the old string tags
    msgspec.msgpack.encode([[1, 1, "", "q"]]),  # an enqueue missing fields
    msgspec.msgpack.encode([[1, "1", "", "q", b"", b"", True, 0, None, None, "", 0]]),  # seq not an int
    msgspec.msgpack.encode([[2, 5]]),  # checked out: not a list of seqs
    msgspec.msgpack.encode([[4, [[1, "", "q", b"", b"", True, 0, None, None]]]]),  # sync item without count
    msgspec.msgpack.encode([[7, [], False, "always", "when-synced"]]),  # view without the leader
    msgspec.msgpack.encode([8]),  # an operation, not a list of them
    msgspec.msgpack.encode({"E": 1}),
    b"\xc1",  # not msgpack
    b"",
])
def test_a_malformed_payload_is_refused_on_decoding(payload):
    with pytest.raises(msgspec.DecodeError):  # ValidationError is a DecodeError
        decode_ops(payload)


def test_a_malformed_payload_names_what_is_wrong():
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int`, got `str` - at `\$\[0\]\[1\]`"):
        decode_ops(msgspec.msgpack.encode([[1, "1", "", "q", b"", b"", True, 0, None, None, "", 0]]))
