"""Recovery of the segment log after a crash: torn tails are truncated and logged, corrupt
records in the middle are reported with their position and skipped, every intact record
is recovered, nothing damaged is returned, and a real kill -9 loses nothing that sync()
reported durable.

A crash is simulated by copying the segment files while the log is still open (what the
disk holds at that moment) and damaging the copy; the kill -9 test kills a real process.
"""

import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.store import CorruptRegion, SegmentLog
from hutch.store import format as fmt


def _crash_image(log: SegmentLog, into: Path) -> Path:
    """The segment files as a crash would leave them now (the log stays open)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(log.directory):
        if name.endswith(".hseg"):
            shutil.copyfile(log.directory / name, into / name)
    return into


def _record_spans(directory: Path) -> dict[int, tuple[str, int, bytes]]:
    """seq -> (file, offset, the record's bytes) for every record in an intact log."""
    spans = {}
    for name in sorted(os.listdir(directory)):
        data = (directory / name).read_bytes()
        found, damage = fmt.scan_segment(data, fmt.SEGMENT_HEADER_BYTES, 1 << 24, 0, 1 << 64)
        assert damage == []
        for r in found:
            spans[r.seq] = (name, r.offset, data[r.offset:r.offset + fmt.RECORD_HEADER_BYTES + r.length])
    return spans


def _synced_upto(directory: Path, name: str, offset: int) -> None:
    """Set the log's record of how much of segment `name` was synced, as a crash would leave it
    when the bytes past `offset` had not been synced yet."""
    head = b"HSYN" + int(name.split(".")[0]).to_bytes(8, "little") + offset.to_bytes(8, "little")
    (directory / "SYNCED").write_bytes(head + zlib.crc32(head).to_bytes(4, "little"))


def _last_segment(directory: Path) -> str:
    return sorted(n for n in os.listdir(directory) if n.endswith(".hseg"))[-1]


def _write(directory: Path, payloads: list[bytes], segment_bytes_max: int = 1024) -> dict[int, bytes]:
    with SegmentLog(directory, segment_bytes_max=segment_bytes_max) as log:
        return {log.append(p, key=len(p)): p for p in payloads}


def test_torn_tail_is_truncated_and_logged(tmp_path, caplog):
    written = _write(tmp_path, [bytes([i]) * 100 for i in range(10)], segment_bytes_max=1 << 20)
    (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".hseg")]
    spans = _record_spans(tmp_path)
    last_offset = spans[10][1]
    os.truncate(tmp_path / name, last_offset + 60)  # record 10 was being written
    _synced_upto(tmp_path, name, last_offset)  # and records 1-9 synced
    with caplog.at_level(logging.WARNING, logger="hutch.store"):
        log = SegmentLog(tmp_path)
    with log:
        assert log.recovery.torn_tail == CorruptRegion(name, last_offset, 60)
        assert f"truncated torn tail at offset {last_offset} (60 bytes)" in caplog.text
        assert os.path.getsize(tmp_path / name) == last_offset
        assert {r.seq: r.payload for r in log.replay()} == {s: written[s] for s in range(1, 10)}
        assert log.append(b"after") == 10  # seq 10 was never durable; it is reused
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hutch.store"), SegmentLog(tmp_path) as log:
        assert log.recovery.torn_tail is None and caplog.text == ""
        assert [r.payload for r in log.replay()][-1] == b"after"


def test_damage_at_the_end_of_synced_data_is_corruption_not_a_torn_write(tmp_path, caplog):
    written = _write(tmp_path, [bytes([i]) * 100 for i in range(10)], segment_bytes_max=1 << 20)  # closed: synced
    name = _last_segment(tmp_path)
    size = os.path.getsize(tmp_path / name)
    last_offset = _record_spans(tmp_path)[10][1]
    data = bytearray((tmp_path / name).read_bytes())
    data[-1] ^= 0xFF  # bit rot in the last record, which was on disk
    (tmp_path / name).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="hutch.store"), SegmentLog(tmp_path) as log:
        assert log.recovery.torn_tail is None
        assert log.recovery.corrupt == [CorruptRegion(name, last_offset, size - last_offset)]
        assert f"corrupt data in segment {name} from offset {last_offset} to its end" in caplog.text
        assert os.path.getsize(tmp_path / name) == size  # left in place, not cut
        assert {r.seq: r.payload for r in log.replay()} == {s: written[s] for s in range(1, 10)}
        # seq 10 is given again: only records after it could name it, and they went with it
        assert log.append(b"after") == 10
    with SegmentLog(tmp_path) as log:
        assert [r.payload for r in log.replay()][-1] == b"after"


def test_a_last_segment_shorter_than_what_was_synced_of_it_is_reported(tmp_path, caplog):
    _write(tmp_path, [bytes([i]) * 100 for i in range(10)], segment_bytes_max=1 << 20)
    name = _last_segment(tmp_path)
    size = os.path.getsize(tmp_path / name)
    os.truncate(tmp_path / name, size - 50)
    with caplog.at_level(logging.ERROR, logger="hutch.store"), SegmentLog(tmp_path) as log:
        assert CorruptRegion(name, size - 50, 50) in log.recovery.corrupt
        assert f"{size} bytes of it were synced: 50 bytes that were on disk are gone" in caplog.text


def test_a_missing_last_segment_that_was_synced_is_reported(tmp_path, caplog):
    _write(tmp_path, [bytes([i]) * 100 for i in range(30)], segment_bytes_max=1024)
    name = _last_segment(tmp_path)
    size = os.path.getsize(tmp_path / name)
    os.unlink(tmp_path / name)
    with caplog.at_level(logging.ERROR, logger="hutch.store"), SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert CorruptRegion(name, 0, size) in log.recovery.corrupt
        assert f"segment {name}, of which {size} bytes were synced, is missing" in caplog.text


def test_the_synced_mark_follows_a_new_segment_at_once_and_the_rest_at_most_once_a_second(tmp_path):
    def mark() -> tuple[int, int]:
        raw = (tmp_path / "SYNCED").read_bytes()
        return int.from_bytes(raw[4:12], "little"), int.from_bytes(raw[12:20], "little")

    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        first = mark()
        assert first == (1, fmt.SEGMENT_HEADER_BYTES)  # written at open: everything recovered is synced
        log.append(b"x" * 100)
        log.sync()
        assert mark() == first  # within the second: not rewritten
        while len(log.segment_names()) < 2:
            log.append(b"y" * 100)
        log.sync()
        base, size = mark()
        assert base == int(_last_segment(tmp_path).split(".")[0]) and size <= os.path.getsize(tmp_path / _last_segment(tmp_path))
        log.append(b"z" * 100)
    assert mark() == (base, os.path.getsize(tmp_path / _last_segment(tmp_path)))  # a clean close marks it all


def test_zeroed_tail_left_by_the_filesystem_is_truncated(tmp_path):
    written = _write(tmp_path, [b"z" * 50] * 5)
    name = _last_segment(tmp_path)
    size = os.path.getsize(tmp_path / name)
    with open(tmp_path / name, "ab") as f:
        f.write(bytes(4096))
    _synced_upto(tmp_path, name, size)
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert log.recovery.torn_tail == CorruptRegion(name, size, 4096)
        assert {r.seq: r.payload for r in log.replay()} == written


def test_corrupt_record_in_the_middle_is_reported_with_its_position_and_the_rest_recovered(tmp_path, caplog):
    written = _write(tmp_path, [bytes([i]) * 80 for i in range(12)], segment_bytes_max=1 << 20)
    spans = _record_spans(tmp_path)
    name, offset, raw = spans[4]
    with open(tmp_path / name, "r+b") as f:
        f.seek(offset + 50)
        f.write(b"\xff")
    with caplog.at_level(logging.ERROR, logger="hutch.store"), SegmentLog(tmp_path) as log:
        assert log.recovery.corrupt == [CorruptRegion(name, offset, len(raw))]
        assert log.recovery.torn_tail is None
        assert f"corrupt data in segment {name} at offset {offset} ({len(raw)} bytes skipped)" in caplog.text
        assert {r.seq: r.payload for r in log.replay()} == {s: p for s, p in written.items() if s != 4}
        assert log.append(b"next") == 13


def test_bytes_that_are_no_record_between_two_records_do_not_become_part_of_either(tmp_path):
    """The index keeps no lengths: a record's length is where the next one starts. Garbage
    between two records of consecutive seqs must still not be read as part of the first."""
    written = _write(tmp_path, [bytes([i]) * (60 + i) for i in range(8)], segment_bytes_max=1 << 20)
    name, offset, raw = _record_spans(tmp_path)[3]
    path = tmp_path / name
    data = path.read_bytes()
    end = offset + len(raw)
    path.write_bytes(data[:end] + b"no record here" * 3 + data[end:])
    with SegmentLog(tmp_path) as log:
        assert [c.offset for c in log.recovery.corrupt] == [end]
        assert {r.seq: r.payload for r in log.replay()} == written
        assert all(log.read(s).payload == p for s, p in written.items())
        assert [bytes(r.payload) for r in log.read_many(sorted(written))] == [written[s] for s in sorted(written)]
        seg = log._segments[0]
        assert seg.live_bytes == sum(fmt.RECORD_HEADER_BYTES + len(p) for p in written.values())
        log.release_many([3, 4])
        assert seg.live_bytes == sum(fmt.RECORD_HEADER_BYTES + len(p) for s, p in written.items() if s not in (3, 4))


def test_corrupt_tail_of_a_sealed_segment_is_reported_and_later_segments_recovered(tmp_path):
    written = _write(tmp_path, [bytes([i]) * 100 for i in range(30)])
    spans = _record_spans(tmp_path)
    first = sorted(n for n in os.listdir(tmp_path) if n.endswith(".hseg"))[0]
    in_first = sorted(s for s, (n, _, _) in spans.items() if n == first)
    cut = spans[in_first[-1]][1] + 10
    os.truncate(tmp_path / first, cut)
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert log.recovery.corrupt == [CorruptRegion(first, spans[in_first[-1]][1], 10)]
        assert {r.seq: r.payload for r in log.replay()} == {s: p for s, p in written.items() if s != in_first[-1]}


def test_a_damaged_segment_header_does_not_hide_its_records(tmp_path):
    written = _write(tmp_path, [b"h" * 100] * 20)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".hseg"))
    for name in (names[0], names[-1]):
        with open(tmp_path / name, "r+b") as f:
            f.write(b"XXXX")
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert log.recovery.damaged_headers == [names[0], names[-1]]
        assert {r.seq: r.payload for r in log.replay()} == written
        log.append(b"more")
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:  # the active one was repaired
        assert log.recovery.damaged_headers == [names[0]]


def test_an_empty_segment_file_from_a_crash_during_creation_is_repaired(tmp_path):
    written = _write(tmp_path, [b"e" * 10] * 3)
    (tmp_path / fmt_name(4)).write_bytes(b"")
    with SegmentLog(tmp_path) as log:
        assert {r.seq: r.payload for r in log.replay()} == written
        assert log.append(b"four") == 4
    with SegmentLog(tmp_path) as log:
        assert log.recovery.damaged_headers == [] and log.read(4).payload == b"four"


def fmt_name(base_seq: int) -> str:
    return f"{base_seq:020d}.hseg"


def test_leftover_compaction_output_is_removed_and_the_original_kept(tmp_path):
    written = _write(tmp_path, [b"c" * 200] * 10)
    first = sorted(os.listdir(tmp_path))[0]
    (tmp_path / (first + ".compact")).write_bytes(b"half a rewrite")
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert log.recovery.removed_files == [first + ".compact"]
        assert {r.seq: r.payload for r in log.replay()} == written
    assert not (tmp_path / (first + ".compact")).exists()


def test_recovery_after_compaction_does_not_resurrect_deleted_records(tmp_path):
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        seqs = [log.append(b"%04d" % i * 25) for i in range(40)]
        log.sync()
        for s in seqs[:20]:
            log.release(s)  # whole segments go
        for s in seqs[20:35]:
            if s % 3:
                log.release(s)  # these segments get rewritten
        log.compact(live_ratio_max=0.9, rewrite_bytes_max=1 << 20)
        still_there = {s for s in seqs if log.contains(s)}
        assert not any(log.contains(s) for s in seqs[:20])
    with SegmentLog(tmp_path, segment_bytes_max=1024) as log:
        assert {r.seq for r in log.replay()} == still_there
        assert log.append(b"new") == 41


def test_records_synced_before_a_crash_survive_losing_everything_after_the_durable_point(tmp_path):
    with SegmentLog(tmp_path / "log", segment_bytes_max=2048) as log:
        synced = {log.append(bytes([i]) * 70): bytes([i]) * 70 for i in range(40)}
        durable = log.sync()
        for i in range(40, 60):
            log.append(bytes([i]) * 70)
        log.flush()  # written to the OS, never synced
        image = _crash_image(log, tmp_path / "crash")
    # The unsynced pages are lost: cut the file holding the first unsynced record there.
    spans = _record_spans(image)
    name, offset, _ = spans[durable + 1]
    os.truncate(image / name, offset + 5)
    for later in sorted(os.listdir(image)):
        if later > name:
            os.unlink(image / later)
    with SegmentLog(image, segment_bytes_max=2048) as log:
        assert {r.seq: r.payload for r in log.replay()} == synced
        assert log.recovery.torn_tail is not None


_mutation = st.tuples(st.sampled_from(["truncate", "flip", "zero"]), st.integers(0, 1 << 16),
                      st.floats(0, 1), st.integers(1, 300))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
       synced=st.booleans(), mutations=st.lists(_mutation, max_size=4))
def test_every_intact_record_is_recovered_and_nothing_damaged_is_returned(tmp_path_factory, payloads, synced,
                                                                          mutations):
    base = tmp_path_factory.mktemp("crash")
    with SegmentLog(base / "log", segment_bytes_max=1024) as log:
        written = {log.append(p, key=i): (i, p) for i, p in enumerate(payloads)}
        log.sync() if synced else log.flush()
        image = _crash_image(log, base / "image")
    spans = _record_spans(image)
    names = sorted(os.listdir(image))
    for kind, which, where, length in mutations:
        path = image / names[which % len(names)]
        data = bytearray(path.read_bytes())
        at = int(where * len(data))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and at < len(data):
            data[at] ^= 1 << (length % 8)
        elif kind == "zero":
            data[at:at + length] = bytes(len(data[at:at + length]))
        path.write_bytes(bytes(data))
    intact = set()
    for seq, (name, offset, raw) in spans.items():
        now = (image / name).read_bytes()
        if now[offset:offset + len(raw)] == raw:
            intact.add(seq)

    visited = []  # what recovery hands its owner as it checks each record (read once)
    with SegmentLog(image, segment_bytes_max=1024,
                    visit=lambda seq, key, payload: visited.append((seq, key, bytes(payload)))) as log:
        recovered = {r.seq: (r.key, r.payload) for r in log.replay()}
        assert visited == [(s, *recovered[s]) for s in sorted(recovered)]  # the same records, in seq order
        assert set(recovered) == intact
        assert all(recovered[s] == written[s] for s in recovered)  # nothing damaged comes back
        # the index (offsets only; lengths implied) finds each record beside the damage too
        assert all(log.read(s).payload == written[s][1] for s in recovered)
        seqs = sorted(recovered)
        assert [bytes(r.payload) for r in log.read_many(seqs)] == [written[s][1] for s in seqs]
        assert log.append(b"after") > max(recovered, default=0)
    with SegmentLog(image, segment_bytes_max=1024) as log:  # recovery leaves a clean log behind
        assert log.recovery.torn_tail is None
        assert {r.seq: (r.key, r.payload) for r in log.replay()}.items() >= recovered.items()


_CHILD = textwrap.dedent("""
    import sys
    from hutch.store import SegmentLog
    log = SegmentLog(sys.argv[1], segment_bytes_max=64 * 1024, write_buffer_bytes_max=256)
    n = 0
    while True:
        for _ in range(int(sys.argv[2])):
            n += 1
            log.append(n.to_bytes(8, "little") * (n % 40 + 1), key=n % 7)
        print(log.sync(), flush=True)
""")


def test_kill_9_loses_no_record_that_sync_reported_durable(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    beyond_durable = []
    for round_no in range(3):
        directory = tmp_path / f"round{round_no}"
        batch = rng.choice([1, 17, 200])
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(directory), str(batch)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines_before_kill = rng.randrange(1, 20)
            durable = 0
            for _ in range(lines_before_kill):
                line = proc.stdout.readline()
                assert line, f"child exited early: {proc.stderr.read()}"
                durable = int(line)
            # The kill lands a random time after the last report: mid-append, mid-write or
            # mid-fsync. (A jitter choosing the moment of the fault, not a wait for anything.)
            time.sleep(rng.uniform(0, 0.02))
            proc.kill()  # SIGKILL
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()
        assert durable > 0
        with SegmentLog(directory, segment_bytes_max=64 * 1024) as log:
            recovered = {r.seq: (r.key, r.payload) for r in log.replay()}
        context = f"seed {seed}, round {round_no}, batch {batch}, durable {durable}"
        assert set(range(1, durable + 1)) <= set(recovered), context
        for n, (key, payload) in recovered.items():
            assert key == n % 7 and payload == n.to_bytes(8, "little") * (n % 40 + 1), context
        # A process kill loses no page cache: what was written is a gapless prefix.
        assert sorted(recovered) == list(range(1, len(recovered) + 1)), context
        beyond_durable.append(len(recovered) - durable)
    # Records written but not yet synced at the kill are recovered too (page cache survives).
    assert any(n > 0 for n in beyond_durable), f"seed {seed}: every kill landed on a sync boundary"


def test_a_log_knows_whether_it_was_closed_cleanly(tmp_path):
    log = SegmentLog(tmp_path)
    assert not log.closed_cleanly  # nothing says how a new directory was left
    log.append(b"x")
    log.close()
    assert (tmp_path / "CLEAN").exists()
    log = SegmentLog(tmp_path)
    assert log.closed_cleanly and not (tmp_path / "CLEAN").exists()  # the mark goes as the log opens
    log.append(b"y")
    log.sync()
    log._close_fds()  # the process dies: no close
    log = SegmentLog(tmp_path)
    assert not log.closed_cleanly and [r.payload for r in log.replay()] == [b"x", b"y"]
    log.close()
