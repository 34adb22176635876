"""The queue as a deterministic state machine: hutch's one queue model.

A queue's state — messages ready for delivery, messages checked out to consumers, their
delivery counts — changes only through the operations below, and the same operations in the
same order give the same state on every copy (ARCHITECTURE.md). A classic queue applies them
locally; a mirrored queue applies them on the leader and on every mirror in the leader's order;
a quorum queue applies them when its Raft group commits them.

    enqueue(message)          a new message joins the tail            -> its sequence number
    checkout()                the head goes to a consumer             -> the entry, or None
    settle(seq)               a checked-out message is acknowledged   -> the entry
    return_(seq)              a checked-out message comes back (requeue, nack, consumer gone)
    discard(seq)              a message leaves unacknowledged (reject, expiry, overflow)
    purge()                   every ready message leaves              -> how many

Rules that keep it deterministic and safe:
- Time never enters implicitly. Whoever decides (the leader) turns "the head expired" into an
  explicit `discard`, using `expired_head(now_ms)` only to find out which one.
- Sequence numbers are assigned here, by counting; a returned message goes back to its place
  in sequence order (ahead of everything enqueued after it), with `redelivered` set.
- Overflow is decided here from the queue's limits (`x-max-length`, `x-max-length-bytes`,
  `x-overflow`), so every copy drops or refuses the same message.
- Priorities (`x-max-priority`) order delivery: higher first, FIFO within one priority.

Nothing here does I/O, reads a clock, or knows about channels and sockets.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from hutch.queues.message import Message

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOW_MODES = (DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX)


class Entry:
    """One message in one queue."""

    __slots__ = ("seq", "message", "delivery_count", "expires_at_ms", "log_seq")

    def __init__(self, seq: int, message: Message, expires_at_ms: int | None):
        self.seq = seq
        self.message = message
        self.delivery_count = 0
        self.expires_at_ms = expires_at_ms
        self.log_seq = 0  # where a durable copy of this entry lives in the node's log (0: none)

    @property
    def redelivered(self) -> bool:
        """For a ready entry: its next delivery carries `redelivered` (it was delivered before).
        After `checkout` the count includes that delivery, so a delivery's flag is count > 1."""
        return self.delivery_count > 0

    def __lt__(self, other: Entry) -> bool:
        return self.seq < other.seq

    def __repr__(self) -> str:
        return f"Entry(seq={self.seq}, delivery_count={self.delivery_count})"


class _Level:
    """Ready messages of one priority: returned ones (a heap by seq) ahead of the FIFO."""

    __slots__ = ("fifo", "returned")

    def __init__(self) -> None:
        self.fifo: deque[Entry] = deque()
        self.returned: list[Entry] = []

    def __len__(self) -> int:
        return len(self.fifo) + len(self.returned)

    def head(self) -> Entry | None:
        if self.returned:
            return self.returned[0]
        return self.fifo[0] if self.fifo else None

    def pop(self) -> Entry:
        if self.returned:
            return heapq.heappop(self.returned)
        return self.fifo.popleft()

    def remove(self, entry: Entry) -> None:
        if self.returned and entry in self.returned:
            self.returned.remove(entry)
            heapq.heapify(self.returned)
        else:
            self.fifo.remove(entry)

    def __iter__(self) -> Iterator[Entry]:
        yield from sorted(self.returned)
        yield from self.fifo


class QueueLimits:
    __slots__ = ("max_length", "max_length_bytes", "overflow", "max_priority")

    def __init__(self, max_length: int | None = None, max_length_bytes: int | None = None,
                 overflow: str = DROP_HEAD, max_priority: int = 0):
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"unknown overflow mode {overflow!r}")
        self.max_length = max_length
        self.max_length_bytes = max_length_bytes
        self.overflow = overflow
        self.max_priority = max(0, min(255, max_priority))


class Refused(Exception):
    """enqueue refused by reject-publish overflow."""


class NotCheckedOut(KeyError):
    """settle or return_ of a sequence number that is not checked out: the caller's bug (a
    channel settles only what it was delivered, a replica only what its leader checked out)."""


class QueueState:
    """See the module docstring."""

    __slots__ = ("limits", "next_seq", "_levels", "_single", "unacked", "ready_count", "ready_bytes",
                 "unacked_bytes")

    def __init__(self, limits: QueueLimits | None = None):
        self.limits = limits or QueueLimits()
        self.next_seq = 1
        n = self.limits.max_priority + 1
        self._levels = [_Level() for _ in range(n)]
        self._single = self._levels[0] if n == 1 else None
        self.unacked: dict[int, Entry] = {}
        self.ready_count = 0
        self.ready_bytes = 0
        self.unacked_bytes = 0

    # ---------------------------------------------------------------- queries

    def __len__(self) -> int:
        return self.ready_count

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    def level_count(self, level: int) -> int:
        """Ready messages of one priority level (0 for a queue without priorities)."""
        return len(self._levels[level])

    def head(self) -> Entry | None:
        for level in self._by_priority():
            h = level.head()
            if h is not None:
                return h
        return None

    def ready(self) -> Iterator[Entry]:
        """Ready entries in delivery order."""
        for level in self._by_priority():
            yield from level

    def expired_head(self, now_ms: int) -> Entry | None:
        """The head, if its expiry time has passed (only the head expires, as in RabbitMQ)."""
        h = self.head()
        if h is not None and h.expires_at_ms is not None and h.expires_at_ms <= now_ms:
            return h
        return None

    def would_overflow(self, body_size: int) -> bool:
        lim = self.limits
        return ((lim.max_length is not None and self.ready_count + 1 > lim.max_length)
                or (lim.max_length_bytes is not None and self.ready_bytes + body_size > lim.max_length_bytes))

    # ---------------------------------------------------------------- operations

    def enqueue(self, message: Message, expires_at_ms: int | None = None) -> tuple[Entry, list[Entry]]:
        """Add a message at the tail. Returns (entry, dropped) where dropped are the heads that
        drop-head overflow pushed out (to be dead-lettered by the caller).

        Raises Refused when the queue is full and overflows by rejecting publishes."""
        dropped: list[Entry] = []
        lim = self.limits
        size = message.size
        limited = lim.max_length is not None or lim.max_length_bytes is not None
        if limited and lim.overflow != DROP_HEAD and self.would_overflow(size):
            raise Refused()
        entry = Entry(self.next_seq, message, expires_at_ms)
        self.next_seq += 1
        level = self._single if self._single is not None else self._level_of(message)
        level.fifo.append(entry)
        self.ready_count += 1
        self.ready_bytes += size
        if limited and lim.overflow == DROP_HEAD:
            # as RabbitMQ's maybe_drop_head: the message joins, then heads leave while the queue
            # is over a limit. With priorities the head may be the new message itself; a message
            # larger than x-max-length-bytes empties the queue and leaves too.
            while self.ready_count and ((lim.max_length is not None and self.ready_count > lim.max_length) or (
                    lim.max_length_bytes is not None and self.ready_bytes > lim.max_length_bytes)):
                dropped.append(self._pop_head())
        return entry, dropped

    def restore(self, entry: Entry) -> None:
        """Put back a ready entry that keeps its sequence number and delivery count (recovery of
        a replica on promotion). Entries must come in sequence order."""
        level = self._single if self._single is not None else self._level_of(entry.message)
        level.fifo.append(entry)
        self.ready_count += 1
        self.ready_bytes += entry.message.size
        if entry.seq >= self.next_seq:
            self.next_seq = entry.seq + 1

    def restore_run(self, entries: list[Entry]) -> None:
        """`restore` each of `entries` (in sequence order), as one step when the queue has a
        single level (a paged batch read back)."""
        single = self._single
        if single is None or not entries:
            for e in entries:
                self.restore(e)
            return
        single.fifo.extend(entries)
        self.ready_count += len(entries)
        self.ready_bytes += sum([e.message.size for e in entries])
        last = entries[-1].seq
        if last >= self.next_seq:
            self.next_seq = last + 1

    def ready_heads(self) -> Iterator[Entry]:
        """The oldest ready entry of each priority level (returned ones first)."""
        for level in self._levels:
            if level.returned:
                yield level.returned[0]
            if level.fifo:
                yield level.fifo[0]

    def checkout(self) -> Entry | None:
        """Hand the head to a consumer: it moves to `unacked` with its delivery count raised."""
        if not self.ready_count:
            return None
        entry = self._pop_head()
        entry.delivery_count += 1
        self.unacked[entry.seq] = entry
        self.unacked_bytes += entry.message.size
        return entry

    def take(self) -> Entry | None:
        """Checkout and settle in one step (autoack delivery, basic.get with no-ack)."""
        if not self.ready_count:
            return None
        entry = self._pop_head()
        entry.delivery_count += 1
        return entry

    def settle(self, seq: int) -> Entry:
        entry = self.unacked.pop(seq, None)
        if entry is None:
            raise NotCheckedOut(seq)
        self.unacked_bytes -= entry.message.size
        assert self.unacked_bytes >= 0, f"unacked bytes below zero after settling {seq}"
        return entry

    def return_(self, seq: int) -> Entry:
        entry = self.unacked.pop(seq, None)
        if entry is None:
            raise NotCheckedOut(seq)
        self.unacked_bytes -= entry.message.size
        level = self._single if self._single is not None else self._level_of(entry.message)
        heapq.heappush(level.returned, entry)
        self.ready_count += 1
        self.ready_bytes += entry.message.size
        return entry

    def discard(self, seq: int) -> Entry:
        """Remove a message without delivery: a checked-out one (reject/nack without requeue)
        or a ready one (expiry, overflow)."""
        entry = self.unacked.pop(seq, None)
        if entry is not None:
            self.unacked_bytes -= entry.message.size
            return entry
        for level in self._levels:
            h = level.head()
            if h is not None and h.seq == seq:
                level.pop()
                self._ready_removed(h)
                return h
        for level in self._levels:
            for e in level:
                if e.seq == seq:
                    level.remove(e)
                    self._ready_removed(e)
                    return e
        raise KeyError(seq)

    def purge(self) -> list[Entry]:
        """Remove every ready message (checked-out ones stay). Returns what was removed."""
        removed: list[Entry] = []
        for level in self._levels:
            removed.extend(level)
            level.fifo.clear()
            level.returned.clear()
        self.ready_count = 0
        self.ready_bytes = 0
        return removed

    # ---------------------------------------------------------------- internals

    def _by_priority(self) -> list[_Level]:
        return self._levels if self._single is not None else self._levels[::-1]

    def _level_of(self, message: Message) -> _Level:
        return self._levels[min(message.priority, self.limits.max_priority)]

    def _pop_head(self) -> Entry:
        if self._single is not None:
            entry = self._single.pop()
        else:
            for level in reversed(self._levels):
                if len(level):
                    entry = level.pop()
                    break
            else:  # pragma: no cover - guarded by ready_count
                raise IndexError("empty queue")
        self._ready_removed(entry)
        return entry

    def _ready_removed(self, entry: Entry) -> None:
        self.ready_count -= 1
        self.ready_bytes -= entry.message.size
        assert self.ready_count >= 0 and self.ready_bytes >= 0, "ready count or bytes below zero"

    def check_invariants(self) -> None:
        """The counters agree with the entries (O(n): for tests and simulations, not per operation)."""
        ready = list(self.ready())
        assert self.ready_count == len(ready) >= 0, (self.ready_count, len(ready))
        assert self.ready_bytes == sum(e.message.size for e in ready), "ready bytes disagree"
        assert self.unacked_bytes == sum(e.message.size for e in self.unacked.values()), "unacked bytes"
        seqs = {e.seq for e in ready}
        assert len(seqs) == len(ready) and not seqs & self.unacked.keys(), "an entry is both ready and out"
        assert all(e.seq < self.next_seq for e in ready), "a ready entry from the future"
