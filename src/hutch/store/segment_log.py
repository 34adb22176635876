"""A node's append-only segment log: opaque records in bounded segment files, group
commit, whole-segment deletion and rewrite of settled records, and recovery after any
stop, kill -9 included.

The log knows nothing of queues or Raft. A record is an opaque payload with a stream
key (a small integer the user chooses: a queue id, a Raft group id) and a log-wide
sequence number (seq) that the log assigns and that names the record for as long as it
exists: compaction never changes it. The users are durable classic queues (enqueue and
settle operations) and, later, the one Raft WAL that all of a node's Raft groups share.

Group commit. `append()` encodes a record into a memory buffer and returns its seq;
`flush()` hands the buffer to the OS in one write; `sync()` flushes, then makes one
fdatasync (plus one per segment sealed since the last sync, plus the directory when a
segment was created or removed) and returns the highest *durable* seq: every record up
to it survives a crash. The runtime calls `sync()` in a worker thread once per loop
iteration while the loop thread keeps appending; the number it returns covers only
records whose bytes were written before the fsync began.

Settling. The user calls `release(seq)` when a record is no longer needed. A sealed
segment whose records are all released is deleted at once; `compact()` rewrites sealed
segments that are mostly released, keeping the live records (same seqs, new offsets)
and swapping the file atomically. Releases are not written down: after a restart every
record still on disk is live again and the user, replaying, releases what its own
state says is settled (as RabbitMQ rebuilds its message store's reference counts from
the queue indices). So deletion can never resurrect a record: what was deleted is gone,
and what survives is re-judged by its owner.

What it must never do: report a record durable before its bytes were fsynced; return a
record whose CRC does not match; lose an intact record because a neighbour is damaged;
grow a buffer, a record or a segment past its limit.

Reading. `read(seq)` returns one record, CRC checked. `read_many(seqs)` returns many (a queue
reading its backlog back in publish order): records that lie one after another in a segment
come from one `pread` of up to `READ_RUN_BYTES_MAX`, and each is still checked against its CRC.

On-disk layout: see `hutch.store.format` and docs/design/store.md.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import re
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from isal.isal_zlib import crc32

from . import format as fmt
from .fileio import Unlinker, write_all, writev_all

log = logging.getLogger("hutch.store")

KiB = 1024
MiB = 1024 * KiB

SEGMENT_BYTES_MAX_DEFAULT = 64 * MiB
RECORD_BYTES_MAX_DEFAULT = 16 * MiB
WRITE_BUFFER_BYTES_MAX_DEFAULT = 1 * MiB
DIRECT_WRITE_BYTES_MIN = 64 * KiB  # a record at least this large is written at once, not copied into the buffer
READ_RUN_BYTES_MAX = 1 * MiB  # read_many: one pread covers records that lie together, up to this much
READ_RUN_GAP_BYTES_MAX = 64 * KiB  # ... skipping at most this much between two of them
REPLAY_WINDOW_BYTES = 4 * MiB  # replay reads a segment this much at a time
SEGMENT_BYTES_MAX_LIMIT = 1024 * MiB  # offsets are kept as u32
SEGMENT_BYTES_MAX_MIN = 256

SEGMENT_SUFFIX = ".hseg"
COMPACT_SUFFIX = ".compact"
LOCK_FILE = "LOCK"
SYNCED_FILE = "SYNCED"  # the synced extent of the active segment, rewritten at most once a second
CLEAN_FILE = "CLEAN"  # there only while the log is closed, and only after a clean close
SYNCED_INTERVAL_S = 1.0
_SYNCED = struct.Struct("<4sQQI")  # magic, segment base seq, bytes known synced, crc32 of the first two
_SYNCED_MAGIC = b"HSYN"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.hseg$")

# Per-record state in a segment's index.
_ABSENT = 0    # no record with this seq in the file (damaged, or removed by a rewrite)
_LIVE = 1
_RELEASED = 2  # settled by the user, still on disk until its segment goes

_fdatasync = getattr(os, "fdatasync", os.fsync)


class StoreError(Exception):
    """The segment log could not do what was asked."""


class RecordTooLarge(StoreError, ValueError):
    """A payload over `record_bytes_max`."""


class UnknownRecord(StoreError, KeyError):
    """No live record with this seq (never appended, already released, or deleted)."""


class StoreFailed(StoreError):
    """A write or fsync failed. The log refuses further writes; reopen it to recover."""


class StoreClosed(StoreError):
    pass


class Record(NamedTuple):
    seq: int
    key: int
    payload: bytes


@dataclass(frozen=True)
class CorruptRegion:
    segment: str  # file name
    offset: int
    length: int


@dataclass
class RecoveryReport:
    segments: int = 0
    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    torn_tail: CorruptRegion | None = None  # truncated away
    corrupt: list[CorruptRegion] = field(default_factory=list)  # skipped, left in place
    damaged_headers: list[str] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)  # unfinished compaction output
    duration_ms: float = 0.0


@dataclass
class CompactionReport:
    segments_rewritten: int = 0
    records_kept: int = 0
    bytes_reclaimed: int = 0


def segment_name(base_seq: int) -> str:
    return f"{base_seq:020d}{SEGMENT_SUFFIX}"


class _Segment:
    """The in-memory index of one segment file: where each seq's record is, and its state.

    Five bytes a record: its offset and its state. A record's length is where the next one
    starts less its header (records lie back to back), so it is not kept: a seq that is not in
    the file is given the offset where the record before it ended, and the rare record that is
    followed by bytes that are no record (a damaged one skipped at recovery) has its length in
    `odd`."""

    __slots__ = ("base_seq", "path", "size_bytes", "offsets", "end", "odd", "states",
                 "live_count", "live_bytes", "read_fd", "compacting", "unsynced", "live_at_look")

    def __init__(self, base_seq: int, path: Path, size_bytes: int):
        self.base_seq = base_seq
        self.path = path
        self.size_bytes = size_bytes        # including bytes still in the write buffer
        self.offsets = array("I")           # by seq - base_seq
        self.end = fmt.SEGMENT_HEADER_BYTES  # where the last indexed record ends
        self.odd: dict[int, int] = {}       # payload length by seq - base_seq, where not implied
        self.states = bytearray()           # _ABSENT / _LIVE / _RELEASED, by seq - base_seq
        self.live_count = 0
        self.live_bytes = 0                 # on-disk bytes of live records
        self.read_fd: int | None = None
        self.compacting = False
        self.unsynced = False               # sealed, its write fd not yet fsynced
        self.live_at_look = -1              # live_count when compact(quiet_only=True) last looked

    @property
    def end_seq(self) -> int:
        """One past the highest seq this segment indexes."""
        return self.base_seq + len(self.states)

    def length(self, i: int) -> int:
        """The payload bytes of the record at index i (one that is in the file)."""
        if self.odd:
            odd = self.odd.get(i)
            if odd is not None:
                return odd
        offsets = self.offsets
        nxt = offsets[i + 1] if i + 1 < len(offsets) else self.end
        return nxt - offsets[i] - fmt.RECORD_HEADER_BYTES

    def lengths(self) -> list[int]:
        """The payload bytes of every index (meaningless for a seq not in the file)."""
        offsets = self.offsets
        header = fmt.RECORD_HEADER_BYTES
        out = [b - a - header for a, b in zip(offsets, offsets[1:], strict=False)]
        if offsets:
            out.append(self.end - offsets[-1] - header)
        for i, n in self.odd.items():
            out[i] = n
        return out

    def add_scanned(self, records: list[fmt.ScannedRecord]) -> None:
        """Index the records a scan of the file found (seqs ascending, from base_seq on): a run
        without gaps, lying back to back, in two array extensions, as at every start for each
        segment."""
        if not records:
            return
        header = fmt.RECORD_HEADER_BYTES
        last = records[-1]
        if (not self.states and records[0].seq == self.base_seq and last.seq == self.base_seq + len(records) - 1
                and records[0].offset == self.end
                and last.offset + header + last.length - records[0].offset
                == header * len(records) + sum(r.length for r in records)):
            self.offsets.extend(r.offset for r in records)
            self.states.extend(bytes([_LIVE]) * len(records))
            self.live_count += len(records)
            self.live_bytes += last.offset + header + last.length - records[0].offset
            self.end = last.offset + header + last.length
            return
        for r in records:
            self.add(r.seq, r.offset, r.length)

    def add(self, seq: int, offset: int, length: int) -> None:
        gap = seq - self.end_seq
        assert gap >= 0, (seq, self.end_seq)
        if gap:  # seqs not in the file: they end where the record before them did
            self.offsets.extend([self.end] * gap)
            self.states.extend(bytes(gap))
        elif offset != self.end and self.offsets:  # bytes that are no record follow the one before
            i = len(self.offsets) - 1
            self.odd[i] = self.end - self.offsets[i] - fmt.RECORD_HEADER_BYTES
        self.offsets.append(offset)
        self.states.append(_LIVE)
        self.live_count += 1
        self.live_bytes += fmt.RECORD_HEADER_BYTES + length
        self.end = offset + fmt.RECORD_HEADER_BYTES + length

    def moved(self, kept: list[tuple[int, int, int]], end: int) -> None:
        """The segment was rewritten with only the records at these indices (ascending), as
        (index, new offset, payload length), back to back up to `end`: the others are no longer
        in the file."""
        offsets = self.offsets
        header = fmt.RECORD_HEADER_BYTES
        at = fmt.SEGMENT_HEADER_BYTES  # where the kept record before ends
        j = 0
        for i in range(len(offsets)):
            if j < len(kept) and kept[j][0] == i:
                _i, offset, length = kept[j]
                offsets[i] = offset
                at = offset + header + length
                j += 1
            else:
                offsets[i] = at
        self.odd = {}
        self.end = end


class SegmentLog:
    """One directory of segment files. Opening it recovers it (see `recovery`)."""

    def __init__(self, directory: str | os.PathLike, *,
                 segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT,
                 record_bytes_max: int | None = None,
                 write_buffer_bytes_max: int = WRITE_BUFFER_BYTES_MAX_DEFAULT,
                 visit: Callable[[int, int, memoryview], None] | None = None,
                 unlink_in_background: bool = False):
        """`visit(seq, key, payload)`: called for each record recovery finds, in seq order, as
        it checks them, so an owner that rebuilds its state from the log reads the log once
        (`replay()` reads it again). The payload is a view into the segment's bytes, valid
        during the call only; the log is not usable until the constructor returns.
        `unlink_in_background`: a segment whose records are all released is removed from the
        log at once and its file by a thread of the log's own (`fileio.Unlinker`), not by the
        caller of `release`; a crash may leave the file, whose records then come back as live,
        as those of a segment not deleted yet do (releases are not persisted)."""
        if not SEGMENT_BYTES_MAX_MIN <= segment_bytes_max <= SEGMENT_BYTES_MAX_LIMIT:
            raise ValueError(f"segment_bytes_max={segment_bytes_max} is outside "
                             f"[{SEGMENT_BYTES_MAX_MIN}, {SEGMENT_BYTES_MAX_LIMIT}]")
        room = segment_bytes_max - fmt.SEGMENT_HEADER_BYTES - fmt.RECORD_HEADER_BYTES
        if record_bytes_max is None:  # the default, or all an empty segment can hold
            record_bytes_max = min(RECORD_BYTES_MAX_DEFAULT, room)
        if not 0 <= record_bytes_max <= room:
            raise ValueError(f"record_bytes_max={record_bytes_max} must fit an empty segment: "
                             f"at most {room} with segment_bytes_max={segment_bytes_max}")
        if write_buffer_bytes_max < 1:
            raise ValueError("write_buffer_bytes_max must be positive")
        self.directory = Path(directory)
        self._unlinker = Unlinker(f"unlink {self.directory.name}") if unlink_in_background else None
        self.segment_bytes_max = segment_bytes_max
        self.record_bytes_max = record_bytes_max
        self.write_buffer_bytes_max = write_buffer_bytes_max

        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(f"Segment log {self.directory}: in use by another process") from None
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.closed_cleanly = False  # whether the last process to open the log closed it

        # _lock guards everything below; _sync_lock makes syncs one at a time;
        # _compact_lock makes compactions one at a time. Order: sync/compact, then _lock.
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._segments_deleted = 0
        self._bases: list[int] = []          # base_seq of each segment, for bisect
        self._buf = bytearray()
        self._buf_last_seq = 0
        self._next_seq = 1
        self._written_seq = 0                # highest seq whose bytes the OS has
        self._durable_seq = 0                # highest seq fsynced
        self._active: _Segment | None = None
        self._active_fd = -1
        self._sealed_unsynced: list[tuple[_Segment, int]] = []  # sealed segments' write fds
        self._dir_dirty = False
        self._failed: BaseException | None = None
        self._closed = False
        self.fsync_count = 0                 # syncs that reached the disk (a metric)
        self._synced_fd = -1                 # SYNCED_FILE: how much of the active segment is on disk
        self._synced_mark = (0, 0)
        self._synced_at = 0.0
        self._visit = visit
        try:
            self.closed_cleanly = self._take_clean_mark()
            self.recovery = self._recover()
        except BaseException:
            self._close_fds()
            raise
        finally:
            self._visit = None

    # -- recovery -----------------------------------------------------------------

    def _take_clean_mark(self) -> bool:
        """Whether the log was closed cleanly (not after a crash or a power loss). The mark goes,
        durably, before anything is written: it must not outlive this run."""
        try:
            os.unlink(self.directory / CLEAN_FILE)
        except FileNotFoundError:
            return False
        os.fsync(self._dir_fd)
        return True

    def _read_synced(self) -> tuple[int, int] | None:
        """(segment base seq, bytes of it known synced) as last recorded, or None."""
        try:
            raw = (self.directory / SYNCED_FILE).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _SYNCED.size:
            return None
        magic, base, size, crc = _SYNCED.unpack(raw)
        if magic != _SYNCED_MAGIC or crc != crc32(raw[:_SYNCED.size - 4]):
            log.warning("Segment log %s: %s is damaged; a damaged end of the last segment will be taken for "
                        "a write torn by a crash", self.directory, SYNCED_FILE)
            return None
        return base, size

    def _write_synced(self, base: int, size: int) -> None:
        """Record that `size` bytes of segment `base` are on disk (called after their fsync)."""
        head = _SYNCED_MAGIC + base.to_bytes(8, "little") + size.to_bytes(8, "little")
        os.pwrite(self._synced_fd, head + crc32(head).to_bytes(4, "little"), 0)
        _fdatasync(self._synced_fd)
        self._synced_at = time.monotonic()
        self._synced_mark = (base, size)

    def _recover(self) -> RecoveryReport:
        started = time.monotonic()
        report = RecoveryReport()
        self._synced_before = self._read_synced()
        entries: list[tuple[int, str]] = []
        for name in sorted(os.listdir(self.directory)):
            m = _SEGMENT_NAME.match(name)
            if m:
                entries.append((int(m.group(1)), name))
            elif name.endswith(SEGMENT_SUFFIX + COMPACT_SUFFIX):
                os.unlink(self.directory / name)
                report.removed_files.append(name)
                log.warning("Segment log %s: removed %s, the output of a compaction that did not finish",
                            self.directory, name)
            elif name not in (LOCK_FILE, SYNCED_FILE):
                log.warning("Segment log %s: ignoring unknown file %s", self.directory, name)
        entries.sort()

        for i, (base_seq, name) in enumerate(entries):
            last = i == len(entries) - 1
            seq_limit = fmt.SEQ_MAX + 1 if last else entries[i + 1][0]
            self._recover_segment(base_seq, name, seq_limit, last, report)

        mark = self._synced_before
        if mark is not None and (not entries or mark[0] > entries[-1][0]):
            # the segment the mark speaks of is gone, and with it data that was on disk
            region = CorruptRegion(segment_name(mark[0]), 0, mark[1])
            report.corrupt.append(region)
            log.error("Segment log %s: segment %s, of which %d bytes were synced, is missing", self.directory,
                      region.segment, mark[1])
        if not self._segments:
            fd = self._create_segment(1)
            try:
                _fdatasync(fd)  # its header, before the synced mark below counts it
            finally:
                os.close(fd)
        self._synced_fd = os.open(self.directory / SYNCED_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._write_synced(self._segments[-1].base_seq, self._segments[-1].size_bytes)  # all of it is now
        os.fsync(self._dir_fd)
        self._dir_dirty = False
        active = self._segments[-1]
        self._active = active
        self._active_fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._next_seq = active.end_seq
        self._written_seq = self._durable_seq = self._buf_last_seq = self._next_seq - 1

        report.segments = len(self._segments)
        report.duration_ms = (time.monotonic() - started) * 1000
        if report.records:
            log.info("Segment log %s: recovered %d records in %d segments (seq %d..%d) in %.1f ms",
                     self.directory, report.records, report.segments, report.first_seq, report.last_seq,
                     report.duration_ms)
        return report

    def _recover_segment(self, base_seq: int, name: str, seq_limit: int, last: bool,
                         report: RecoveryReport) -> None:
        path = self.directory / name
        data = path.read_bytes()
        header_base = fmt.decode_segment_header(data)
        header_ok = header_base == base_seq
        if not header_ok:
            report.damaged_headers.append(name)
            log.warning("Segment log %s: segment %s has a damaged header (%d bytes in file); "
                        "scanning it for records", self.directory, name, len(data))
        start = min(fmt.SEGMENT_HEADER_BYTES, len(data))
        records, damage = fmt.scan_segment(data, start, self.record_bytes_max, base_seq, seq_limit)

        valid_end = len(data)
        mark = self._synced_before
        synced = mark[1] if mark is not None and mark[0] == base_seq else 0
        if last and synced > len(data):
            # shorter than what was on disk: not a torn write, a loss
            report.corrupt.append(CorruptRegion(name, len(data), synced - len(data)))
            log.error("Segment log %s: segment %s ends at offset %d, but %d bytes of it were synced: %d bytes "
                      "that were on disk are gone", self.directory, name, len(data), synced, synced - len(data))
        if last and damage and damage[-1].offset + damage[-1].length == len(data) and damage[-1].offset >= synced:
            # damage at the end, past what was known synced: a write that a crash tore
            torn = damage.pop()
            valid_end = torn.offset
            report.torn_tail = CorruptRegion(name, torn.offset, torn.length)
        for d in damage:
            region = CorruptRegion(name, d.offset, d.length)
            report.corrupt.append(region)
            if d.offset + d.length == len(data):
                log.error("Segment log %s: corrupt data in segment %s from offset %d to its end "
                          "(%d bytes skipped)", self.directory, name, d.offset, d.length)
            else:
                log.error("Segment log %s: corrupt data in segment %s at offset %d (%d bytes skipped); "
                          "resynchronised at offset %d, the records after it are recovered",
                          self.directory, name, d.offset, d.length, d.offset + d.length)

        if last:
            # The active segment: make it a clean append point.
            if not header_ok and not records:
                with open(path, "r+b") as f:
                    f.truncate(0)
                    f.write(fmt.encode_segment_header(base_seq))
                    f.flush()
                    os.fsync(f.fileno())
                valid_end = fmt.SEGMENT_HEADER_BYTES
            else:
                if not header_ok:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        os.pwrite(fd, fmt.encode_segment_header(base_seq), 0)
                    finally:
                        os.close(fd)
                if report.torn_tail is not None:
                    os.truncate(path, valid_end)
            if report.torn_tail is not None:
                log.warning("Segment log %s: truncated torn tail at offset %d (%d bytes) in segment %s",
                            self.directory, report.torn_tail.offset, report.torn_tail.length, name)

        seg = _Segment(base_seq, path, valid_end)
        seg.add_scanned(records)
        visit = self._visit
        if visit is not None and records:
            view = memoryview(data)
            header = fmt.RECORD_HEADER_BYTES
            for seq, key, offset, length in records:
                start = offset + header
                visit(seq, key, view[start:start + length])
        # Records read back from the page cache after a kill -9 may not be on the disk yet:
        # make them so before anyone relies on them.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._segments.append(seg)
        self._bases.append(base_seq)
        if records:
            report.records += len(records)
            if report.first_seq is None:
                report.first_seq = records[0].seq
            report.last_seq = records[-1].seq

    def _create_segment(self, base_seq: int) -> int:
        """Create an empty segment file; return its write fd. Caller holds _lock (or is __init__)."""
        path = self.directory / segment_name(base_seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, fmt.encode_segment_header(base_seq))
        except BaseException:
            os.close(fd)
            raise
        self._segments.append(_Segment(base_seq, path, fmt.SEGMENT_HEADER_BYTES))
        self._bases.append(base_seq)
        self._dir_dirty = True
        return fd

    # -- writing --------------------------------------------------------------------

    def append(self, payload: bytes | bytearray | memoryview, key: int = 0) -> int:
        """Buffer one record and return its seq. Nothing is written to the OS yet unless
        the buffer is full; nothing is durable until a `sync()` returns a seq >= this one."""
        length = len(payload)
        if length > self.record_bytes_max:
            raise RecordTooLarge(f"Segment log {self.directory}: record of {length} bytes is over "
                                 f"record_bytes_max={self.record_bytes_max}")
        if not 0 <= key <= fmt.KEY_MAX:
            raise ValueError(f"key {key} is outside [0, 2**64)")
        size = fmt.RECORD_HEADER_BYTES + length
        with self._lock:
            self._check_writable()
            seg = self._active
            if seg.size_bytes + size > self.segment_bytes_max and seg.states:
                self._roll()
                seg = self._active
            seq = self._next_seq
            assert seq == seg.end_seq, (seq, seg.end_seq)
            header = fmt.encode_record_header(seq, key, payload)
            buf = self._buf
            if length >= DIRECT_WRITE_BYTES_MIN or len(buf) + size >= self.write_buffer_bytes_max:
                # a large record, or one that fills the buffer, goes to the OS at once behind
                # what the buffer holds (one writev), without being copied into it: for a record
                # of a stream's batch the copy cost as much as the write
                self._write_record(header, payload)
                self._written_seq = seq
            else:
                buf += header
                buf += payload
            seg.add(seq, seg.size_bytes, length)
            seg.size_bytes += size
            self._next_seq = seq + 1
            self._buf_last_seq = seq
            return seq

    def flush(self) -> int:
        """Hand buffered records to the OS (one write). Returns the highest written seq."""
        with self._lock:
            self._check_writable()
            self._write_buffer()
            return self._written_seq

    def sync(self) -> int:
        """Make every record written so far durable; return the highest durable seq.

        Safe to call from a worker thread while another thread appends. One sync runs at
        a time. The returned seq covers only records whose bytes were written before the
        fsync started; records appended meanwhile wait for the next sync.
        """
        with self._sync_lock:
            with self._lock:
                self._check_writable()
                self._write_buffer()
                upto = self._written_seq
                sealed, self._sealed_unsynced = self._sealed_unsynced, []
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                active_fd = self._active_fd
                active = (self._active.base_seq, self._active.size_bytes)  # all written: the buffer is empty
                if upto == self._durable_seq and not sealed and not dir_dirty:
                    return upto
            try:
                for _seg, fd in sealed:
                    _fdatasync(fd)
                _fdatasync(active_fd)
                if dir_dirty:
                    os.fsync(self._dir_fd)
                self.fsync_count += 1
                if active[0] != self._synced_mark[0] or time.monotonic() - self._synced_at >= SYNCED_INTERVAL_S:
                    self._write_synced(*active)
            except OSError as e:
                with self._lock:
                    self._fail(e, "fsync")
                raise StoreFailed(f"Segment log {self.directory}: fsync failed: {e}") from e
            finally:
                for _seg, fd in sealed:
                    os.close(fd)
            with self._lock:
                for seg, _fd in sealed:
                    seg.unsynced = False
                if upto > self._durable_seq:
                    self._durable_seq = upto
                return self._durable_seq

    def _write_buffer(self) -> None:
        """Caller holds _lock."""
        buf = self._buf
        if not buf:
            return
        try:
            write_all(self._active_fd, buf)
        except OSError as e:
            self._fail(e, "write")
            raise StoreFailed(f"Segment log {self.directory}: write failed: {e}") from e
        buf.clear()
        self._written_seq = self._buf_last_seq

    def _write_record(self, header: bytes, payload: bytes | bytearray | memoryview) -> None:
        """Write what the buffer holds and then one record straight to the active segment, in
        one writev. Caller holds _lock."""
        buf = self._buf
        try:
            writev_all(self._active_fd, (buf, header, payload) if buf else (header, payload))
        except OSError as e:
            self._fail(e, "write")
            raise StoreFailed(f"Segment log {self.directory}: write failed: {e}") from e
        buf.clear()

    def _roll(self) -> None:
        """Seal the active segment and start a new one. Caller holds _lock."""
        self._write_buffer()
        old = self._active
        old.unsynced = True
        self._sealed_unsynced.append((old, self._active_fd))
        try:
            self._active_fd = self._create_segment(self._next_seq)
        except OSError as e:
            self._active_fd = -1
            self._fail(e, "segment creation")
            raise StoreFailed(f"Segment log {self.directory}: could not create a segment: {e}") from e
        self._active = self._segments[-1]
        if old.live_count == 0 and not old.compacting:
            self._delete(old)

    def _fail(self, e: BaseException, what: str) -> None:
        if self._failed is None:
            self._failed = e
            log.error("Segment log %s: %s failed (%s); refusing further writes until the log is reopened "
                      "and recovered", self.directory, what, e)

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosed(f"Segment log {self.directory}: closed")
        if self._failed is not None:
            raise StoreFailed(f"Segment log {self.directory}: failed earlier ({self._failed}); reopen it")

    # -- settling ---------------------------------------------------------------------

    def release(self, seq: int) -> None:
        """The record `seq` is settled: the log may drop it. A sealed segment whose records
        are all released is deleted now. Releases are not persisted (see the module doc)."""
        with self._lock:
            if self._closed:
                raise StoreClosed(f"Segment log {self.directory}: closed")
            seg, i = self._locate(seq)
            if seg.states[i] != _LIVE:
                what = "already released" if seg.states[i] == _RELEASED else "not in the log"
                raise UnknownRecord(f"record {seq} is {what}")
            seg.states[i] = _RELEASED
            seg.live_count -= 1
            seg.live_bytes -= fmt.RECORD_HEADER_BYTES + seg.length(i)
            if seg.live_count == 0 and seg is not self._active and not seg.compacting:
                self._delete(seg)

    def release_many(self, seqs: list[int]) -> None:
        """`release` each of `seqs`, under one lock (consecutive seqs of one segment without a
        lookup each). An unknown or already released seq raises UnknownRecord; those before it
        are released."""
        with self._lock:
            if self._closed:
                raise StoreClosed(f"Segment log {self.directory}: closed")
            header = fmt.RECORD_HEADER_BYTES
            seg: _Segment | None = None
            for seq in seqs:
                if seg is None or not 0 <= seq - seg.base_seq < len(seg.states):
                    if seg is not None and seg.live_count == 0 and seg is not self._active and not seg.compacting:
                        self._delete(seg)
                    seg, i = self._locate(seq)
                else:
                    i = seq - seg.base_seq
                states = seg.states
                if states[i] != _LIVE:
                    what = "already released" if states[i] == _RELEASED else "not in the log"
                    raise UnknownRecord(f"record {seq} is {what}")
                states[i] = _RELEASED
                seg.live_count -= 1
                if seg.odd:
                    seg.live_bytes -= header + seg.length(i)
                else:  # (seg.length inlined: a drain releases every record)
                    offsets = seg.offsets
                    seg.live_bytes -= (offsets[i + 1] if i + 1 < len(offsets) else seg.end) - offsets[i]
            if seg is not None and seg.live_count == 0 and seg is not self._active and not seg.compacting:
                self._delete(seg)

    def contains(self, seq: int) -> bool:
        """True while the record `seq` is on disk (live, or released but not yet removed)."""
        with self._lock:
            try:
                seg, i = self._locate(seq)
            except UnknownRecord:
                return False
            return seg.states[i] != _ABSENT

    def segment_base(self, seq: int) -> int | None:
        """The first seq of the segment holding record `seq`, or None when it is not on disk.
        Two records with the same base are deleted together."""
        with self._lock:
            try:
                seg, i = self._locate(seq)
            except UnknownRecord:
                return None
            return seg.base_seq if seg.states[i] != _ABSENT else None

    def outlives(self, seq: int, seqs: list[int]) -> bool:
        """Would some record of `seqs` (in increasing order) stay on disk if record `seq`'s
        segment were deleted, that is, is one of them on disk in another segment? Looks from the
        end of `seqs` and drops there (in place) those that are not, stopping at the first that
        is: the next call goes on from there. One lock for the lot, and one step for all those
        of a deleted segment or of `seq`'s own."""
        with self._lock:
            try:
                base = self._locate(seq)[0].base_seq
            except UnknownRecord:
                base = -1
            bases, segments = self._bases, self._segments
            while seqs:
                d = seqs[-1]
                j = bisect.bisect_right(bases, d) - 1
                gone_from = 0  # every seq from here to d is gone with d
                if j >= 0:
                    dseg = segments[j]
                    k = d - dseg.base_seq
                    if k >= len(dseg.states):
                        gone_from = dseg.base_seq + len(dseg.states)  # d was in a deleted segment
                    elif dseg.base_seq == base:
                        gone_from = base  # deleted with `seq`
                    elif dseg.states[k] != _ABSENT:
                        return True
                    else:  # removed from its segment by a rewrite
                        seqs.pop()
                        continue
                del seqs[bisect.bisect_left(seqs, gone_from):]
            return False

    def is_live(self, seq: int) -> bool:
        with self._lock:
            try:
                seg, i = self._locate(seq)
            except UnknownRecord:
                return False
            return seg.states[i] == _LIVE

    def _locate(self, seq: int) -> tuple[_Segment, int]:
        j = bisect.bisect_right(self._bases, seq) - 1
        if j >= 0:
            seg = self._segments[j]
            if seq < seg.end_seq:
                return seg, seq - seg.base_seq
        raise UnknownRecord(f"record {seq} is not in the log")

    def _delete(self, seg: _Segment) -> None:
        """Remove a sealed segment's file and index. Caller holds _lock. A write fd still
        waiting for its fsync is left to sync(), which closes it."""
        assert seg is not self._active
        j = self._segments.index(seg)
        del self._segments[j]
        del self._bases[j]
        self._segments_deleted += 1
        if seg.read_fd is not None:
            os.close(seg.read_fd)
            seg.read_fd = None
        if self._unlinker is not None:
            self._unlinker.unlink(seg.path)
        else:
            try:
                os.unlink(seg.path)
            except FileNotFoundError:
                pass
        self._dir_dirty = True
        log.debug("Segment log %s: deleted segment %s, all its records settled", self.directory, seg.path.name)

    # -- reading ------------------------------------------------------------------------

    def read(self, seq: int) -> Record:
        """The record `seq`, read from its segment and checked against its CRC."""
        with self._lock:
            if self._closed:
                raise StoreClosed(f"Segment log {self.directory}: closed")
            seg, i = self._locate(seq)
            if seg.states[i] == _ABSENT:
                raise UnknownRecord(f"record {seq} is not in the log")
            if seg is self._active and seq > self._written_seq:
                self._check_writable()
                self._write_buffer()
            offset, length = seg.offsets[i], seg.length(i)
            data = os.pread(self._read_fd(seg), fmt.RECORD_HEADER_BYTES + length, offset)
        rec = fmt.decode_record_at(data, 0, self.record_bytes_max)
        if rec is None or rec.seq != seq or rec.length != length:
            log.error("Segment log %s: record %d in segment %s at offset %d fails its check",
                      self.directory, seq, seg.path.name, offset)
            raise StoreError(f"Segment log {self.directory}: record {seq} in segment {seg.path.name} "
                             f"at offset {offset} is corrupt")
        return Record(seq, rec.key, data[fmt.RECORD_HEADER_BYTES:])

    def read_many(self, seqs: list[int]) -> list[Record | StoreError]:
        """The records `seqs`, each as `read` returns it (CRC checked), or the StoreError that
        `read` would raise for it. One lock for the lot, and one `pread` for records that lie
        one after another in a segment (gaps of up to READ_RUN_GAP_BYTES_MAX skipped, up to
        READ_RUN_BYTES_MAX a read): a backlog read back in publish order costs a read per
        megabyte, not one per record. The payloads are memoryviews into those reads (no copy):
        decode them and let them go, for one kept holds its whole read in memory."""
        header = fmt.RECORD_HEADER_BYTES
        out: list[Record | StoreError | None] = [None] * len(seqs)
        # the reads to make: (segment, offset, end, its records as (index in seqs, seq, offset, length))
        runs: list[tuple[_Segment, int, int, list[tuple[int, int, int, int]]]] = []
        with self._lock:
            if self._closed:
                raise StoreClosed(f"Segment log {self.directory}: closed")
            active = self._active
            seg: _Segment | None = None
            base = indexed = 0  # seg's base seq and how many seqs it indexes
            rseg: _Segment | None = None  # the run being gathered
            rstart = rend = 0
            items: list[tuple[int, int, int, int]] = []
            for n, seq in enumerate(seqs):
                i = seq - base
                if seg is None or not 0 <= i < indexed:
                    try:
                        seg, i = self._locate(seq)
                    except UnknownRecord as e:
                        out[n] = e
                        seg = None
                        continue
                    base, indexed = seg.base_seq, len(seg.states)
                if seg.states[i] == _ABSENT:
                    out[n] = UnknownRecord(f"record {seq} is not in the log")
                    continue
                if seg is active and seq > self._written_seq:
                    self._check_writable()
                    self._write_buffer()
                offsets = seg.offsets
                offset = offsets[i]
                if seg.odd:
                    length = seg.length(i)
                else:  # (seg.length inlined: a drain reads every record)
                    length = (offsets[i + 1] if i + 1 < len(offsets) else seg.end) - offset - header
                end = offset + header + length
                if seg is rseg and 0 <= offset - rend <= READ_RUN_GAP_BYTES_MAX and end - rstart <= READ_RUN_BYTES_MAX:
                    rend = end
                else:
                    if rseg is not None:
                        runs.append((rseg, rstart, rend, items))
                    rseg, rstart, rend, items = seg, offset, end, []
                items.append((n, seq, offset, length))
            if rseg is not None:
                runs.append((rseg, rstart, rend, items))
            datas = [os.pread(self._read_fd(rseg), rend - rstart, rstart) for rseg, rstart, rend, _items in runs]
        checked = fmt.checked_record
        for (rseg, rstart, _rend, items), data in zip(runs, datas, strict=True):
            view = memoryview(data)
            for n, seq, offset, length in items:
                got = checked(view, offset - rstart, seq, length)
                if got is None:
                    log.error("Segment log %s: record %d in segment %s at offset %d fails its check",
                              self.directory, seq, rseg.path.name, offset)
                    out[n] = StoreError(f"Segment log {self.directory}: record {seq} in segment {rseg.path.name} "
                                        f"at offset {offset} is corrupt")
                    continue
                out[n] = Record(seq, got[0], got[1])
        return out  # type: ignore[return-value]

    def _read_fd(self, seg: _Segment) -> int:
        if seg.read_fd is None:
            seg.read_fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
        return seg.read_fd

    def replay(self, key: int | None = None, views: bool = False) -> Iterator[Record]:
        """Every live record in seq order (only those with `key`, when given). Meant for
        start-up, after recovery: it yields the records live when it reached their segment, read
        through a descriptor of its own (so a segment rewritten or deleted meanwhile is still read
        as it was) in windows of `REPLAY_WINDOW_BYTES`. `views`: each payload is a memoryview
        into its window's bytes instead of a copy, for a reader that only decodes it (one that
        keeps a view keeps the whole window in memory)."""
        unpack_key = fmt.unpack_record_key
        header_bytes = fmt.RECORD_HEADER_BYTES
        with self._lock:
            segments = list(self._segments)
        for seg in segments:
            with self._lock:
                if self._closed:
                    raise StoreClosed(f"Segment log {self.directory}: closed")
                if seg.base_seq not in self._bases or seg.live_count == 0:
                    continue
                if seg is self._active:
                    self._check_writable()
                    self._write_buffer()
                base = seg.base_seq
                if seg.live_count == len(seg.states):  # all live: no state to look at
                    entries = list(zip(range(base, base + len(seg.states)), seg.offsets, seg.lengths(), strict=True))
                else:
                    offsets, lengths = seg.offsets, seg.lengths()
                    entries = [(base + i, offsets[i], lengths[i]) for i, st in enumerate(seg.states) if st == _LIVE]
                fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = b""
                view = memoryview(data)
                wstart = wend = 0  # the window's extent in the file
                for seq, offset, length in entries:
                    end = offset + header_bytes + length
                    if end > wend or offset < wstart:
                        last_end = entries[-1][1] + header_bytes + entries[-1][2]
                        wstart, wend = offset, max(end, min(offset + REPLAY_WINDOW_BYTES, last_end))
                        data = os.pread(fd, wend - wstart, wstart)
                        view = memoryview(data)
                    at = offset - wstart
                    (rec_key,) = unpack_key(data, at)
                    if key is not None and rec_key != key:
                        continue
                    payload = view[at + header_bytes:at + header_bytes + length]
                    yield Record(seq, rec_key, payload if views else bytes(payload))
            finally:
                os.close(fd)

    # -- compaction ---------------------------------------------------------------------

    def compact(self, live_ratio_max: float = 0.5, rewrite_bytes_max: int | None = None,
                quiet_only: bool = False) -> CompactionReport:
        """Rewrite sealed segments whose live bytes are under `live_ratio_max` of their
        records' bytes, keeping only the live records (same seqs). At most
        `rewrite_bytes_max` live bytes are copied per call (default: one segment's worth).
        With `quiet_only`, a segment is rewritten only if none of its records was released
        since the previous call looked at it: one still being settled (a backlog drained in
        order) is likely to be deleted whole soon, and copying its rest would be wasted.
        Safe to call from a worker thread; appends, releases and reads go on meanwhile.
        """
        budget = self.segment_bytes_max if rewrite_bytes_max is None else rewrite_bytes_max
        report = CompactionReport()
        with self._compact_lock:
            with self._lock:
                if self._closed or self._failed is not None:
                    return report
                candidates = []
                for seg in self._segments:
                    body = seg.size_bytes - fmt.SEGMENT_HEADER_BYTES
                    if (seg is self._active or seg.unsynced or seg.compacting or body <= 0
                            or seg.live_bytes >= live_ratio_max * body):
                        continue
                    if quiet_only:
                        settling = seg.live_count != seg.live_at_look
                        seg.live_at_look = seg.live_count
                        if settling:
                            continue
                    candidates.append((seg.live_bytes / body, seg))
                candidates.sort(key=lambda c: c[0])
                chosen = []
                for _ratio, seg in candidates:
                    if chosen and seg.live_bytes > budget:
                        break
                    budget -= seg.live_bytes
                    seg.compacting = True
                    lengths = seg.lengths()
                    live = [(i, seg.offsets[i], lengths[i]) for i, st in enumerate(seg.states) if st == _LIVE]
                    chosen.append((seg, live))
            try:
                for seg, live in chosen:
                    kept, reclaimed = self._rewrite(seg, live)
                    report.segments_rewritten += 1
                    report.records_kept += kept
                    report.bytes_reclaimed += reclaimed
            finally:
                with self._lock:
                    for seg, _live in chosen:
                        seg.compacting = False
                        if seg.live_count == 0 and seg.base_seq in self._bases and not self._closed:
                            self._delete(seg)
                if chosen and not self._closed:
                    os.fsync(self._dir_fd)
        return report

    def _rewrite(self, seg: _Segment, live: list[tuple[int, int, int]]) -> tuple[int, int]:
        """Write the live records of a sealed segment to a new file and swap it in."""
        src = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(src, seg.size_bytes, 0)
        finally:
            os.close(src)
        out = bytearray(fmt.encode_segment_header(seg.base_seq))
        new_offsets: list[tuple[int, int, int]] = []  # (index, new offset, length)
        for i, offset, length in live:
            end = offset + fmt.RECORD_HEADER_BYTES + length
            rec = fmt.decode_record_at(data, offset, self.record_bytes_max)
            if rec is None or rec.seq != seg.base_seq + i:
                raise StoreError(f"Segment log {self.directory}: record {seg.base_seq + i} in segment "
                                 f"{seg.path.name} at offset {offset} is corrupt; not compacting it")
            new_offsets.append((i, len(out), length))
            out += data[offset:end]
        tmp = seg.path.with_name(seg.path.name + COMPACT_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, out)
            _fdatasync(fd)
        finally:
            os.close(fd)
        with self._lock:
            if self._closed or seg.base_seq not in self._bases:
                os.unlink(tmp)
                return 0, 0
            os.rename(tmp, seg.path)
            kept = {i for i, _, _ in new_offsets}
            for i, st in enumerate(seg.states):
                if st == _RELEASED and i not in kept:
                    seg.states[i] = _ABSENT  # released before the copy: not in the new file
            seg.moved(new_offsets, len(out))
            reclaimed = seg.size_bytes - len(out)
            seg.size_bytes = len(out)
            if seg.read_fd is not None:
                os.close(seg.read_fd)
                seg.read_fd = None
        log.info("Segment log %s: compacted segment %s: kept %d records, reclaimed %d bytes",
                 self.directory, seg.path.name, len(new_offsets), reclaimed)
        return len(new_offsets), reclaimed

    # -- state ----------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The highest seq appended (0 when none ever was)."""
        return self._next_seq - 1

    @property
    def written_seq(self) -> int:
        return self._written_seq

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments_deleted(self) -> int:
        """How many segments this log has deleted since it was opened (a cheap change signal)."""
        return self._segments_deleted

    @property
    def live_records(self) -> int:
        with self._lock:
            return sum(s.live_count for s in self._segments)

    def segment_names(self) -> list[str]:
        with self._lock:
            return [s.path.name for s in self._segments]

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Sync what was appended (unless the log failed), record the clean close (`CLEAN_FILE`,
        read back as `closed_cleanly` by the next open) and release the files."""
        if self._closed:
            return
        if self._failed is None:
            self.sync()
        if self._unlinker is not None:
            self._unlinker.close()  # the deleted segments are gone before the clean close is recorded
        with self._compact_lock, self._sync_lock, self._lock:
            if self._closed:
                return
            if self._failed is None and self._synced_mark != (self._active.base_seq, self._active.size_bytes):
                self._write_synced(self._active.base_seq, self._active.size_bytes)  # all of it: just synced
            if self._failed is None:
                self._leave_clean_mark()
            self._closed = True
            self._close_fds()

    def _leave_clean_mark(self) -> None:
        try:
            fd = os.open(self.directory / CLEAN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.fsync(self._dir_fd)
        except OSError as e:  # the next open takes the log for one that was not closed: safe
            log.warning("Segment log %s: could not record the clean close: %s", self.directory, e)

    def _close_fds(self) -> None:
        for _seg, fd in self._sealed_unsynced:
            os.close(fd)
        self._sealed_unsynced = []
        for seg in self._segments:
            if seg.read_fd is not None:
                os.close(seg.read_fd)
                seg.read_fd = None
        if self._active_fd >= 0:
            os.close(self._active_fd)
            self._active_fd = -1
        if getattr(self, "_synced_fd", -1) >= 0:
            os.close(self._synced_fd)
            self._synced_fd = -1
        if getattr(self, "_dir_fd", -1) >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

