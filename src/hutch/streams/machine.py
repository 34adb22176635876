"""One member's replica of a stream: the state its Raft group's committed entries are applied
to, on top of the member's own log of chunks.

Entries (msgpack arrays; field order is the wire format, append only):

    [WRITE, origin node, request id, epoch, timestamp ms, writer, publishing ids | None,
     records, filter values | None, record count]
    [TRACK, reference, offset]

`records` is the records framed as a chunk's data (`chunk.frame`), `record count` of them, so
that a member applying the entry wraps a header around it and looks at no record (the proposer
frames them once; an entry of the first format, without the count, holds a list of records).

A `WRITE` becomes one chunk, numbered from the stream's next offset when it is applied, so every
member numbers every message alike. Deduplication is part of the state: a writer (a stream
publisher with a reference, or an AMQP 0-9-1 channel) has the highest publishing id applied,
and a record whose id is not above it is not written again (a publisher that resends after a
reconnect or a leader change gets its confirm, and the stream keeps one copy). A `TRACK` stores
a consumer's offset under its reference (the stream protocol's store_offset).

Snapshots hold only the numbers (next offset, writers, tracked offsets): the messages are in
the member's log, made durable before the Raft log is compacted to the snapshot. A member that
restores a snapshot whose next offset is beyond its log's end has a gap; it fetches the missing
chunks from another member (`missing_from`, `fill`) and writes the entries it applies meanwhile
once the gap is closed. A member's log may run past what is applied: at a restart the Raft log
is applied again from its snapshot (or its start) over the log the member kept, and a `WRITE`
whose chunk is already in the log is applied to the state only (the log holds only committed
entries, so the chunk there is the one the entry makes).

Deduplication keeps the highest publishing id and, besides it, the ids a writer skipped (a
bounded list of ranges, counted from 0 for a writer's first entry): an entry that overtook an
earlier one of the same writer (the earlier one was lost with a leader, or proposed before a
leader was known, and resent after the later one was committed) leaves the earlier ids as a
hole, and when they come they are written, not taken for duplicates.

A member may also write an entry's chunk before the entry is committed, as soon as it is in
its Raft log (`hutch.streams.ahead`): numbering and deduplicating an entry depends only on the
entries before it, which are the same on every member holding it. Such a member's log runs
ahead of its applied state; readers stop at the applied state (`committed`), and applying the
entry finds its chunk there. The Raft log's record of such an entry then holds it without its
records (`reference_entry`): `full_entry` makes it whole again from the chunk.

Must never: read a clock (times are in the entries), talk to peers, or import from
`hutch.broker` or above.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from hutch.streamproto import chunk

WRITE = 0
TRACK = 1
REF = 2  # a WRITE as a Raft log record keeps it when its chunk holds all its records (never proposed)
WRITERS_MAX = 4096  # writers remembered per stream (least recently written forgotten first)
TRACKED_MAX = 16384  # consumer references with a stored offset per stream
HOLES_MAX = 64  # ranges of publishing ids skipped, remembered per writer (the lowest forgotten first)
REFERENCE_BYTES_MAX = 256  # the stream protocol's publisher and consumer references

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


class _Write(msgspec.Struct, array_like=True):
    """A WRITE entry as decoded for applying: its framed records are a view into the entry's
    bytes, not a copy of them (an entry is up to 1000 KiB, applied on every member)."""

    kind: int
    origin: str
    req: int
    epoch: int
    timestamp: int
    writer: str
    pids: list[int] | None
    # framed (a view), or a list in an entry of the first format; None for a reference entry
    records: memoryview | list[bytes] | None
    filters: list[bytes | None] | None
    count: int = -1  # the framed records' count; -1 in an entry of the first format


_write_dec = msgspec.msgpack.Decoder(_Write)
_FIXARRAY_MIN, _FIXARRAY_MAX = 0x90, 0x9F


class StreamLogLike(Protocol):
    first_offset: int
    next_offset: int

    def append(self, chunk: bytes | tuple, chunk_id: int, num_records: int, timestamp: int, epoch: int,
               chunk_type: int = 0, filter: bytes | None = None, split_crc: tuple[int, int] | None = None) -> Any: ...

    def sync(self) -> None: ...


class Written:
    """What applying a WRITE did, for the leader to confirm to the publisher's node: `first`
    the offset of its first written record (None when all were duplicates), `written` and
    `duplicates` the counts; `crc` the CRC-32 of its chunk's data when this call wrote the
    chunk (0 otherwise)."""

    __slots__ = ("origin", "req", "first", "written", "duplicates", "crc")

    def __init__(self, origin: str, req: int, first: int | None, written: int, duplicates: int, crc: int = 0):
        self.origin = origin
        self.req = req
        self.first = first
        self.written = written
        self.duplicates = duplicates
        self.crc = crc

    def __repr__(self) -> str:
        return f"Written({self.origin}, {self.req}, first={self.first}, {self.written}+{self.duplicates} dup)"


def write_entry(origin: str, req: int, epoch: int, timestamp: int, writer: str, pids: Sequence[int] | None,
                records: Sequence[bytes], filters: Sequence[bytes | None] | None = None) -> bytes:
    return framed_write_entry(origin, req, epoch, timestamp, writer, pids, chunk.frame(records), len(records),
                              filters)


def framed_write_entry(origin: str, req: int, epoch: int, timestamp: int, writer: str, pids: Sequence[int] | None,
                       framed: bytes, count: int, filters: Sequence[bytes | None] | None = None) -> bytes:
    """A WRITE entry of `count` records already framed as a chunk's data (`chunk.frame`)."""
    return _enc.encode([WRITE, origin, req, epoch, timestamp, writer, pids, framed, filters, count])


def track_entry(reference: str, offset: int) -> bytes:
    return _enc.encode([TRACK, reference, offset])


def decode_entry(data: bytes) -> list:
    return _dec.decode(data)


def is_reference(data: bytes) -> bool:
    return len(data) > 1 and _FIXARRAY_MIN <= data[0] <= _FIXARRAY_MAX and data[1] == REF


def reference_entry(data: bytes, first: int, crc: int) -> bytes:
    """The WRITE entry `data` without its records, which are all in the chunk at offset `first`
    whose data has CRC-32 `crc` (what a Raft log record keeps of it)."""
    w = _write_dec.decode(data)
    return _enc.encode([REF, w.origin, w.req, w.epoch, w.timestamp, w.writer, w.pids, w.filters, w.count,
                        first, crc])


def full_entry(ref: bytes, stored: bytes | memoryview) -> bytes:
    """The WRITE entry that `reference_entry` made `ref` of, from the chunk it names as stored
    (ValueError, or `chunk.ChunkError`, when `stored` is not that chunk)."""
    _kind, origin, req, epoch, ts, writer, pids, filters, count, first, crc = _dec.decode(ref)
    h = chunk.read_header(stored)
    if h.first_offset != first or h.num_records != count or h.crc != crc:
        raise ValueError(f"the chunk at offset {h.first_offset} ({h.num_records} records, data CRC {h.crc:#010x}) is "
                         f"not the one the entry names (offset {first}, {count} records, data CRC {crc:#010x})")
    at = h.data_at
    return framed_write_entry(origin, req, epoch, ts, writer, pids, stored[at:at + h.data_length], count, filters)


def reference_offset(ref: bytes) -> int:
    """The offset of the chunk a reference entry names."""
    return _dec.decode(ref)[9]


class StreamMachine:
    """The applied state of one member's replica (see the module docstring)."""

    def __init__(self, log: StreamLogLike, filter_size: int = chunk.BLOOM_SIZE_DEFAULT):
        self.log = log
        self.filter_size = filter_size
        self.next_offset = 0  # the applied state starts empty: the Raft log (or a snapshot) rebuilds it
        self.writers: dict[str, int] = {}  # writer -> highest publishing id applied (insertion = recency)
        self.holes: dict[str, list[list[int]]] = {}  # writer -> [[first, last], ...] ids skipped, ascending
        self.tracking: dict[str, int] = {}  # consumer reference -> stored offset
        self.last_epoch = 0
        self.last_timestamp = 0
        # the gap a restored snapshot left: offsets [missing_from, next_offset) are not in the
        # log yet; chunks applied meanwhile wait in `pending`
        self.missing_from: int | None = None
        self.pending: list[tuple[bytes, int, int, int, int]] = []

    # ------------------------------------------------------------ applying

    def clone(self) -> StreamMachine:
        """A machine over the same log with this one's state (a member's writer that runs
        ahead of what is applied, `hutch.streams.ahead`)."""
        m = StreamMachine(self.log, self.filter_size)
        m.next_offset = self.next_offset
        m.writers = dict(self.writers)
        m.holes = {w: [list(r) for r in ranges] for w, ranges in self.holes.items()}
        m.tracking = dict(self.tracking)
        m.last_epoch = self.last_epoch
        m.last_timestamp = self.last_timestamp
        return m

    def apply(self, data: bytes, epoch: int | None = None) -> Written | None:
        """Apply one committed entry; `epoch`: the Raft term it was committed in (the chunk's
        epoch; the entry's own field when not given)."""
        if len(data) > 1 and _FIXARRAY_MIN <= data[0] <= _FIXARRAY_MAX and data[1] == WRITE:
            w = _write_dec.decode(data)
            if epoch is not None:
                w.epoch = epoch
            return self._write(w)
        e = _dec.decode(data)
        if e[0] == REF:  # a WRITE whose chunk is in the log already (or went with retention)
            _kind, origin, req, e_epoch, ts, writer, pids, filters, count, _first, _crc = e
            return self._write(_Write(WRITE, origin, req, e_epoch if epoch is None else epoch, ts, writer, pids,
                                      None, filters, count))
        if e[0] == TRACK:
            ref, offset = e[1], e[2]
            tr = self.tracking
            if ref not in tr and len(tr) >= TRACKED_MAX:
                del tr[next(iter(tr))]
            tr.pop(ref, None)
            tr[ref] = offset
            return None
        raise ValueError(f"unknown stream entry kind {e[0]!r}")

    def _write(self, w: _Write) -> Written:
        origin, req, epoch, ts, writer, pids, records, filters = (w.origin, w.req, w.epoch, w.timestamp, w.writer,
                                                                  w.pids, w.records, w.filters)
        framed = w.count >= 0  # records framed as a chunk's data, w.count of them (else a list)
        n = w.count if framed else len(records)
        dups = 0
        if writer and pids is not None:
            last = self.writers.pop(writer, -1)
            if len(self.writers) >= WRITERS_MAX:
                gone = next(iter(self.writers))
                del self.writers[gone]
                self.holes.pop(gone, None)
            if pids and pids[0] <= last:
                holes = self.holes.get(writer)
                keep = [i for i, p in enumerate(pids) if p > last or (holes is not None and _take(holes, p))]
                if holes == []:
                    del self.holes[writer]
                dups = n - len(keep)
                if records is None:
                    raise ValueError(f"a reference entry of writer {writer!r} holds {dups} record(s) this "
                                     f"member already has: its state is not the one the entry was written in")
                if framed:
                    records, framed = chunk.unframe(records, n), False
                records = [records[i] for i in keep]
                n = len(records)
                if filters is not None:
                    filters = [filters[i] for i in keep]
                pids = [pids[i] for i in keep]
            if pids:
                # a new writer's ids below its first are holes too: its first entry may be
                # committed after its second (lost with a leader, or proposed before the
                # leader was known, and sent again)
                self._skipped(writer, last, pids)
                last = max(last, pids[-1])
            self.writers[writer] = last
        if not n:
            return Written(origin, req, None, 0, dups)
        first = self.next_offset
        self.next_offset = first + n
        self.last_epoch = epoch
        self.last_timestamp = ts
        log = self.log
        if first < log.next_offset:  # written ahead, or applied again over the member's own log (a restart)
            if first + n > log.next_offset:
                raise AssertionError(f"stream entry for offsets {first}..{first + n - 1} ends past the log's end "
                                     f"{log.next_offset}: the log does not hold whole applied entries")
            return Written(origin, req, first, n, dups)
        if records is None:
            raise ValueError(f"the chunk of a reference entry (offsets {first}..{first + n - 1}) is not in the log, "
                             f"which ends at {log.next_offset}")
        values = [f for f in filters if f] if filters else ()
        if not framed:
            records = chunk.frame(records)
        head, crc = chunk.encode_head(records, n, ts, epoch, first, values, self.filter_size)
        if self.missing_from is None:  # the chunk's head, then its records as the entry holds them
            log.append((head, records), first, n, ts, epoch, split_crc=(len(head), crc))
        else:
            head += records
            self.pending.append((head, first, n, ts, epoch))
        return Written(origin, req, first, n, dups, crc)

    def _skipped(self, writer: str, last: int, pids: list[int]) -> None:
        """Remember the ids above `last` that the ascending new ids `pids` skip."""
        if pids[-1] - last == len(pids) and pids[0] == last + 1:
            return  # the usual case: the ids follow on without a gap
        prev = last
        for p in pids:
            if p > prev + 1:
                holes = self.holes.setdefault(writer, [])
                holes.append([prev + 1, p - 1])
                if len(holes) > HOLES_MAX:
                    del holes[0]
            prev = max(prev, p)

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The numbers; the Raft log may drop the entries before it only once the log is
        durable up to `next_offset` (`StreamLog.sync`, which the caller runs). With a gap the
        entries applied meanwhile wait in memory, not in the log, so there is nothing to sync:
        a restart fetches the gap again."""
        return _enc.encode([self.next_offset, list(self.writers.items()), list(self.tracking.items()),
                            self.last_epoch, self.last_timestamp, list(self.holes.items())])

    def restore(self, data: bytes) -> None:
        n, writers, tracking, epoch, ts, *more = _dec.decode(data)
        self.writers = {w: p for w, p in writers}
        self.holes = {w: [list(r) for r in ranges] for w, ranges in more[0]} if more else {}
        self.tracking = {r: o for r, o in tracking}
        self.last_epoch = epoch
        self.last_timestamp = ts
        self.pending.clear()
        self.next_offset = n
        log = self.log
        self.missing_from = log.next_offset if log.next_offset < n else None

    # ------------------------------------------------------------ closing a gap

    def fill(self, chunks: Sequence[bytes]) -> None:
        """Chunks fetched from another member for the gap (each whole, in order from
        `missing_from`; a chunk already there or out of order is ignored)."""
        log = self.log
        for c in chunks:
            if self.missing_from is None:
                return
            h = chunk.check(c)
            end = self.pending[0][1] if self.pending else self.next_offset
            if h.first_offset != log.next_offset or h.next_offset > end:
                continue
            log.append(bytes(c), h.first_offset, h.num_records, h.timestamp, h.epoch, split_crc=(h.data_at, h.crc))
            self.missing_from = log.next_offset
        self._close_gap()

    def restart_at(self, offset: int) -> None:
        """The gap starts below what any member still has (retention removed it everywhere):
        this member's log starts at `offset` instead."""
        log = self.log
        if self.missing_from is None or offset <= log.next_offset:
            return
        reset = getattr(log, "reset", None)
        if reset is not None:
            reset(offset)
        self.missing_from = log.next_offset
        self._close_gap()

    def _close_gap(self) -> None:
        if self.missing_from is None:
            return
        log = self.log
        pending = self.pending
        if pending and pending[0][1] == log.next_offset:
            for data, first, n, ts, epoch in pending:
                _append(log, data, first, n, ts, epoch)
            pending.clear()
        if log.next_offset >= self.next_offset:
            self.missing_from = None

    # ------------------------------------------------------------ reading

    @property
    def committed(self) -> int:
        """The end of what readers on this member may read: its contiguous log, up to what is
        applied (the log may hold chunks of entries not yet committed)."""
        end = self.log.next_offset
        return end if end < self.next_offset else self.next_offset

    def stored_offset(self, reference: str) -> int | None:
        return self.tracking.get(reference)

    def writer_sequence(self, writer: str) -> int:
        return self.writers.get(writer, 0)


def _append(log: StreamLogLike, data: bytearray, first: int, n: int, ts: int, epoch: int) -> None:
    """Append a chunk this member encoded: its header holds its data's CRC, so the log adds the
    header to it rather than reading the data again (`StreamLog.append`'s `split_crc`)."""
    h = chunk.read_header(data)
    log.append(data, first, n, ts, epoch, split_crc=(h.data_at, h.crc))


def _take(holes: list[list[int]], p: int) -> bool:
    """Whether `p` is in one of the ascending ranges `holes`; if so it is taken out of it."""
    i = bisect.bisect_right(holes, [p, _ID_MAX]) - 1
    if i < 0 or holes[i][1] < p:
        return False
    lo, hi = holes[i]
    if lo == hi:
        del holes[i]
    elif p == lo:
        holes[i][0] = p + 1
    elif p == hi:
        holes[i][1] = p - 1
    else:
        holes[i:i + 1] = [[lo, p - 1], [p + 1, hi]]
    return True


_ID_MAX = (1 << 64) - 1

__all__ = ["StreamMachine", "Written", "write_entry", "framed_write_entry", "track_entry", "decode_entry",
           "is_reference", "reference_entry", "full_entry", "reference_offset", "WRITE", "TRACK", "REF"]
