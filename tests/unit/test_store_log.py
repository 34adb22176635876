"""The segment log's contract while it runs: appends and reads, segment rollover, group
commit (what sync() reports durable), limits, release and compaction."""

import os
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.store import RecordTooLarge, SegmentLog, StoreClosed, StoreError, UnknownRecord
from hutch.store import format as fmt


def _on_disk_seqs(directory, seq_from: int = 0) -> set[int]:
    """Seqs of every complete, valid record in the segment files as they are now (only
    in the files that can hold seqs from `seq_from` on: files are named for their first seq)."""
    seqs = set()
    names = sorted(n for n in os.listdir(directory) if n.endswith(".hseg"))
    for name, next_name in zip(names, names[1:] + [None], strict=True):
        if next_name is not None and int(next_name.split(".")[0]) <= seq_from:
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        found, _damage = fmt.scan_segment(data, fmt.SEGMENT_HEADER_BYTES, 1 << 24, 0, 1 << 64)
        seqs.update(r.seq for r in found)
    return seqs


# -- appends, reads, rollover ------------------------------------------------------------

def test_round_trip_append_read_replay_and_reopen(tmp_path):
    payloads = [os.urandom(n) for n in (0, 1, 100, 1000, 5000)]
    with SegmentLog(tmp_path) as log:
        seqs = [log.append(p, key=i) for i, p in enumerate(payloads)]
        assert seqs == [1, 2, 3, 4, 5]
        assert [log.read(s).payload for s in seqs] == payloads  # read straight from the buffer
        assert [(r.seq, r.key, r.payload) for r in log.replay()] == list(zip(seqs, range(5), payloads, strict=True))
    with SegmentLog(tmp_path) as log:
        assert log.recovery.records == 5 and log.recovery.corrupt == [] and log.recovery.torn_tail is None
        assert [r.payload for r in log.replay()] == payloads
        assert [r.seq for r in log.replay(key=3)] == [4]
        assert log.append(b"next") == 6  # seqs keep growing across restarts


def test_segments_roll_over_at_segment_bytes_max_and_never_exceed_it(tmp_path):
    segment_bytes_max = 1024
    with SegmentLog(tmp_path, segment_bytes_max=segment_bytes_max) as log:
        for i in range(200):
            log.append(bytes([i % 256]) * (i % 97), key=i)
        log.sync()
        assert log.segment_count > 10
        for s in (1, 57, 123, 200):
            assert log.read(s).payload == bytes([(s - 1) % 256]) * ((s - 1) % 97)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".hseg")]
    assert len(files) > 10
    assert all(os.path.getsize(tmp_path / f) <= segment_bytes_max for f in files)
    # Each file is named for the first seq it holds, so seqs and names sort alike.
    with SegmentLog(tmp_path, segment_bytes_max=segment_bytes_max) as log:
        assert [r.seq for r in log.replay()] == list(range(1, 201))


def test_a_second_process_cannot_open_a_log_in_use(tmp_path):
    with SegmentLog(tmp_path):
        with pytest.raises(StoreError, match="in use"):
            SegmentLog(tmp_path)
    SegmentLog(tmp_path).close()  # free again once closed


def test_a_closed_log_refuses_work(tmp_path):
    log = SegmentLog(tmp_path)
    log.append(b"a")
    log.close()
    with pytest.raises(StoreClosed):
        log.append(b"b")
    with pytest.raises(StoreClosed):
        log.read(1)
    log.close()  # twice is fine


# -- group commit -------------------------------------------------------------------------

def test_group_commit_one_sync_makes_every_record_written_before_it_durable(tmp_path):
    with SegmentLog(tmp_path) as log:
        for i in range(3):
            log.append(b"m%d" % i)
        assert log.durable_seq == 0 and log.written_seq == 0  # buffered, not even written
        assert log.flush() == 3
        assert log.durable_seq == 0
        before = log.fsync_count
        assert log.sync() == 3
        assert log.fsync_count == before + 1
        log.append(b"m3")
        log.append(b"m4")
        assert log.durable_seq == 3
        assert log.sync() == 5
        assert log.sync() == 5
        assert log.fsync_count == before + 2  # nothing new: no fsync


def test_group_commit_covers_records_in_segments_sealed_since_the_last_sync(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=512) as log:
        for _ in range(40):
            log.append(b"r" * 50)
        assert log.segment_count > 3
        assert log.sync() == 40
        assert _on_disk_seqs(tmp_path) == set(range(1, 41))


def test_sync_in_a_worker_thread_reports_only_records_written_before_it(tmp_path):
    log = SegmentLog(tmp_path, segment_bytes_max=16 * 1024, write_buffer_bytes_max=2048)
    reported: list[int] = []
    checked: list[int] = []
    problems: list[str] = []
    stop = threading.Event()
    progress = threading.Condition()

    def syncer():
        try:
            check_while_appending()
        except BaseException as e:  # seen by the assertions below, never lost
            problems.append(repr(e))
            with progress:
                progress.notify()

    def check_while_appending():
        while not stop.is_set():
            durable = log.sync()
            if reported and durable < reported[-1]:
                problems.append(f"durable seq went down: {reported[-1]} -> {durable}")
            reported.append(durable)
            if durable and (not checked or durable > checked[-1]):
                seq_from = checked[-1] + 1 if checked else 1
                missing = set(range(seq_from, durable + 1)) - _on_disk_seqs(tmp_path, seq_from)
                with progress:
                    checked.append(durable)
                    progress.notify()
                if missing:
                    problems.append(f"sync reported {durable} durable but {sorted(missing)[:5]} are not in the files")

    worker = threading.Thread(target=syncer)
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # interleave the two threads finely
    worker.start()
    appended = 0
    try:
        # Append until the syncer has checked the files several times at growing durable
        # seqs, i.e. while appends went on; at most 3000 records ahead of the last check.
        while len(checked) < 6:
            with progress:
                if not progress.wait_for(lambda a=appended: problems or a - (checked[-1] if checked else 0) < 3000,
                                         timeout=30) or problems:
                    raise AssertionError(f"the syncer stopped or found a problem: {problems or 'no progress in 30 s'}")
            appended += 1
            log.append(appended.to_bytes(4, "little") * 25)
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(switch_interval_s)
    assert problems == []
    assert len(checked) >= 6
    assert log.sync() == appended
    log.close()
    assert _on_disk_seqs(tmp_path) == set(range(1, appended + 1))


# -- limits --------------------------------------------------------------------------------

def test_a_record_over_record_bytes_max_is_refused_and_one_at_the_limit_fits(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=4096, record_bytes_max=1000) as log:
        with pytest.raises(RecordTooLarge, match="record_bytes_max=1000"):
            log.append(b"x" * 1001)
        seq = log.append(b"x" * 1000)
        assert log.read(seq).payload == b"x" * 1000
        assert log.last_seq == 1  # the refused record took no seq


def test_limits_are_checked_when_the_log_is_opened(tmp_path):
    with pytest.raises(ValueError, match="segment_bytes_max"):
        SegmentLog(tmp_path, segment_bytes_max=100)
    with pytest.raises(ValueError, match="record_bytes_max"):
        SegmentLog(tmp_path, segment_bytes_max=4096, record_bytes_max=4096)
    with SegmentLog(tmp_path, segment_bytes_max=4096) as log:
        assert log.record_bytes_max == 4096 - fmt.SEGMENT_HEADER_BYTES - fmt.RECORD_HEADER_BYTES
        with pytest.raises(ValueError, match="key"):
            log.append(b"a", key=-1)
        with pytest.raises(ValueError, match="key"):
            log.append(b"a", key=1 << 64)


def test_the_write_buffer_is_bounded_by_write_buffer_bytes_max(tmp_path):
    with SegmentLog(tmp_path, write_buffer_bytes_max=4096) as log:
        for _ in range(10):
            log.append(b"b" * 1000)
        assert log.written_seq >= 7  # written out as the buffer filled, without a flush()
        assert log.durable_seq == 0


# -- release and compaction ------------------------------------------------------------------

def test_a_sealed_segment_whose_records_are_all_released_is_deleted(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=512) as log:
        seqs = [log.append(b"s" * 60) for _ in range(30)]
        names = log.segment_names()
        first_end = int(names[1].split(".")[0])  # segments are named for their first seq
        assert 1 < first_end < seqs[-1]
        for s in range(1, first_end):
            assert os.path.exists(tmp_path / names[0])
            log.release(s)
        assert not os.path.exists(tmp_path / names[0])
        assert log.segment_names() == names[1:]
        assert not log.contains(1)
        with pytest.raises(UnknownRecord):
            log.read(1)
        assert log.read(first_end).payload == b"s" * 60


def test_with_unlink_in_background_a_released_segments_file_goes_in_the_logs_own_thread(tmp_path, monkeypatch):
    """The segment leaves the log at once; its file is removed by another thread (unlinking a
    large segment with dirty pages took the caller tens of ms), and is gone once close() returns,
    before the clean close is recorded."""
    unlinked_by: list[str] = []
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".hseg"):
            unlinked_by.append(threading.current_thread().name)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    log = SegmentLog(tmp_path, segment_bytes_max=512, unlink_in_background=True)
    seqs = [log.append(b"s" * 60) for _ in range(30)]
    names = log.segment_names()
    first_end = int(names[1].split(".")[0])
    log.release_many(list(range(1, first_end)))
    assert log.segment_names() == names[1:] and not log.contains(1)  # out of the log at once
    log.close()
    assert not os.path.exists(tmp_path / names[0])
    assert unlinked_by and threading.current_thread().name not in unlinked_by
    with SegmentLog(tmp_path, segment_bytes_max=512) as again:
        assert again.closed_cleanly
        assert [r.seq for r in again.replay()] == seqs[first_end - 1:]


def test_the_active_segment_is_never_deleted_even_when_all_released(tmp_path):
    with SegmentLog(tmp_path) as log:
        s = log.append(b"only")
        log.release(s)
        assert log.segment_count == 1
        assert log.contains(s) and not log.is_live(s)
        assert log.append(b"next") == s + 1


def test_release_refuses_unknown_and_twice_released_records(tmp_path):
    with SegmentLog(tmp_path) as log:
        s = log.append(b"a")
        log.release(s)
        with pytest.raises(UnknownRecord, match="already released"):
            log.release(s)
        with pytest.raises(UnknownRecord):
            log.release(99)


def test_compaction_rewrites_mostly_settled_segments_keeping_live_records_and_seqs(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=2048) as log:
        seqs = [log.append(b"%06d" % i * 10, key=i % 4) for i in range(100)]
        log.sync()
        keep = {s for s in seqs if s % 10 == 0}
        for s in seqs:
            if s not in keep:
                log.release(s)
        sizes_before = sum(os.path.getsize(tmp_path / n) for n in log.segment_names())
        report = log.compact(live_ratio_max=0.5, rewrite_bytes_max=1 << 20)
        assert report.segments_rewritten >= 1 and report.bytes_reclaimed > 0
        sizes_after = sum(os.path.getsize(tmp_path / n) for n in log.segment_names())
        assert sizes_before - sizes_after == report.bytes_reclaimed
        for s in keep:
            assert log.read(s).payload == b"%06d" % (s - 1) * 10
        assert [r.seq for r in log.replay()] == sorted(keep)
    with SegmentLog(tmp_path, segment_bytes_max=2048) as log:
        # Rewritten segments lost their released records for good; the active segment's
        # released records come back (releases are the user's to replay).
        active_base = int(log.segment_names()[-1].split(".")[0])
        assert [r.seq for r in log.replay()] == sorted(keep | set(range(active_base, 101)))
        assert all(log.read(s).key == (s - 1) % 4 for s in keep)


def test_compaction_refuses_to_copy_a_corrupt_record_and_leaves_the_log_usable(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        seqs = [log.append(b"k" * 100) for _ in range(30)]
        log.sync()
        for s in seqs:
            if s % 5:
                log.release(s)
        with open(tmp_path / log.segment_names()[0], "r+b") as f:  # bit rot under a live record
            f.seek(fmt.SEGMENT_HEADER_BYTES + 4 * (fmt.RECORD_HEADER_BYTES + 100) + 40)
            f.write(b"!")
        with pytest.raises(StoreError, match="record 5 .* is corrupt"):
            log.compact(live_ratio_max=0.5, rewrite_bytes_max=1 << 20)
        with pytest.raises(StoreError, match="record 5 .* is corrupt"):
            log.read(5)
        # The segments it did not get to are not left marked as being compacted.
        for s in seqs:
            if s % 5 == 0 and s != 5:
                log.release(s)
        assert log.segment_count == 2  # all but the damaged segment and the active one deleted


def test_compaction_skips_segments_that_are_mostly_live(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        seqs = [log.append(b"l" * 100) for _ in range(30)]
        log.sync()
        log.release(seqs[0])
        assert log.compact(live_ratio_max=0.5).segments_rewritten == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=60),
       steps=st.lists(st.tuples(st.sampled_from(["release", "compact", "sync", "append"]),
                                st.integers(0, 10_000)), max_size=80))
def test_release_and_compaction_never_lose_a_live_record(tmp_path_factory, sizes, steps):
    directory = tmp_path_factory.mktemp("log")
    payload_of = {}
    live = set()
    with SegmentLog(directory, segment_bytes_max=1024) as log:
        for n in sizes:
            s = log.append(os.urandom(n))
            payload_of[s] = log.read(s).payload
            live.add(s)
        for op, arg in steps:
            if op == "release" and live:
                s = sorted(live)[arg % len(live)]
                log.release(s)
                live.discard(s)
            elif op == "compact":
                log.compact(live_ratio_max=(arg % 100) / 100, rewrite_bytes_max=arg)
            elif op == "sync":
                log.sync()
            elif op == "append":
                s = log.append(os.urandom(arg % 200), key=arg)
                payload_of[s] = log.read(s).payload
                live.add(s)
            for s in live:
                assert log.is_live(s)
        assert {r.seq: r.payload for r in log.replay()} == {s: payload_of[s] for s in live}
        assert all(log.read(s).payload == payload_of[s] for s in live)  # lengths implied by offsets
        for seg in log._segments:  # what compaction weighs, kept right through rewrites
            assert seg.live_bytes == sum(fmt.RECORD_HEADER_BYTES + len(payload_of[s])
                                         for s in live if seg.base_seq <= s < seg.end_seq)
        on_disk = {s for s in payload_of if log.contains(s)}
        assert live <= on_disk
    with SegmentLog(directory, segment_bytes_max=1024) as log:
        # After a restart, exactly the records that were still on disk are back, all live.
        assert {r.seq: r.payload for r in log.replay()} == {s: payload_of[s] for s in on_disk}
