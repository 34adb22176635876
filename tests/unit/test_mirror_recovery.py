"""Mirrors that remember: a mirror's copy in the node's journal comes back after a restart with
only its live messages, apart from the queues' own records; a replica recovered from disk
reports its seqs as bounded ranges, drops what the leader says, and lets the leader's messages
replace recovered ones it has not judged yet."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.broker.broker import Config
from hutch.broker.journal import CopyRefs, Journal
from hutch.mirror.leader import RECOVERY_REPORTS_MAX, Leader, new_epochs
from hutch.mirror.replica import (
    RANGES_MAX,
    Enqueued,
    Recovered,
    Removed,
    Replica,
    SyncBatch,
    SyncItem,
    Unreconciled,
    decode_ops,
    encode_ops,
    in_ranges,
    to_ranges,
)
from hutch.server.config import ConfigError, apply_file


def _journal(tmp_path, segment_bytes_max=4096):
    return Journal(str(tmp_path / "msgs"), segment_bytes_max=segment_bytes_max)


def _me(j: Journal, copy_id: int, seq: int) -> int:
    return j.mirror_enqueue(copy_id, "", "q", b"\x00\x00", b"m%d" % seq, seq, 0, None, None)


def test_a_mirror_copy_comes_back_with_its_live_messages_only(tmp_path):
    rng = random.Random(3)
    j = _journal(tmp_path)
    j.mirror_header(11, "/", "q", 77, 5)
    queue_msgs = [j.enqueue(77, "", "q", b"\x00\x00", b"queue's own") for _ in range(3)]
    live: dict[int, int] = {}  # record seq -> leader seq
    for seq in range(1, 800):
        live[_me(j, 11, seq)] = seq
        if rng.random() < 0.6:
            gone = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 3)))
            j.mirror_removed(11, gone)
            for g in gone:
                del live[g]
        if seq % 50 == 0:
            j.sync()
            j.collect()
    j.sync()
    j.close()
    j2 = _journal(tmp_path)
    recovered = j2.recover([77])
    assert [m.log_seq for m in recovered[77]] == queue_msgs  # the queue's own records are apart
    copy = j2.take_mirror_copy("/", "q")
    assert (copy.copy_id, copy.queue_journal_id, copy.epoch) == (11, 77, 5)
    assert dict(copy.items.items()) == live  # by reference: record seq -> leader seq, no message decoded
    assert j2.take_mirror_copy("/", "q") is None
    j2.drop_mirror_copy(copy)
    j2.sync()
    j2.close()
    j3 = _journal(tmp_path)
    j3.recover([77])
    assert j3.mirror_copies == {}  # a dropped copy stays dropped
    j3.close()


def test_a_newer_header_replaces_the_older_and_a_second_copy_of_a_queue_wins(tmp_path):
    j = _journal(tmp_path)
    old = j.mirror_header(1, "/", "q", 9, 100)
    _me(j, 1, 1)
    j.mirror_header(1, "/", "q", 9, 200)  # reconciled into a new epoch
    j.mirror_removed(1, [old])
    j.mirror_header(2, "/", "q", 9, 300)  # a later copy of the same queue
    _me(j, 2, 5)
    j.sync()
    j.close()
    j2 = _journal(tmp_path)
    j2.recover([])
    copy = j2.mirror_copies[("/", "q")]
    assert (copy.copy_id, copy.epoch, [seq for _log, seq in copy.items.items()]) == (2, 300, [5])
    # the message itself is read back from its record only when asked (a promotion)
    assert j2.read_mirror_enqueue(next(iter(copy.items))) == ("", "q", b"\x00\x00", b"m5", 0, None, None)
    assert j2.read_mirror_enqueue(copy.header_seq) is None  # not a message record
    j2.close()


def _enq(seq: int, persistent: bool = True) -> Enqueued:
    return Enqueued(seq, "", "q", b"\x00\x00", b"%d" % seq, persistent, 0, None, None, "", 0)


def test_a_durable_replica_notes_what_to_write_and_release_and_a_plain_one_does_not():
    r = Replica(durable=True)
    r.apply([_enq(1), _enq(2, persistent=False), _enq(3)])
    assert [e.seq for e in r.to_write] == [1, 3]
    for e in r.to_write:
        e.log_seq = 100 + e.seq
    r.to_write = []
    r.apply([Removed([1, 2])])
    assert r.to_release == [101]
    plain = Replica()
    plain.apply([_enq(1), Removed([1])])
    assert plain.to_write == [] and plain.to_release == []


def _restored(seqs) -> Replica:
    r = Replica(durable=True)
    for s in seqs:
        r.restore(s, 1000 + s)  # by reference: its ME record is 1000 + s
    return r


def test_ranges_are_compact_and_bounded_to_the_newest():
    assert to_ranges([1, 2, 3, 7, 9, 10]) == [1, 3, 7, 7, 9, 10]
    assert in_ranges([1, 3, 7, 7, 9, 10]) == [1, 2, 3, 7, 9, 10]
    r = _restored(range(2, 2 * (RANGES_MAX + 10) + 1, 2))  # every other seq: one range each
    ranges = r.held_ranges()
    assert len(ranges) == 2 * RANGES_MAX
    assert in_ranges(ranges) == sorted(r.seqs())  # the older ones were dropped from the copy
    assert len(r.to_release) == 10


def test_recovered_drops_what_the_leader_says_for_that_mirror_only():
    r = _restored(range(1, 11))
    r.member = "m1"
    r.apply(decode_ops(encode_ops([Recovered("m2", (1, 10))])))
    assert len(r) == 10
    r.apply(decode_ops(encode_ops([Recovered("m1", (1, 3, 8, 8))])))
    assert sorted(r.seqs()) == [4, 5, 6, 7, 9, 10]
    assert sorted(r.to_release) == [1001, 1002, 1003, 1008]
    assert not r.unreconciled
    r.apply([SyncBatch((SyncItem(4, "", "q", b"\x00\x00", b"new", True, 0, None, None, 0),))])
    assert 4 in r.on_disk and 4 not in r.entries  # reconciled: the copy's message (on disk) is the leader's


def test_the_leaders_message_replaces_an_unreconciled_one_and_promotion_forgets_the_rest():
    r = _restored([1, 2, 3])
    r.apply([SyncBatch((SyncItem(2, "", "q", b"\x00\x00", b"new", True, 0, None, None, 0),)), _enq(3)])
    assert r.entries[2].body == b"new" and r.entries[3].body == b"3"
    assert 1002 in r.to_release  # the copy's own message 2 gives way
    r.forget_unreconciled()
    assert sorted(r.seqs()) == [2, 3] and len(r.on_disk) == 0


def test_a_promoted_leader_keeps_the_epochs_before_it_bounded():
    e = new_epochs()
    for i in range(20):
        e = new_epochs(e, 100 * i)
    assert len(e) == 8 and e[-1][1] == 1900
    assert len({x[0] for x in e}) == 8


def test_mirroring_recover_from_disk_is_a_boolean_on_by_default(tmp_path):
    path = tmp_path / "hutch.conf"
    path.write_text("mirroring_recover_from_disk = false\n")
    assert apply_file(Config(), path).mirroring_recover_from_disk is False
    assert Config().mirroring_recover_from_disk is True
    path.write_text("mirroring_recover_from_disk = soon\n")
    with pytest.raises(ConfigError, match="bad value for 'mirroring_recover_from_disk'"):
        apply_file(Config(), path)


def test_a_leader_takes_a_copy_of_its_own_or_an_earlier_epoch_only_below_where_the_next_began():
    ld = Leader.__new__(Leader)  # only its epochs and the reports it keeps are used here
    ld.epochs = new_epochs(new_epochs(), 500)  # promoted once: the second epoch began at seq 500
    ld.recovery_reports = {}
    first, second = ld.epochs[0][0], ld.epochs[1][0]
    assert ld.recovery_report("m1", second, [1, 900]) and ld.recovery_reports["m1"] == ([1, 900], None)
    assert ld.recovery_report("m2", first, [1, 900]) and ld.recovery_reports["m2"] == ([1, 900], 500)
    assert not ld.recovery_report("m3", 12345, [1, 900])  # a leader that numbers afresh: start empty
    for i in range(100):
        ld.recovery_report(f"x{i}", second, [])
    assert len(ld.recovery_reports) == RECOVERY_REPORTS_MAX


def test_a_large_copy_is_dropped_in_bounded_records(tmp_path, monkeypatch):
    monkeypatch.setattr("hutch.broker.journal.MIRROR_REMOVED_PER_RECORD", 7)
    j = _journal(tmp_path, segment_bytes_max=1 << 20)
    h = j.mirror_header(3, "/", "q", 1, 1)
    seqs = [_me(j, 3, s) for s in range(1, 51)]
    j.mirror_removed(3, seqs[:20])
    j.sync()
    j.close()
    j2 = _journal(tmp_path, segment_bytes_max=1 << 20)
    j2.recover([])
    copy = j2.take_mirror_copy("/", "q")
    assert (copy.header_seq, sorted(copy.items)) == (h, seqs[20:])
    j2.drop_mirror_copy(copy)
    j2.sync()
    j2.close()
    j3 = _journal(tmp_path, segment_bytes_max=1 << 20)
    j3.recover([])
    assert j3.mirror_copies == {}
    j3.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add_any", "discard"]), st.integers(0, 400)), max_size=200),
       st.lists(st.integers(0, 300), max_size=12))
def test_unreconciled_seqs_behave_as_a_set(ops, start) -> None:
    """Unreconciled (ranges, less what was taken out) against a set."""
    seqs = sorted(set(start))
    u, model = Unreconciled(to_ranges(seqs)), set(seqs)
    top = max(seqs, default=0)
    for op, n in ops:
        if op == "add":  # in order, as a copy is read back
            top += n % 3 + 1
            u.add(top)
            model.add(top)
        elif op == "add_any":
            u.add(n)
            model.add(n)
            top = max(top, n)
        else:
            u.discard(n)
            model.discard(n)
        assert (n in u) == (n in model)
        assert len(u) == len(model) and bool(u) == bool(model)
    assert sorted(u) == sorted(model)


def test_a_recovered_copy_costs_a_few_bytes_a_message() -> None:
    import tracemalloc
    tracemalloc.start()
    refs = CopyRefs()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(200_000):
        refs[1_000_000 + 3 * i] = 10 + i
    per = (tracemalloc.get_traced_memory()[0] - before) / 200_000
    tracemalloc.stop()
    assert per < 8, per
    assert refs.pop(1_000_003) == 11 and refs.pop(1_000_003) is None and 1_000_006 in refs
    assert len(refs) == 199_999 and list(refs.items())[:2] == [(1_000_000, 10), (1_000_006, 12)]
    with pytest.raises(ValueError):
        refs[5] = 1  # a replay gives record seqs in order: anything else is a defect
