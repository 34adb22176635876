"""A stream replica's on-disk log: chunks of records in segment files with one index file
each, as RabbitMQ's osiris keeps a stream.

A stream is an append-only log of messages addressed by *offsets*. Writers batch
records into *chunks* (osiris's chunk format: a header, an optional filter, the records,
a trailer); this log stores each chunk as the opaque byte string the caller encoded and
keeps, beside it, the chunk's metadata: `chunk_id` (the offset of its first record),
`num_records`, `timestamp` (ms), `epoch` (the leader epoch that wrote it), `chunk_type`
(0 user data, 1 tracking delta, 2 tracking snapshot) and the size of its filter. Offsets
are dense: a chunk's id is the log's `next_offset`, which then grows by `num_records`.

Files (docs/design/store.md, "Stream logs"): segment files named for the first chunk id
they were created for, `%020d.segment`, holding an 8-byte header and then the chunks back
to back exactly as given, so a reader can hand a byte range of a segment straight to a
socket (`segment_ranges()`, for `os.sendfile`); and per segment an `.index` file of
fixed-size records, one per chunk, with the chunk's metadata, its place in the segment, a
CRC-32 of the chunk and a CRC-32 of the record. The chunk's CRC-32 runs over its bytes in order,
or, where the record names a split point `s` (its otherwise reserved field), over the bytes
from `s` on and then those before `s`: a writer that knows the CRC of a chunk's data (osiris's
header carries it) adds its header to that instead of reading the data a second time.
Opening a log reads the index files (in bulk), plus the chunks in its last `tail_check_bytes`
(16 MiB) to check them against their CRCs. A new segment starts when the current one would
pass `max_segment_bytes` (RabbitMQ's `x-stream-max-segment-size-bytes`).

Durability. An append writes the chunk to the segment, then its index record (two
writes, no fsync). `sync()` fdatasyncs everything written since the last sync (group
commit: append many, sync once) and moves `synced_offset`. A write or fsync that fails
stops the log taking writes until it is reopened (an fsync is never retried). Recovery
after any stop: an index record that is cut short, fails its CRC, does not follow its
predecessor, or points past the end of its segment ends the log there; so does a chunk in
the checked tail whose bytes fail their CRC. Both files are truncated at that point and
segment bytes past the last indexed chunk are cut. What was cut is told in `recovery` (a
`StreamRecoveryReport`), in sentences an operator can read.

Replicas. `truncate(next_offset)` drops a replica's unconfirmed tail after a leader change
(the index shrinks before the segment, so a crash in between leaves only unindexed bytes
that the next open cuts); `epochs()` lists where each leader epoch starts, for finding
where a replica's log diverges from a new leader's. `retain()` deletes whole oldest
segments by size or age, never the active one, as RabbitMQ's stream retention does.

Memory: the in-memory index is a set of `array` columns per segment, 46 bytes per chunk
(4.6 MB for ten million messages in chunks of 100).

Threads: `sync()` may run in a worker thread while the owner appends and reads; one lock
guards the index, a second makes syncs, truncations, retention and closing one at a time.

What it must never do: put a chunk at an offset other than `next_offset`; report an offset
synced before its bytes were fsynced; hand out bytes of a chunk that recovery did not
accept; delete the active segment to meet a retention limit.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import re
import shutil
import struct
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from isal.isal_zlib import crc32

from .fileio import write_all, writev_all

MAX_SEGMENT_BYTES_DEFAULT = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
CHUNK_BYTES_MAX = 0xFFFF_FFFF            # the index keeps a chunk's size as u32
FILTER_BYTES_MAX = 255                   # osiris: filter size is one byte
NUM_RECORDS_MAX = 0xFFFF_FFFF
TAIL_CHECK_BYTES_DEFAULT = 16 * 1024 * 1024  # read back and CRC-checked on open

CHUNK_TYPE_USER = 0
CHUNK_TYPE_TRACKING_DELTA = 1
CHUNK_TYPE_TRACKING_SNAPSHOT = 2

SEGMENT_SUFFIX = ".segment"
INDEX_SUFFIX = ".index"
LOCK_FILE = "LOCK"
SEGMENT_MAGIC = b"HSTS\x00\x00\x00\x01"  # magic and format version 1
INDEX_MAGIC = b"HSTI\x00\x00\x00\x01"
HEADER_BYTES = 8                         # both files start with their magic

# Index record, little-endian: chunk_id, timestamp, epoch, position, size, num_records,
# chunk CRC-32, chunk_type, filter size, the chunk CRC's split point (0: none), record CRC-32 (of
# the 48 bytes before it).
_INDEX_RECORD = struct.Struct("<qqqqIIIBBHI")
INDEX_RECORD_BYTES = _INDEX_RECORD.size  # 52
_INDEX_BODY_BYTES = INDEX_RECORD_BYTES - 4
_NAME = re.compile(r"^(\d{20})\.(segment|index)$")
_I64_MAX = (1 << 63) - 1

_fdatasync = getattr(os, "fdatasync", os.fsync)


class StreamLogError(Exception):
    """The stream log could not do what was asked."""


class StreamLogClosed(StreamLogError):
    pass


class ChunkInfo(NamedTuple):
    """One chunk's metadata as the index keeps it. `position` is the chunk's byte offset
    in the segment file named by `segment` (the segment's first chunk id)."""

    chunk_id: int
    num_records: int
    timestamp: int
    epoch: int
    chunk_type: int
    size: int
    position: int
    segment: int
    filter_size: int = 0

    @property
    def next_offset(self) -> int:
        """The offset just past this chunk's last record."""
        return self.chunk_id + self.num_records


class SegmentRange(NamedTuple):
    """A run of whole chunks, back to back in one segment file: `length` bytes at
    `position` of the file open as `fd` (for `os.sendfile`; the descriptor belongs to the
    log and stays valid until a `truncate`, `retain` or `close` removes or closes it)."""

    fd: int
    position: int
    length: int
    chunks: list[ChunkInfo]


@dataclass
class StreamRecoveryReport:
    """What opening the log found. `notes` says in words what was cut and why."""

    segments: int = 0
    chunks: int = 0
    first_offset: int = 0
    next_offset: int = 0
    segment_bytes_cut: int = 0
    index_bytes_cut: int = 0
    chunks_dropped: int = 0          # index records recovery removed
    files_removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_ms: float = 0.0

    @property
    def clean(self) -> bool:
        return not (self.segment_bytes_cut or self.index_bytes_cut or self.chunks_dropped
                    or self.files_removed)

    def __str__(self) -> str:
        if not self.notes:
            return (f"recovered {self.chunks} chunks in {self.segments} segments (offsets {self.first_offset} to "
                    f"{self.next_offset}) in {self.duration_ms:.1f} ms")
        return "; ".join(self.notes)


SPLIT_MAX = 0xFFFF  # a split point is kept in 16 bits


def chunk_crc(chunk: bytes | bytearray | memoryview, split: int = 0, tail_crc: int | None = None) -> int:
    """The CRC-32 an index record keeps for `chunk`: of its bytes in order (`split` 0), else of
    `chunk[split:]` (whose CRC-32 is `tail_crc` when the caller knows it) followed by
    `chunk[:split]`."""
    if not split:
        return crc32(chunk)
    with memoryview(chunk) as view:
        if tail_crc is None:
            tail_crc = crc32(view[split:])
        return crc32(view[:split], tail_crc)


def segment_file_name(first_chunk_id: int) -> str:
    return f"{first_chunk_id:020d}{SEGMENT_SUFFIX}"


def index_file_name(first_chunk_id: int) -> str:
    return f"{first_chunk_id:020d}{INDEX_SUFFIX}"


def encode_index_record(chunk_id: int, timestamp: int, epoch: int, position: int, size: int,
                        num_records: int, chunk_crc: int, chunk_type: int, filter_size: int, split: int = 0) -> bytes:
    body = _INDEX_RECORD.pack(chunk_id, timestamp, epoch, position, size, num_records, chunk_crc,
                              chunk_type, filter_size, split, 0)[:_INDEX_BODY_BYTES]
    return body + crc32(body).to_bytes(4, "little")


class _Segment:
    """The in-memory index of one segment: one array column per field, one row per chunk."""

    __slots__ = ("base", "seg_path", "idx_path", "size_bytes", "ids", "timestamps", "epochs",
                 "positions", "sizes", "nums", "crcs", "splits", "types", "filter_sizes", "read_fd")

    def __init__(self, base: int, directory: Path):
        self.base = base
        self.seg_path = directory / segment_file_name(base)
        self.idx_path = directory / index_file_name(base)
        self.size_bytes = HEADER_BYTES
        self.ids = array("q")
        self.timestamps = array("q")
        self.epochs = array("q")
        self.positions = array("q")
        self.sizes = array("I")
        self.nums = array("I")
        self.crcs = array("I")             # CRC-32 of each chunk's bytes (`chunk_crc`)
        self.splits = array("H")           # ... and its split point
        self.types = bytearray()
        self.filter_sizes = bytearray()
        self.read_fd: int | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def next_offset(self) -> int:
        """One past the last record this segment holds (its base when empty)."""
        return self.ids[-1] + self.nums[-1] if self.ids else self.base

    def info(self, i: int) -> ChunkInfo:
        return ChunkInfo(self.ids[i], self.nums[i], self.timestamps[i], self.epochs[i], self.types[i],
                         self.sizes[i], self.positions[i], self.base, self.filter_sizes[i])

    def find(self, offset: int) -> int:
        """Row of the chunk containing `offset` (the segment must hold it)."""
        return bisect.bisect_right(self.ids, offset) - 1

    def cut(self, n: int) -> None:
        """Keep the first n rows."""
        for col in (self.ids, self.timestamps, self.epochs, self.positions, self.sizes, self.nums,
                    self.crcs, self.splits, self.types, self.filter_sizes):
            del col[n:]
        self.size_bytes = self.positions[-1] + self.sizes[-1] if n else HEADER_BYTES

    def index_bytes(self) -> int:
        return HEADER_BYTES + len(self.ids) * INDEX_RECORD_BYTES

    def open_read(self) -> int:
        if self.read_fd is None:
            self.read_fd = os.open(self.seg_path, os.O_RDONLY | os.O_CLOEXEC)
        return self.read_fd

    def close_read(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None


class StreamLog:
    """A directory of stream segments: `append` chunks at `next_offset`, `sync` them, `read`
    them back by offset, look chunks up by offset, timestamp, epoch or type, and cut the log
    at either end (`truncate` the tail, `retain` to drop the oldest segments).

    Opening recovers the log; `recovery` says what that found. A `LOCK` file held with
    `flock` keeps a second process out of the directory. With `fsync=False` nothing is
    fsynced (for tests and for streams that accept losing their tail)."""

    __slots__ = ("directory", "max_segment_bytes", "fsync", "recovery", "_lock", "_sync_lock", "_advised",
                 "_segments", "_bases", "_seg_fd", "_idx_fd", "_unsynced_sealed", "_dir_dirty",
                 "_synced_offset", "_epochs", "_bytes", "_closed", "_failed", "_lock_fd", "_dir_fd",
                 "fsync_count", "tail_check_bytes")

    def __init__(self, directory: str | os.PathLike, max_segment_bytes: int = MAX_SEGMENT_BYTES_DEFAULT,
                 fsync: bool = True, tail_check_bytes: int = TAIL_CHECK_BYTES_DEFAULT):
        if max_segment_bytes <= HEADER_BYTES:
            raise ValueError(f"max_segment_bytes={max_segment_bytes} leaves no room for a chunk")
        self.directory = Path(directory)
        self.max_segment_bytes = max_segment_bytes
        self.fsync = fsync
        self.tail_check_bytes = tail_check_bytes
        self.fsync_count = 0
        self._lock = threading.Lock()        # the index, the files' ends, the fds
        self._sync_lock = threading.Lock()   # syncs, truncate, retain, close; taken before _lock
        self._segments: list[_Segment] = []
        self._bases: list[int] = []          # each segment's base, for bisect
        self._advised: dict[int, int] = {}   # segment base -> how far the kernel was asked to read ahead
        self._seg_fd = -1                    # the active segment's and index's append fds
        self._idx_fd = -1
        self._unsynced_sealed: list[tuple[int, int]] = []  # sealed (segment, index) fds to fsync, then close
        self._dir_dirty = False
        self._epochs: list[tuple[int, int]] = []  # (epoch, first chunk id of it)
        self._bytes = 0
        self._closed = False
        self._failed: str | None = None      # a write or fsync failed: no more writes until reopened
        self._synced_offset = 0
        self._lock_fd = -1
        self._dir_fd = -1
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StreamLogError(f"Stream log {self.directory}: in use by another process") from None
        try:
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.recovery = self._recover()
        except BaseException:
            self._close_fds()
            raise

    # -- opening and recovery ----------------------------------------------------------

    def _recover(self) -> StreamRecoveryReport:
        started = time.monotonic()
        report = StreamRecoveryReport()
        segs: set[int] = set()
        idxs: set[int] = set()
        for name in os.listdir(self.directory):
            m = _NAME.match(name)
            if m:
                (segs if m.group(2) == "segment" else idxs).add(int(m.group(1)))
        for base in sorted(idxs - segs):
            # retention and truncation remove a segment's index with the segment
            self._remove_file(self.directory / index_file_name(base), report,
                              "an index without its segment (a deletion that did not finish)")
        bases = sorted(segs)
        ended = False  # the log ended in an earlier segment: the rest goes
        for i, base in enumerate(bases):
            if ended:
                report.chunks_dropped += self._count_index_records(base)
                self._remove_file(self.directory / index_file_name(base), report, "past the end of the log")
                self._remove_file(self.directory / segment_file_name(base), report, "past the end of the log")
                continue
            expected = self._segments[-1].next_offset if self._segments else None
            last = i == len(bases) - 1
            if expected is not None and base != expected:
                if base > expected and not self._has_chunks(base):
                    # an empty segment left by a truncation that did not finish
                    ended = True
                    self._remove_file(self.directory / index_file_name(base), report, "past the end of the log")
                    self._remove_file(self.directory / segment_file_name(base), report,
                                      "past the end of the log")
                    continue
                raise StreamLogError(
                    f"Stream log {self.directory}: segment {segment_file_name(base)} starts at offset {base}, "
                    f"but the segment before it ends at offset {expected}; refusing to open a log with a "
                    f"gap or an overlap")
            if not (self.directory / index_file_name(base)).exists() and not last:
                raise StreamLogError(
                    f"Stream log {self.directory}: segment {segment_file_name(base)} has no index file "
                    f"and is not the last segment; refusing to open")
            seg, intact = self._load_segment(base, report)
            self._segments.append(seg)
            self._bases.append(base)
            if not intact:
                ended = True
        if not self._segments:
            self._create_segment(0)
        # Chunks read back from the page cache after a kill -9 may not be on disk yet.
        for seg in self._segments:
            for path in (seg.seg_path, seg.idx_path):
                self._fsync_path(path)
        self._fsync_dir()
        active = self._segments[-1]
        self._seg_fd = os.open(active.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._idx_fd = os.open(active.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._bytes = sum(s.size_bytes for s in self._segments)
        self._rebuild_epochs()
        self._synced_offset = self.next_offset
        self._check_tail(report)
        report.segments = len(self._segments)
        report.chunks = sum(len(s) for s in self._segments)
        report.first_offset = self.first_offset
        report.next_offset = self.next_offset
        report.duration_ms = (time.monotonic() - started) * 1000
        return report

    def _has_chunks(self, base: int) -> bool:
        return self._count_index_records(base) > 0

    def _count_index_records(self, base: int) -> int:
        try:
            size = os.path.getsize(self.directory / index_file_name(base))
        except FileNotFoundError:
            return 0
        return max(0, size - HEADER_BYTES) // INDEX_RECORD_BYTES

    def _remove_file(self, path: Path, report: StreamRecoveryReport, why: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        report.files_removed.append(path.name)
        report.notes.append(f"Stream log {self.directory}: removed {path.name}: {why}")

    def _load_segment(self, base: int, report: StreamRecoveryReport) -> tuple[_Segment, bool]:
        """Read one segment's index and check it against the segment file; cut a torn end.
        Returns the segment and whether its index ran to its end intact."""
        seg = _Segment(base, self.directory)
        seg_size = self._ensure_header(seg.seg_path, SEGMENT_MAGIC, report)
        self._ensure_header(seg.idx_path, INDEX_MAGIC, report)
        with open(seg.idx_path, "rb") as f:
            raw = f.read()
        n_whole = (len(raw) - HEADER_BYTES) // INDEX_RECORD_BYTES
        view = memoryview(raw)[HEADER_BYTES:HEADER_BYTES + n_whole * INDEX_RECORD_BYTES]
        rows = []
        why = None
        expect_id, expect_pos = base, HEADER_BYTES
        for k, rec in enumerate(_INDEX_RECORD.iter_unpack(view)):
            start = k * INDEX_RECORD_BYTES
            chunk_id, _ts, _ep, pos, size, num, _ccrc, ctype, _fs, _res, rcrc = rec
            if crc32(view[start:start + _INDEX_BODY_BYTES]) != rcrc:
                why = f"index record {k} fails its CRC"
            elif chunk_id != expect_id or pos != expect_pos or num == 0:
                why = f"index record {k} (chunk {chunk_id} at {pos}) does not follow the chunk before it"
            elif pos + size > seg_size:
                why = (f"chunk {chunk_id} ({size} bytes at position {pos}) is not wholly in the segment "
                       f"({seg_size} bytes)")
            if why is not None:
                break
            rows.append(rec)
            expect_id, expect_pos = chunk_id + num, pos + size
        view.release()
        if why is None and len(raw) > HEADER_BYTES + n_whole * INDEX_RECORD_BYTES:
            why = f"the index ends in a partial record ({(len(raw) - HEADER_BYTES) % INDEX_RECORD_BYTES} bytes)"
        if rows:
            cols = list(zip(*rows, strict=True))
            seg.ids = array("q", cols[0])
            seg.timestamps = array("q", cols[1])
            seg.epochs = array("q", cols[2])
            seg.positions = array("q", cols[3])
            seg.sizes = array("I", cols[4])
            seg.nums = array("I", cols[5])
            seg.crcs = array("I", cols[6])
            seg.splits = array("H", cols[9])
            seg.types = bytearray(cols[7])
            seg.filter_sizes = bytearray(cols[8])
        seg.size_bytes = expect_pos
        intact = why is None
        dropped = (n_whole - len(rows)) if why else 0
        self._cut_files(seg, len(raw), seg_size, report, why, dropped)
        return seg, intact

    def _ensure_header(self, path: Path, magic: bytes, report: StreamRecoveryReport) -> int:
        """Make the file start with its header (a crash can leave a new file short or empty);
        return its size."""
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
            size = os.path.getsize(path)
        except FileNotFoundError:
            head, size = b"", -1
        if head == magic:
            return size
        if len(head) == HEADER_BYTES:
            raise StreamLogError(f"Stream log {self.directory}: {path.name} is not a stream log file "
                                 f"(its header is {head!r})")
        with open(path, "wb") as f:
            f.write(magic)
        if size > 0:
            report.notes.append(f"Stream log {self.directory}: {path.name} had a partial header "
                                f"({size} bytes); rewritten")
        elif size < 0 and path.suffix == INDEX_SUFFIX:
            report.notes.append(f"Stream log {self.directory}: {path.name} was missing; "
                                f"its segment is taken as empty")
        return HEADER_BYTES

    def _cut_files(self, seg: _Segment, idx_size: int, seg_size: int, report: StreamRecoveryReport,
                   why: str | None, dropped: int) -> None:
        """Truncate the index after the accepted records and the segment after their chunks."""
        idx_keep = seg.index_bytes()
        seg_keep = seg.size_bytes
        if idx_size > idx_keep:
            os.truncate(seg.idx_path, idx_keep)
            report.index_bytes_cut += idx_size - idx_keep
        if seg_size > seg_keep:
            os.truncate(seg.seg_path, seg_keep)
            report.segment_bytes_cut += seg_size - seg_keep
        report.chunks_dropped += dropped
        if why is not None:
            report.notes.append(
                f"Stream log {self.directory}: torn tail in segment {seg.seg_path.name}: {why}; the log ends "
                f"at offset {seg.next_offset} ({idx_size - idx_keep} index bytes and "
                f"{max(0, seg_size - seg_keep)} segment bytes cut, {_chunks(dropped)} dropped)")
        elif seg_size > seg_keep:
            report.notes.append(
                f"Stream log {self.directory}: cut {seg_size - seg_keep} unindexed bytes at the end of "
                f"segment {seg.seg_path.name} (a chunk whose index record was never written)")

    def _check_tail(self, report: StreamRecoveryReport) -> None:
        """Read back the chunks in the last `tail_check_bytes` of the log and check each
        against the CRC its index record holds: an index record can reach the disk before
        its chunk's bytes do, and only what was written after the last fsync can be torn.
        The first chunk that fails ends the log there (truncated as a replica's tail is)."""
        total = 0
        start = self.next_offset
        for chunk in self.iter_chunks(reverse=True):
            if total >= self.tail_check_bytes:
                break
            total += chunk.size
            start = chunk.chunk_id
        for r in self.segment_ranges(start, total):
            data = memoryview(_pread_all(r.fd, r.length, r.position))
            seg = self._segments[bisect.bisect_right(self._bases, r.chunks[0].chunk_id) - 1]
            first_row = seg.find(r.chunks[0].chunk_id)
            for k, c in enumerate(r.chunks):
                begin = c.position - r.position
                row = first_row + k
                if chunk_crc(data[begin:begin + c.size], seg.splits[row]) != seg.crcs[row]:
                    data.release()
                    chunks_before, seg_names = self.chunk_count, set(self.segment_names())
                    size_before = self._bytes
                    self.truncate(c.chunk_id)
                    report.chunks_dropped += chunks_before - self.chunk_count
                    report.segment_bytes_cut += size_before - self._bytes
                    report.files_removed += sorted(seg_names - set(self.segment_names()))
                    report.notes.append(
                        f"Stream log {self.directory}: torn tail: chunk {c.chunk_id} ({c.size} bytes at position "
                        f"{c.position} in segment {segment_file_name(c.segment)}) fails its CRC; the log ends at "
                        f"offset {self.next_offset} ({_chunks(chunks_before - self.chunk_count)} dropped)")
                    return
            data.release()

    def _rebuild_epochs(self) -> None:
        epochs: list[tuple[int, int]] = []
        for seg in self._segments:
            for chunk_id, epoch in zip(seg.ids, seg.epochs, strict=True):
                if not epochs or epochs[-1][0] != epoch:
                    epochs.append((epoch, chunk_id))
        self._epochs = epochs

    # -- files --------------------------------------------------------------------------

    def _create_segment(self, base: int) -> None:
        """Create an empty segment and its index (segment first: an index never exists
        without its segment except while one is deleted). Caller holds _lock or is __init__."""
        seg = _Segment(base, self.directory)
        for path, magic in ((seg.seg_path, SEGMENT_MAGIC), (seg.idx_path, INDEX_MAGIC)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, magic)
            finally:
                os.close(fd)
        self._segments.append(seg)
        self._bases.append(base)
        self._bytes += HEADER_BYTES
        self._dir_dirty = True

    def _fsync_path(self, path: Path) -> None:
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _fsync_dir(self) -> None:
        if self.fsync:
            os.fsync(self._dir_fd)
        self._dir_dirty = False

    def _delete_segment_files(self, seg: _Segment, index_first: bool) -> None:
        """Unlink a segment's two files. Retention removes the segment first (a leftover
        index is deleted at the next open); truncation removes the index first (a leftover
        segment without an index is taken as empty)."""
        seg.close_read()
        paths = (seg.idx_path, seg.seg_path) if index_first else (seg.seg_path, seg.idx_path)
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._dir_dirty = True

    # -- writing ------------------------------------------------------------------------

    def append(self, chunk: bytes | bytearray | memoryview | tuple, chunk_id: int, num_records: int, timestamp: int,
               epoch: int, chunk_type: int = CHUNK_TYPE_USER, filter: bytes | None = None,
               split_crc: tuple[int, int] | None = None) -> ChunkInfo:
        """Write one chunk at the end of the log. `chunk_id` must be `next_offset`; `epoch`
        never goes down. `filter` is the chunk's filter, which osiris's chunk format carries
        inside the chunk; the index keeps its size. `split_crc`: (s, the CRC-32 of `chunk[s:]`)
        when the caller knows it (an osiris chunk's data CRC), so that the chunk's CRC costs
        only its first `s` bytes. `chunk` may be given as two parts, (head, rest), written one
        after the other without being joined; `split_crc` is then (len(head), CRC of rest).
        Nothing is durable until `sync()`."""
        parts = chunk if type(chunk) is tuple else None
        if parts is not None:
            if len(parts) != 2 or split_crc is None or split_crc[0] != len(parts[0]):
                raise ValueError("a chunk in parts is (head, rest), with split_crc (len(head), CRC-32 of rest)")
            size = len(parts[0]) + len(parts[1])
        else:
            size = len(chunk)
        filter_size = 0 if filter is None else len(filter)
        if not 0 < size <= CHUNK_BYTES_MAX:
            raise ValueError(f"a chunk has 1 to {CHUNK_BYTES_MAX} bytes, not {size}")
        if not 0 < num_records <= NUM_RECORDS_MAX:
            raise ValueError(f"a chunk holds 1 to {NUM_RECORDS_MAX} records, not {num_records}")
        if chunk_type not in (CHUNK_TYPE_USER, CHUNK_TYPE_TRACKING_DELTA, CHUNK_TYPE_TRACKING_SNAPSHOT):
            raise ValueError(f"unknown chunk type {chunk_type}")
        if filter_size > FILTER_BYTES_MAX:
            raise ValueError(f"a filter has at most {FILTER_BYTES_MAX} bytes, not {filter_size}")
        if not 0 <= timestamp <= _I64_MAX or not 0 <= epoch <= _I64_MAX:
            raise ValueError("timestamp and epoch are integers in [0, 2**63)")
        if split_crc is None:
            split, crc = 0, crc32(chunk)
        else:
            split, tail = split_crc
            if not 0 < split <= min(size, SPLIT_MAX):
                raise ValueError(f"a split point is in [1, {min(size, SPLIT_MAX)}], not {split}")
            crc = crc32(parts[0], tail) if parts is not None else chunk_crc(chunk, split, tail)
        with self._lock:
            self._check_writable()
            seg = self._segments[-1]
            expected = seg.next_offset
            if chunk_id != expected:
                raise StreamLogError(f"Stream log {self.directory}: chunk id {chunk_id} is not the next "
                                     f"offset {expected}")
            if self._epochs and epoch < self._epochs[-1][0]:
                raise StreamLogError(f"Stream log {self.directory}: epoch {epoch} is below the last "
                                     f"chunk's epoch {self._epochs[-1][0]}")
            try:
                if seg.ids and seg.size_bytes + size > self.max_segment_bytes:
                    self._roll(chunk_id)
                    seg = self._segments[-1]
                position = seg.size_bytes
                if parts is not None:
                    writev_all(self._seg_fd, parts)
                else:
                    write_all(self._seg_fd, chunk)
                write_all(self._idx_fd, encode_index_record(chunk_id, timestamp, epoch, position, size,
                                                             num_records, crc, chunk_type, filter_size, split))
            except OSError as e:
                raise self._fail("append", e) from e
            seg.ids.append(chunk_id)
            seg.timestamps.append(timestamp)
            seg.epochs.append(epoch)
            seg.positions.append(position)
            seg.sizes.append(size)
            seg.nums.append(num_records)
            seg.crcs.append(crc)
            seg.splits.append(split)
            seg.types.append(chunk_type)
            seg.filter_sizes.append(filter_size)
            seg.size_bytes = position + size
            self._bytes += size
            if not self._epochs or self._epochs[-1][0] != epoch:
                self._epochs.append((epoch, chunk_id))
            return ChunkInfo(chunk_id, num_records, timestamp, epoch, chunk_type, size, position, seg.base,
                             filter_size)

    def _roll(self, base: int) -> None:
        """Seal the active segment and start one at `base`. Caller holds _lock."""
        self._unsynced_sealed.append((self._seg_fd, self._idx_fd))
        self._seg_fd = self._idx_fd = -1
        self._create_segment(base)
        active = self._segments[-1]
        self._seg_fd = os.open(active.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._idx_fd = os.open(active.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def reset(self, next_offset: int) -> None:
        """Make an empty log start at `next_offset` (a replica joining a stream whose oldest
        segments retention has removed everywhere starts where the others now start)."""
        with self._sync_lock, self._lock:
            self._check_writable()
            if any(len(seg) for seg in self._segments):
                raise StreamLogError(f"Stream log {self.directory}: only an empty log can be reset")
            if next_offset == self.next_offset:
                return
            try:
                self._sync_sealed_locked()
                old = self._segments.pop()
                self._advised.pop(self._bases.pop(), None)
                os.close(self._seg_fd)
                os.close(self._idx_fd)
                self._seg_fd = self._idx_fd = -1
                self._delete_segment_files(old, index_first=True)
                self._bytes -= old.size_bytes
                self._create_segment(next_offset)
                active = self._segments[-1]
                self._seg_fd = os.open(active.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                self._idx_fd = os.open(active.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                self._fsync_dir()
                self._synced_offset = next_offset
            except OSError as e:
                raise self._fail("reset", e) from e

    def sync(self) -> int:
        """Fdatasync every chunk and index record written so far (and the directory when a
        segment came or went); return `synced_offset`, the offset below which every record
        survives a crash. Safe to call from a worker thread while appends go on: it covers
        the chunks appended before it began."""
        with self._sync_lock:
            with self._lock:
                self._check_writable()
                upto = self.next_offset
                if upto == self._synced_offset and not self._unsynced_sealed and not self._dir_dirty:
                    return upto
                sealed, self._unsynced_sealed = self._unsynced_sealed, []
                fds = [fd for pair in sealed for fd in pair] + [self._seg_fd, self._idx_fd]
                dir_dirty, self._dir_dirty = self._dir_dirty, False
            if self.fsync:
                try:
                    for fd in fds:
                        _fdatasync(fd)
                    if dir_dirty:
                        os.fsync(self._dir_fd)
                except OSError as e:
                    raise self._fail("fsync", e) from e  # never retried: the page cache is not to be trusted
                self.fsync_count += 1
            for seg_fd, idx_fd in sealed:
                os.close(seg_fd)
                os.close(idx_fd)
            with self._lock:
                self._synced_offset = max(self._synced_offset, upto)
                return self._synced_offset

    def truncate(self, next_offset: int) -> int:
        """Drop every chunk whose id is `next_offset` or above (a replica's unconfirmed tail
        after a leader change) and return the new `next_offset` (the end of the last chunk
        kept, which is above `next_offset` when that falls inside a chunk). Crash safe:
        trailing segments lose their index first, then a segment's index shrinks and is
        fsynced before the segment does, so a crash leaves at worst unindexed bytes that the
        next open cuts."""
        with self._sync_lock, self._lock:
            self._check_writable()
            if next_offset >= self.next_offset:
                return self.next_offset
            if next_offset < self.first_offset:
                raise StreamLogError(f"Stream log {self.directory}: cannot truncate to {next_offset}, below the "
                                     f"first offset {self.first_offset}")
            try:
                return self._truncate_locked(next_offset)
            except OSError as e:
                raise self._fail("truncate", e) from e

    def _truncate_locked(self, next_offset: int) -> int:
        """Caller holds both locks."""
        self._sync_sealed_locked()
        while len(self._segments) > 1 and self._segments[-1].base >= next_offset:
            self._drop_active_locked()
        seg = self._segments[-1]
        keep = bisect.bisect_left(seg.ids, next_offset)
        if keep < len(seg):
            old_size = seg.size_bytes
            seg.cut(keep)
            os.ftruncate(self._idx_fd, seg.index_bytes())
            if self.fsync:
                _fdatasync(self._idx_fd)
            os.ftruncate(self._seg_fd, seg.size_bytes)
            if self.fsync:
                _fdatasync(self._seg_fd)
            self._bytes -= old_size - seg.size_bytes
        if self._dir_dirty:
            self._fsync_dir()
        while self._epochs and self._epochs[-1][1] >= self.next_offset:
            self._epochs.pop()
        self._synced_offset = min(self._synced_offset, self.next_offset)
        return self.next_offset

    def _drop_active_locked(self) -> None:
        """Delete the active segment and make the one before it active. Caller holds both locks."""
        seg = self._segments.pop()
        self._advised.pop(self._bases.pop(), None)
        os.close(self._seg_fd)
        os.close(self._idx_fd)
        self._delete_segment_files(seg, index_first=True)
        self._bytes -= seg.size_bytes
        self._fsync_dir()  # the deletion is on disk before the segment before it shrinks
        active = self._segments[-1]
        self._seg_fd = os.open(active.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._idx_fd = os.open(active.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def _sync_sealed_locked(self) -> None:
        """Fsync and close the sealed segments' fds still waiting for a sync. Caller holds both locks."""
        for seg_fd, idx_fd in self._unsynced_sealed:
            if self.fsync:
                _fdatasync(seg_fd)
                _fdatasync(idx_fd)
            os.close(seg_fd)
            os.close(idx_fd)
        self._unsynced_sealed = []

    def retain(self, max_bytes: int | None = None, max_age_ms: int | None = None,
               now_ms: int | None = None) -> int:
        """Delete whole oldest segments, never the active one, while the log's size is above
        `max_bytes` or the oldest segment's newest chunk is older than `max_age_ms` (RabbitMQ's
        `x-max-length-bytes` and `x-max-age`). Returns how many segments went; `first_offset`
        moves to the first chunk left."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        deleted = 0
        with self._sync_lock, self._lock:
            self._check_open()
            while len(self._segments) > 1:
                oldest = self._segments[0]
                over_size = max_bytes is not None and self._bytes > max_bytes
                too_old = (max_age_ms is not None and len(oldest) > 0
                           and max(oldest.timestamps) < now_ms - max_age_ms)
                if not (over_size or too_old):
                    break
                self._segments.pop(0)
                self._advised.pop(self._bases.pop(0), None)
                self._delete_segment_files(oldest, index_first=False)
                self._bytes -= oldest.size_bytes
                deleted += 1
            if deleted:
                self._fsync_dir()
                first = self._segments[0].ids[0] if self._segments[0].ids else self.next_offset
                while len(self._epochs) > 1 and self._epochs[1][1] <= first:
                    self._epochs.pop(0)
                if self._epochs:
                    self._epochs[0] = (self._epochs[0][0], first)
                if not self._segments[0].ids:
                    self._epochs = []
        return deleted

    # -- reading ------------------------------------------------------------------------

    def segment_ranges(self, from_offset: int, max_bytes: int) -> list[SegmentRange]:
        """Whole chunks from the one containing `from_offset` (from the first chunk when
        `from_offset` is below `first_offset`), at least one chunk and otherwise at most
        `max_bytes`, as one byte range per segment they lie in. Empty at or past `next_offset`.
        The descriptors are the log's: use them in the thread that calls `truncate`,
        `retain` and `close`, or before it calls them next."""
        with self._lock:
            return self._ranges_locked(from_offset, max_bytes)

    def _ranges_locked(self, from_offset: int, max_bytes: int) -> list[SegmentRange]:
        self._check_open()
        if from_offset >= self.next_offset:
            return []
        j = max(0, bisect.bisect_right(self._bases, from_offset) - 1)
        i = max(0, self._segments[j].find(from_offset))
        ranges: list[SegmentRange] = []
        total = 0
        while j < len(self._segments):
            seg = self._segments[j]
            start = i
            while i < len(seg) and (total == 0 or total + seg.sizes[i] <= max_bytes):
                total += seg.sizes[i]
                i += 1
            if i > start:
                pos = seg.positions[start]
                ranges.append(SegmentRange(seg.open_read(), pos, seg.positions[i - 1] + seg.sizes[i - 1] - pos,
                                           [seg.info(k) for k in range(start, i)]))
            if i < len(seg):
                break
            j += 1
            i = 0
        return ranges

    def read(self, from_offset: int, max_bytes: int) -> list[tuple[ChunkInfo, memoryview]]:
        """Whole chunks as `segment_ranges` picks them, each with its bytes: one read per
        segment range, then slices of it. Safe from any thread."""
        out: list[tuple[ChunkInfo, memoryview]] = []
        with self._lock:
            ranges = self._ranges_locked(from_offset, max_bytes)
            blobs = [_pread_all(r.fd, r.length, r.position) for r in ranges]
            if ranges and _fadvise is not None:
                self._read_ahead(ranges[-1])
        for r, blob in zip(ranges, blobs, strict=True):
            data = memoryview(blob)
            for c in r.chunks:
                start = c.position - r.position
                out.append((c, data[start:start + c.size]))
        return out

    def _read_ahead(self, last: SegmentRange) -> None:
        """A reader reads on from the end of `last`: have the kernel fetch what follows while
        this is delivered, not when it is asked for (a catch-up from the disk), READ_AHEAD_BYTES
        at a time, asked again once a reader is half-way through what was asked. Caller holds
        _lock."""
        base = self._bases[bisect.bisect_right(self._bases, last.chunks[-1].chunk_id) - 1]
        end = last.position + last.length
        advised = self._advised
        if end + READ_AHEAD_BYTES // 2 <= advised.get(base, 0):
            return
        try:
            _fadvise(last.fd, end, READ_AHEAD_BYTES, _WILLNEED)
        except OSError:
            return  # only a hint: a file system that takes none reads as it did
        advised[base] = end + READ_AHEAD_BYTES

    def chunk_containing(self, offset: int) -> ChunkInfo | None:
        """The chunk holding the record at `offset`, or None outside [first_offset, next_offset)."""
        with self._lock:
            j = bisect.bisect_right(self._bases, offset) - 1
            if j < 0:
                return None
            seg = self._segments[j]
            i = seg.find(offset)
            if i < 0 or offset >= seg.ids[i] + seg.nums[i]:
                return None
            return seg.info(i)

    def first_chunk_at_or_after_timestamp(self, ts_ms: int) -> ChunkInfo | None:
        """The first chunk whose timestamp is `ts_ms` or later (the start for a consumer's
        offset specification by timestamp), or None when every chunk is older."""
        with self._lock:
            for seg in self._segments:
                if not seg.ids or max(seg.timestamps) < ts_ms:
                    continue
                for i, ts in enumerate(seg.timestamps):
                    if ts >= ts_ms:
                        return seg.info(i)
            return None

    def epochs(self) -> list[tuple[int, int]]:
        """(epoch, first chunk id written in it) for each epoch still in the log, in order.
        A replica compares these with a new leader's to find where their logs diverge."""
        with self._lock:
            return list(self._epochs)

    def iter_chunks(self, reverse: bool = False, chunk_type: int | None = None) -> Iterator[ChunkInfo]:
        """Every chunk's metadata in offset order, or from the end backwards with `reverse`
        (to find the latest tracking snapshot); only chunks of `chunk_type` when given. Reads
        a snapshot of the index: chunks appended meanwhile are not seen."""
        with self._lock:
            segments = list(self._segments)
            counts = [len(s) for s in segments]
        order = range(len(segments) - 1, -1, -1) if reverse else range(len(segments))
        for j in order:
            seg = segments[j]
            rows = range(counts[j] - 1, -1, -1) if reverse else range(counts[j])
            for i in rows:
                if chunk_type is None or seg.types[i] == chunk_type:
                    yield seg.info(i)

    def last_chunk_of_type(self, chunk_type: int) -> ChunkInfo | None:
        return next(self.iter_chunks(reverse=True, chunk_type=chunk_type), None)

    # -- state --------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The offset of the first record still in the log (`next_offset` when it is empty)."""
        seg = self._segments[0]
        return seg.ids[0] if seg.ids else self._segments[-1].next_offset

    @property
    def next_offset(self) -> int:
        """The offset the next chunk gets."""
        return self._segments[-1].next_offset

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def synced_offset(self) -> int:
        """Every record below this offset has been fsynced."""
        return self._synced_offset

    @property
    def last_chunk(self) -> ChunkInfo | None:
        with self._lock:
            for seg in reversed(self._segments):
                if seg.ids:
                    return seg.info(len(seg) - 1)
            return None

    @property
    def bytes(self) -> int:
        """The segment files' total size."""
        return self._bytes

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def chunk_count(self) -> int:
        return sum(len(s) for s in self._segments)

    def segment_names(self) -> list[str]:
        with self._lock:
            return [s.seg_path.name for s in self._segments]

    # -- closing ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StreamLogClosed(f"Stream log {self.directory}: closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise StreamLogError(f"Stream log {self.directory}: {self._failed}; reopen it to recover")

    def _fail(self, what: str, e: OSError) -> StreamLogError:
        """A write or fsync failed: what the files hold past the index is unknown, so the log
        takes no more writes; reopening recovers it (cutting what is not wholly written)."""
        if self._failed is None:
            self._failed = f"{what} failed ({e})"
        return StreamLogError(f"Stream log {self.directory}: {what} failed: {e}; reopen it to recover")

    def close(self) -> None:
        """Sync and release the files."""
        if self._closed:
            return
        if self._failed is None:
            self.sync()
        with self._sync_lock, self._lock:
            self._closed = True
            self._close_fds()

    def delete(self) -> None:
        """Close the log and remove its directory."""
        with self._sync_lock, self._lock:
            self._closed = True
            self._close_fds()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _close_fds(self) -> None:
        for seg_fd, idx_fd in self._unsynced_sealed:
            os.close(seg_fd)
            os.close(idx_fd)
        self._unsynced_sealed = []
        for seg in self._segments:
            seg.close_read()
        for name in ("_seg_fd", "_idx_fd", "_dir_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)  # the lock fd's close releases the flock
                setattr(self, name, -1)

    def __enter__(self) -> StreamLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _chunks(n: int) -> str:
    return f"{n} chunk" if n == 1 else f"{n} chunks"


READ_AHEAD_BYTES = 8 << 20  # what `read` asks the kernel to fetch beyond what it read
_fadvise = getattr(os, "posix_fadvise", None)
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", 3)


def _pread_all(fd: int, length: int, position: int) -> bytes:
    data = os.pread(fd, length, position)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            raise StreamLogError(f"segment ends {length - got} bytes short of a chunk")
        parts.append(more)
        got += len(more)
    return b"".join(parts)
