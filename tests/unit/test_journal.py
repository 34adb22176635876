"""The message journal: settled messages never come back, and the log shrinks as they settle."""

from __future__ import annotations

import random

from hutch.broker.journal import REF_DELIVERED, Journal


def _journal(tmp_path, segment_bytes_max=4096):
    return Journal(str(tmp_path / "msgs"), segment_bytes_max=segment_bytes_max)


def test_acked_messages_let_their_segments_go(tmp_path):
    j = _journal(tmp_path)
    body = b"x" * 200
    for _ in range(20):
        seqs = [j.enqueue(7, "", "q", b"\x00\x00", body) for _ in range(30)]
        for s in seqs:
            j.delivered(7, s)
        for s in seqs:
            j.settled(7, s)
        j.sync()
        j.collect()
    # everything settled: only the active segment (and at most one behind it) remains
    assert j.log.segment_count <= 2, j.log.segment_names()
    j.close()
    j2 = _journal(tmp_path)
    assert j2.recover([7]) == {}
    j2.close()


def test_recovery_returns_exactly_the_unsettled_messages_with_their_delivered_flag(tmp_path):
    rng = random.Random(5)
    j = _journal(tmp_path)
    live: dict[int, bool] = {}
    for i in range(600):
        s = j.enqueue(1, "x", "rk", b"\x00\x00", b"m%d" % i)
        live[s] = False
        if rng.random() < 0.5:
            j.delivered(1, s)
            live[s] = True
        if rng.random() < 0.6:
            j.settled(1, s)
            del live[s]
        if i % 50 == 0:
            j.sync()
            j.collect()
    j.sync()
    j.close()
    j2 = _journal(tmp_path)
    got = j2.recover([1])[1]
    assert {m.log_seq: m.delivered for m in got} == live
    assert [m.log_seq for m in got] == sorted(live)
    j2.close()


def test_records_of_deleted_queues_are_not_recovered(tmp_path):
    j = _journal(tmp_path)
    a = [j.enqueue(1, "", "a", b"\x00\x00", b"a") for _ in range(5)]
    j.enqueue(2, "", "b", b"\x00\x00", b"b")
    j.purged(1, a)
    j.sync()
    j.close()
    j2 = _journal(tmp_path)
    rec = j2.recover([1, 2])
    assert 1 not in rec and [m.body for m in rec[2]] == [b"b"]
    j2.close()
    j3 = _journal(tmp_path)
    assert j3.recover([1]) == {}  # queue 2 deleted meanwhile: its message is dropped
    j3.close()


def test_a_deleted_queues_delivered_messages_leave_no_record_behind(tmp_path):
    """Its E records go at the next start, and the V records naming them go with them: nothing
    of a queue deleted while the node was down keeps a segment alive."""
    j = _journal(tmp_path, segment_bytes_max=4096)
    gone = [j.enqueue(2, "", "b", b"\x00\x00", b"b" * 100) for _ in range(60)]
    for s in gone:
        j.delivered(2, s)
    j.flush()
    j.sync()
    j.close()
    j = _journal(tmp_path, segment_bytes_max=4096)
    assert j.recover([1]) == {}  # queue 2 deleted meanwhile
    for _ in range(60):  # the active segment moves on
        j.settled(1, j.enqueue(1, "", "a", b"\x00\x00", b"a" * 100))
        j.flush()
    j.sync()
    j.collect(force=True)
    assert j.log.live_records == 0  # every message settled or deleted, no guard left
    assert j.log.segment_count == 1, j.log.segment_names()
    j.close()


def _die(j: Journal) -> None:
    """The process is gone: its files close, nothing more is written (no clean-close mark)."""
    j._stop.set()
    j.log._close_fds()


def _crash(j: Journal) -> None:
    """The node dies with everything written on disk but without closing the journal."""
    j.sync()
    _die(j)


def test_after_a_stop_without_a_clean_close_every_recovered_message_counts_as_delivered(tmp_path):
    j = _journal(tmp_path)
    j.recover([1])
    assert not j.closed_cleanly  # a new directory: nothing says how it was left
    seqs = [j.enqueue(1, "", "q", b"\x00\x00", b"m%d" % i) for i in range(3)]
    j.delivered(1, seqs[0])
    j.flush()
    _crash(j)

    j = _journal(tmp_path)
    assert not j.closed_cleanly
    assert [m.delivered for m in j.recover([1])[1]] == [True, True, True]
    later = j.enqueue(1, "", "q", b"\x00\x00", b"later")  # published after the crash, never delivered
    j.close()

    j = _journal(tmp_path)  # a clean close since: the crash's mark still holds for what it covered
    assert j.closed_cleanly
    refs = j.recover_refs([1])[1]
    assert [(s, bool(ref & REF_DELIVERED)) for s, ref in refs.items()] == [(s, True) for s in seqs] + [(later, False)]
    for s in seqs:
        j.settled(1, s)
    j.close()

    j = _journal(tmp_path)  # the covered messages are gone; the message after them is not marked
    assert [(m.log_seq, m.delivered) for m in j.recover([1])[1]] == [(later, False)]
    _crash(j)
    j = _journal(tmp_path)
    assert [(m.log_seq, m.delivered) for m in j.recover([1])[1]] == [(later, True)]
    j.close()


def test_the_mark_of_a_crash_survives_a_second_crash_before_it_reached_the_disk(tmp_path):
    """The clean-shutdown file goes for good when the journal opens, so a crash before the D
    record is on disk still leaves the next start counting every message delivered."""
    j = _journal(tmp_path)
    j.recover([1])
    s = j.enqueue(1, "", "q", b"\x00\x00", b"m")
    j.close()
    j = _journal(tmp_path)
    assert j.closed_cleanly and not j.recover([1])[1][0].delivered
    j.delivered(1, s)  # its V record is never written: the node dies first
    _die(j)
    j = _journal(tmp_path)
    assert not j.closed_cleanly and j.recover([1])[1][0].delivered
    j.close()


def test_the_mark_of_a_crash_outlives_a_start_that_did_not_know_the_queue(tmp_path):
    """A node whose catalogue is behind starts without one of its queues, and stops cleanly;
    when the queue is back, its messages from before the crash still count as delivered."""
    j = _journal(tmp_path)
    j.recover([1])
    s = j.enqueue(1, "", "q", b"\x00\x00", b"m")
    j.delivered(1, s)  # never written: the node dies first
    j.sync()
    _die(j)
    j = _journal(tmp_path)
    assert j.recover([]) == {}  # queue 1 unknown at this start
    j.close()
    j = _journal(tmp_path)
    assert j.closed_cleanly
    assert [(m.log_seq, m.delivered) for m in j.recover([1])[1]] == [(s, True)]
    j.close()


def test_recovery_reads_each_messages_size_expiration_and_priority_and_skips_a_malformed_one(tmp_path, caplog):
    """Recovery reads a message record without its body: what it keeps of each is checked
    against what was written, and a record named a message that does not parse as one is
    reported and released, not recovered."""
    from pamqp import commands

    from hutch.amqp.codec import encode_properties
    from hutch.broker.journal import REF_EXPIRATION, REF_PRIORITY_SHIFT, REF_SIZE_MASK, _enc

    j = _journal(tmp_path, segment_bytes_max=1 << 20)
    j.recover_refs([])
    kinds = [(commands.Basic.Properties(), 10), (commands.Basic.Properties(expiration="60000"), 300),
             (commands.Basic.Properties(priority=7), 70_000), (commands.Basic.Properties(priority=2, expiration="5"), 0)]
    seqs = [j.enqueue(1, "x", "rk", encode_properties(p), b"b" * n) for p, n in kinds]
    bad = j.log.append(_enc.encode(("E", 1, "x")))  # too short to be a message
    j.sync()
    j.close()
    j = _journal(tmp_path, segment_bytes_max=1 << 20)
    refs = j.recover_refs([1])[1]
    assert [(s, r & REF_SIZE_MASK, bool(r & REF_EXPIRATION), r >> REF_PRIORITY_SHIFT & 0xFF) for s, r in refs.items()] \
        == [(seqs[0], 10, False, 0), (seqs[1], 300, True, 0), (seqs[2], 70_000, False, 7), (seqs[3], 0, True, 2)]
    assert f"malformed message record {bad} skipped" in caplog.text
    assert not j.log.is_live(bad)
    j.close()
