"""A node's Raft log on disk: every Raft group of the node in one shared segment log.

Ra (RabbitMQ's Raft) keeps one write-ahead log per node for all its groups, so a node
with thousands of quorum queues still makes one fsync per batch. This module does the same
on `hutch.store.SegmentLog`. `RaftHostStorage` owns the log and hands each group a
`RaftLog`, an implementation of `hutch.raft.storage.LogStorage`: a table of the group's
entries (their terms and records, the newest ones themselves; older ones are read back from
their records) in front of the shared log (what survives). Every
change the group makes to its storage is appended to the segment log as it happens, as one
record keyed by the group id:

- `EntriesRecord(entries)` — an append; like `LogStorage.append` it first discards every
  entry from `entries[0].index` on, so a conflicting suffix is replaced by the same record
  that writes the new entries;
- `HardStateRecord(hs)` — term, vote, commit;
- `SnapshotRecord(snapshot, keep_from, last_index)` — a snapshot (its data included) and the
  window of entries that stayed: a local compaction keeps `[keep_from, last_index]`; a
  snapshot installed from the leader keeps nothing.

Nothing is durable until `RaftHostStorage.sync()` (one fsync for all groups), which the
runtime calls in step 1 of the Ready contract, before sending the Ready's messages.

Recovery (after a clean stop or a kill -9) refuses a log with corrupt data in it (the segment
log's CRC found a damaged record that is not a torn tail): whatever was lost may have been a
group's newest term and vote, and coming back with an older one could make this node vote
twice in a term. Otherwise it replays the records in log order: an append
drops the entries at and after its first index, a snapshot record drops the entries outside
its window, the last hard state and snapshot records win. What comes back is exactly what
was durable: every group's entries, hard state and snapshot, and never an entry that a later
durable record had truncated.

Compaction. A record is released to the segment log (which deletes or rewrites segments
whose records are all or mostly released) once nothing needs it: an entries record when none
of its entries is still in the group's log, an old hard state or snapshot record when a newer
one exists — and only once the record that replaced it is durable, so after a crash one of
the two is always there. A released record may stay on disk (its segment holds live records) while the one
that truncated it is gone; replaying it is harmless, because every record overwrites
blindly: the record that wrote the last entry of the group's log is live and later, and
discards everything above it; the newest snapshot record is live and discards everything
outside its window; every entry still in the log is rewritten by its own live record. So a
released record can never bring back a truncated entry (docs/design/catalogue.md has the
argument in full; the randomized tests check it with segments small enough to delete and
rewrite all the time).

What it must never do: report an entry durable before its record is fsynced; release a
record whose replacement is not durable; bring back a truncated entry. Group ids are the
segment log's stream keys: integers in [0, 2**64). A snapshot must fit one record
(`record_bytes_max`, 16 MiB by default). Use a host from one thread.
"""

from __future__ import annotations

import os
from array import array
from collections import deque
from typing import Protocol

import msgspec

from hutch.raft.messages import Entry, HardState, Snapshot, SnapshotMeta, entry_size_bytes
from hutch.raft.storage import EntryWindow, bootstrap_log
from hutch.store import SegmentLog
from hutch.store.segment_log import RECORD_BYTES_MAX_DEFAULT


class RaftLogError(Exception):
    """The shared Raft log cannot be used as asked (or its records are inconsistent)."""


class EntriesRecord(msgspec.Struct, tag=1, array_like=True, gc=False, frozen=True):
    entries: list[Entry]


class HardStateRecord(msgspec.Struct, tag=2, array_like=True, gc=False, frozen=True):
    hs: HardState


class SnapshotRecord(msgspec.Struct, tag=3, array_like=True, gc=False, frozen=True):
    snapshot: Snapshot
    keep_from: int
    last_index: int  # the entries [keep_from, last_index] stayed in the log


LogRecord = EntriesRecord | HardStateRecord | SnapshotRecord

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(LogRecord).decode

_EMPTY_HS = HardState()
_EMPTY_SNAP = Snapshot(SnapshotMeta())
GROUP_ID_MAX = (1 << 64) - 1
# the largest entry a queue's group proposes: the log takes records up to its record limit, and
# an entry's framing goes around it; a larger publish or batch is refused before it is proposed
ENTRY_BYTES_MAX = RECORD_BYTES_MAX_DEFAULT - (64 << 10)
# A group keeps its newest entries in memory (they are sent to followers and applied at once)
# up to either bound; older ones are read back from the segment log when asked for, the
# records after one that was asked for read ahead with it (a follower catching up, a quorum
# queue's consumers draining a backlog read the log in order).
MEMORY_ENTRIES = 8192
MEMORY_BYTES = 8 << 20
READ_AHEAD_RECORDS = 256
READ_CACHE_ENTRIES = 4096


class RaftLog(EntryWindow):
    """One group's `LogStorage`, backed by the host's shared segment log.

    Besides the interface it keeps, per entry, its term and the seq of the record that wrote
    it, and per record how many of its entries are still in the log, so it knows when a record
    may go. Only the newest entries stay in memory (MEMORY_ENTRIES, `memory_bytes`); an older one
    is None in `_entries` and is read back from its record when asked for."""

    __slots__ = ("host", "group_id", "_entries", "_terms", "_seqs", "_offset", "_hs", "_hs_seq", "_snap",
                 "_snap_seq", "_counts", "truncations", "_mem_lo", "_mem_bytes", "_cache", "reads", "codec",
                 "memory_bytes")

    def __init__(self, host: RaftHostStorage, group_id: int) -> None:
        self.host = host
        self.group_id = group_id
        self._entries: list[Entry | None] = []  # None: only in the segment log
        self._terms = array("Q")  # term of each entry in _entries
        self._seqs = array("Q")  # record seq of each entry in _entries
        self._offset = 1  # index of _entries[0]
        self._mem_lo = 1  # every entry from this index on is in memory, none below it
        self._mem_bytes = 0  # entry_size_bytes of the entries in memory
        self._cache: dict[int, Entry] = {}  # entries read back lately, by index
        self.reads = 0  # segment log reads made for entries not in memory
        self._hs = _EMPTY_HS
        self._hs_seq = 0  # 0: no record
        self._snap = _EMPTY_SNAP
        self._snap_seq = 0
        self._counts: dict[int, int] = {}  # entries record seq -> its entries still in the log
        self.truncations = 0
        self.codec: EntryCodec | None = None  # how the group's records keep its entries (None: as they are)
        self.memory_bytes = MEMORY_BYTES  # the bound of the entries kept in memory (a group may have its own)

    # -- LogStorage: reads ----------------------------------------------------------------------

    def term(self, index: int) -> int | None:
        i = index - self._offset
        if 0 <= i < len(self._terms):
            return self._terms[i]
        if index == self._snap.meta.index:
            return self._snap.meta.term
        return None

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo >= self._mem_lo or lo >= hi:
            return EntryWindow.entries(self, lo, hi, max_bytes)
        if lo < self._offset or hi > self.last_index() + 1:
            raise IndexError(f"entries [{lo}, {hi}) outside log [{self._offset}, {self.last_index()}]")
        out: list[Entry] = []
        size = 0
        for index in range(lo, hi):
            e = self._entries[index - self._offset] or self._cache.get(index) or self._read(index)
            size += entry_size_bytes(e)
            if size > max_bytes and out:
                break
            out.append(e)
        return out

    def _read(self, index: int) -> Entry:
        """Entry `index` from its record, and the entries of the records after it, up to
        READ_AHEAD_RECORDS, into the cache."""
        off = self._offset
        seqs = self._seqs
        entries = self._entries
        first = index - off
        wanted: list[int] = []
        i = first
        end = min(len(seqs), self._mem_lo - off)
        while i < end and len(wanted) < READ_AHEAD_RECORDS:
            s = seqs[i]
            if not wanted or wanted[-1] != s:
                wanted.append(s)
            i += 1
        if len(self._cache) + (i - first) > READ_CACHE_ENTRIES:
            self._cache.clear()
        self.reads += 1
        for rec in self.host.log.read_many(wanted):
            if isinstance(rec, Exception):
                raise RaftLogError(f"Raft log {self.host.log.directory}: group {self.group_id} cannot read back "
                                   f"entry {index}: {rec}") from rec
            record = _decode(rec.payload)
            if type(record) is not EntriesRecord:
                raise RaftLogError(f"Raft log {self.host.log.directory}: record {rec.seq} of group {self.group_id} "
                                   f"holds no entries")
            codec = self.codec
            for e in record.entries:
                j = e.index - off
                if first <= j < end and seqs[j] == rec.seq and entries[j] is None:
                    if codec is not None:
                        try:
                            e = codec.restored(e)
                        except RaftLogError:
                            if e.index == index:
                                raise
                            continue  # one read ahead: it fails again if it is asked for
                    self._cache[e.index] = e
        got = self._cache.get(index)
        if got is None:
            raise RaftLogError(f"Raft log {self.host.log.directory}: group {self.group_id}: entry {index} is not "
                               f"in record {seqs[first]}")
        return got

    # -- LogStorage: writes -------------------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first > self.last_index() + 1:
            raise IndexError(f"append at {first} leaves a gap after {self.last_index()}")
        if first < self._offset:
            raise IndexError(f"append at {first} below the first index {self._offset}")
        if entries[-1].index != first + len(entries) - 1:
            raise IndexError(f"entries to append are not consecutive: {first}..{entries[-1].index}")
        stored = entries if self.codec is None else self.codec.appending(self, entries)
        seq = self.host._write(self.group_id, EntriesRecord(stored))
        if first <= self.last_index():
            self._cut_from(first, seq)
        self._entries.extend(entries)
        self._terms.extend([e.term for e in entries])
        self._seqs.extend([seq] * len(entries))
        self._counts[seq] = len(entries)
        size = self._mem_bytes
        for e in entries:
            size += len(e.data) + 16  # entry_size_bytes
        self._mem_bytes = size
        if size > self.memory_bytes or self.last_index() - self._mem_lo >= MEMORY_ENTRIES:
            self._page_out()

    def _page_out(self) -> None:
        """Let the oldest entries in memory go (they stay in their records) until both bounds hold."""
        entries = self._entries
        off = self._offset
        lo = self._mem_lo
        last = self.last_index()
        size = self._mem_bytes
        bound = self.memory_bytes
        while lo < last and (size > bound or last - lo >= MEMORY_ENTRIES):
            size -= len(entries[lo - off].data) + 16
            entries[lo - off] = None
            lo += 1
        self._mem_lo, self._mem_bytes = lo, size

    def _forget(self, lo: int, hi: int) -> None:
        """Entries [lo, hi) of _entries leave the log: their memory is no longer counted."""
        for e in self._entries[max(lo, self._mem_lo - self._offset):hi]:
            self._mem_bytes -= len(e.data) + 16
        self._cache.clear()

    def set_hard_state(self, hs: HardState) -> None:
        seq = self.host._write(self.group_id, HardStateRecord(hs))
        if self._hs_seq:
            self.host._retire(self._hs_seq, seq)
        self._hs, self._hs_seq = hs, seq

    def install_snapshot(self, snap: Snapshot) -> None:
        if self.codec is not None:
            self.codec.replacing()
        index = snap.meta.index
        seq = self.host._write(self.group_id, SnapshotRecord(snap, index + 1, index))
        self._drop(0, len(self._entries), seq)
        self._forget(0, len(self._entries))
        self._entries = []
        self._terms = array("Q")
        self._seqs = array("Q")
        self._offset = self._mem_lo = index + 1
        self._new_snapshot(snap, seq)

    def create_snapshot(self, snap: Snapshot, keep_from: int) -> None:
        if snap.meta.index > self.last_index() or snap.meta.index < self._snap.meta.index:
            raise IndexError(f"snapshot at {snap.meta.index} outside log [{self._offset}, {self.last_index()}]")
        keep_from = max(self._offset, min(keep_from, snap.meta.index + 1))
        seq = self.host._write(self.group_id, SnapshotRecord(snap, keep_from, self.last_index()))
        n = keep_from - self._offset
        self._drop(0, n, seq)
        self._forget(0, n)
        del self._entries[:n]
        del self._terms[:n]
        del self._seqs[:n]
        self._offset = keep_from
        self._mem_lo = max(self._mem_lo, keep_from)
        self._new_snapshot(snap, seq)

    def cut_after(self, index: int) -> None:
        """Drop the entries after `index` (entries this node wrote but cannot read back whole
        after a crash: never acknowledged, so as good as never written). Recorded as a snapshot
        record of the snapshot the group has, whose window ends at `index`."""
        if not self._offset - 1 <= index < self.last_index():
            raise IndexError(f"cut after {index} outside log [{self._offset}, {self.last_index()}]")
        seq = self.host._write(self.group_id, SnapshotRecord(self._snap, self._offset, index))
        self._cut_from(index + 1, seq)
        self._new_snapshot(self._snap, seq)

    def _cut_from(self, index: int, by_seq: int) -> None:
        """The entries from `index` on leave the log because of record `by_seq`."""
        cut = index - self._offset
        self.truncations += 1
        self._drop(cut, len(self._entries), by_seq)
        self._forget(cut, len(self._entries))
        del self._entries[cut:]
        del self._terms[cut:]
        del self._seqs[cut:]
        self._mem_lo = min(self._mem_lo, index)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _new_snapshot(self, snap: Snapshot, seq: int) -> None:
        if self._snap_seq:
            self.host._retire(self._snap_seq, seq)
        self._snap, self._snap_seq = snap, seq

    def _drop(self, lo: int, hi: int, by_seq: int) -> None:
        """Entries [lo, hi) of _entries leave the log because of record `by_seq`."""
        counts = self._counts
        i = lo
        seqs = self._seqs
        while i < hi:  # runs of one record at a time
            s = seqs[i]
            j = i + 1
            while j < hi and seqs[j] == s:
                j += 1
            left = counts[s] - (j - i)
            if left:
                counts[s] = left
            else:
                del counts[s]
                self.host._retire(s, by_seq)
            i = j

    def record_seqs(self) -> list[int]:
        """Seqs of the records this group still needs (for tests and diagnostics)."""
        out = set(self._counts)
        if self._hs_seq:
            out.add(self._hs_seq)
        if self._snap_seq:
            out.add(self._snap_seq)
        return sorted(out)


class SideFile(Protocol):
    def sync(self) -> None: ...


class EntryCodec(Protocol):
    """How a group's records keep its entries, when not as they are (a stream's Raft log keeps
    a batch without its records once they are in the stream's own log: `hutch.streams.ahead`)."""

    def appending(self, log: RaftLog, entries: list[Entry]) -> list[Entry]:
        """`entries` are about to be appended (the log still holds any they replace): the
        entries as their record is to keep them."""

    def restored(self, entry: Entry) -> Entry:
        """An entry as its record kept it, made whole."""

    def replacing(self) -> None:
        """The whole log is about to be replaced by a snapshot from the leader."""


class RaftHostStorage:
    """The node's Raft log: one `SegmentLog` in `directory`, one `RaftLog` per group.

    Opening it recovers every group from the log. Per Ready batch: let the groups write,
    call `sync()` once, then send. Call `maintain()` now and then (after snapshots) to rewrite
    mostly-released segments."""

    def __init__(self, directory: str | os.PathLike, **segment_log_options) -> None:
        self.directory = directory
        self._rebuilds: dict[int, _Rebuild] = {}
        # the groups are rebuilt as the log's recovery checks each record: the log is read once
        self.log = SegmentLog(directory, visit=self._visit, **segment_log_options)
        self.groups: dict[int, RaftLog] = {}
        # (record, the record that replaced it): released once the second is durable.
        self._retiring: deque[tuple[int, int]] = deque()
        self.released_count = 0
        self.closed = False
        # files that hold what this log's records name (a stream's chunk log), written since they
        # were last handed to an fsync: fsynced before the log itself (`take_side`, `sync`)
        self._side: dict[int, SideFile] = {}
        try:
            self._recover()
        except BaseException:
            self.log.close()
            raise

    # -- groups --------------------------------------------------------------------------------

    def group(self, group_id: int) -> RaftLog:
        """The storage of `group_id`, recovered from disk, or new and empty."""
        st = self.groups.get(group_id)
        if st is None:
            if not 0 <= group_id <= GROUP_ID_MAX:
                raise RaftLogError(f"group id {group_id} is outside [0, 2**64)")
            st = self.groups[group_id] = RaftLog(self, group_id)
        return st

    def bootstrap(self, group_id: int, voters: tuple[int, ...]) -> RaftLog:
        """A new group's storage holding the bootstrap entry (see `raft.storage.bootstrap_log`)."""
        st = self.group(group_id)
        if st.last_index() != 0 or st.hard_state() != _EMPTY_HS:
            raise RaftLogError(f"group {group_id} already has a log")
        hs, entries = bootstrap_log(voters)
        st.append(entries)
        st.set_hard_state(hs)
        return st

    # -- durability and compaction ----------------------------------------------------------------

    def sync(self) -> int:
        """Make every record written so far durable (one fsync for all groups), the files its
        records name first; release the records that are no longer needed. Returns the durable
        seq."""
        for f in self.take_side():
            f.sync()
        durable = self.log.sync()
        self.settle(durable)
        return durable

    def side_written(self, f: SideFile) -> None:
        """`f` was written: records appended from now on may name what it holds, so the next
        fsync of this log fsyncs `f` first."""
        self._side[id(f)] = f

    def take_side(self) -> list[SideFile]:
        """The side files written since the last call, to fsync before this log (a runtime that
        fsyncs in a worker thread calls this on the owning thread, and claims durable only the
        records appended by then: `log.last_seq`)."""
        if not self._side:
            return []
        side, self._side = list(self._side.values()), {}
        return side

    def settle(self, durable_seq: int) -> None:
        """Release what became releasable now that `durable_seq` is durable (for a runtime that
        calls `log.sync()` in a worker thread itself; call this on the owning thread)."""
        q = self._retiring
        release = self.log.release
        while q and q[0][1] <= durable_seq:
            release(q.popleft()[0])
            self.released_count += 1

    def maintain(self, live_ratio_max: float = 0.5, rewrite_bytes_max: int | None = None) -> None:
        """Rewrite mostly-released segments (whole released segments go at once by themselves).
        Blocking file I/O: a runtime calls it from a worker thread."""
        self.log.compact(live_ratio_max, rewrite_bytes_max)

    def _write(self, group_id: int, record: LogRecord) -> int:
        return self.log.append(_encode(record), key=group_id)

    def _retire(self, seq: int, after_seq: int) -> None:
        self._retiring.append((seq, after_seq))

    @property
    def waiting_count(self) -> int:
        """Records no longer needed, kept until the records replacing them are durable."""
        return len(self._retiring)

    def close(self) -> None:
        """Sync what was written and close the log."""
        self.closed = True
        self.log.close()

    def __enter__(self) -> RaftHostStorage:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- recovery ---------------------------------------------------------------------------------

    def _visit(self, seq: int, key: int, payload: memoryview) -> None:
        try:
            record = _decode(payload)
        except msgspec.DecodeError as e:
            raise RaftLogError(f"Raft log {self.directory}: record {seq} of group {key} "
                               f"cannot be decoded: {e}") from e
        rb = self._rebuilds.get(key)
        if rb is None:
            rb = self._rebuilds[key] = _Rebuild()
        rb.apply(seq, record)

    def _recover(self) -> None:
        corrupt = self.log.recovery.corrupt
        if corrupt:
            # A damaged record may have been any group's newest term and vote: replaying around
            # it would bring back an older vote, and this node could vote twice in one term.
            where = ", ".join(f"segment {c.segment} at offset {c.offset} ({c.length} bytes)" for c in corrupt)
            raise RaftLogError(f"Raft log {self.log.directory} has corrupt data ({where}): the terms, votes and "
                               f"entries it holds cannot be trusted, so this node will not serve its Raft groups. "
                               f"Restore the data directory from a good copy, or remove the node from its "
                               f"cluster (forget_cluster_node) and add it back with an empty data directory")
        rebuilds, self._rebuilds = self._rebuilds, {}
        for gid, rb in rebuilds.items():
            self.groups[gid] = rb.finish(self, gid)
        # Everything replayed is durable: release what recovery found unneeded.
        self.settle(self.log.durable_seq)


class _Rebuild:
    """One group's state while its records are replayed. Entries (their terms and records) live
    in a dict because a released record may be missing from the disk, so the log can have holes
    until the records after it are replayed; `finish` checks that none is left. No entry's data
    is kept: the recovered log reads entries back from their records when asked for."""

    __slots__ = ("ents", "lo", "hi", "counts", "hs", "hs_seq", "snap", "snap_seq", "keep_from", "retired")

    def __init__(self) -> None:
        self.ents: dict[int, tuple[int, int]] = {}  # index -> (term, record seq)
        self.lo = 1 << 62  # no entry below this (or above hi) can be in `ents`
        self.hi = 0
        self.counts: dict[int, int] = {}
        self.hs, self.hs_seq = _EMPTY_HS, 0
        self.snap, self.snap_seq = _EMPTY_SNAP, 0
        self.keep_from = 1
        self.retired: list[int] = []

    def _remove(self, index: int) -> None:
        got = self.ents.pop(index, None)
        if got is None:
            return
        s = got[1]
        left = self.counts[s] - 1
        if left:
            self.counts[s] = left
        else:
            del self.counts[s]
            self.retired.append(s)

    def apply(self, seq: int, record: LogRecord) -> None:
        t = type(record)
        if t is EntriesRecord:
            first = record.entries[0].index
            for i in range(max(first, self.lo), self.hi + 1):
                self._remove(i)
            for e in record.entries:
                self.ents[e.index] = (e.term, seq)
            self.counts[seq] = len(record.entries)
            self.lo = min(self.lo, first)
            self.hi = record.entries[-1].index
        elif t is HardStateRecord:
            if self.hs_seq:
                self.retired.append(self.hs_seq)
            self.hs, self.hs_seq = record.hs, seq
        elif t is SnapshotRecord:
            for i in range(self.lo, min(record.keep_from, self.hi + 1)):
                self._remove(i)
            for i in range(max(record.last_index + 1, self.lo), self.hi + 1):
                self._remove(i)
            self.lo = max(self.lo, record.keep_from)
            self.hi = min(self.hi, record.last_index)
            if self.snap_seq:
                self.retired.append(self.snap_seq)
            self.snap, self.snap_seq, self.keep_from = record.snapshot, seq, record.keep_from
        else:  # pragma: no cover - the decoder admits nothing else
            raise RaftLogError(f"unknown record {record!r}")

    def finish(self, host: RaftHostStorage, gid: int) -> RaftLog:
        st = RaftLog(host, gid)
        if self.ents:
            lo, hi = min(self.ents), max(self.ents)
            if len(self.ents) != hi - lo + 1 or lo != max(self.keep_from, 1):
                raise RaftLogError(f"Raft log {host.log.directory}: group {gid} has holes in its recovered log "
                                   f"(indices {lo}..{hi}, {len(self.ents)} entries, first expected at "
                                   f"{max(self.keep_from, 1)})")
            st._entries = [None] * (hi - lo + 1)
            st._terms = array("Q", (self.ents[i][0] for i in range(lo, hi + 1)))
            st._seqs = array("Q", (self.ents[i][1] for i in range(lo, hi + 1)))
            st._offset = lo
            st._mem_lo = hi + 1
        else:
            st._offset = st._mem_lo = max(self.keep_from, self.snap.meta.index + 1, 1)
        st._hs, st._hs_seq = self.hs, self.hs_seq
        st._snap, st._snap_seq = self.snap, self.snap_seq
        st._counts = self.counts
        for s in self.retired:
            host._retire(s, 0)
        return st
