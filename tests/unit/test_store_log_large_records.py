"""The segment log (hutch.store.segment_log) with records as large as its write buffer or
larger (a stream's batches in the Raft log): such a record goes to the OS at once, behind what
the buffer held, and the log reads, replays and recovers the same as with small records."""

from __future__ import annotations

import os

from hutch.store import SegmentLog


def test_a_record_that_fills_the_buffer_is_written_at_once_behind_the_buffered_ones(tmp_path):
    small = [os.urandom(100) for _ in range(3)]
    large = os.urandom(8192)
    with SegmentLog(tmp_path, write_buffer_bytes_max=4096) as log:
        seqs = [log.append(p) for p in small]
        assert log.written_seq == 0  # the small ones wait in the buffer
        big = log.append(large)
        assert log.written_seq == big  # the buffer and then the large record are with the OS
        after = log.append(b"tail")
        assert log.written_seq == big and log.durable_seq == 0
        assert [log.read(s).payload for s in [*seqs, big, after]] == [*small, large, b"tail"]
        log.sync()
        assert log.durable_seq == after
    with SegmentLog(tmp_path, write_buffer_bytes_max=4096) as log:
        assert log.recovery.corrupt == [] and log.recovery.torn_tail is None
        assert [r.payload for r in log.replay()] == [*small, large, b"tail"]


def test_large_records_across_segments_replay_in_order(tmp_path):
    payloads = [os.urandom(n) for n in (5000, 10, 9000, 4096, 1, 12000)]
    with SegmentLog(tmp_path, segment_bytes_max=16 * 1024, write_buffer_bytes_max=4096) as log:
        for p in payloads:
            log.append(p)
        assert [r.payload for r in log.replay()] == payloads
    with SegmentLog(tmp_path, segment_bytes_max=16 * 1024, write_buffer_bytes_max=4096) as log:
        assert log.recovery.records == len(payloads) and log.recovery.corrupt == []
        assert [r.payload for r in log.replay()] == payloads
