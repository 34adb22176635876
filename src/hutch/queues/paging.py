"""Disk-first classic queues: which message bodies stay in memory, and the paged tail.

A classic queue keeps a small *window* of its ready messages in memory (`QueueState`, whole
`Entry` objects with their bodies) and, past it, only a compact record of each newer message
(always for a persistent message of a durable queue, whose body is in the journal already; for
any other once the node's memory use passes `vm_memory_high_watermark_paging_ratio`):
where its body lives on the node's disk, its size, its expiry time and its delivery count. As
RabbitMQ's classic queues (CQv2) do, the bodies come back in publish order, a batch at a time,
when the in-memory part falls below a low mark, ahead of delivery (one `BodyStore` call a
batch, so the store reads a run of records in one go); a lazy queue
(`x-queue-mode: lazy`, policy key `queue-mode`) has a window of zero and holds no more than
the read-ahead batch.

Order is kept by one rule: once a message has been paged, every later one is paged too until
the tail is empty again, so the tail is always younger than everything in memory and its seqs
are consecutive. Returned (requeued) messages go back to memory, ahead of everything.

Where a body lives (a *location*, one unsigned 64-bit integer): a persistent message of a
durable queue is already in the node's message journal, so its location is the journal record's
seq; any other message was written to the node's scratch log, a second segment log that is never
fsynced and is wiped at boot, and its location is that record's seq with `SCRATCH` set.

A priority queue (`x-max-priority`) pages the same way, one tail per priority level
(`PagedLevels`): the rule holds level by level, so each level's paged messages are younger than
its messages in memory, and the queue reads back from the highest level that has messages
before it delivers (order per level, higher levels first). A level's seqs are not consecutive
(the levels interleave), so its tail keeps them (one more column).

This module decides and counts; it does no I/O. The queue asks a `BodyStore` (the broker, on
its journal and scratch log) for the bodies. The leader of a mirrored queue pages as any
other: it tells its mirrors what leaves the tail, and a sync reads paged messages without
taking them out of it (`BodyStore.peek_paged`). Not paged: quorum queues.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol

from hutch.queues.columns import DeltaColumn

if TYPE_CHECKING:
    from hutch.queues.message import Message

SCRATCH = 1 << 63  # a location in the scratch log (else: a journal seq)

WINDOW_MESSAGES_DEFAULT = 8192  # classic_queue.memory_window_messages
WINDOW_BYTES_DEFAULT = 16 * 1024 * 1024  # classic_queue.memory_window_bytes
READ_AHEAD_MESSAGES = 256  # bodies read back per batch, and the low mark that starts a batch
READ_AHEAD_BYTES = 4 * 1024 * 1024  # ... and at most this many body bytes per batch
PAGED_INDEX_BYTES = 5  # what a paged message's record costs the node's segment log index (beside the tail)


class PagingPolicy:
    """The per-queue numbers: the window (0: lazy) and the read-ahead batch."""

    __slots__ = ("window_messages", "window_bytes", "low_mark", "batch_messages", "batch_bytes")

    def __init__(self, window_messages: int = WINDOW_MESSAGES_DEFAULT, window_bytes: int = WINDOW_BYTES_DEFAULT,
                 batch_messages: int = READ_AHEAD_MESSAGES, batch_bytes: int = READ_AHEAD_BYTES):
        if window_messages < 0 or window_bytes < 0 or batch_messages < 1 or batch_bytes < 1:
            raise ValueError("paging windows are >= 0 and read-ahead batches >= 1")
        self.window_messages = window_messages
        self.window_bytes = window_bytes
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.low_mark = batch_messages

    @classmethod
    def lazy(cls, batch_messages: int = READ_AHEAD_MESSAGES, batch_bytes: int = READ_AHEAD_BYTES) -> PagingPolicy:
        return cls(0, 0, batch_messages, batch_bytes)

    def pages_out(self, ready_count: int, ready_bytes: int, paged_count: int) -> bool:
        """Does the next enqueued message go to disk? Yes once the tail has started (order),
        or when the in-memory ready messages fill the window (in count or in bytes)."""
        return paged_count > 0 or ready_count >= self.window_messages or ready_bytes >= self.window_bytes

    def wants_read_ahead(self, ready_count: int, paged_count: int) -> bool:
        """Read a batch back now? When the in-memory part is below the low mark."""
        return paged_count > 0 and ready_count < self.low_mark

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PagingPolicy) and all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self) -> str:
        return f"PagingPolicy(window={self.window_messages} msgs/{self.window_bytes} B, batch={self.batch_messages})"


class PagedTail:
    """The paged messages of one queue, oldest first, in parallel columns (no object per message).

    Per message: location, body size and delivery count (capped at 255), and the expiry time only
    once some message of the queue has one. Locations, sizes and expiry times are
    `DeltaColumn`s: a backlog of journal seqs and like sizes costs about three bytes a message.
    Seqs are consecutive from `first_seq`; a tail made with `gaps=True` (a priority level's)
    takes increasing seqs with gaps and keeps them (a fourth column)."""

    __slots__ = ("count", "bytes", "first_seq", "_locs", "_sizes", "_counts", "_ci", "_expiry", "_seqs")

    def __init__(self, gaps: bool = False) -> None:
        self.count = 0
        self.bytes = 0
        self.first_seq = 0
        self._locs = DeltaColumn()
        self._sizes = DeltaColumn()
        self._counts = bytearray()
        self._ci = 0  # index of the head in _counts
        self._expiry: DeltaColumn | None = None  # expiry time + 1; 0: none
        self._seqs: DeltaColumn | None = DeltaColumn() if gaps else None

    def __len__(self) -> int:
        return self.count

    @property
    def next_seq(self) -> int:
        """The lowest seq the next append may take."""
        if self._seqs is not None:
            return self._seqs.last + 1 if self.count else self.first_seq
        return self.first_seq + self.count

    def append(self, seq: int, loc: int, size: int, expires_at_ms: int | None = None,
               delivery_count: int = 0) -> None:
        seqs = self._seqs
        if self.count == 0:
            self._clear()
            self.first_seq = seq
        elif seq < self.next_seq if seqs is not None else seq != self.first_seq + self.count:
            raise ValueError(f"paged seq {seq} out of order: the tail expects {self.next_seq}"
                             + (" or later" if seqs is not None else ""))
        if seqs is not None:
            seqs.append(seq)
        self._locs.append(loc)
        self._sizes.append(size)
        self._counts.append(min(delivery_count, 255))
        exp = self._expiry
        if expires_at_ms is not None and exp is None:
            exp = self._expiry = DeltaColumn()
            for _ in range(self.count):
                exp.append(0)
        if exp is not None:
            exp.append(0 if expires_at_ms is None else expires_at_ms + 1)
        self.count += 1
        self.bytes += size

    def head_expires_at_ms(self) -> int | None:
        if not self.count or self._expiry is None:
            return None
        e = self._expiry[0]
        return e - 1 if e else None

    def pop(self, messages_max: int, bytes_max: int) -> list[tuple[int, int, int, int | None, int]]:
        """Up to `messages_max` items from the head (and at least one, whatever `bytes_max`):
        (seq, location, size, expires_at_ms, delivery_count) each."""
        n = min(self.count, messages_max)
        if n <= 0:
            return []
        sums = list(accumulate(self._sizes.values(n)))
        n = max(bisect_right(sums, bytes_max), 1)  # the first always; then while the bytes fit
        sizes = self._sizes.take(n)
        gaps = self._seqs
        seqs = range(self.first_seq, self.first_seq + n) if gaps is None else gaps.take(n)
        exp = self._expiry
        expiries = [None] * n if exp is None else [e - 1 if e else None for e in exp.take(n)]
        i = self._ci
        end = i + n
        out = list(zip(seqs, self._locs.take(n), sizes, expiries, self._counts[i:end], strict=True))
        self._ci = end
        self.count -= n
        self.bytes -= sums[n - 1]
        if gaps is None:
            self.first_seq += n
        else:
            self.first_seq = gaps[0] if self.count else out[-1][0] + 1
        if self.count == 0:
            self._clear()
        elif end > 4096 and end * 2 > len(self._counts):
            del self._counts[:end]
            self._ci = 0
        return out

    def take_all(self) -> list[int]:
        """Empty the tail; returns the locations of what it held (a purge, a deleted queue)."""
        locs = self._locs.tolist()
        self._clear()
        self.count = 0
        self.bytes = 0
        return locs

    def locations(self) -> list[int]:
        return self._locs.tolist()

    def seqs(self) -> list[int]:
        """The seqs of the paged messages, oldest first (a mirrored queue's sync, its copies)."""
        if self._seqs is not None:
            return self._seqs.tolist()
        return list(range(self.first_seq, self.first_seq + self.count))

    @property
    def head_seq(self) -> int | None:
        return self.first_seq if self.count else None

    @property
    def keeps_seqs(self) -> bool:
        """Made with `gaps=True`: it takes any increasing seqs."""
        return self._seqs is not None

    def find(self, seq: int) -> tuple[int, int | None, int] | None:
        """(location, expires_at_ms, delivery_count) of the paged message `seq`; None when it
        is not in the tail (read back since, or never paged)."""
        return self.find_many([seq])[0]

    def find_many(self, seqs: list[int]) -> list[tuple[int, int | None, int] | None]:
        """`find` for each of `seqs` (a sync's batch, in order): the columns are read once over
        the span they cover, not summed up to each position."""
        out: list[tuple[int, int | None, int] | None] = [None] * len(seqs)
        if not self.count:
            return out
        gaps = self._seqs
        if gaps is None:
            first, n = self.first_seq, self.count
            ks = [seq - first if first <= seq < first + n else -1 for seq in seqs]
        else:
            ks = [gaps.index(seq) for seq in seqs]
        found = [k for k in ks if k >= 0]
        if not found:
            return out
        lo, hi = min(found), max(found)
        locs = self._locs.values(hi - lo + 1, lo)
        exp = self._expiry.values(hi - lo + 1, lo) if self._expiry is not None else None
        counts, ci = self._counts, self._ci
        for j, k in enumerate(ks):
            if k >= 0:
                e = exp[k - lo] if exp is not None else 0
                out[j] = (locs[k - lo], e - 1 if e else None, counts[ci + k])
        return out

    def _clear(self) -> None:
        self._locs.clear()  # in place: a lazy queue whose consumers keep up empties its tail per message
        self._sizes.clear()
        del self._counts[:]
        self._ci = 0
        self._expiry = None
        if self._seqs is not None:
            self._seqs.clear()

    def memory_bytes(self) -> int:
        """What the columns take now (their allocated size, hole included)."""
        n = self._locs.memory_bytes() + self._sizes.memory_bytes() + len(self._counts)
        if self._expiry is not None:
            n += self._expiry.memory_bytes()
        if self._seqs is not None:
            n += self._seqs.memory_bytes()
        return n


class PagedLevels:
    """The paged messages of a priority queue: one `PagedTail` per priority level (made when a
    level first pages), with the counts of them all. The queue reads back from one level at a
    time (`pop(level, ...)`), the highest one that has messages."""

    __slots__ = ("count", "bytes", "levels")

    def __init__(self, max_priority: int) -> None:
        self.count = 0
        self.bytes = 0
        self.levels: list[PagedTail | None] = [None] * (max_priority + 1)

    def __len__(self) -> int:
        return self.count

    def level_of(self, priority: int) -> int:
        """The level a message of this priority joins (as QueueState's: capped at the maximum)."""
        return min(priority, len(self.levels) - 1)

    def level_count(self, level: int) -> int:
        t = self.levels[level]
        return t.count if t is not None else 0

    def append(self, seq: int, loc: int, size: int, expires_at_ms: int | None = None, delivery_count: int = 0,
               priority: int = 0) -> None:
        level = self.level_of(priority)
        t = self.levels[level]
        if t is None:
            t = self.levels[level] = PagedTail(gaps=True)
        t.append(seq, loc, size, expires_at_ms, delivery_count)
        self.count += 1
        self.bytes += size

    def pop_level(self, level: int, messages_max: int, bytes_max: int) -> list[tuple[int, int, int, int | None, int]]:
        t = self.levels[level]
        if t is None or not t.count:
            return []
        before = t.bytes
        out = t.pop(messages_max, bytes_max)
        self.count -= len(out)
        self.bytes -= before - t.bytes
        return out

    def take_all(self) -> list[int]:
        locs: list[int] = []
        for t in self.levels:
            if t is not None:
                locs.extend(t.take_all())
        self.count = 0
        self.bytes = 0
        return locs

    def locations(self) -> list[int]:
        return [loc for t in self.levels if t is not None for loc in t.locations()]

    def seqs(self) -> list[int]:
        return sorted(seq for t in self.levels if t is not None for seq in t.seqs())

    @property
    def head_seq(self) -> int | None:
        """The lowest paged seq (of any level)."""
        return min((t.first_seq for t in self.levels if t is not None and t.count), default=None)

    def find(self, seq: int) -> tuple[int, int | None, int] | None:
        return self.find_many([seq])[0]

    def find_many(self, seqs: list[int]) -> list[tuple[int, int | None, int] | None]:
        out: list[tuple[int, int | None, int] | None] = [None] * len(seqs)
        for t in self.levels:
            if t is not None and t.count:
                for j, got in enumerate(t.find_many(seqs)):
                    if got is not None:
                        out[j] = got
        return out

    def memory_bytes(self) -> int:
        return sum(t.memory_bytes() for t in self.levels if t is not None)


class BodyStore(Protocol):
    """What a queue with a paged tail needs of its node (`hutch.broker.broker.Broker`)."""

    def read_paged_batch(self, q: Any, items: list[tuple[int, int]]) -> list[Message | None]:
        """The messages stored at these locations, one for each (the queue's message seq,
        location), in that order, their scratch copies released. None for one that cannot be
        read back (a corrupt or missing record): the store has logged it with the queue's name
        and the position and dropped it for good. One call a batch: the store reads records that
        lie together on disk in one go."""
        ...

    def drop_paged(self, q: Any, locs: list[int]) -> None:
        """Paged messages leave without being read (purge, deleted queue): free their records."""
        ...

    def peek_paged(self, q: Any, items: list[tuple[int, int]]) -> list[Message | None]:
        """As `read_paged_batch`, but the messages stay paged: nothing is released or dropped
        (None for one that cannot be read). A mirrored queue's sync sends paged messages so."""
        ...


def is_scratch(loc: int) -> bool:
    return loc >= SCRATCH


__all__ = ["BodyStore", "PagedLevels", "PagedTail", "PagingPolicy", "SCRATCH", "is_scratch", "WINDOW_MESSAGES_DEFAULT",
           "WINDOW_BYTES_DEFAULT", "READ_AHEAD_MESSAGES", "READ_AHEAD_BYTES", "PAGED_INDEX_BYTES"]
