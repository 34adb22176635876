"""The message journal's batched V and A records (hutch.broker.journal).

`delivered` and `settled` only note a message; `flush` (once per loop iteration) writes one V
and one A record per queue for all of them. The promises stay those of one record a message:
a restart brings back exactly the unsettled messages, `redelivered` exactly for those whose V
record was written, and a V record stays on disk while any message it names is queued.
Journals written before batching (one E seq per V or A record) recover the same way.
"""

from __future__ import annotations

import random

import msgspec

from hutch.broker.journal import Journal, Unreadable

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


def _journal(tmp_path, segment_bytes_max=64 * 1024 * 1024):
    j = Journal(str(tmp_path / "msgs"), segment_bytes_max=segment_bytes_max)
    j.recover_refs([])
    return j


def _live_kinds(j: Journal) -> list[tuple[str, object]]:
    return [(item[0], item[2]) for item in (_dec.decode(r.payload) for r in j.log.replay())]


def test_a_drain_writes_one_v_and_one_a_record_per_queue_and_flush(tmp_path):
    j = _journal(tmp_path)
    seqs = [j.enqueue(1, "", "q", b"\x00\x00", b"m") for _ in range(100)]
    others = [j.enqueue(2, "", "r", b"\x00\x00", b"m") for _ in range(10)]
    first = j.log.last_seq + 1
    for s in seqs:
        j.delivered(1, s)
    for s in others:
        j.delivered(2, s)
    j.flush()
    for s in seqs:
        j.settled(1, s)
    j.flush()
    written = [_dec.decode(j.log.read(s).payload)[:3] for s in range(first, j.log.last_seq + 1) if j.log.is_live(s)]
    assert j.log.last_seq - first + 1 == 3, "a V record for each queue, one A record"
    assert written == [["V", 2, others]], "V and A of queue 1 went with the E records they name (one segment)"
    j.close()


def test_a_message_delivered_and_settled_between_two_flushes_gets_no_v_record(tmp_path):
    j = _journal(tmp_path)
    s = j.enqueue(1, "", "q", b"\x00\x00", b"m")
    j.delivered(1, s)
    j.settled(1, s)
    before = j.log.last_seq
    j.flush()
    assert j.log.last_seq == before + 1 and _dec.decode(j.log.read(before + 1).payload) == ["A", 1, [s]]
    j.close()


def test_recovery_returns_exactly_the_unsettled_messages_with_their_delivered_flag(tmp_path):
    rng = random.Random(11)
    j = _journal(tmp_path, segment_bytes_max=8192)
    live: dict[int, bool] = {}
    delivered: set[int] = set()
    for i in range(2000):
        s = j.enqueue(1, "x", "rk", b"\x00\x00", b"m%d" % i)
        live[s] = False
        for t in rng.sample(sorted(live), min(len(live), 3)):
            r = rng.random()
            if r < 0.3 and t not in delivered:
                j.delivered(1, t)
                delivered.add(t)
                live[t] = True
            elif r < 0.5:
                j.settled(1, t)
                del live[t]
        if i % 37 == 0:
            j.flush()
            j.sync()
            j.collect()
    j.flush()
    j.sync()
    j.close()
    j2 = Journal(str(tmp_path / "msgs"), segment_bytes_max=8192)
    got = j2.recover([1])[1]
    assert {m.log_seq: m.delivered for m in got} == live
    for m in got:  # and the survivors settle for good after the restart
        j2.settled(1, m.log_seq)
    j2.flush()
    j2.sync()
    j2.collect()
    j2.close()
    j3 = Journal(str(tmp_path / "msgs"), segment_bytes_max=8192)
    assert j3.recover([1]) == {}
    assert j3.log.segment_count <= 3, "settled records do not keep segments"
    j3.close()


def test_a_v_record_stays_while_one_message_it_names_is_queued(tmp_path):
    j = _journal(tmp_path, segment_bytes_max=4096)
    seqs = [j.enqueue(1, "", "q", b"\x00\x00", b"x" * 100) for _ in range(10)]
    for s in seqs:
        j.delivered(1, s)
    j.flush()
    for s in seqs[:9]:
        j.settled(1, s)
    for _ in range(200):  # push the log on, so the E records' segments are sealed and can go
        j.settled(1, j.enqueue(1, "", "q", b"\x00\x00", b"y" * 100))
        j.flush()
        j.sync()
        j.collect()
    assert ("V", seqs) in _live_kinds(j), "one of its messages is still queued"
    j.settled(1, seqs[9])
    for _ in range(200):
        j.settled(1, j.enqueue(1, "", "q", b"\x00\x00", b"y" * 100))
        j.flush()
        j.sync()
        j.collect()
    assert ("V", seqs) not in _live_kinds(j), "all settled and their segment gone: the V record goes too"
    j.close()


def test_a_journal_written_one_record_a_message_recovers_the_same(tmp_path):
    j = _journal(tmp_path)
    seqs = [j.enqueue(3, "", "q", b"\x00\x00", b"m%d" % i) for i in range(4)]
    log = j.log
    log.append(_enc.encode(("V", 3, seqs[0])), 3)  # the form before batching: one E seq
    log.append(_enc.encode(("V", 3, seqs[1])), 3)
    log.append(_enc.encode(("A", 3, seqs[1])), 3)
    log.append(_enc.encode(("A", 3, seqs[2])), 3)
    j.sync()
    j.close()
    j2 = Journal(str(tmp_path / "msgs"))
    got = j2.recover([3])[3]
    assert [(m.log_seq, m.delivered) for m in got] == [(seqs[0], True), (seqs[3], False)]
    j2.close()


def test_read_enqueues_gives_a_corrupt_record_its_error_and_the_rest_their_messages(tmp_path):
    j = _journal(tmp_path)
    seqs = [j.enqueue(1, "x", f"rk{i}", b"\x00\x00", bytes([i]) * 300) for i in range(20)]
    j.sync()
    path = j.log.directory / j.log.segment_names()[0]
    data = bytearray(path.read_bytes())
    data[data.index(bytes([7]) * 300) + 100] ^= 0x55
    path.write_bytes(bytes(data))
    got = j.read_enqueues(seqs)
    assert isinstance(got[7], Unreadable)
    assert [g[1] for i, g in enumerate(got) if i != 7] == [f"rk{i}" for i in range(20) if i != 7]
    assert got[3] == j.read_enqueue(seqs[3]) == ("x", "rk3", b"\x00\x00", bytes([3]) * 300)
    j.close()
