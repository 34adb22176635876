"""The stream log's contract: chunks at dense offsets in segment files with an index each,
read back by offset across segments, found by offset, timestamp, epoch and type; a torn
tail cut on open at the last whole chunk; a replica's tail truncated; the oldest segments
retained away by size and age, as RabbitMQ's streams do."""

from __future__ import annotations

import os
import shutil
import zlib

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hutch.store.stream_log import (
    CHUNK_TYPE_TRACKING_DELTA,
    CHUNK_TYPE_TRACKING_SNAPSHOT,
    CHUNK_TYPE_USER,
    HEADER_BYTES,
    INDEX_RECORD_BYTES,
    StreamLog,
    StreamLogClosed,
    StreamLogError,
    encode_index_record,
    index_file_name,
    segment_file_name,
)


def chunk_bytes(chunk_id: int, size: int) -> bytes:
    """Deterministic, distinct contents for a chunk."""
    seed = chunk_id.to_bytes(8, "little")
    return (seed * (size // 8 + 1))[:size]


def fill(log: StreamLog, n: int, size: int = 100, num_records: int = 10, epoch: int = 1,
         timestamp0: int = 1_000, chunk_type: int = CHUNK_TYPE_USER) -> list[int]:
    ids = []
    for k in range(n):
        cid = log.next_offset
        log.append(chunk_bytes(cid, size), cid, num_records, timestamp0 + k, epoch, chunk_type)
        ids.append(cid)
    return ids


def files(directory, suffix: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(suffix))


# -- appends and reads ------------------------------------------------------------------

def test_offsets_are_dense_and_chunks_read_back_across_segments_and_reopen(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=1_000, fsync=False) as log:
        assert (log.first_offset, log.next_offset, log.last_chunk, log.segment_count) == (0, 0, None, 1)
        ids = fill(log, 30, size=100, num_records=10)
        assert ids == list(range(0, 300, 10))
        assert log.next_offset == 300
        assert log.segment_count > 3
        got = log.read(0, 1 << 30)
        assert [c.chunk_id for c, _ in got] == ids
        assert all(bytes(b) == chunk_bytes(c.chunk_id, 100) for c, b in got)
        assert log.last_chunk.chunk_id == 290
    # Segments are named for their first chunk id, 20 digits, with one index each.
    segs = files(tmp_path, ".segment")
    assert segs[0] == "00000000000000000000.segment"
    assert [s.replace(".segment", ".index") for s in segs] == files(tmp_path, ".index")
    assert all(os.path.getsize(tmp_path / s) <= 1_000 for s in segs)
    assert sum(os.path.getsize(tmp_path / s) for s in segs) == HEADER_BYTES * len(segs) + 30 * 100
    with StreamLog(tmp_path, max_segment_bytes=1_000) as log:
        assert log.recovery.clean and log.recovery.notes == []
        assert (log.recovery.chunks, log.first_offset, log.next_offset) == (30, 0, 300)
        assert [c.chunk_id for c, _ in log.read(0, 1 << 30)] == ids
        log.append(b"x", 300, 1, 5_000, 1)
        assert log.next_offset == 301


def test_segment_files_hold_the_chunks_back_to_back_as_given(tmp_path):
    chunks = [os.urandom(n) for n in (1, 50, 333)]
    with StreamLog(tmp_path, fsync=False) as log:
        off = 0
        for c in chunks:
            log.append(c, off, 2, 1, 1)
            off += 2
    data = (tmp_path / segment_file_name(0)).read_bytes()
    assert data[HEADER_BYTES:] == b"".join(chunks)
    assert os.path.getsize(tmp_path / index_file_name(0)) == HEADER_BYTES + 3 * INDEX_RECORD_BYTES


def test_read_starts_at_the_chunk_holding_the_offset_and_returns_whole_chunks(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)       # 4 chunks per segment
        assert [c.chunk_id for c, _ in log.read(35, 250)] == [30, 40]
        assert [c.chunk_id for c, _ in log.read(35, 1)] == [30]   # one chunk even if larger
        assert [c.chunk_id for c, _ in log.read(30, 500)] == [30, 40, 50, 60, 70]  # across a boundary
        assert log.read(100, 1000) == []
        assert log.read(10_000, 1000) == []


def test_read_crosses_segments_with_one_read_per_segment(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
        ranges = log.segment_ranges(20, 10_000)
        assert [[c.chunk_id for c in r.chunks] for r in ranges] == [[20, 30], [40, 50, 60, 70], [80, 90]]
        for r in ranges:
            assert r.length == sum(c.size for c in r.chunks)
            assert os.pread(r.fd, r.length, r.position) == b"".join(chunk_bytes(c.chunk_id, 100) for c in r.chunks)


def test_the_byte_ranges_can_go_straight_to_a_socket_with_sendfile(tmp_path):
    import socket
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 6, size=100, num_records=1)
        a, b = socket.socketpair()
        with a, b:
            sent = 0
            for r in log.segment_ranges(0, 10_000):
                sent += os.sendfile(a.fileno(), r.fd, r.position, r.length)
            received = b""
            while len(received) < sent:
                received += b.recv(65536)
        assert received == b"".join(chunk_bytes(i, 100) for i in range(6))


def test_reading_below_the_first_offset_starts_at_the_first_chunk(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
        assert log.retain(max_bytes=700) == 1
        assert log.first_offset == 40
        assert [c.chunk_id for c, _ in log.read(0, 150)] == [40]
        assert log.chunk_containing(5) is None


def test_chunk_containing_finds_the_chunk_by_any_of_its_offsets(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
        for offset in (0, 9, 10, 45, 79, 80, 99):
            assert log.chunk_containing(offset).chunk_id == offset // 10 * 10
        assert log.chunk_containing(100) is None
        assert log.chunk_containing(-1) is None


def test_append_refuses_an_offset_other_than_next_and_an_epoch_that_goes_down(tmp_path):
    with StreamLog(tmp_path, fsync=False) as log:
        log.append(b"a", 0, 5, 1, 3)
        with pytest.raises(StreamLogError, match="not the next offset 5"):
            log.append(b"b", 6, 1, 1, 3)
        with pytest.raises(StreamLogError, match="epoch 2 is below"):
            log.append(b"b", 5, 1, 1, 2)
        with pytest.raises(ValueError):
            log.append(b"", 5, 1, 1, 3)
        with pytest.raises(ValueError):
            log.append(b"b", 5, 0, 1, 3)
        with pytest.raises(ValueError):
            log.append(b"b", 5, 1, 1, 3, chunk_type=7)
        assert log.next_offset == 5


def test_a_chunk_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=100, fsync=False) as log:
        log.append(b"a" * 10, 0, 1, 1, 1)
        log.append(b"b" * 500, 1, 1, 1, 1)
        log.append(b"c" * 10, 2, 1, 1, 1)
        assert log.segment_names() == [segment_file_name(0), segment_file_name(1), segment_file_name(2)]
        assert [bytes(b) for _, b in log.read(0, 10_000)] == [b"a" * 10, b"b" * 500, b"c" * 10]


def test_sync_moves_the_synced_offset(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=300) as log:
        assert log.synced_offset == 0
        fill(log, 5, size=100, num_records=4)
        assert log.synced_offset == 0
        assert log.sync() == 20 == log.synced_offset
        count = log.fsync_count
        assert log.sync() == 20 and log.fsync_count == count  # nothing new: no fsync


def test_a_worker_thread_syncs_while_the_owner_appends_across_segments(tmp_path):
    import threading
    with StreamLog(tmp_path, max_segment_bytes=2_000) as log:
        stop = threading.Event()
        seen: list[int] = []
        errors: list[BaseException] = []

        def syncer():
            try:
                while not stop.is_set():
                    seen.append(log.sync())
            except BaseException as e:  # reported by the assertion below
                errors.append(e)

        worker = threading.Thread(target=syncer)
        worker.start()
        try:
            fill(log, 300, size=150, num_records=2)
        finally:
            stop.set()
            worker.join()
        assert errors == []
        assert seen == sorted(seen) and all(0 <= s <= 600 and s % 2 == 0 for s in seen)
        assert log.sync() == 600
        assert log.segment_count > 20
    with StreamLog(tmp_path, max_segment_bytes=2_000) as log:
        assert log.recovery.clean and log.next_offset == 600


def test_a_second_process_cannot_open_a_log_in_use_and_a_closed_log_refuses_work(tmp_path):
    log = StreamLog(tmp_path, fsync=False)
    with pytest.raises(StreamLogError, match="in use"):
        StreamLog(tmp_path)
    log.close()
    with pytest.raises(StreamLogClosed):
        log.append(b"a", 0, 1, 1, 1)
    StreamLog(tmp_path).close()


def test_delete_removes_the_directory(tmp_path):
    log = StreamLog(tmp_path / "s", fsync=False)
    fill(log, 3)
    log.delete()
    assert not (tmp_path / "s").exists()


# -- lookups ----------------------------------------------------------------------------

def test_first_chunk_at_or_after_a_timestamp(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        for k in range(10):
            log.append(b"x" * 100, k * 10, 10, 1_000 + 100 * k, 1)
        assert log.first_chunk_at_or_after_timestamp(0).chunk_id == 0
        assert log.first_chunk_at_or_after_timestamp(1_000).chunk_id == 0
        assert log.first_chunk_at_or_after_timestamp(1_001).chunk_id == 10
        assert log.first_chunk_at_or_after_timestamp(1_450).chunk_id == 50  # in the second segment
        assert log.first_chunk_at_or_after_timestamp(1_900).chunk_id == 90
        assert log.first_chunk_at_or_after_timestamp(1_901) is None


def test_epochs_say_where_each_leader_epoch_starts_and_survive_reopen_and_truncate(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 3, epoch=1)
        fill(log, 4, epoch=2)
        fill(log, 2, epoch=5)
        assert log.epochs() == [(1, 0), (2, 30), (5, 70)]
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.epochs() == [(1, 0), (2, 30), (5, 70)]
        assert log.truncate(70) == 70
        assert log.epochs() == [(1, 0), (2, 30)]
        fill(log, 1, epoch=6)
        assert log.epochs() == [(1, 0), (2, 30), (6, 70)]
        assert log.retain(max_bytes=500) >= 1
        assert log.epochs()[0] == (2, log.first_offset)


def test_the_latest_tracking_snapshot_is_found_from_the_end(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 2)
        fill(log, 1, num_records=1, chunk_type=CHUNK_TYPE_TRACKING_SNAPSHOT)
        fill(log, 3)
        fill(log, 1, num_records=1, chunk_type=CHUNK_TYPE_TRACKING_SNAPSHOT)
        fill(log, 1, num_records=1, chunk_type=CHUNK_TYPE_TRACKING_DELTA)
        fill(log, 2)
        assert log.last_chunk_of_type(CHUNK_TYPE_TRACKING_SNAPSHOT).chunk_id == 51
        assert [c.chunk_id for c in log.iter_chunks(chunk_type=CHUNK_TYPE_TRACKING_SNAPSHOT)] == [20, 51]
        assert [c.chunk_id for c in log.iter_chunks(reverse=True)][:3] == [63, 53, 52]
        assert log.last_chunk_of_type(CHUNK_TYPE_TRACKING_DELTA).chunk_id == 52


def test_the_filter_size_is_kept_with_the_chunk(tmp_path):
    with StreamLog(tmp_path, fsync=False) as log:
        log.append(b"chunk", 0, 1, 1, 1, filter=b"f" * 16)
        log.append(b"chunk", 1, 1, 1, 1)
    with StreamLog(tmp_path, fsync=False) as log:
        assert [c.filter_size for c in log.iter_chunks()] == [16, 0]


# -- truncation ----------------------------------------------------------------------------

def test_truncate_then_append_continues_at_the_cut(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)       # segments at 0, 40, 80
        assert log.truncate(55) == 60                  # inside chunk 50: it stays
        assert log.segment_names() == [segment_file_name(0), segment_file_name(40)]
        assert log.truncate(40) == 40                  # a segment's first chunk: the segment goes
        assert log.segment_names() == [segment_file_name(0)]
        fill(log, 2, size=100, num_records=10, epoch=2)
        assert [c.chunk_id for c, _ in log.read(0, 1 << 20)] == [0, 10, 20, 30, 40, 50]
        assert log.bytes == sum(os.path.getsize(tmp_path / s) for s in files(tmp_path, ".segment"))
        assert log.truncate(1000) == 60                # past the end: nothing to do
    with StreamLog(tmp_path, max_segment_bytes=450) as log:
        assert log.recovery.clean and log.next_offset == 60
        assert log.epochs() == [(1, 0), (2, 40)]


def test_truncate_to_the_first_offset_empties_the_log_but_keeps_the_offset(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
        log.retain(max_bytes=700)
        first = log.first_offset
        assert log.truncate(first) == first
        assert (log.first_offset, log.next_offset, log.last_chunk, log.epochs()) == (first, first, None, [])
        with pytest.raises(StreamLogError, match="below the first offset"):
            log.truncate(first - 1)
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert (log.first_offset, log.next_offset) == (first, first)
        fill(log, 1)
        assert log.next_offset == first + 10


def test_a_truncation_cut_short_by_a_crash_leaves_a_log_that_opens(tmp_path):
    """Truncation removes trailing segments index first, then shrinks the index before the
    segment: each state a crash can leave behind opens as a consistent log."""
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
    pristine = tmp_path.parent / (tmp_path.name + "-pristine")
    shutil.copytree(tmp_path, pristine)

    # 1. the last segment's index is gone, its segment not yet: it is taken as empty (it
    #    starts where the log now ends, so it stays as the active segment)
    os.unlink(tmp_path / index_file_name(80))
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 80 and log.chunk_count == 8
        assert any("was missing" in n for n in log.recovery.notes)
        assert log.recovery.segment_bytes_cut == 200

    # 1b. a segment without an index past where the log ends holds nothing: it goes
    shutil.rmtree(tmp_path)
    shutil.copytree(pristine, tmp_path)
    os.unlink(tmp_path / index_file_name(80))
    os.truncate(tmp_path / index_file_name(40), HEADER_BYTES + 2 * INDEX_RECORD_BYTES)
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 60 and log.segment_count == 2
        assert segment_file_name(80) in log.recovery.files_removed

    # 2. an index shrunk, its segment not yet: the unindexed bytes are cut
    shutil.rmtree(tmp_path)
    shutil.copytree(pristine, tmp_path)
    os.truncate(tmp_path / index_file_name(80), HEADER_BYTES + INDEX_RECORD_BYTES)
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 90
        assert log.recovery.segment_bytes_cut == 100
        assert os.path.getsize(tmp_path / segment_file_name(80)) == HEADER_BYTES + 100


# -- retention --------------------------------------------------------------------------------

def test_retention_by_bytes_deletes_whole_oldest_segments_never_the_active_one(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)      # segments: 408, 408, 208 bytes
        assert log.bytes == 1024
        assert log.retain(max_bytes=1024) == 0
        assert log.retain(max_bytes=1000) == 1       # 616 left: at most the limit
        assert (log.first_offset, log.bytes, log.segment_count) == (40, 616, 2)
        assert log.retain(max_bytes=0) == 1          # the active segment stays
        assert (log.first_offset, log.segment_count) == (80, 1)
        assert log.retain(max_bytes=0) == 0
    assert files(tmp_path, ".segment") == [segment_file_name(80)]
    assert files(tmp_path, ".index") == [index_file_name(80)]
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert (log.first_offset, log.next_offset) == (80, 100)


def test_retention_by_age_deletes_segments_whose_newest_chunk_is_too_old(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        for k in range(10):
            log.append(b"x" * 100, k, 1, 10_000 + 1_000 * k, 1)  # segments hold k 0-3, 4-7, 8-9
        now = 10_000 + 1_000 * 9
        assert log.retain(max_age_ms=6_000, now_ms=now) == 0     # segment 0's newest is 6 s old
        assert log.retain(max_age_ms=5_999, now_ms=now) == 1
        assert log.first_offset == 4
        assert log.retain(max_age_ms=0, now_ms=now + 1_000_000) == 1
        assert log.first_offset == 8 and log.segment_count == 1


def test_a_retention_cut_short_by_a_crash_leaves_a_log_that_opens(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
    os.unlink(tmp_path / segment_file_name(0))     # the segment went, its index not yet
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert (log.first_offset, log.next_offset) == (40, 100)
        assert log.recovery.files_removed == [index_file_name(0)]


# -- recovery of a torn tail -------------------------------------------------------------------

def _torn_log(tmp_path, n: int = 6) -> tuple[str, int, int]:
    """A log whose last chunk is alone in its segment; returns its segment base, the last
    chunk's position and size."""
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, n, size=150, num_records=3)
        last = log.last_chunk
    return last.segment, last.position, last.size


def _reopen_copy(src, dst, cut):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    cut(dst)
    return StreamLog(dst, max_segment_bytes=450, fsync=False)


@pytest.mark.parametrize("n", [5, 6])  # the last chunk first in its segment, or after another
def test_a_segment_cut_anywhere_in_the_last_chunk_opens_at_the_last_whole_chunk(tmp_path, n):
    src = tmp_path / "log"
    base, position, size = _torn_log(src, n)
    last_id = (n - 1) * 3
    for cut_at in range(position, position + size):
        def cut(d, cut_at=cut_at):
            os.truncate(d / segment_file_name(base), cut_at)
        with _reopen_copy(src, tmp_path / "copy", cut) as log:
            assert log.next_offset == last_id, cut_at
            assert log.recovery.chunks_dropped == 1
            assert any("torn tail" in note for note in log.recovery.notes)
            assert [c.chunk_id for c, _ in log.read(0, 1 << 20)] == list(range(0, last_id, 3))
            assert all(bytes(b) == chunk_bytes(c.chunk_id, 150) for c, b in log.read(0, 1 << 20))
            log.append(b"again", last_id, 1, 1, 1)  # and appends go on from there
        with StreamLog(tmp_path / "copy", max_segment_bytes=450, fsync=False) as log:
            assert log.recovery.clean and log.next_offset == last_id + 1


def test_an_index_cut_anywhere_in_the_last_record_opens_at_the_last_whole_chunk(tmp_path):
    src = tmp_path / "log"
    base, position, size = _torn_log(src, 6)
    idx_size = os.path.getsize(src / index_file_name(base))
    for cut_at in range(idx_size - INDEX_RECORD_BYTES, idx_size):
        def cut(d, cut_at=cut_at):
            os.truncate(d / index_file_name(base), cut_at)
        with _reopen_copy(src, tmp_path / "copy", cut) as log:
            assert log.next_offset == 15, cut_at
            assert log.recovery.segment_bytes_cut == size  # the unindexed chunk goes too
            assert os.path.getsize(tmp_path / "copy" / segment_file_name(base)) == position
            assert os.path.getsize(tmp_path / "copy" / index_file_name(base)) == idx_size - INDEX_RECORD_BYTES


def test_a_damaged_index_record_or_chunk_ends_the_log_there(tmp_path):
    src = tmp_path / "log"
    base, position, size = _torn_log(src, 6)
    idx = index_file_name(base)
    idx_size = os.path.getsize(src / idx)
    for byte in range(idx_size - INDEX_RECORD_BYTES, idx_size):   # every byte of the last record
        def flip(d, byte=byte):
            with open(d / idx, "r+b") as f:
                f.seek(byte)
                b = f.read(1)
                f.seek(byte)
                f.write(bytes([b[0] ^ 0x40]))
        with _reopen_copy(src, tmp_path / "copy", flip) as log:
            assert log.next_offset == 15, byte
    # the chunk's bytes changed but not its length: its CRC finds it
    def scribble(d):
        with open(d / segment_file_name(base), "r+b") as f:
            f.seek(position + size // 2)
            f.write(b"\x00\xff")
    with _reopen_copy(src, tmp_path / "copy", scribble) as log:
        assert log.next_offset == 15
        assert any("fails its CRC" in note for note in log.recovery.notes)


def test_a_damaged_last_chunk_before_an_empty_new_segment_takes_that_segment_with_it(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 4, size=100, num_records=10)        # segment 0 is full
    # a crash right after the next append created segment 40, before its chunk was written
    (tmp_path / segment_file_name(40)).write_bytes(b"HSTS\x00\x00\x00\x01")
    (tmp_path / index_file_name(40)).write_bytes(b"HSTI\x00\x00\x00\x01")
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.recovery.clean and log.next_offset == 40 and log.segment_count == 2
    with open(tmp_path / segment_file_name(0), "r+b") as f:  # chunk 30's bytes never reached the disk
        f.seek(HEADER_BYTES + 300)
        f.write(bytes(100))
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 30 and log.segment_names() == [segment_file_name(0)]
        assert segment_file_name(40) in log.recovery.files_removed
        fill(log, 2, size=100, num_records=10)
        assert log.segment_names() == [segment_file_name(0), segment_file_name(40)]


def test_a_chunk_written_without_its_index_record_is_cut(tmp_path):
    with StreamLog(tmp_path, fsync=False) as log:
        fill(log, 3, size=100, num_records=1)
    with open(tmp_path / segment_file_name(0), "ab") as f:
        f.write(b"z" * 77)
    with StreamLog(tmp_path, fsync=False) as log:
        assert log.next_offset == 3 and log.recovery.segment_bytes_cut == 77
        assert "unindexed bytes" in log.recovery.notes[0]


def test_a_torn_tail_in_an_earlier_segment_ends_the_log_and_the_later_segments_go(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
    os.truncate(tmp_path / segment_file_name(40), HEADER_BYTES + 250)  # chunk 60 cut short
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 60
        assert log.segment_names() == [segment_file_name(0), segment_file_name(40)]
        assert segment_file_name(80) in log.recovery.files_removed
        assert log.recovery.chunks_dropped == 4
        assert str(log.recovery).startswith(f"Stream log {tmp_path}: torn tail in segment {segment_file_name(40)}: "
                                            f"chunk 60 (100 bytes at position 208) is not wholly in the segment")


def test_a_gap_between_segments_refuses_to_open(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 10, size=100, num_records=10)
    os.rename(tmp_path / segment_file_name(80), tmp_path / segment_file_name(85))
    os.rename(tmp_path / index_file_name(80), tmp_path / index_file_name(85))
    with pytest.raises(StreamLogError, match="gap or an overlap"):
        StreamLog(tmp_path, max_segment_bytes=450, fsync=False)


def test_a_new_segment_left_without_its_index_or_header_is_taken_as_empty(tmp_path):
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        fill(log, 4, size=100, num_records=10)
    (tmp_path / segment_file_name(40)).write_bytes(b"HS")  # a crash while creating it
    with StreamLog(tmp_path, max_segment_bytes=450, fsync=False) as log:
        assert log.next_offset == 40 and log.segment_count == 2
        fill(log, 1, size=100, num_records=10)
        assert [c.chunk_id for c in log.iter_chunks()] == [0, 10, 20, 30, 40]


def test_a_chunk_appended_with_its_datas_crc_is_checked_whole_on_open(tmp_path):
    """With `split_crc` the log adds the chunk's first bytes to the CRC the caller gives for the
    rest; on open, damage on either side of the split is found, and chunks of both kinds mix."""
    split = 20
    with StreamLog(tmp_path, fsync=False) as log:
        fill(log, 2, size=100, num_records=10)  # the CRC of the bytes in order
        for _ in range(3):
            cid = log.next_offset
            data = chunk_bytes(cid, 100)
            log.append(data, cid, 10, 5_000, 1, split_crc=(split, zlib.crc32(data[split:])))
        with pytest.raises(ValueError, match="split point"):
            log.append(chunk_bytes(50, 100), 50, 10, 5_000, 1, split_crc=(101, 0))
    with StreamLog(tmp_path, fsync=False) as log:
        assert log.recovery.clean and log.next_offset == 50
        assert [c.chunk_id for c in log.iter_chunks()] == [0, 10, 20, 30, 40]
        last = log.last_chunk
    for at in (3, split + 40):  # in the bytes before the split, then after it
        copy = tmp_path.parent / f"copy-{at}"
        shutil.copytree(tmp_path, copy)
        with open(copy / segment_file_name(0), "r+b") as f:
            f.seek(last.position + at)
            b = f.read(1)
            f.seek(last.position + at)
            f.write(bytes([b[0] ^ 0x01]))
        with StreamLog(copy, fsync=False) as log:
            assert log.next_offset == 40, at
            assert any("fails its CRC" in note for note in log.recovery.notes)


def test_a_chunk_in_two_parts_is_stored_as_the_joined_chunk(tmp_path):
    whole = chunk_bytes(0, 300)
    head, rest = whole[:60], memoryview(whole)[60:]
    with StreamLog(tmp_path / "parts", fsync=False) as log:
        log.append((head, rest), 0, 10, 5_000, 1, split_crc=(60, zlib.crc32(rest)))
        with pytest.raises(ValueError, match="in parts"):
            log.append((head, rest), 10, 10, 5_000, 1, split_crc=(59, zlib.crc32(rest)))
        with pytest.raises(ValueError, match="in parts"):
            log.append((head, rest), 10, 10, 5_000, 1)
    with StreamLog(tmp_path / "whole", fsync=False) as log:
        log.append(whole, 0, 10, 5_000, 1, split_crc=(60, zlib.crc32(rest)))
    for name in (segment_file_name(0), index_file_name(0)):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    with StreamLog(tmp_path / "parts", fsync=False) as log:
        assert log.recovery.clean and [bytes(b) for _c, b in log.read(0, 1 << 20)] == [whole]


def test_index_records_carry_their_own_crc(tmp_path):
    rec = encode_index_record(7, 1, 2, 8, 100, 3, 0xDEAD, 0, 0)
    assert len(rec) == INDEX_RECORD_BYTES
    assert zlib.crc32(rec[:-4]).to_bytes(4, "little") == rec[-4:]


# -- a model ------------------------------------------------------------------------------------

class StreamLogMachine(RuleBasedStateMachine):
    """Random appends, syncs, reads, truncations, retention and reopens against a list of
    chunks kept in memory."""

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="stream-log-")
        self.log = StreamLog(self.dir, max_segment_bytes=600, fsync=False)
        self.chunks: list[tuple[int, int, int, int, int, bytes]] = []  # id, num, ts, epoch, type, bytes
        self.next = 0
        self.epoch = 0

    def teardown(self):
        self.log.delete()

    @rule(size=st.integers(1, 400), num=st.integers(1, 20), ts=st.integers(0, 10_000),
          new_epoch=st.booleans(), ctype=st.sampled_from([0, 0, 0, 1, 2]), split=st.integers(0, 60))
    def append(self, size, num, ts, new_epoch, ctype, split):
        self.epoch += new_epoch
        data = os.urandom(size)
        split_crc = (min(split, size), zlib.crc32(data[min(split, size):])) if split else None
        info = self.log.append(data, self.next, num, ts, self.epoch, ctype, split_crc=split_crc)
        assert info.chunk_id == self.next
        self.chunks.append((self.next, num, ts, self.epoch, ctype, data))
        self.next += num

    @rule()
    def sync(self):
        assert self.log.sync() == self.next

    @rule()
    def reopen(self):
        self.log.close()
        self.log = StreamLog(self.dir, max_segment_bytes=600, fsync=False)
        assert self.log.recovery.clean, self.log.recovery.notes

    @precondition(lambda self: self.chunks)
    @rule(data=st.data(), in_index=st.booleans())
    def crash_tearing_the_last_chunk(self, data, in_index):
        """The process dies while writing the last chunk: its segment bytes or its index
        record are cut anywhere; the log opens at the chunk before it."""
        last = self.log.last_chunk
        self.log.close()
        if in_index:
            path = os.path.join(self.dir, index_file_name(last.segment))
            end = os.path.getsize(path)
            os.truncate(path, data.draw(st.integers(end - INDEX_RECORD_BYTES, end - 1)))
        else:
            path = os.path.join(self.dir, segment_file_name(last.segment))
            os.truncate(path, data.draw(st.integers(last.position, last.position + last.size - 1)))
        self.log = StreamLog(self.dir, max_segment_bytes=600, fsync=False)
        assert not self.log.recovery.clean and self.log.recovery.notes
        dropped = self.chunks.pop()
        self.next = dropped[0]
        self.epoch = max([0] + [c[3] for c in self.chunks])

    @rule(data=st.data())
    def truncate(self, data):
        first = self.chunks[0][0] if self.chunks else self.next
        to = data.draw(st.integers(first, self.next + 5))
        self.chunks = [c for c in self.chunks if c[0] < to]
        self.next = self.chunks[-1][0] + self.chunks[-1][1] if self.chunks else min(to, self.next)
        assert self.log.truncate(to) == self.next
        self.epoch = max([self.epoch] + [c[3] for c in self.chunks])

    @rule(max_bytes=st.integers(0, 3000))
    def retain(self, max_bytes):
        before = self.log.segment_count
        deleted = self.log.retain(max_bytes=max_bytes)
        assert self.log.segment_count == before - deleted >= 1
        assert self.log.bytes <= max_bytes or self.log.segment_count == 1
        first = self.log.first_offset
        assert first == self.next or any(c[0] == first for c in self.chunks)
        self.chunks = [c for c in self.chunks if c[0] >= first]

    @precondition(lambda self: self.chunks)
    @rule(data=st.data(), max_bytes=st.integers(1, 2000))
    def read(self, data, max_bytes):
        offset = data.draw(st.integers(0, self.next + 3))
        got = self.log.read(offset, max_bytes)
        expect = [c for c in self.chunks if c[0] + c[1] > offset]
        if not expect:
            assert got == []
            return
        assert len(got) >= 1
        assert sum(c.size for c, _ in got) <= max_bytes or len(got) == 1
        for (info, b), c in zip(got, expect, strict=False):
            assert (info.chunk_id, info.num_records, info.timestamp, info.epoch, info.chunk_type) == c[:5]
            assert bytes(b) == c[5]
        if len(got) < len(expect):
            assert sum(c.size for c, _ in got) + len(expect[len(got)][5]) > max_bytes

    @precondition(lambda self: self.chunks)
    @rule(data=st.data())
    def lookups(self, data):
        offset = data.draw(st.integers(self.chunks[0][0], self.next - 1))
        holder = next(c for c in self.chunks if c[0] <= offset < c[0] + c[1])
        assert self.log.chunk_containing(offset).chunk_id == holder[0]
        ts = data.draw(st.integers(0, 10_001))
        at = next((c[0] for c in self.chunks if c[2] >= ts), None)
        found = self.log.first_chunk_at_or_after_timestamp(ts)
        assert (found.chunk_id if found else None) == at
        snap = next((c[0] for c in reversed(self.chunks) if c[4] == CHUNK_TYPE_TRACKING_SNAPSHOT), None)
        found = self.log.last_chunk_of_type(CHUNK_TYPE_TRACKING_SNAPSHOT)
        assert (found.chunk_id if found else None) == snap

    @invariant()
    def offsets_and_sizes(self):
        assert self.log.next_offset == self.next
        assert self.log.first_offset == (self.chunks[0][0] if self.chunks else self.next)
        epochs = []
        for c in self.chunks:
            if not epochs or epochs[-1][0] != c[3]:
                epochs.append((c[3], c[0]))
        assert self.log.epochs() == epochs
        on_disk = sum(os.path.getsize(os.path.join(self.dir, n)) for n in os.listdir(self.dir)
                      if n.endswith(".segment"))
        assert self.log.bytes == on_disk
        assert self.log.chunk_count == len(self.chunks)


StreamLogMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_stream_log_against_a_model = StreamLogMachine.TestCase


# -- real processes: kill -9, and a write that fails ----------------------------------------------

_CHILD_APPENDER = """
import os, sys
sys.path.insert(0, sys.argv[2])
from hutch.store.stream_log import StreamLog
log = StreamLog(sys.argv[1], max_segment_bytes=20_000)
k = 0
while True:
    for _ in range(5):
        cid = log.next_offset
        log.append((cid.to_bytes(8, "little") * 40)[: 100 + cid % 200], cid, 3, k, 1 + k // 50)
        k += 1
    print(log.sync(), flush=True)
"""


def test_every_offset_reported_synced_survives_a_kill_9(tmp_path):
    import signal
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    child = subprocess.Popen([sys.executable, "-c", _CHILD_APPENDER, str(tmp_path / "log"), src],
                             stdout=subprocess.PIPE, text=True)
    try:
        synced = 0
        for line in child.stdout:
            synced = int(line)
            if synced >= 3_000:  # several segments, still appending
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with StreamLog(tmp_path / "log", max_segment_bytes=20_000) as log:
        assert log.next_offset >= synced
        assert log.segment_count > 3
        got = log.read(0, 1 << 30)
        assert [c.chunk_id for c, _ in got] == list(range(0, log.next_offset, 3))
        for c, data in got:
            assert bytes(data) == (c.chunk_id.to_bytes(8, "little") * 40)[: 100 + c.chunk_id % 200]


_CHILD_FULL_DISK = """
import os, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from hutch.store.stream_log import StreamLog, StreamLogError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # a write past the limit fails with EFBIG
log = StreamLog(sys.argv[1], max_segment_bytes=1 << 20)
resource.setrlimit(resource.RLIMIT_FSIZE, (5_000, resource.RLIM_INFINITY))
try:
    while True:
        log.append(b"x" * 300, log.next_offset, 1, 1, 1)
except StreamLogError as e:
    print("failed:", e)
try:
    log.append(b"y", log.next_offset, 1, 1, 1)
except StreamLogError as e:
    print("then:", e)
print("indexed:", log.next_offset)
"""


def test_a_failed_write_stops_the_log_until_it_is_reopened(tmp_path):
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    out = subprocess.run([sys.executable, "-c", _CHILD_FULL_DISK, str(tmp_path / "log"), src],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert "append failed" in lines["failed"] and "File too large" in lines["failed"]
    assert "reopen it to recover" in lines["then"]
    indexed = int(lines["indexed"])
    assert indexed == (5_000 - HEADER_BYTES) // 300  # every chunk whose bytes all went in
    with StreamLog(tmp_path / "log") as log:
        assert log.next_offset == indexed
        assert log.recovery.segment_bytes_cut == 5_000 - HEADER_BYTES - indexed * 300
        log.append(b"z", indexed, 1, 1, 1)


def test_an_empty_log_can_start_at_any_offset_and_keeps_it_across_a_reopen(tmp_path):
    log = StreamLog(tmp_path / "s", fsync=False)
    log.reset(1000)
    assert log.first_offset == log.next_offset == 1000
    log.append(b"x" * 64, 1000, 3, 1, 1)
    assert log.next_offset == 1003
    with pytest.raises(StreamLogError):
        log.reset(5)  # not empty any more
    log.close()
    again = StreamLog(tmp_path / "s", fsync=False)
    assert (again.first_offset, again.next_offset) == (1000, 1003)
    assert [info.chunk_id for info, _b in again.read(0, 1 << 20)] == [1000]
    again.close()
