"""StreamMachine over a real StreamLog in a temporary directory: a member's replica of a stream as
its Raft group's committed entries make it.

Deduplication by writer and publishing id, the Raft log applied again over the log a member kept
(a restart), a snapshot restored past the log's end (a gap) closed by chunks fetched from another
member with the entries applied meanwhile written after them, a gap that starts below what any
member still has, and a snapshot behind the log.
"""

from __future__ import annotations

import pytest

from hutch.store.stream_log import StreamLog
from hutch.streamproto import chunk
from hutch.streams import machine as sm


def write(req: int, records: list[bytes], writer: str = "w", pids: list[int] | None = None, ts: int = 1000) -> bytes:
    return sm.write_entry("n1", req, 0, ts, writer, pids, records)


def stored(log: StreamLog) -> list[tuple[int, bytes]]:
    out = []
    for info, data in log.read(log.first_offset, 1 << 30):
        out += [(info.chunk_id + i, r) for i, r in enumerate(chunk.records(data))]
    return out


@pytest.fixture
def log(tmp_path):
    lg = StreamLog(tmp_path / "s", fsync=False)
    yield lg
    lg.close()


def test_each_write_is_one_chunk_numbered_from_the_next_offset(log):
    m = sm.StreamMachine(log)
    w1 = m.apply(write(1, [b"a", b"b"], pids=[1, 2]))
    w2 = m.apply(write(2, [b"c"], pids=[3]))
    assert (w1.first, w1.written, w1.duplicates) == (0, 2, 0)
    assert (w2.first, w2.written, w2.duplicates) == (2, 1, 0)
    assert log.chunk_count == 2 and m.next_offset == m.committed == 3
    assert stored(log) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_writer_resending_gets_its_answer_and_the_stream_keeps_one_copy(log):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"a", b"b"], pids=[1, 2]))
    again = m.apply(write(2, [b"a", b"b"], pids=[1, 2]))
    assert (again.first, again.written, again.duplicates) == (None, 0, 2)
    partly = m.apply(write(3, [b"b", b"c"], pids=[2, 3]))
    assert (partly.first, partly.written, partly.duplicates) == (2, 1, 1)
    other = m.apply(write(4, [b"x"], writer="other", pids=[1]))
    assert other.written == 1
    assert stored(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"x")]
    assert m.writer_sequence("w") == 3 and m.writer_sequence("other") == 1


def test_an_entry_that_an_earlier_one_overtook_is_written_not_taken_for_a_duplicate(log):
    """A writer's entry lost with a leader and resent after its next entry was committed."""
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"a1", b"a2"], pids=[1, 2]))
    m.apply(write(3, [b"a5", b"a6"], pids=[5, 6]))  # ids 3 and 4 were lost with the old leader
    late = m.apply(write(2, [b"a3", b"a4"], pids=[3, 4]))
    assert (late.first, late.written, late.duplicates) == (4, 2, 0)
    again = m.apply(write(2, [b"a3", b"a4"], pids=[3, 4]))  # and resent once more
    assert (again.written, again.duplicates) == (0, 2)
    assert [r for _o, r in stored(log)] == [b"a1", b"a2", b"a5", b"a6", b"a3", b"a4"]
    assert m.writer_sequence("w") == 6 and m.holes == {"w": [[0, 0]]}  # its ids began at 1


def test_a_new_writers_first_entry_committed_after_its_second_is_written(log):
    """The first batch of a writer proposed before a leader was known and sent again after
    its second batch was committed."""
    m = sm.StreamMachine(log)
    m.apply(write(2, [b"c", b"d"], pids=[2, 3]))
    late = m.apply(write(1, [b"a", b"b"], pids=[0, 1]))
    assert (late.first, late.written, late.duplicates) == (2, 2, 0)
    assert m.apply(write(1, [b"a", b"b"], pids=[0, 1])).duplicates == 2
    assert [r for _o, r in stored(log)] == [b"c", b"d", b"a", b"b"]
    assert not m.holes


def test_a_resend_that_straddles_a_hole_writes_only_the_missing_ids(log):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"1"], pids=[1]))
    m.apply(write(2, [b"4"], pids=[4]))
    w = m.apply(write(3, [b"2", b"3", b"4", b"5"], pids=[2, 3, 4, 5]))
    assert (w.written, w.duplicates) == (3, 1)
    assert [r for _o, r in stored(log)] == [b"1", b"4", b"2", b"3", b"5"]
    assert m.holes == {"w": [[0, 0]]}


def test_a_writers_holes_are_bounded_and_kept_in_snapshots(log, tmp_path):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"x"], pids=[1]))
    for i in range(sm.HOLES_MAX + 5):
        m.apply(write(i + 2, [b"x"], pids=[3 + 2 * i]))  # every other id skipped
    assert len(m.holes["w"]) == sm.HOLES_MAX
    assert m.holes["w"][0] == [2 + 2 * 5, 2 + 2 * 5]  # the lowest were forgotten
    lg2 = StreamLog(tmp_path / "other", fsync=False)
    m2 = sm.StreamMachine(lg2)
    m2.restore(m.snapshot())
    assert m2.holes == m.holes
    top = m.writer_sequence("w")
    assert m2.apply(write(99, [b"late"], pids=[top - 1])).written == 1
    assert m2.apply(write(99, [b"old"], pids=[2])).duplicates == 1  # a forgotten hole: a duplicate
    lg2.close()


def test_a_snapshot_without_holes_restores(log, tmp_path):
    """Snapshots taken before holes were kept have five fields."""
    m = sm.StreamMachine(log)
    m.restore(sm._enc.encode([3, [["w", 3]], [], 0, 0]))
    assert m.writer_sequence("w") == 3 and m.holes == {}


def test_without_publishing_ids_nothing_is_deduplicated(log):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"a"], writer="", pids=None))
    m.apply(write(2, [b"a"], writer="", pids=None))
    assert stored(log) == [(0, b"a"), (1, b"a")]


def test_tracked_offsets_are_kept_by_reference(log):
    m = sm.StreamMachine(log)
    assert m.apply(sm.track_entry("app", 5)) is None
    m.apply(sm.track_entry("app", 9))
    assert m.stored_offset("app") == 9 and m.stored_offset("none") is None


def test_a_restart_applies_the_raft_log_again_without_writing_twice(tmp_path):
    entries = [write(i, [f"m{i}".encode()], pids=[i]) for i in range(1, 6)]
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    for e in entries[:3]:
        m.apply(e)
    lg.close()
    lg = StreamLog(tmp_path / "s", fsync=False)  # the member restarts with its log of 3 chunks
    m = sm.StreamMachine(lg)
    answers = [m.apply(e) for e in entries]  # its Raft log is applied again from the start
    assert [a.first for a in answers] == [0, 1, 2, 3, 4]
    assert stored(lg) == [(i, f"m{i + 1}".encode()) for i in range(5)]
    assert lg.chunk_count == 5 and m.writer_sequence("w") == 5
    lg.close()


def test_a_restart_after_a_snapshot_numbers_on_from_it(tmp_path):
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    m.apply(write(1, [b"a"], pids=[1]))
    snap = m.snapshot()
    m.apply(write(2, [b"b"], pids=[2]))
    lg.close()
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    m.restore(snap)  # the log runs past the snapshot: the entry after it is applied again
    assert m.missing_from is None
    m.apply(write(2, [b"b"], pids=[2]))
    m.apply(write(3, [b"c"], pids=[3]))
    assert stored(lg) == [(0, b"a"), (1, b"b"), (2, b"c")]
    lg.close()


def test_a_restart_over_a_log_that_retention_shortened_numbers_as_before(tmp_path):
    entries = [write(i, [b"r" * 300], pids=[i]) for i in range(1, 9)]
    lg = StreamLog(tmp_path / "s", max_segment_bytes=1000, fsync=False)
    m = sm.StreamMachine(lg)
    for e in entries[:6]:
        m.apply(e)
    assert lg.retain(max_bytes=1000) > 0
    first = lg.first_offset
    assert first > 0
    lg.close()
    lg = StreamLog(tmp_path / "s", max_segment_bytes=1000, fsync=False)
    m = sm.StreamMachine(lg)  # no snapshot: the Raft log is applied again from its first entry
    answers = [m.apply(e) for e in entries]
    assert [a.first for a in answers] == list(range(8))
    assert [o for o, _r in stored(lg)] == list(range(first, 8))
    lg.close()


def test_an_entry_that_would_split_a_chunk_of_the_log_is_refused(log):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"a", b"b"], pids=[1, 2]))
    m2 = sm.StreamMachine(log)
    m2.apply(write(1, [b"a"], writer="x", pids=[1]))  # offset 0 is in the log: the chunk is there
    with pytest.raises(AssertionError):
        m2.apply(write(2, [b"b", b"c"], writer="x", pids=[2, 3]))  # offsets 1..2: the log ends at 2


def _source(tmp_path, n: int) -> tuple[StreamLog, sm.StreamMachine]:
    lg = StreamLog(tmp_path / "src", fsync=False)
    m = sm.StreamMachine(lg)
    for i in range(n):
        m.apply(write(i + 1, [f"m{i}".encode()], pids=[i + 1]))
    return lg, m


def test_a_snapshot_past_the_logs_end_leaves_a_gap_that_fill_closes(tmp_path):
    src_log, src = _source(tmp_path, 4)
    snap = src.snapshot()
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    m.restore(snap)
    assert m.missing_from == 0 and m.next_offset == 4 and m.committed == 0
    # entries committed after the snapshot wait for the gap to close
    w = m.apply(write(5, [b"m4"], pids=[5]))
    assert w.first == 4 and lg.next_offset == 0 and len(m.pending) == 1
    raw = [bytes(data) for _info, data in src_log.read(0, 1 << 30)]
    m.fill(raw[:2])
    assert m.missing_from == 2 and lg.next_offset == 2
    m.fill(raw[1:])  # a chunk it has already is ignored
    assert m.missing_from is None and not m.pending
    assert stored(lg) == [(i, f"m{i}".encode()) for i in range(5)]
    assert m.writer_sequence("w") == 5
    src_log.close()
    lg.close()


def test_fill_ignores_chunks_out_of_order(tmp_path):
    src_log, src = _source(tmp_path, 3)
    snap = src.snapshot()
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    m.restore(snap)
    raw = [bytes(data) for _info, data in src_log.read(0, 1 << 30)]
    m.fill([raw[2], raw[1]])
    assert lg.next_offset == 0 and m.missing_from == 0
    m.fill(raw)
    assert m.missing_from is None and lg.next_offset == 3
    src_log.close()
    lg.close()


def test_a_gap_below_what_any_member_has_restarts_the_log_there(tmp_path):
    src_log, src = _source(tmp_path, 6)
    snap = src.snapshot()
    lg = StreamLog(tmp_path / "s", fsync=False)
    m = sm.StreamMachine(lg)
    m.restore(snap)
    m.restart_at(4)  # retention removed offsets below 4 everywhere
    assert lg.first_offset == 4 and m.missing_from == 4
    raw = [bytes(data) for info, data in src_log.read(4, 1 << 30)]
    m.fill(raw)
    assert m.missing_from is None
    assert stored(lg) == [(4, b"m4"), (5, b"m5")]
    src_log.close()
    lg.close()


def test_a_snapshot_holds_the_writers_and_tracked_offsets(log, tmp_path):
    m = sm.StreamMachine(log)
    m.apply(write(1, [b"a"], pids=[7]))
    m.apply(sm.track_entry("app", 0))
    lg2 = StreamLog(tmp_path / "other", fsync=False)
    m2 = sm.StreamMachine(lg2)
    m2.restore(m.snapshot())
    assert m2.writer_sequence("w") == 7 and m2.stored_offset("app") == 0
    assert m2.apply(write(2, [b"a"], pids=[7])).duplicates == 1
    lg2.close()


# -- entries carry their records framed as a chunk's data


def test_framed_records_make_the_same_chunk_and_come_back_as_they_went():
    records = [b"", b"a", b"x" * 70_000, bytes(range(256))]
    data = chunk.frame(records)
    assert chunk.unframe(data, len(records)) == records
    assert chunk.encode_framed(data, 4, 1000, 3, 42, [b"eu"]) == chunk.encode(records, 1000, 3, 42, [b"eu"])
    head, crc = chunk.encode_head(data, 4, 1000, 3, 42, [b"eu"])
    whole = bytes(head) + data
    assert whole == chunk.encode_framed(data, 4, 1000, 3, 42, [b"eu"])
    h = chunk.check(whole)
    assert (h.crc, h.data_at, h.num_records) == (crc, len(head), 4)
    for bad, n in ((data[:-1], 4), (data + b"\x00", 4), (data, 5), (b"\x80\x00\x00\x01x", 1)):
        with pytest.raises(chunk.ChunkError):
            chunk.unframe(bad, n)


def test_an_entry_of_the_first_format_a_list_of_records_is_applied_as_before(log, tmp_path):
    """Raft logs and snapshots written before entries framed their records hold WRITE entries of
    nine fields with a list of records: they make the same chunks, deduplicated alike."""
    old = [sm._enc.encode([sm.WRITE, "n1", 1, 0, 1000, "w", [1, 2], [b"a", b"b"], None]),
           sm._enc.encode([sm.WRITE, "n1", 2, 0, 1000, "w", [2, 3], [b"b", b"c"], None])]
    m = sm.StreamMachine(log)
    assert [m.apply(e).duplicates for e in old] == [0, 1]
    new_log = StreamLog(tmp_path / "new", fsync=False)
    try:
        m2 = sm.StreamMachine(new_log)
        assert [m2.apply(e).duplicates for e in (write(1, [b"a", b"b"], pids=[1, 2]),
                                                 write(2, [b"b", b"c"], pids=[2, 3]))] == [0, 1]
        assert stored(log) == stored(new_log) == [(0, b"a"), (1, b"b"), (2, b"c")]
        assert [d for _i, d in log.read(0, 1 << 30)] == [d for _i, d in new_log.read(0, 1 << 30)]
    finally:
        new_log.close()
