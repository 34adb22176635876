"""A quorum queue's messages keep their contents in the Raft log (hutch.quorum.fifo.LoggedMessage).

Applied at a log index, an Enqueue leaves the state with the message's index, size, priority,
expiry and persistence only; deliveries and dead letters name the index and the runtime reads
the rest back from the log. The snapshot a member stores names the entries too, the one a
follower without the log is sent carries every content, and the digest form is the same
wherever the contents are kept. These tests play the log as a dict of index -> command.
"""

from __future__ import annotations

import zlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.quorum.fifo import (
    AT_LEAST_ONCE,
    SNAP_COMPRESSED,
    SNAP_DIGEST,
    SNAP_PORTABLE,
    Checkout,
    DeadLetter,
    Deliver,
    Discard,
    Enqueue,
    QuorumConfig,
    QuorumQueueState,
    Resent,
    Return,
    Settle,
)

PROPS = b"\x80\x00\x02"  # delivery-mode 2


class Log:
    """The commands a Raft log would hold, applied to `state` at their indexes."""

    def __init__(self, state: QuorumQueueState, logged: bool = True, first: int = 1):
        self.state = state
        self.logged = logged
        self.entries: dict[int, object] = {}
        self.next = first

    def apply(self, cmd) -> list:
        index = self.next
        self.next += 1
        self.entries[index] = cmd
        return self.state.apply(cmd, index if self.logged else 0)

    def content(self, index: int) -> tuple[str, str, bytes, bytes]:
        cmd = self.entries[index]
        assert type(cmd) is Enqueue
        return cmd.exchange, cmd.routing_key, cmd.props, cmd.body

    def body(self, d: Deliver) -> bytes:
        return d.body if d.body is not None else self.content(d.index)[3]


def enq(body: str, exchange: str = "ex", routing_key: str = "rk") -> Enqueue:
    return Enqueue(exchange, routing_key, PROPS, body.encode())


def delivered(effects) -> list[Deliver]:
    return [e for e in effects if type(e) is Deliver]


def test_a_message_applied_at_a_log_index_keeps_its_index_and_size_and_no_content():
    log = Log(QuorumQueueState(QuorumConfig(name="q")), first=7)
    log.apply(enq("x" * 1000))
    (entry,) = log.state.ready_entries()
    m = entry.message
    assert (m.index, m.size, m.body, m.props) == (7, 1000, None, b"")
    assert log.state.message_bytes == 1000 and log.state.first_logged_index() == 7
    (d,) = delivered(log.apply(Checkout("n1/c1", prefetch=10)))
    assert d.body is None and d.index == 7
    assert log.content(d.index) == ("ex", "rk", PROPS, b"x" * 1000)


def test_without_a_log_index_the_state_keeps_the_content():
    s = QuorumQueueState(QuorumConfig(name="q"))
    s.apply(enq("held"))
    (d,) = delivered(s.apply(Checkout("n1/c1", prefetch=10)))
    assert (d.exchange, d.routing_key, d.props, d.body, d.index) == ("ex", "rk", PROPS, b"held", 0)
    assert s.first_logged_index() is None


def test_the_oldest_message_still_held_bounds_the_log():
    """Ready, checked out or owed as a dead letter: each keeps its entry in the log."""
    cfg = QuorumConfig(name="q", dead_letter_exchange="dlx", overflow="reject-publish",
                       dead_letter_strategy=AT_LEAST_ONCE)
    log = Log(QuorumQueueState(cfg))
    for i in range(4):
        log.apply(enq(f"m{i}"))  # indexes 1-4
    ds = delivered(log.apply(Checkout("n1/c1", prefetch=2)))  # m0, m1 checked out
    assert [d.index for d in ds] == [1, 2] and log.state.first_logged_index() == 1
    log.apply(Settle("n1/c1", [ds[0].msg_id]))
    assert log.state.first_logged_index() == 2
    dead = [e for e in log.apply(Discard("n1/c1", [ds[1].msg_id])) if type(e) is DeadLetter]
    (msg,) = dead[0].messages
    assert msg.body is None and msg.index == 2  # owed to the dead-letter exchange: still needed
    assert log.state.first_logged_index() == 2


def test_the_stored_snapshot_names_log_entries_and_holds_no_body():
    log = Log(QuorumQueueState(QuorumConfig(name="q")))
    for i in range(50):
        log.apply(enq(f"BODY-{i:04}"))
    data = log.state.snapshot()
    assert data[:1] == SNAP_COMPRESSED and b"BODY-" not in zlib.decompress(data[1:])
    restored = QuorumQueueState.restore(data)
    assert restored.first_logged_index() == 1 and restored.message_bytes == 50 * 9
    ds = delivered(restored.apply(Checkout("n1/c1", prefetch=100), 51))
    assert [log.body(d) for d in ds] == [f"BODY-{i:04}".encode() for i in range(50)]


def test_a_queue_of_millions_snapshots_in_one_record_of_the_raft_log():
    """Compressed, a stored snapshot costs a few bytes a message (about 25 before): the
    2,000,000 messages of a backlog fit the Raft log's record limit, so its log is compacted
    (the limit is reached at some 3,500,000)."""
    from hutch.server.raft_host import SNAPSHOT_RECORD_SLACK_BYTES
    from hutch.store.segment_log import RECORD_BYTES_MAX_DEFAULT
    s = QuorumQueueState(QuorumConfig(name="q"))
    index = 10
    publishes = [Enqueue("", "q", PROPS, b"x" * n) for n in (1024, 1024, 1024, 17, 4000)]
    for i in range(2_000_000):
        index += 1 + (i % 7 == 0)  # the odd entry between publishes (a settle, a checkout)
        s.apply(publishes[i % 5], index)
    data = s.snapshot()
    assert len(data) < 5 * 2_000_000 < RECORD_BYTES_MAX_DEFAULT - SNAPSHOT_RECORD_SLACK_BYTES, len(data)
    restored = QuorumQueueState.restore(data)
    assert restored.snapshot() == data and restored.first_logged_index() == 12


def test_a_portable_snapshot_carries_every_content_and_its_copy_needs_no_log():
    log = Log(QuorumQueueState(QuorumConfig(name="q")))
    for i in range(20):
        log.apply(enq(f"m{i}", routing_key=f"rk{i}"))
    ds = delivered(log.apply(Checkout("n1/c1", prefetch=5)))  # five checked out, fifteen ready
    portable = log.state.snapshot(SNAP_PORTABLE, log.content)
    copy = QuorumQueueState.restore(portable)
    assert copy.first_logged_index() is None  # a follower that installs it needs none of the log
    assert copy.snapshot(SNAP_DIGEST) == log.state.snapshot(SNAP_DIGEST)
    assert copy.snapshot() != log.state.snapshot()  # what each member stores differs
    # the copy delivers the same messages with their contents (the five come back first)
    returned = copy.apply(Return("n1/c1", [d.msg_id for d in ds]), 22)
    got = [(d.routing_key, d.body) for d in delivered(returned)]
    got += [(d.routing_key, d.body) for d in delivered(copy.apply(Checkout("n2/c2", prefetch=100), 23))]
    assert sorted(got) == sorted((f"rk{i}", f"m{i}".encode()) for i in range(20))
    assert all(b is not None for _, b in got)


def test_a_resend_names_the_log_entries_of_what_is_checked_out():
    log = Log(QuorumQueueState(QuorumConfig(name="q")))
    for i in range(3):
        log.apply(enq(f"m{i}"))
    log.apply(Checkout("n1/c1", prefetch=10))
    r = log.state.resend("n1/c1")
    assert type(r) is Resent and [log.body(d) for d in r.deliveries] == [b"m0", b"m1", b"m2"]
    assert all(d.body is None for d in r.deliveries)


OPS = st.lists(st.tuples(st.sampled_from(["pub", "take", "ack", "return", "discard", "snapshot"]),
                         st.integers(0, 5)), max_size=80)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_a_state_that_reads_contents_from_the_log_delivers_what_one_that_holds_them_does(ops):
    """The same commands applied with log indexes and without: the same deliveries and dead
    letters, once the logged state's are read back from the log, with snapshots taken and
    restored on the way; the log is always kept from the oldest message still held."""
    cfg = QuorumConfig(name="q", dead_letter_exchange="dlx", delivery_limit=2)
    logged, held = Log(QuorumQueueState(cfg)), Log(QuorumQueueState(cfg), logged=False)
    n = 0
    outstanding: list[int] = []

    def both(cmd) -> None:
        a, b = logged.apply(cmd), held.apply(cmd)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            if type(x) is Deliver:
                assert msgspec.structs.replace(x, body=logged.body(x), index=0, exchange="ex", routing_key="rk",
                                               props=PROPS) == y
                outstanding.append(x.msg_id)
            elif type(x) is DeadLetter:
                assert [logged.content(m.index)[3] for m in x.messages] == [m.body for m in y.messages]
            else:
                assert x == y

    both(Checkout("n1/c1", prefetch=3))
    for op, k in ops:
        if op == "pub":
            both(enq(f"p{n}"))
            n += 1
        elif op in ("ack", "return", "discard") and outstanding:
            msg_id = outstanding.pop(k % len(outstanding))
            both({"ack": Settle, "return": Return, "discard": Discard}[op]("n1/c1", [msg_id]))
        elif op == "take":
            both(Checkout(f"n2/c{k}", prefetch=k + 1))
        elif op == "snapshot":
            logged.state = QuorumQueueState.restore(logged.state.snapshot())
            held.state = QuorumQueueState.restore(held.state.snapshot())
        logged.state.check_invariants()
        assert logged.state.figures() == held.state.figures()
        live = [e.message.index for e in (*logged.state.queue.ready(), *logged.state.queue.unacked.values())]
        assert logged.state.first_logged_index() == (min(live) if live else None)



def test_the_log_is_compacted_only_to_a_snapshot_whose_messages_have_all_been_settled_since() -> None:
    """hutch.quorum.host._QuorumApp.checkpoint: snapshots are kept until the oldest message still
    queued is younger than one of them; the newest such is what the log is compacted to."""
    from types import SimpleNamespace

    from hutch.quorum import host as qhost

    log = Log(QuorumQueueState(QuorumConfig(name="q")))
    app = qhost._QuorumApp.__new__(qhost._QuorumApp)
    app.q = SimpleNamespace(name="q", vhost="/", machine=log.state)
    app.checkpoints, app._looked_at, app._take_new, app._low = qhost.deque(), 0, True, (-1, None)
    taken = []

    def take(name):
        app.applied_index = log.next - 1  # (the state was applied to directly, not through app.apply)
        return lambda: taken.append(name) or name

    for i in range(5):  # indexes 1-5
        log.apply(enq(f"m{i}"))
    assert app.checkpoint(5, "conf", take(b"at 5")) is None  # its messages are all still queued
    ds = delivered(log.apply(Checkout("n1/c1", prefetch=10)))  # 6
    log.apply(Settle("n1/c1", [d.msg_id for d in ds[:3]]))  # 7: m0-m2 gone
    (d5,) = delivered(log.apply(enq("m5")))  # 8: to c1, which has room
    assert app.checkpoint(8, "conf", take(b"at 8")) is None  # m3 (index 4) is older than both
    log.apply(Settle("n1/c1", [d.msg_id for d in ds[3:]]))  # 9: m3, m4 gone; m5 (index 8) is the oldest
    app._take_new = False  # only a look: no new snapshot is taken
    assert app.checkpoint(9, "conf", take(b"at 9")) == (5, "conf", b"at 5")
    assert taken == [b"at 5", b"at 8"] and [c[0] for c in app.checkpoints] == [8]
    log.apply(enq("m6"))  # 10: to c1 as well
    log.apply(Settle("n1/c1", [d5.msg_id, d5.msg_id + 1]))  # 11: the queue is empty
    app._take_new = True
    assert app.checkpoint(11, "conf", take(b"at 11")) == (11, "conf", b"at 11")  # the newest, taken now
    assert not app.checkpoints
    for _ in range(qhost.CHECKPOINTS_MAX + 2):  # a message that stays: none is released, at most three kept
        log.apply(enq("stays"))
        assert app.checkpoint(log.next - 1, "conf", take(b"x")) is None
    assert len(app.checkpoints) == qhost.CHECKPOINTS_MAX


def test_content_a_snapshot_named_and_that_is_gone_from_the_log_is_told_apart_from_a_defect(caplog) -> None:
    """QuorumHost.content: a message at or below this node's snapshot whose entry is not in the
    log was settled since (ContentGone, logged once a queue); above it, a missing entry is a
    defect (LookupError)."""
    import logging
    from types import SimpleNamespace

    from hutch.quorum import host as qhost

    h = qhost.QuorumHost.__new__(qhost.QuorumHost)
    h.raft = SimpleNamespace(entry_data=lambda gid, index: None, snapshot_index=lambda gid: 100)
    h._gone_told = set()
    q = SimpleNamespace(gid=7, name="orders", vhost="/", recent={})
    with caplog.at_level(logging.WARNING, logger="hutch.quorum"):
        for index in (50, 60):
            with pytest.raises(qhost.ContentGone):
                h.content(q, index)
        assert len(caplog.records) == 1 and "leads before it applied" in caplog.records[0].getMessage()
    with pytest.raises(LookupError) as defect:
        h.content(q, 150)
    assert type(defect.value) is LookupError
    d = Deliver("n1/c1", 1, 0, False, "", "", b"", None, index=60)
    assert h._resent_out(q, Resent("n1/c1", 1, (d,))).deliveries == []  # left out, not a failure
