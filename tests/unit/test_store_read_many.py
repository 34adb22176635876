"""The segment log's batch read, guard check and quiet compaction (hutch.store.segment_log).

`read_many` is what a queue draining a paged backlog uses: records that lie one after another
come from one `pread`, every record is still checked against its CRC, and a bad record costs
only itself. `outlives` answers the journal's guard question for a whole list under one lock.
`compact(quiet_only=True)` leaves alone a segment that is still being settled.
"""

from __future__ import annotations

import os

import pytest

from hutch.store import segment_log as sl
from hutch.store.segment_log import SegmentLog, StoreError, UnknownRecord


def _fill(log: SegmentLog, n: int, size: int = 100) -> list[int]:
    return [log.append(bytes([i % 251]) * size, key=7) for i in range(n)]


def test_read_many_returns_what_read_returns_across_segments_and_the_write_buffer(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        seqs = _fill(log, 100)
        log.sync()
        more = _fill(log, 3)  # still in the write buffer
        wanted = seqs[::3] + more
        got = log.read_many(wanted)
        assert [(r.seq, r.key, r.payload) for r in got] == [tuple(log.read(s)) for s in wanted]
        assert log.segment_count > 2


def test_read_many_reads_records_that_lie_together_in_one_pread(tmp_path, monkeypatch):
    with SegmentLog(tmp_path) as log:
        seqs = _fill(log, 2000, size=1000)  # 2 MB in one segment: two reads of at most 1 MiB
        log.sync()
        calls = []
        real = os.pread

        def counting_pread(fd, n, offset):
            calls.append(n)
            return real(fd, n, offset)

        monkeypatch.setattr(sl.os, "pread", counting_pread)
        got = log.read_many(seqs)
        assert [r.seq for r in got] == seqs
        assert len(calls) == 2 and max(calls) <= sl.READ_RUN_BYTES_MAX


def test_read_many_gives_a_bad_record_its_error_and_the_others_their_records(tmp_path):
    with SegmentLog(tmp_path) as log:
        seqs = _fill(log, 10)
        log.release(seqs[7])
        log.sync()
        path = tmp_path / log.segment_names()[0]
    data = bytearray(path.read_bytes())
    data[24 + 28 + 3 * (28 + 100) + 50] ^= 0xFF  # a byte of the fourth record's payload
    path.write_bytes(bytes(data))
    with SegmentLog(tmp_path) as log:  # recovery skips the damaged record, the rest stay live
        got = log.read_many([*seqs, 10_000])
    assert isinstance(got[3], StoreError)
    assert isinstance(got[10], UnknownRecord)
    assert [r.seq for i, r in enumerate(got[:10]) if i != 3] == [s for i, s in enumerate(seqs) if i != 3]


def test_read_many_checks_the_crc_of_each_record_it_reads(tmp_path):
    with SegmentLog(tmp_path) as log:
        seqs = _fill(log, 10)
        log.sync()
        path = tmp_path / log.segment_names()[0]
        with open(path, "r+b") as f:  # damaged under the running log (a bad sector)
            f.seek(24 + 5 * (28 + 100) + 28 + 10)
            f.write(b"\x00\x01")
        got = log.read_many(seqs)
    assert isinstance(got[5], StoreError) and "corrupt" in str(got[5])
    assert all(not isinstance(r, StoreError) for i, r in enumerate(got) if i != 5)


def test_outlives_holds_while_a_record_is_on_disk_in_another_segment(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        first = _fill(log, 20)  # about two segments
        later = _fill(log, 60)
        guard = later[-1]
        deps = [first[0], first[-1], later[-2]]  # the last shares the guard's segment
        assert log.outlives(guard, deps)
        assert deps == [first[0], first[-1]], "the one in the guard's segment is dropped"
        assert log.outlives(guard, deps), "asked again: still there"
        for s in first + later:  # every segment before the guard's goes
            if log.segment_base(s) != log.segment_base(guard):
                log.release(s)
        assert not log.outlives(guard, deps) and deps == []


def test_quiet_compaction_leaves_a_segment_that_is_still_being_settled(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        seqs = _fill(log, 60)
        log.sync()
        head = [s for s in seqs if log.segment_base(s) == log.segment_base(seqs[0])]
        for s in head[: len(head) * 3 // 4]:
            log.release(s)
        assert log.compact(quiet_only=True).segments_rewritten == 0, "first look: it was just settled"
        log.release(head[len(head) * 3 // 4])
        assert log.compact(quiet_only=True).segments_rewritten == 0, "still being settled"
        assert log.compact(quiet_only=True).segments_rewritten == 1, "quiet since the last look"
        assert [r.seq for r in log.read_many(head[len(head) * 3 // 4 + 1:])] == head[len(head) * 3 // 4 + 1:]


@pytest.mark.parametrize("n", [0, 1])
def test_read_many_of_nothing_or_one(tmp_path, n):
    with SegmentLog(tmp_path) as log:
        seqs = _fill(log, n)
        assert [r.seq for r in log.read_many(seqs)] == seqs


def test_release_many_releases_across_segments_and_deletes_those_left_empty(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        seqs = _fill(log, 100)
        segments = log.segment_count
        log.release_many(seqs[:60])
        assert log.segment_count < segments and not log.is_live(seqs[59]) and log.is_live(seqs[60])
        with pytest.raises(UnknownRecord):
            log.release_many([seqs[60], seqs[10]])
        assert not log.is_live(seqs[60]), "those before the bad one are released"


def test_outlives_drops_a_deleted_segments_seqs_in_one_step_and_skips_rewritten_ones(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        seqs = _fill(log, 100)
        first_base = log.segment_base(seqs[0])
        head = [s for s in seqs if log.segment_base(s) == first_base]
        second = [s for s in seqs if log.segment_base(s) == log.segment_base(seqs[len(head)])]
        guard = seqs[-1]
        log.release_many(second[:-1])  # the second segment keeps one live record
        log.sync()
        log.compact(live_ratio_max=0.9)  # the second segment rewritten: its released records are gone
        log.release_many(head)  # the first segment deleted
        deps = head + second[:-1]
        assert not log.outlives(guard, deps) and deps == []
        deps = head + second
        assert log.outlives(guard, deps) and deps == head + second, "the live one keeps the guard"
