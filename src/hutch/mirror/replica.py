"""The operations a mirrored queue's leader sends round its GM ring, and a mirror's copy.

The leader applies every change to its `QueueState` and records the same change as an
operation here; once per loop iteration the operations go out in one GM broadcast, so every
mirror applies them in the leader's order (ARCHITECTURE.md: one queue model, replicated).
A mirror does not need the leader's dispatch decisions, only their outcome, so its copy is a
map from the leader's sequence numbers to entries.

A broadcast is a msgpack list of operations. Each operation is a frozen msgspec struct sent
as an array whose first element is its integer tag, and a mirror decodes the list against
`Op`, the union of them, so a payload that does not fit fails in `decode_ops` with a
`msgspec.ValidationError` (or `DecodeError`) naming what is wrong instead of somewhere in
`Replica.apply`:

- `Enqueued`: a message joined the queue under sequence number `seq`, with what a promoted
  mirror needs to deliver it again; `origin` and `token` name the publish on its publisher's
  node (origin "" for a local one), so a publish sent again after a promotion is recognised.
- `CheckedOut`: these messages went to consumers; each one's delivery count goes up by one.
  Consecutive check-outs (and consecutive removals) share one operation.
- `Removed`: these messages left the queue (ack, reject, expiry, purge, overflow drop).
- `SyncBatch`: a sync's messages the mirror may lack, oldest first, each a `SyncItem` that
  carries its delivery count so far (and no publish id); a mirror keeps those it lacks.
- `SyncDone`: the sync has sent everything up to `floor`; the leader waits for this
  broadcast to be stable before it calls the late mirrors synchronised.
- `NewLeaderHead`: a promoted leader holds every message from `floor` on, and below it only
  the seqs in `keep`; a mirror drops what the new leader lacks.
- `View`: the leader's view of its mirrors (`MirrorView`: member, node, synchronised, the seq
  from which it has everything), whether the leader is stopping on purpose, the queue's
  ha-promote-on-failure / -on-shutdown and the leader's own member: what a mirror picks a
  successor from.
- `Deleted`: the queue is deleted; its leader leaves the ring and nobody takes over.
- `Recovered`: the answer to a mirror that came back with a copy from disk (see below): the
  seqs of its copy, as ranges, that left the queue while it was away (or that an older leader
  gave to other messages); that mirror drops them, the others ignore the operation.

A mirror of a durable queue keeps the persistent messages of its copy on its node's journal
(`Replica(durable=True)`): `apply` notes what joined and what left the copy (`to_write`,
`to_release`) and the mirror writes them after each broadcast. After a restart its copy comes
back from disk by reference (`MirrorEntry.on_disk`: the seq and the ME record; the bodies are
read back only if the mirror is promoted); the mirror reports it to the leader as ranges of seqs (`held_ranges`), the
leader answers with a `Recovered` operation and then synchronises only what the copy lacks.

Past the node's memory window (`classic_queue.memory_window_messages` and `_bytes`, the window a
classic queue pages past), a durable mirror keeps a newly written message by reference too: once
its ME record is written the body is dropped from memory (`Replica.release_body`), as the leader
pages a persistent message of a durable queue past the same window. Transient messages, and every
message of a mirror that does not persist, stay in memory.

A mirror that joined late simply lacks the head: operations on seqs it does not hold are
ignored. Whether a message is checked out or ready does not matter to a mirror (a promoted
mirror returns every checked-out message, marked redelivered), so returns are not sent; only
the delivery counts are kept. On promotion the entries are handed to a new `QueueState` in
sequence order, keeping their numbers, so the other mirrors' copies stay keyed the same way.

Nothing here does I/O.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator

import msgspec

from hutch.queues.columns import KeyedColumns

TOKENS_KEPT = 65536  # publish ids remembered for deduplication after a promotion


# -- the operations (msgpack arrays with an integer tag first) --------------------------------


def remember_token(tokens: dict[tuple[str, int], None], origin: str, token: int) -> None:
    """Note a forwarded publish's id (its node, its token) among the last TOKENS_KEPT: a node
    that sends it again (its answer lost with a link, or a promotion) gets it deduplicated."""
    tokens[(origin, token)] = None
    if len(tokens) > TOKENS_KEPT:
        del tokens[next(iter(tokens))]


class _Message(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The fields of a message that every copy keeps (the first fields of Enqueued and SyncItem)."""

    seq: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    persistent: bool
    priority: int
    expiration_ms: int | None
    expires_at_ms: int | None


class Enqueued(_Message, tag=1):
    """A message joined the queue (built once per message on a mirrored queue's publish path)."""

    origin: str  # the publishing node's id for this publish ("" for none), to deduplicate
    token: int


class CheckedOut(msgspec.Struct, tag=2, array_like=True, frozen=True, gc=False):
    """These messages went to consumers. The leader appends to `seqs` while the operation is
    the last one recorded, hence a list."""

    seqs: list[int]


class Removed(msgspec.Struct, tag=3, array_like=True, frozen=True, gc=False):
    """These messages left the queue. `seqs` grows like CheckedOut's."""

    seqs: list[int]


class SyncItem(_Message):
    """One message of a sync batch, with its delivery count at the leader."""

    delivery_count: int


class SyncBatch(msgspec.Struct, tag=4, array_like=True, frozen=True, gc=False):
    """Messages a late mirror may lack, oldest first."""

    items: tuple[SyncItem, ...]


class SyncDone(msgspec.Struct, tag=5, array_like=True, frozen=True, gc=False):
    """The sync sent everything below `floor` (the queue's next seq when it started)."""

    floor: int


class NewLeaderHead(msgspec.Struct, tag=6, array_like=True, frozen=True, gc=False):
    """A promoted leader has every message from `floor` on and, below it, only `keep`."""

    floor: int
    keep: tuple[int, ...]


class MirrorView(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One mirror as its leader sees it."""

    member: str
    node: str
    synchronised: bool
    since: int  # it holds every message from this seq on


class View(msgspec.Struct, tag=7, array_like=True, frozen=True, gc=False):
    """The leader's view, sent whenever it changes: its mirrors, oldest first, and what
    decides which of them is promoted when the leader goes."""

    mirrors: tuple[MirrorView, ...]
    stopping: bool  # a controlled shutdown: ha-promote-on-shutdown applies
    promote_on_failure: str
    promote_on_shutdown: str
    leader: str  # the leader's GM member


class Deleted(msgspec.Struct, tag=8, array_like=True, frozen=True, gc=False):
    """The queue is deleted: its leader's leaving is no failure."""


class Recovered(msgspec.Struct, tag=9, array_like=True, frozen=True, gc=False):
    """The mirror `member` came back with a copy from disk: it drops the seqs in `drop`
    (flat pairs: first, last, first, last, ...), which the queue no longer holds as they were."""

    member: str
    drop: tuple[int, ...]


Op = Enqueued | CheckedOut | Removed | SyncBatch | SyncDone | NewLeaderHead | View | Deleted | Recovered

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(list[Op])


def encode_ops(ops: list[Op]) -> bytes:
    return _enc.encode(ops)


def decode_ops(data: bytes) -> list[Op]:
    """Raises msgspec.DecodeError (msgspec.ValidationError for a payload of the wrong shape)."""
    return _dec.decode(data)


RANGES_MAX = 4096  # ranges a mirror reports of its recovered copy (it drops the oldest beyond)


def to_ranges(seqs: Iterable[int]) -> list[int]:
    """Sorted seqs as flat pairs (first, last, first, last, ...)."""
    out: list[int] = []
    for s in seqs:
        if out and out[-1] == s - 1:
            out[-1] = s
        else:
            out.append(s)
            out.append(s)
    return out


def in_ranges(ranges: list[int] | tuple[int, ...]) -> list[int]:
    """The seqs of flat pairs."""
    out: list[int] = []
    for i in range(0, len(ranges) - 1, 2):
        out.extend(range(ranges[i], ranges[i + 1] + 1))
    return out


class Unreconciled:
    """The seqs of a copy read from disk that the leader has not judged yet: ranges of seqs
    (added in order, as a copy is read back, or given as the ranges the mirror reports), less
    those taken out since. A copy of millions is a few ranges, not a set of millions."""

    __slots__ = ("firsts", "lasts", "out", "extra")

    def __init__(self, ranges: list[int] | tuple[int, ...] = ()) -> None:
        self.firsts = array("Q", ranges[0::2])
        self.lasts = array("Q", ranges[1::2])
        self.out: set[int] = set()  # taken out of the ranges
        self.extra: set[int] = set()  # added out of order

    def add(self, seq: int) -> None:
        if self.lasts and seq == self.lasts[-1] + 1:
            self.lasts[-1] = seq
        elif not self.lasts or seq > self.lasts[-1]:
            self.firsts.append(seq)
            self.lasts.append(seq)
        elif seq not in self:
            self.out.discard(seq)
            if not self._in_ranges(seq):
                self.extra.add(seq)

    def _in_ranges(self, seq: int) -> bool:
        k = bisect_right(self.firsts, seq) - 1
        return k >= 0 and seq <= self.lasts[k]

    def __contains__(self, seq: int) -> bool:
        return seq in self.extra or self._in_ranges(seq) and seq not in self.out

    def discard(self, seq: int) -> None:
        if seq in self.extra:
            self.extra.discard(seq)
        elif self._in_ranges(seq):
            self.out.add(seq)

    def __iter__(self) -> Iterator[int]:
        out = self.out
        for first, last in zip(self.firsts, self.lasts, strict=True):
            for seq in range(first, last + 1):
                if seq not in out:
                    yield seq
        yield from sorted(self.extra)

    def __len__(self) -> int:
        return sum(self.lasts) - sum(self.firsts) + len(self.firsts) - len(self.out) + len(self.extra)

    def __bool__(self) -> bool:
        return len(self) > 0


class MirrorEntry:
    __slots__ = ("seq", "exchange", "routing_key", "props", "body", "persistent", "priority", "expiration_ms",
                 "expires_at_ms", "delivery_count", "log_seq")

    def __init__(self, op: _Message, delivery_count: int = 0):
        self.seq = op.seq
        self.exchange = op.exchange
        self.routing_key = op.routing_key
        self.props = op.props
        self.body = op.body
        self.persistent = op.persistent
        self.priority = op.priority
        self.expiration_ms = op.expiration_ms
        self.expires_at_ms = op.expires_at_ms
        self.delivery_count = delivery_count
        self.log_seq = 0  # its ME record in the node's journal (0: none)

    @classmethod
    def on_disk(cls, seq: int, log_seq: int) -> MirrorEntry:
        """A message of a copy recovered from disk, by reference: its ME record `log_seq` holds
        the message (`body` None until it is read back, on promotion). Delivered or not while
        the mirror was away, it counts as delivered once."""
        e = cls.__new__(cls)
        e.seq = seq
        e.exchange = e.routing_key = ""
        e.props = b""
        e.body = None
        e.persistent = True
        e.priority = 0
        e.expiration_ms = e.expires_at_ms = None
        e.delivery_count = 1
        e.log_seq = log_seq
        return e


_COUNT_MAX = KeyedColumns.GONE - 1  # a delivery count is kept as a mark byte: this many at most


class OnDisk:
    """The entries of a copy kept by reference only: the message is in its ME record (written),
    read back if the mirror is promoted. In runs of ascending seqs (a copy grows at its end; a
    sync or a copy read back from disk makes a run of its own below), about 6 bytes an entry
    where a MirrorEntry in a dict costs some 300, so a mirror of a long backlog stays small."""

    __slots__ = ("runs", "firsts", "live")

    def __init__(self) -> None:
        self.runs: list[KeyedColumns] = []  # keyed by seq: its ME record seq, its delivery count
        self.firsts: list[int] = []  # each run's first seq, for bisection
        self.live = 0

    def __len__(self) -> int:
        return self.live

    def _locate(self, seq: int) -> tuple[int, int]:
        """(run index, entry index) of a live entry, or (-1, -1)."""
        k = bisect_right(self.firsts, seq) - 1
        if k < 0:
            return -1, -1
        i = self.runs[k].index(seq)
        return (k, i) if i >= 0 else (-1, -1)

    def __contains__(self, seq: int) -> bool:
        return self._locate(seq)[1] >= 0

    def add(self, seq: int, log_seq: int, delivery_count: int) -> bool:
        """Keep an entry by reference; False if its seq falls inside a run's range (the caller
        keeps it as a MirrorEntry then)."""
        k = bisect_right(self.firsts, seq) - 1
        count = min(delivery_count, _COUNT_MAX)
        if k >= 0:
            run = self.runs[k]
            if seq <= run.last_key:
                return False
            run.append(seq, log_seq, count)
            self.live += 1
            return True
        run = KeyedColumns()
        self.runs.insert(k + 1, run)
        self.firsts.insert(k + 1, seq)
        run.append(seq, log_seq, count)
        self.live += 1
        return True

    def bump(self, seq: int) -> None:
        """One more delivery of the entry, if it is here."""
        k, i = self._locate(seq)
        if i >= 0:
            counts = self.runs[k].marks
            if counts[i] < _COUNT_MAX:
                counts[i] += 1

    def pop(self, seq: int) -> int | None:
        """Remove the entry; its ME record's seq (None: not here)."""
        k, i = self._locate(seq)
        if i < 0:
            return None
        run = self.runs[k]
        log_seq = run.take(i)
        self.live -= 1
        if not run.live:
            del self.runs[k]
            del self.firsts[k]
        else:
            self.firsts[k] = run.base
        return log_seq

    def items(self) -> Iterator[tuple[int, int, int]]:
        """(seq, ME record seq, delivery count) of every entry, in seq order (none taken out
        meanwhile)."""
        for run in list(self.runs):
            for _i, seq, log_seq, count in run.entries():
                yield seq, log_seq, count


class Replica:
    """A mirror's copy of its queue, built from the leader's operations."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable  # persistent messages go to the node's journal
        self.to_write: list[MirrorEntry] = []  # persistent entries added since the last write
        self.to_release: list[int] = []  # ME records of entries that left
        self.member = ""  # this mirror's GM member (for Recovered)
        self.recovered_epoch = 0  # the leader epoch of a copy recovered from disk, until reconciled
        self.epochs: list = []  # the leader's epochs [epoch, first seq] as it told at join
        self.unreconciled = Unreconciled()  # seqs recovered from disk the leader has not judged yet
        self.entries: dict[int, MirrorEntry] = {}  # in memory (a body, or by reference out of order)
        self.on_disk = OnDisk()  # by reference only, compactly: most of a long copy
        # entries whose body is in memory, and those bodies' bytes (`release_body` drops one past
        # the node's memory window once its ME record is written; `_drop` counts them out)
        self.bodies_held = 0
        self.body_bytes_held = 0
        self.max_seq = 0
        self.tokens: dict[tuple[str, int], None] = {}  # recent publishes, oldest first
        self.view: View | None = None  # the leader's last view (see MirrorHost)
        self.deleted = False  # the leader said: the queue is deleted (its leaving is no failure)

    def __len__(self) -> int:
        return len(self.entries) + len(self.on_disk)

    def holds(self, seq: int) -> bool:
        return seq in self.entries or seq in self.on_disk

    def seqs(self) -> Iterator[int]:
        """Every entry's seq (those in memory first, then the rest in order)."""
        yield from self.entries
        for seq, _log_seq, _count in self.on_disk.items():
            yield seq

    def apply(self, ops: list[Op]) -> None:
        for op in ops:
            t = type(op)  # an if-chain, most frequent first: faster than a dict of methods
            if t is Enqueued:
                self._add(MirrorEntry(op))
                if op.origin:
                    remember_token(self.tokens, op.origin, op.token)
            elif t is CheckedOut:
                for seq in op.seqs:
                    e = self.entries.get(seq)
                    if e is not None:
                        e.delivery_count += 1
                    elif self.on_disk.live:
                        self.on_disk.bump(seq)
            elif t is Removed:
                for seq in op.seqs:
                    self._drop(seq)
            elif t is SyncBatch:
                for item in op.items:
                    if not self.holds(item.seq) or item.seq in self.unreconciled:
                        self._add(MirrorEntry(item, item.delivery_count))
            elif t is SyncDone:
                pass  # the leader's marker: once it is stable, every mirror has the sync's messages
            elif t is NewLeaderHead:  # a new leader: what it lacks goes
                keep = set(op.keep)
                for seq in [s for s in self.seqs() if s < op.floor and s not in keep]:
                    self._drop(seq)
            elif t is View:
                self.view = op
            elif t is Deleted:
                self.deleted = True
            elif t is Recovered:
                if op.member == self.member:
                    for seq in in_ranges(op.drop):
                        self._drop(seq)
                    self.recovered_epoch = 0
                    self.unreconciled = Unreconciled()

    def _drop(self, seq: int) -> None:
        e = self.entries.pop(seq, None)
        if e is None:
            if self.on_disk.live:
                log_seq = self.on_disk.pop(seq)
                if log_seq is not None:
                    self.to_release.append(log_seq)
            return
        if e.log_seq:
            self.to_release.append(e.log_seq)
        if e.body is not None:
            self.bodies_held -= 1
            self.body_bytes_held -= len(e.body)

    def release_body(self, e: MirrorEntry) -> None:
        """Keep `e` by reference from here on: its ME record (written) holds the message, read
        back only if this mirror is promoted, as a copy recovered from disk is. Call it oldest
        first: an entry newer than every one kept so goes to `on_disk`."""
        self.bodies_held -= 1
        self.body_bytes_held -= len(e.body)
        if self.entries.get(e.seq) is e and self.on_disk.add(e.seq, e.log_seq, e.delivery_count):
            del self.entries[e.seq]
            return
        e.body = None
        e.props = b""
        e.exchange = e.routing_key = ""

    def _add(self, e: MirrorEntry) -> None:
        if self.holds(e.seq):
            if e.seq not in self.unreconciled:
                return
            self.unreconciled.discard(e.seq)  # the leader's message beats one recovered from disk
            self._drop(e.seq)
        self.entries[e.seq] = e
        self.bodies_held += 1
        self.body_bytes_held += len(e.body)
        if self.durable and e.persistent:
            self.to_write.append(e)
        if e.seq > self.max_seq:
            self.max_seq = e.seq

    def restore(self, seq: int, log_seq: int) -> None:
        """An entry recovered from disk by reference (its ME record `log_seq`): delivered or not
        while the mirror was away, it counts as delivered once."""
        if not self.on_disk.add(seq, log_seq, 1):
            self.entries[seq] = MirrorEntry.on_disk(seq, log_seq)
        self.unreconciled.add(seq)
        if seq > self.max_seq:
            self.max_seq = seq

    def keep_unreconciled(self) -> None:
        """Promoted with a copy that is the queue as it stands: take what the leader never judged
        as judged."""
        self.unreconciled = Unreconciled()
        self.recovered_epoch = 0

    def forget_unreconciled(self) -> None:
        """Promoted before the leader judged the copy from disk: keep only what came since."""
        for seq in list(self.unreconciled):
            self._drop(seq)
        self.unreconciled = Unreconciled()
        self.recovered_epoch = 0

    def held_ranges(self) -> list[int]:
        """What to tell the leader of the copy: its persisted seqs as ranges, at most RANGES_MAX,
        the newest; entries not covered (transient ones, the oldest beyond the bound) are dropped."""
        for seq in [s for s, e in self.entries.items() if not e.log_seq]:
            self._drop(seq)
        ranges = self.seq_ranges()
        if len(ranges) > 2 * RANGES_MAX:
            ranges = ranges[-2 * RANGES_MAX:]
            for seq in [s for s in self.seqs() if s < ranges[0]]:
                self._drop(seq)
        return ranges

    def seq_ranges(self) -> list[int]:
        """Every entry's seq as ranges (flat pairs), without a list of them all."""
        return to_ranges(heapq.merge(sorted(self.entries), (seq for seq, _log, _count in self.on_disk.items())))

    def in_order(self) -> Iterator[MirrorEntry]:
        """Every entry by sequence number: what a promoted mirror's queue starts from. One kept
        by reference comes as a MirrorEntry without its body (read it from its ME record)."""
        def referenced() -> Iterator[MirrorEntry]:
            for seq, log_seq, count in self.on_disk.items():
                e = MirrorEntry.on_disk(seq, log_seq)
                e.delivery_count = count
                yield e
        in_memory = [self.entries[s] for s in sorted(self.entries)]
        return heapq.merge(in_memory, referenced(), key=lambda e: e.seq)

    def log_refs(self) -> list[tuple[int, int]]:
        """(ME record seq, seq) of every entry written to the journal."""
        refs = [(e.log_seq, e.seq) for e in self.entries.values() if e.log_seq]
        refs.extend((log_seq, seq) for seq, log_seq, _count in self.on_disk.items())
        return refs


class Backlog:
    """Broadcasts not yet stable and what waits on them (confirms, tx.commit-ok)."""

    __slots__ = ("waiters", "unstable_msgs", "sizes")

    def __init__(self) -> None:
        self.waiters: deque = deque()  # (gm seq, fn, arg, refused or None)
        self.unstable_msgs = 0
        self.sizes: deque = deque()  # (gm seq, messages in it)

    def sent(self, gm_seq: int, messages: int) -> None:
        if messages:
            self.sizes.append((gm_seq, messages))
            self.unstable_msgs += messages

    def stable(self, gm_seq: int) -> list:
        while self.sizes and self.sizes[0][0] <= gm_seq:
            self.unstable_msgs -= self.sizes.popleft()[1]
        out = []
        w = self.waiters
        while w and w[0][0] <= gm_seq:
            out.append(w.popleft())
        return out
