"""The message journal: settled messages never come back, and the log shrinks as they settle."""

from __future__ import annotations

import random

from hutch.broker.journal import Journal


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
