"""A stream member that writes each batch's chunk as the batch enters its Raft log, so that a
batch is written once, not twice.

Without this, a member writes every batch twice: the Raft log's record of the entry when it is
appended, and the chunk when the entry is committed and applied. With three replicas the six
writes of each batch (all fsynced) asked more of the disk than it had.

Numbering and deduplicating an entry depends only on the entries before it in the log, and by
Raft's log matching property every member that holds an entry holds the same entries before
it, committed or not. So `AheadWriter` keeps a second `StreamMachine` (`ahead`) whose state is
the applied one carried over every entry in the Raft log, and applies each entry to it as the
entry is appended: that writes the entry's chunk into the member's chunk log at once. The Raft
log's record then keeps the entry without its records (`machine.reference_entry`: the chunk's
offset and data CRC instead), and an entry read back from its record is made whole from the
chunk (`restored`). Applying the committed entry later finds its chunk in the log and changes
only the state; readers stop at what is applied (`StreamMachine.committed`).

An entry is kept whole in its record when its chunk does not hold all of its records (some were
duplicates), or when the member does not write ahead: while it closes a gap (a snapshot from
the leader past its log's end), it writes at apply, as before, and writes ahead again from the
next append after the gap is closed, starting with the entries not yet applied.

Truncation. When the leader replaces entries of this member's log, the chunks written for them
are cut (`StreamLog.truncate`, fsynced) before the new entries are written, and `ahead` is
rebuilt from the applied state and the entries that stay. A snapshot installed from the leader
cuts every chunk not yet applied.

Durability. A record names a chunk written before it, and the Raft host fsyncs every chunk log
written since its last fsync before the Raft log itself, counting as durable only the records
appended by then (`RaftHostStorage.side_written`, `take_side`). After a crash a record may
still be on disk while the chunk it names is not (the page cache writes back in any order):
such a record was never acknowledged, so `attach` cuts the Raft log before it
(`RaftLog.cut_after`). Chunks past the end of the recovered Raft log are cut too.

Retention may remove a chunk whose entry is still in the Raft log (before the first snapshot,
or with a tiny size limit): the entry then reads back as the reference it was stored as, and a
machine applies it to its state alone (the chunk, were it there, would be below the log's
start). A follower so far behind that it must write such a chunk starts its log after it,
since every other member has removed it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hutch.cluster.raftlog import RaftLog, RaftLogError
from hutch.raft.messages import ENTRY_NORMAL, Entry
from hutch.store.stream_log import StreamLogError
from hutch.streamproto.chunk import ChunkError
from hutch.streams import machine as sm

log = logging.getLogger("hutch.streams")

_ALL = 1 << 62
# The entries a stream's Raft log keeps in memory. An entry read back for a follower or for
# applying is its chunk read from the chunk log and the entry made again around it; with the
# node's default (8 MiB, eight full batches, no more than a follower's AppendEntries in flight)
# a three-replica stream's leader did that for most batches: it confirmed 155,000-176,000 msg/s,
# against 169,000-183,000 with 32 MiB and 179,000-189,000 with 64 MiB. A stream's Raft log is
# compacted every `host.RAFT_SNAPSHOT_AFTER` batches, so this is reached only under a full load.
RAFT_MEMORY_BYTES = 64 << 20


class ChunkNotThere(RaftLogError):
    """An entry's record names a chunk that the chunk log does not hold (as named)."""


class AheadWriter:
    """One stream replica's `raftlog.EntryCodec` (see the module docstring). `replica()` gives
    the replica's applied machine and its chunk log (None when closed); `applied()` the Raft
    group's applied index (None before the group exists)."""

    __slots__ = ("replica", "applied", "name", "ahead")

    def __init__(self, replica: Callable[[], tuple[sm.StreamMachine, Any] | None], applied: Callable[[], int | None],
                 name: str):
        self.replica = replica
        self.applied = applied
        self.name = name
        self.ahead: sm.StreamMachine | None = None

    # -- the Raft log's side --------------------------------------------------------------------

    def attach(self, storage: RaftLog) -> None:
        """Take over the group's log as recovered (before the group starts): make the chunk log
        and the Raft log end together, and write ahead from here."""
        storage.codec = self
        storage.memory_bytes = RAFT_MEMORY_BYTES
        rep = self.replica()
        if rep is None or rep[0].missing_from is not None:
            return
        m, lg = rep
        self.ahead = self._carried(storage, m, lg, storage.snapshot().meta.index + 1, storage.last_index() + 1,
                                   recovering=True)

    def appending(self, storage: RaftLog, entries: list[Entry]) -> list[Entry]:
        rep = self.replica()
        if rep is None:
            self.ahead = None
            return entries
        m, lg = rep
        first = entries[0].index
        a = self.ahead
        if first <= storage.last_index():  # a conflicting suffix is replaced: cut its chunks first
            a = None
        if a is None:
            a = self._start(storage, m, lg, first)
            if a is None:
                return entries
        out = []
        for e in entries:
            w = self._apply(a, e)
            if w is not None and w.crc and not w.duplicates and w.first is not None:
                e = Entry(e.term, e.index, e.kind, sm.reference_entry(e.data, w.first, w.crc))
            out.append(e)
        self.ahead = a
        storage.host.side_written(self)
        return out

    def restored(self, entry: Entry) -> Entry:
        data = entry.data
        if entry.kind != ENTRY_NORMAL or not sm.is_reference(data):
            return entry
        rep = self.replica()
        if rep is None:
            raise RaftLogError(f"stream {self.name}: entry {entry.index} is kept in a chunk log that is closed")
        lg = rep[1]
        offset = sm.reference_offset(data)
        if offset < lg.first_offset:
            return entry  # retention removed its chunk: the entry stays a reference (applied to the state alone)
        try:
            got = lg.read(offset, 1)
            if not got or got[0][0].chunk_id != offset:
                raise ValueError(f"no chunk at offset {offset} (the log ends at {lg.next_offset})")
            return Entry(entry.term, entry.index, entry.kind, sm.full_entry(data, got[0][1]))
        except (ValueError, ChunkError) as e:
            raise ChunkNotThere(f"stream {self.name}: entry {entry.index} cannot be read back from its chunk: "
                                f"{e}") from e
        except (StreamLogError, OSError) as e:
            raise RaftLogError(f"stream {self.name}: entry {entry.index} cannot be read back from its chunk: "
                               f"{e}") from e

    def replacing(self) -> None:
        """A snapshot from the leader replaces the whole Raft log: the chunks not yet applied
        may be of entries it drops."""
        self.ahead = None
        rep = self.replica()
        if rep is None:
            return
        m, lg = rep
        if m.missing_from is None and lg.next_offset > m.next_offset:
            self._truncate(lg, m.next_offset)

    # -- the Raft host's side -------------------------------------------------------------------

    def sync(self) -> None:
        """Fsync the chunk log before the Raft log (in the Raft host's worker thread); nothing
        when the replica closed meanwhile."""
        rep = self.replica()
        if rep is None:
            return
        lg = rep[1]
        try:
            lg.sync()
        except StreamLogError:
            if not lg.closed:
                raise

    # -- inside ---------------------------------------------------------------------------------

    def _start(self, storage: RaftLog, m: sm.StreamMachine, lg: Any, upto: int) -> sm.StreamMachine | None:
        """`ahead` from the applied state carried over the log's entries below `upto` (their chunks
        written where they are not yet), the chunk log cut back to its end; None when this member
        cannot write ahead now: it is closing a gap, or has installed a snapshot from the leader
        that its machine has not restored yet (the Raft host restores it at its next pass)."""
        applied = self.applied()
        if m.missing_from is not None or applied is None or applied < storage.snapshot().meta.index:
            return None  # closing a gap, or a snapshot from the leader not restored into `m` yet
        return self._carried(storage, m, lg, applied + 1, upto, recovering=False)

    def _carried(self, storage: RaftLog, m: sm.StreamMachine, lg: Any, lo: int, hi: int,
                 recovering: bool) -> sm.StreamMachine:
        """A clone of `m` carried over the log's entries [lo, hi) (their chunks written where
        they are not yet), the chunk log cut back to its end. `recovering` (at start): an entry
        whose chunk did not survive a crash ends the Raft log before it."""
        a = m.clone()
        for index in range(max(lo, storage.first_index()), hi):
            try:
                e = storage.entries(index, index + 1, _ALL)[0]  # read ahead: one read for many
            except ChunkNotThere as err:
                if not recovering:
                    raise
                log.warning("stream %s: entry %d of its Raft log names a chunk that did not survive a crash (%s); "
                            "the log is cut before it (an entry whose chunk was not yet fsynced)", self.name, index,
                            err)
                storage.cut_after(index - 1)
                break
            self._apply(a, e)
        if lg.next_offset > a.next_offset:
            if recovering:
                log.info("stream %s: removing chunks from offset %d, past the end of its Raft log", self.name,
                         a.next_offset)
            self._truncate(lg, a.next_offset)
        return a

    def _apply(self, a: sm.StreamMachine, e: Entry) -> sm.Written | None:
        """Entry `e` on the machine that runs ahead (writing its chunk unless it is there)."""
        if e.kind != ENTRY_NORMAL or not e.data:
            return None
        lg = a.log
        if sm.is_reference(e.data):
            offset = sm.reference_offset(e.data)
            if offset >= lg.next_offset:  # every other member removed it: this log starts after it
                self._restart_after(a, lg, e)
        try:
            return a.apply(e.data, e.term)
        except (OSError, StreamLogError, ValueError, AssertionError) as err:
            raise RaftLogError(f"stream {self.name}: entry {e.index} could not be written to the chunk log: "
                               f"{err}") from err

    def _restart_after(self, a: sm.StreamMachine, lg: Any, e: Entry) -> None:
        n = sm.decode_entry(e.data)[8]
        end = sm.reference_offset(e.data) + n
        log.warning("stream %s: entry %d names a chunk that retention removed from every other member; this "
                    "replica's log now starts at offset %d", self.name, e.index, end)
        try:
            if lg.next_offset > lg.first_offset:
                lg.truncate(lg.first_offset)
            lg.reset(end)
        except (OSError, StreamLogError) as err:
            raise RaftLogError(f"stream {self.name}: could not restart its log at offset {end}: {err}") from err

    def _truncate(self, lg: Any, offset: int) -> None:
        try:
            lg.truncate(offset)
        except (OSError, StreamLogError) as err:
            raise RaftLogError(f"stream {self.name}: could not cut its chunk log back to offset {offset}: "
                               f"{err}") from err


__all__ = ["AheadWriter", "ChunkNotThere"]
