"""Disk-first queues on a broker with real storage: the journal and the scratch log as body store.

A `Broker` with no cluster and no sockets, its message journal and scratch log in a temporary
directory, and one classic queue with a memory window of 10 messages. Checked here: where a
paged body goes (the journal for a persistent message of a durable queue, the scratch log
otherwise) and that reading it back frees the scratch record; recovery that pages a persistent
backlog again and keeps `redelivered`; purge and delete free paged records unread; a corrupt
journal record is logged with the queue and the position, settled and never delivered; a
scratch log that fails keeps new messages in memory, in order.
"""

from __future__ import annotations

import logging
import os

import pytest

from hutch.broker.broker import Broker, Config
from hutch.broker.journal import REF_DELIVERED, REF_SIZE_MASK, Journal, ScratchLog
from hutch.queues.message import Message
from hutch.queues.paging import SCRATCH
from hutch.store import StoreFailed

WINDOW = 10


def make_broker(data_dir, journal_id: int = 7, durable: bool = True, args: dict | None = None,
                paging_ratio: float = 0.0):
    b = Broker(Config(classic_queue_memory_window_messages=WINDOW, vm_memory_high_watermark_paging_ratio=paging_ratio))
    v = b.add_vhost("/")
    q = b.declare_queue(v, "q", durable=durable, exclusive=False, auto_delete=False, arguments=args or {},
                        owner=None)
    q.journal_id = journal_id if durable else 0
    # open_storage without its gc.freeze (this is a test process)
    b.journal = Journal(os.path.join(data_dir, "msgs"))
    b.scratch = ScratchLog(os.path.join(data_dir, "scratch"))
    return b, q


def msg(i: int, persistent: bool = False) -> Message:
    return Message("", "q", b"\x00\x01q", b"\x00\x00", f"{i:06d}".encode() * 20, persistent)


def drain(b: Broker, q, ack: bool = True) -> list[tuple[int, int]]:
    out = []
    while True:
        e = q.take_head(no_ack=False)
        if e is None:
            return out
        b.delivered(q, e)
        out.append((int(e.message.body[:6]), e.delivery_count))
        if ack:
            q.settle(e.seq)
            b.settled(q, e)


@pytest.fixture
def broker(tmp_path):
    b, q = make_broker(tmp_path)
    yield b, q
    b.close_storage()


def test_with_memory_to_spare_a_queue_past_its_window_keeps_new_messages_in_memory(tmp_path):
    """vm_memory_high_watermark_paging_ratio (0.5 here, RabbitMQ's default): below it nothing is
    paged; past it the queue pages what comes next, and keeps paging until its tail is empty."""
    b, q = make_broker(tmp_path, paging_ratio=0.5)
    try:
        limit = 1000
        b.config.vm_memory_high_watermark_bytes = limit
        b.memory_check(400, 10_000)  # 40 % of the watermark
        for i in range(30):
            b.enqueue_local((q,), msg(i))
        assert q.state.ready_count == 30 and q.paged_count == 0
        b.memory_check(600, 10_000)  # 60 %: past the paging ratio
        for i in range(30, 40):
            b.enqueue_local((q,), msg(i))
        assert q.paged_count == 10
        b.memory_check(400, 10_000)  # below again: the paged tail keeps order, so it goes on
        b.enqueue_local((q,), msg(40))
        assert q.paged_count == 11
        assert [n for n, _c in drain(b, q)] == list(range(41))
        b.enqueue_local((q,), msg(41))
        assert q.paged_count == 0  # the tail emptied: in memory again
    finally:
        b.close_storage()


def test_with_memory_to_spare_persistent_messages_of_a_durable_queue_are_paged_past_its_window(tmp_path):
    """Their bodies are in the journal already, so paging them costs no write: they go to disk
    past the window whatever the memory use, and the transient ones after them follow (order)."""
    b, q = make_broker(tmp_path, paging_ratio=0.5)
    try:
        b.config.vm_memory_high_watermark_bytes = 1000
        b.memory_check(100, 10_000)  # 10 % of the watermark: no pressure
        assert not b.paging_pressure
        for i in range(WINDOW + 20):
            b.enqueue_local((q,), msg(i, persistent=True))
        assert q.state.ready_count == WINDOW and q.paged_count == 20
        assert all(loc < SCRATCH for loc in q.tail.locations()), "read from the journal, not copied"
        assert b.scratch.log.live_records == 0
        b.enqueue_local((q,), msg(WINDOW + 20))  # transient, behind the paged tail
        assert q.paged_count == 21 and b.scratch.log.live_records == 1
        assert [n for n, _c in drain(b, q)] == list(range(WINDOW + 21))
    finally:
        b.close_storage()


def test_with_memory_to_spare_a_transient_queue_keeps_persistent_messages_in_memory(tmp_path):
    """A non-durable queue does not journal persistent messages: paging them would be a write."""
    b, q = make_broker(tmp_path, durable=False, paging_ratio=0.5)
    try:
        b.config.vm_memory_high_watermark_bytes = 1000
        b.memory_check(100, 10_000)
        for i in range(WINDOW + 20):
            b.enqueue_local((q,), msg(i, persistent=True))
        assert q.state.ready_count == WINDOW + 20 and q.paged_count == 0
    finally:
        b.close_storage()


def test_transient_messages_past_the_window_go_to_the_scratch_log_and_come_back_in_order(broker):
    b, q = broker
    b.enqueue_local((q,), msg(0))
    for i in range(1, 30):
        b.enqueue_local((q,), msg(i))
    assert q.state.ready_count == WINDOW and q.paged_count == 20
    assert all(loc >= SCRATCH for loc in q.tail.locations())
    assert b.scratch.log.live_records == 20
    assert [n for n, _c in drain(b, q)] == list(range(30))
    assert b.scratch.log.live_records == 0, "a record read back is released"


def test_persistent_message_of_a_durable_queue_is_paged_to_its_journal_record(broker):
    b, q = broker
    for i in range(WINDOW + 5):
        refused, log_seq = b.enqueue_local((q,), msg(i, persistent=True))
        assert not refused and log_seq
    assert q.paged_count == 5
    assert all(loc < SCRATCH and b.journal.log.is_live(loc) for loc in q.tail.locations())
    assert b.scratch.log.live_records == 0
    assert [n for n, _c in drain(b, q)] == list(range(WINDOW + 5))


def test_recovery_pages_a_persistent_backlog_again_and_keeps_redelivered(tmp_path):
    b, q = make_broker(tmp_path)
    for i in range(50):
        b.enqueue_local((q,), msg(i, persistent=True))
    e = q.take_head(no_ack=False)  # delivered, never acknowledged
    b.delivered(q, e)
    b.journal.sync()
    b.close_storage()

    b2, q2 = make_broker(tmp_path)
    try:
        assert b2._recover_messages({7: q2}) == 50
        assert q2.state.ready_count == WINDOW and q2.paged_count == 40 and q2.message_count == 50
        got = drain(b2, q2)
        assert [n for n, _c in got] == list(range(50))
        assert [c for _n, c in got] == [2] + [1] * 49
    finally:
        b2.close_storage()


def test_a_message_an_earlier_leader_may_have_delivered_stays_redelivered_across_a_clean_restart(tmp_path):
    """A publish resent to a new leader of a mirrored queue (`maybe_delivered`: the old leader
    may have delivered it) is enqueued with a delivery count of 1, in memory or paged; its V
    record must say so on disk too, or a restart after a clean close (which trusts the V
    records) delivers it without `redelivered` (simulation seed 235)."""
    b, q = make_broker(tmp_path)
    for i in range(WINDOW + 5):  # the last five paged
        b.enqueue_local((q,), msg(i, persistent=True), maybe_delivered=i % 2 == 0)
    b.journal.sync()
    b.close_storage()

    b2, q2 = make_broker(tmp_path)
    try:
        assert b2._recover_messages({7: q2}) == WINDOW + 5
        assert b2.journal.closed_cleanly
        assert drain(b2, q2) == [(i, 2 if i % 2 == 0 else 1) for i in range(WINDOW + 5)]
    finally:
        b2.close_storage()


def test_purge_and_delete_free_paged_records_unread(broker):
    b, q = broker
    for i in range(30):
        b.enqueue_local((q,), msg(i, persistent=i % 2 == 0))
    live_before = b.journal.log.live_records
    assert b.purge_queue(q) == 30
    assert q.message_count == 0 and b.scratch.log.live_records == 0
    assert b.journal.log.live_records < live_before
    for i in range(30):
        b.enqueue_local((q,), msg(i))
    b.delete_queue(q, propose=False)
    assert b.scratch.log.live_records == 0


def test_corrupt_journal_record_is_logged_settled_and_never_delivered(tmp_path, caplog):
    b, q = make_broker(tmp_path)
    for i in range(WINDOW + 3):
        b.enqueue_local((q,), msg(i, persistent=True))
    bad = q.tail.locations()[1]  # the message numbered WINDOW + 1
    b.journal.sync()
    seg = sorted((tmp_path / "msgs").glob("*.hseg"))[-1]
    data = bytearray(seg.read_bytes())
    at = data.index(f"{WINDOW + 1:06d}".encode() * 20) + 10
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="hutch.broker"):
        got = [n for n, _c in drain(b, q)]
    assert got == [i for i in range(WINDOW + 3) if i != WINDOW + 1]
    assert any(f"queue 'q' in vhost '/': paged message {WINDOW + 2} (journal record {bad}) cannot be read back" in r.message
               for r in caplog.records)
    b.journal.sync()
    b.close_storage()
    b2, q2 = make_broker(tmp_path)
    try:
        assert b2._recover_messages({7: q2}) == 0, "settled: it does not come back"
    finally:
        b2.close_storage()


def test_a_failed_scratch_log_keeps_new_messages_in_memory_in_order(broker, monkeypatch, caplog):
    b, q = broker
    for i in range(WINDOW + 5):
        b.enqueue_local((q,), msg(i))
    assert q.paged_count == 5

    def fail(*_a, **_k):
        raise StoreFailed("disk full")
    monkeypatch.setattr(b.scratch, "write", fail)
    with caplog.at_level(logging.ERROR, logger="hutch.broker"):
        for i in range(WINDOW + 5, WINDOW + 10):
            refused, _ = b.enqueue_local((q,), msg(i))
            assert not refused
    assert q.paged_count == 0 and q.state.ready_count == WINDOW + 10
    assert sum("Scratch log" in r.message and "failed" in r.message for r in caplog.records) == 1
    assert [n for n, _c in drain(b, q)] == list(range(WINDOW + 10))


def test_lazy_queue_argument_pages_from_the_first_message(tmp_path):
    b, q = make_broker(tmp_path, durable=False, args={"x-queue-mode": "lazy"})
    try:
        b.enqueue_local((q,), msg(0))
        assert q.state.ready_count == 0 and q.paged_count == 1
        assert [n for n, _c in drain(b, q)] == [0]
    finally:
        b.close_storage()


def test_priority_queue_pages_per_level_and_recovers_in_priority_order(tmp_path):
    b, q = make_broker(tmp_path, args={"x-max-priority": 5})
    prio = [(i * 3) % 7 for i in range(40)]  # 6 is above the maximum: it counts as 5
    for i in range(40):
        m = msg(i, persistent=True)
        m.props, m.priority = b"\x08\x00" + bytes([prio[i]]), prio[i]
        b.enqueue_local((q,), m)
    assert q.state.ready_count == WINDOW and q.paged_count == 30
    b.journal.sync()
    b.close_storage()

    b2, q2 = make_broker(tmp_path, args={"x-max-priority": 5})
    try:
        assert b2._recover_messages({7: q2}) == 40
        assert q2.paged_count == 30
        assert [n for n, _c in drain(b2, q2)] == sorted(range(40), key=lambda i: (-min(prio[i], 5), i))
    finally:
        b2.close_storage()


def test_recover_refs_keeps_survivors_in_publish_order_without_their_bodies(tmp_path):
    j = Journal(str(tmp_path / "msgs"))
    seqs = [j.enqueue(1, "", "q", b"\x00\x00", bytes(100 + i)) for i in range(6)]
    j.delivered(1, seqs[2])
    j.settled(1, seqs[1])
    j.purged(1, [seqs[4]])
    j.enqueue(2, "", "gone", b"\x00\x00", b"x")  # a queue that no longer exists
    j.sync()
    j.close()
    j2 = Journal(str(tmp_path / "msgs"))
    try:
        refs = j2.recover_refs([1])
        assert list(refs) == [1]
        table = refs[1]
        assert len(table) == 4
        assert [(s, r & REF_SIZE_MASK, bool(r & REF_DELIVERED)) for s, r in table.items()] == [
            (seqs[0], 100, False), (seqs[2], 102, True), (seqs[3], 103, False), (seqs[5], 105, False)]
        assert j2.read_enqueue(seqs[3])[3] == bytes(103)
    finally:
        j2.close()


def test_ref_table_settles_flags_and_refuses_seqs_out_of_order():
    from hutch.broker.journal import REF_EXPIRATION, REF_PRIORITY_SHIFT, _RefTable
    t = _RefTable()
    t.add(5, 50, False, 0)
    t.add(7, 70, True, 0)
    t.add(9, 90, False, 3)
    t.add((1 << 33) + 5, 1024, False, 0)  # seqs further apart than 32 bits widen the array
    with pytest.raises(ValueError):
        t.add(8, 80, False, 0)  # the log replays in seq order: anything else is a defect
    assert [(s, r >> REF_PRIORITY_SHIFT) for s, r in t.items()] == [(5, 0), (7, 0), (9, 3), ((1 << 33) + 5, 0)]
    assert 7 in t and t.pop(9) is True and 9 not in t and t.pop(9, "none") == "none" and 8 not in t
    t.set_delivered(5)
    assert list(t.items()) == [(5, 50 | REF_DELIVERED), (7, 70 | REF_EXPIRATION), ((1 << 33) + 5, 1024)]
    assert len(t) == 3
    assert t.flag_delivered_below(8) == 2  # 5 and 7 (9 was settled)
    assert [r & REF_DELIVERED for _s, r in t.items()] == [REF_DELIVERED, REF_DELIVERED, 0]


def test_ref_table_keeps_each_priority_with_its_message_when_its_front_is_dropped():
    from hutch.broker.journal import REF_PRIORITY_SHIFT, _RefTable
    t = _RefTable()
    n = 3 * _RefTable.DROP_FRONT_MIN
    for s in range(1, n + 1):
        t.add(s, s, False, s % 10)
    for s in range(1, 2 * _RefTable.DROP_FRONT_MIN + 2):  # settled oldest first: the front goes
        assert t.pop(s) is True
    assert len(t.keys) < n  # dropped
    left = list(t.items())
    assert [s for s, _r in left] == list(range(2 * _RefTable.DROP_FRONT_MIN + 2, n + 1))
    assert all(r >> REF_PRIORITY_SHIFT == s % 10 for s, r in left)


def test_a_queue_being_migrated_to_a_quorum_queue_keeps_late_arrivals_in_memory(broker):
    """hutch.broker.kinds moves what arrives during the source queue's deletion from memory
    (its ready entries): such a late arrival must not be paged, or it would be lost."""
    b, q = broker

    class Cluster:
        migrations = {("/", "q"): object()}

    b.cluster = Cluster()
    try:
        for i in range(WINDOW + 5):
            b.enqueue_local((q,), msg(i))
        assert q.paged_count == 0 and [int(e.message.body[:6]) for e in q.state.ready()] == list(range(WINDOW + 5))
    finally:
        b.cluster = None


def test_a_publish_sent_again_after_a_leader_change_is_paged_as_maybe_delivered(broker):
    """A forwarded publish resent after its queue's leader changed (`maybe_delivered`) may have
    been delivered by the earlier leader: paged past the window it keeps that, so its delivery
    comes `redelivered`. Found by `hutch sim cluster --memory-window 4` (mirrored-nodes seed 37):
    the paged path had no delivery count to set, the peer link's handler raised, the link closed,
    the publish was sent again, and the queue stored it again each time."""
    b, q = broker
    for i in range(WINDOW):
        b.enqueue_local((q,), msg(i, persistent=True))
    refused, log_seq = b.enqueue_local((q,), msg(WINDOW, persistent=True), maybe_delivered=True)
    assert not refused and log_seq and q.paged_count == 1
    b.enqueue_local((q,), msg(WINDOW + 1, persistent=True))
    counts = dict(drain(b, q))
    assert counts[WINDOW] == counts[WINDOW + 1] + 1 == counts[0] + 1
