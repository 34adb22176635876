"""A classic queue on its home node: the state machine plus consumers and dispatch.

The queue owns its `QueueState` and the list of consumers attached to it, and decides who
gets the next message: consumers of the highest priority (`x-priority`) first, round-robin
among equals, skipping any that cannot take more (prefetch reached, flow stopped, socket
backed up). With `x-single-active-consumer` only the first registered consumer receives.
Every decision it makes is one of the state machine's operations, so a replicated queue can
send the same operations to its copies.

Consumers are the broker's objects; the queue needs only `can_take()` and
`deliver(queue, entry)` from them (and `no_ack`, `priority`, `tag`). Nothing here does I/O.

Disk-first (hutch.queues.paging): past its memory window a queue homed here keeps only a
compact record of each newer ready message (`tail`); the queue reads the bodies back through
its `BodyStore` (the broker does the I/O), a batch a call, when its in-memory part runs low, before
delivering, so consumers see the order, flags and counts they would see without paging. Its
counts (`message_count`, `figures`, `stat`) include the paged messages.

A priority queue pages one tail per level (`PagedLevels`) and, before it delivers, reads back
the highest level that has messages when that level's in-memory part runs low, so delivery is
in priority order, FIFO within a level, as without paging. Length limits (`x-max-length`,
`x-max-length-bytes`) count paged messages too: `refuses` answers reject-publish overflow
before the body is stored, and `drop_over_limit` pushes heads out under drop-head, reading a
paged head back only when the queue has a dead-letter exchange to send it to (otherwise its
record is released unread).
"""

from __future__ import annotations

from typing import Any, Protocol

from hutch.queues.dispatch import PriorityRings
from hutch.queues.handle import CLASSIC, PENDING, Figures, Got
from hutch.queues.message import Message
from hutch.queues.paging import SCRATCH, BodyStore, PagedLevels, PagedTail, PagingPolicy
from hutch.queues.state import DROP_HEAD, Entry, QueueLimits, QueueState, Refused


class Consumer(Protocol):
    tag: str
    no_ack: bool
    priority: int
    exclusive: bool

    def can_take(self) -> bool: ...

    def waits_for_acks(self) -> bool: ...

    def deliver(self, queue: ClassicQueue, entry: Entry) -> None: ...


class ClassicHost(Protocol):
    """What a classic queue's client operations need of the node that holds it
    (`hutch.broker.broker.Broker`): its journal, its clock and its loop."""

    def purge_queue(self, q: ClassicQueue) -> int: ...
    def queue_used(self, q: ClassicQueue) -> None: ...
    def expire_queue(self, q: ClassicQueue) -> None: ...
    def delivered(self, q: ClassicQueue, entry: Entry) -> None: ...
    def settled(self, q: ClassicQueue, entry: Entry) -> None: ...
    def consumer_added(self, q: ClassicQueue) -> None: ...


class ClassicQueue:
    __slots__ = ("name", "vhost", "durable", "auto_delete", "exclusive_owner", "arguments", "state",
                 "_rings", "_groups", "consumer_count", "single_active", "ever_consumed", "message_ttl_ms",
                 "expires_ms", "dead_letter_exchange", "dead_letter_routing_key", "last_used_ms",
                 "deleted", "home_node", "_registered", "mstats", "dispatch_blocked",
                 "flow_waiters", "journal_id", "last_dispatch_ms", "_mirror", "policy_settings", "host",
                 "tail", "paging", "store", "page_window", "page_window_bytes")

    def __init__(self, name: str, vhost: str, *, durable: bool = False, auto_delete: bool = False,
                 exclusive_owner: Any = None, arguments: dict[str, Any] | None = None,
                 limits: QueueLimits | None = None, single_active: bool = False,
                 message_ttl_ms: int | None = None, expires_ms: int | None = None,
                 dead_letter_exchange: str | None = None, dead_letter_routing_key: str | None = None,
                 home_node: str = "", host: ClassicHost | None = None):
        self.host = host  # the client operations' way to the node (unit tests of the queue alone: None)
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.auto_delete = auto_delete
        self.exclusive_owner = exclusive_owner
        self.arguments = arguments or {}
        self.state = QueueState(limits)
        self._rings = PriorityRings()  # competing consumers (hutch.queues.dispatch)
        self._groups = self._rings.groups  # the same list, read directly on the delivery path
        self._registered: list[Any] = []  # consumers in the order they registered
        self.consumer_count = 0
        self.single_active = single_active
        self.ever_consumed = False
        self.message_ttl_ms = message_ttl_ms
        self.expires_ms = expires_ms
        self.dead_letter_exchange = dead_letter_exchange
        self.dead_letter_routing_key = dead_letter_routing_key
        self.last_used_ms = 0
        self.deleted = False
        self.home_node = home_node
        # message counters as the channels of this node count them (hutch.broker.msgstats layout);
        # the queue itself never counts, so a mirror or a queue fed by other nodes is not counted twice
        self.mstats = [0] * 12
        self.dispatch_blocked = False  # set while something (e.g. a sync) holds the queue
        self.flow_waiters: set | None = None  # publishers held back while consumers are backed up
        self.last_dispatch_ms = -10**9  # when consumers last received (the owner's clock)
        self.journal_id = 0  # durable queues: the key of their records in the node's message journal
        # a mirrored queue's leader side (hutch.mirror.leader.Leader): told every operation
        self._mirror: Any = None
        # disk-first (hutch.queues.paging): the policy while the queue may page, the paged
        # messages (None: everything is in memory), and where their bodies are read from
        self.paging: PagingPolicy | None = None
        self.tail: PagedTail | PagedLevels | None = None
        self.store: BodyStore | None = None
        self.page_window = 0  # the policy's window, kept here for the publish path's one check
        self.page_window_bytes = 0
        # the settings last resolved from arguments and policies (hutch.queues.effective.Effective)
        self.policy_settings: Any = None

    local = True  # this node's object holds the messages: a classic queue homed here
    quorum = False
    queue_type = CLASSIC.name

    def __repr__(self) -> str:
        return f"ClassicQueue({self.vhost!r}, {self.name!r})"

    def figures(self) -> Figures:
        st = self.state
        tail = self.tail
        if tail is not None and tail.count:
            return Figures(st.ready_count + tail.count, len(st.unacked), st.ready_bytes + tail.bytes,
                           st.unacked_bytes, self.consumer_count, tail.count, tail.bytes)
        return Figures(st.ready_count, len(st.unacked), st.ready_bytes, st.unacked_bytes, self.consumer_count)

    # ---------------------------------------------------------------- disk-first (hutch.queues.paging)

    @property
    def mirror(self) -> Any:
        return self._mirror

    @mirror.setter
    def mirror(self, leader: Any) -> None:
        """A mirrored queue's leader (`hutch.mirror.leader.Leader`), told every operation; the
        paged tail stays as it is (a sync reads paged messages through `BodyStore.peek_paged`)."""
        self._mirror = leader

    def _new_tail(self) -> PagedTail | PagedLevels:
        mp = self.state.limits.max_priority
        return PagedLevels(mp) if mp else PagedTail()

    def set_paging(self, policy: PagingPolicy | None, store: BodyStore | None = None) -> None:
        """May this queue page (a policy), or must it hold everything in memory (None)?"""
        if store is not None:
            self.store = store
        if policy is None:
            if self.tail is not None:
                self.page_in_all()
                self.tail = None
            self.paging = None
            return
        self.paging = policy
        self.page_window = policy.window_messages
        self.page_window_bytes = policy.window_bytes
        if self.tail is None and self.store is not None:
            self.tail = self._new_tail()

    def pages_out(self) -> bool:
        """Does a message enqueued now go to disk? (The caller stores its body, then calls
        `publish_paged`.) Broker._put has this check inlined."""
        tail = self.tail
        if tail is None:
            return False
        st = self.state
        return self.paging.pages_out(st.ready_count, st.ready_bytes, tail.count)

    def expiry_of(self, message: Message, now_ms: int) -> int | None:
        ttl = message.expiration_ms
        if self.message_ttl_ms is not None:
            ttl = self.message_ttl_ms if ttl is None else min(ttl, self.message_ttl_ms)
        return None if ttl is None else now_ms + ttl

    def publish_paged(self, loc: int, size: int, expires_at_ms: int | None, delivery_count: int = 0,
                      priority: int = 0, message: Message | None = None) -> int:
        """Enqueue a message whose body is already stored at `loc`: it joins the paged tail (of
        its priority level). Returns its seq. The caller asks `refuses` first and applies
        `drop_over_limit` after, as `QueueState.enqueue` does for a message in memory. A
        mirrored queue's leader passes the `message` on to its mirrors (a recovered one has none:
        it has no mirrors yet)."""
        st = self.state
        seq = st.next_seq
        st.next_seq = seq + 1
        tail = self.tail
        if type(tail) is PagedLevels:
            tail.append(seq, loc, size, expires_at_ms, delivery_count, priority)
        else:
            tail.append(seq, loc, size, expires_at_ms, delivery_count)
        if self._mirror is not None and message is not None:
            self._mirror.enqueued(seq, message, expires_at_ms)
        return seq

    def restore_paged(self, seq: int, loc: int, size: int, expires_at_ms: int | None, delivery_count: int,
                      priority: int = 0) -> None:
        """Add a message under its own `seq` to the paged tail (a promoted mirror's copy, whose
        seqs have gaps: the tail is made to keep them when it is empty)."""
        tail = self.tail
        if type(tail) is PagedTail and not tail.count and not tail.keeps_seqs:
            tail = self.tail = PagedTail(gaps=True)
        if type(tail) is PagedLevels:
            tail.append(seq, loc, size, expires_at_ms, delivery_count, priority)
        else:
            tail.append(seq, loc, size, expires_at_ms, delivery_count)
        st = self.state
        if seq >= st.next_seq:
            st.next_seq = seq + 1

    def live_seqs(self) -> set[int]:
        """The seqs of every message the queue holds: ready (in memory and paged) and unacked."""
        st = self.state
        live = {e.seq for e in st.ready()}
        live.update(st.unacked)
        tail = self.tail
        if tail is not None and tail.count:
            live.update(tail.seqs())
        return live

    def _read_back(self, items: list[tuple[int, int, int, int | None, int]]) -> list[Entry]:
        """Paged messages (the tail's items) as entries, in order; one the store could not read
        back is left out (it has dropped it)."""
        out = []
        msgs = self.store.read_paged_batch(self, [(seq, loc) for seq, loc, _size, _expires, _count in items])
        for (seq, loc, _size, expires, count), msg in zip(items, msgs, strict=True):
            if msg is None:
                if self._mirror is not None:
                    self._mirror.removed(seq)
                continue
            e = Entry(seq, msg, expires)
            e.delivery_count = count
            if loc < SCRATCH:
                e.log_seq = loc
            out.append(e)
        return out

    def page_in(self, level: int = -1) -> int:
        """Read one batch of paged messages back into memory, in order (a priority queue: from
        `level`, by default the highest level that has paged messages). Returns how many came
        back (a message that cannot be read back is dropped by the store and not counted)."""
        tail = self.tail
        if tail is None or not tail.count:
            return 0
        pol = self.paging
        st = self.state
        if type(tail) is PagedLevels:
            if level < 0:
                level = next(lv for lv in range(len(tail.levels) - 1, -1, -1) if tail.level_count(lv))
            items = tail.pop_level(level, pol.batch_messages, pol.batch_bytes)
        else:
            items = tail.pop(pol.batch_messages, pol.batch_bytes)
        entries = self._read_back(items)
        st.restore_run(entries)
        if self._mirror is not None:
            self._mirror.paged_in(entries)
        return len(entries)

    def _top_level(self) -> tuple[int, int, int]:
        """A paging priority queue's highest level that has messages: (level, in memory,
        paged); (-1, 0, 0) when it has none."""
        tail = self.tail
        st = self.state
        for lv in range(len(tail.levels) - 1, -1, -1):
            mem = st.level_count(lv)
            paged = tail.level_count(lv)
            if mem or paged:
                return lv, mem, paged
        return -1, 0, 0

    def page_in_all(self) -> int:
        tail = self.tail
        n = 0
        while tail is not None and tail.count:
            n += self.page_in()
        return n

    def _read_ahead(self) -> None:
        """Read a batch back when the in-memory part is below the low mark; for a priority
        queue, the in-memory part of its highest level (so the queue's head is in memory)."""
        tail = self.tail
        if type(tail) is PagedLevels:
            while tail.count:
                lv, mem, paged = self._top_level()
                if not self.paging.wants_read_ahead(mem, paged) or self.page_in(lv):
                    return
            return
        while tail.count and self.paging.wants_read_ahead(self.state.ready_count, tail.count):
            if self.page_in():
                return

    # ---------------------------------------------------------------- length limits over both parts

    @property
    def limited(self) -> bool:
        lim = self.state.limits
        return lim.max_length is not None or lim.max_length_bytes is not None

    def refuses(self, size: int) -> bool:
        """Would reject-publish overflow refuse a message of `size` bytes now (paged messages
        counted)? Asked before a paged message's body is stored."""
        lim = self.state.limits
        if lim.overflow == DROP_HEAD or (lim.max_length is None and lim.max_length_bytes is None):
            return False
        return ((lim.max_length is not None and self.message_count + 1 > lim.max_length)
                or (lim.max_length_bytes is not None and self.ready_bytes + size > lim.max_length_bytes))

    def drop_over_limit(self, read: bool | None = None) -> list[Entry]:
        """Drop-head overflow over the in-memory and the paged messages: heads leave while the
        queue is over a limit (RabbitMQ's maybe_drop_head). Returns the dropped entries, for
        the caller to dead-letter or settle. A paged head is read back when `read` (by default:
        when the queue has a dead-letter exchange); otherwise its record is released unread."""
        lim = self.state.limits
        if lim.overflow != DROP_HEAD or (lim.max_length is None and lim.max_length_bytes is None):
            return []
        if read is None:
            read = self.dead_letter_exchange is not None
        out: list[Entry] = []
        while True:
            count = self.message_count
            if not count or not ((lim.max_length is not None and count > lim.max_length)
                                 or (lim.max_length_bytes is not None and self.ready_bytes > lim.max_length_bytes)):
                return out
            e = self._drop_head(read)
            if e is not None:
                out.append(e)

    def _drop_head(self, read: bool) -> Entry | None:
        """The head leaves unread by a consumer. None when it was a paged one not read back."""
        tail = self.tail
        st = self.state
        if tail is not None and tail.count:
            if type(tail) is PagedLevels:
                lv, mem, _paged = self._top_level()
                items = tail.pop_level(lv, 1, 0) if not mem else None
            else:
                items = tail.pop(1, 0) if not st.ready_count else None
            if items:
                if read:
                    entries = self._read_back(items)
                    if entries and self._mirror is not None:
                        self._mirror.removed(entries[0].seq)
                    return entries[0] if entries else None
                self.store.drop_paged(self, [items[0][1]])
                if self._mirror is not None:
                    self._mirror.removed(items[0][0])
                return None
        return self.discard(st.head().seq)

    @property
    def ready_bytes(self) -> int:
        """Body bytes of the ready messages, in memory and paged."""
        tail = self.tail
        return self.state.ready_bytes + (tail.bytes if tail is not None else 0)

    # ---------------------------------------------------------------- consumers

    def consumers(self) -> list[Any]:
        return list(self._rings)

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers())

    def add_consumer(self, consumer: Consumer) -> None:
        self._rings.add(consumer.priority, consumer)
        self._registered.append(consumer)
        self.consumer_count += 1
        self.ever_consumed = True

    def remove_consumer(self, consumer: Consumer) -> bool:
        """Detach a consumer. True if it was attached."""
        if not self._rings.remove(consumer):
            return False
        self._registered.remove(consumer)
        self.consumer_count -= 1
        assert self.consumer_count >= 0, "more consumers removed than added"
        return True

    def active_consumer(self) -> Any | None:
        """With single-active-consumer: the one consumer that receives."""
        if self.single_active and self._registered:
            return self._registered[0]
        return None

    # ---------------------------------------------------------------- client operations (hutch.queues.handle)

    def stat(self, reply: Any) -> tuple[int, int]:
        return self.message_count, self.consumer_count

    def purge(self, reply: Any) -> int:
        return self.host.purge_queue(self)

    def get(self, no_ack: bool, reply: Any) -> Any:
        mirror = self._mirror
        if mirror is not None and mirror.sync_holds_clients:  # answered once the sync is done (seed 000)
            mirror.after_sync(lambda _r: reply(self._get_now(no_ack)))
            return PENDING
        return self._get_now(no_ack)

    def _get_now(self, no_ack: bool) -> Got | None:
        host = self.host
        host.queue_used(self)
        host.expire_queue(self)
        entry = self.take_head(no_ack)
        if entry is None:
            return None
        if no_ack:
            host.settled(self, entry)
        else:
            host.delivered(self, entry)
        m = entry.message
        return Got(entry, entry.delivery_count > 1, m.route_enc, m.props, m.body, self.message_count)

    def consume(self, c: Consumer, reply: Any) -> None:
        self.add_consumer(c)
        self.host.consumer_added(self)

    # ---------------------------------------------------------------- messages

    def publish(self, message: Message, now_ms: int) -> tuple[Entry | None, list[Entry]]:
        """Enqueue in memory; returns (entry or None when refused by overflow, dropped heads).
        A queue that pages takes a message here only when `pages_out` says no (the broker's
        `_put` asks it), so the in-memory part never gets ahead of the paged tail."""
        ttl = message.expiration_ms
        if self.message_ttl_ms is not None:
            ttl = self.message_ttl_ms if ttl is None else min(ttl, self.message_ttl_ms)
        expires = None if ttl is None else now_ms + ttl
        try:
            entry, dropped = self.state.enqueue(message, expires)
        except Refused:
            return None, []
        mirror = self._mirror
        if mirror is not None:
            mirror.enqueued(entry.seq, message, expires)
            for d in dropped:
                mirror.removed(d.seq)
        return entry, dropped

    def next_consumer(self) -> Consumer | None:
        if self.single_active:
            c = self.active_consumer()
            return c if c is not None and c.can_take() else None
        for _prio, group in self._groups:  # PriorityRings.next, inlined: it runs per delivery
            for _ in range(len(group)):
                c = group[0]
                group.rotate(-1)
                if c.can_take():
                    return c
        return None

    def dispatch(self) -> int:
        """Deliver ready messages to consumers that can take them. Returns how many."""
        if self.dispatch_blocked or not self._groups:
            return 0
        st = self.state
        mirror = self._mirror
        tail = self.tail
        levels = None  # a paging priority queue: its highest level is read back before each delivery
        if tail is not None and tail.count:
            self._read_ahead()
            if type(tail) is PagedLevels:
                levels = tail
        n = 0
        while True:
            while st.ready_count:
                c = self.next_consumer()
                if c is None:
                    break
                if levels is not None and levels.count:
                    self._read_ahead()
                if c.no_ack:
                    entry = st.take()
                    if mirror is not None:
                        mirror.removed(entry.seq)
                else:
                    entry = st.checkout()
                    if mirror is not None:
                        mirror.checked_out(entry.seq)
                c.deliver(self, entry)
                n += 1
            else:  # memory ran dry before the consumers did: read the next batch back, go on
                if tail is not None and tail.count:
                    self.page_in()
                    continue
            return n

    def take_head(self, no_ack: bool) -> Entry | None:
        tail = self.tail
        if tail is not None and tail.count:
            self._read_ahead()
        entry = self.state.take() if no_ack else self.state.checkout()
        if entry is not None:
            if self._mirror is not None:
                if no_ack:
                    self._mirror.removed(entry.seq)
                else:
                    self._mirror.checked_out(entry.seq)
        return entry

    def settle(self, seq: int) -> Entry:
        entry = self.state.settle(seq)
        if self._mirror is not None:
            self._mirror.removed(seq)
        return entry

    def requeue(self, seq: int) -> Entry:
        return self.state.return_(seq)  # (a mirror keeps delivery counts only: nothing to tell it)

    def discard(self, seq: int) -> Entry:
        entry = self.state.discard(seq)
        if self._mirror is not None:
            self._mirror.removed(seq)
        return entry

    def remove_ready(self) -> list[Entry]:
        """Every ready message leaves; returns those that were in memory (the paged ones go
        through the store's `drop_paged`)."""
        tail = self.tail
        if tail is not None and tail.count:
            if self._mirror is not None:
                for seq in tail.seqs():
                    self._mirror.removed(seq)
            self.store.drop_paged(self, tail.take_all())
        removed = self.state.purge()
        if self._mirror is not None:
            for e in removed:
                self._mirror.removed(e.seq)
        return removed

    def expire(self, now_ms: int) -> list[Entry]:
        """Discard expired messages at the head (the owner's decision, made explicit)."""
        out = []
        st = self.state
        tail = self.tail
        while True:
            if type(tail) is PagedLevels and tail.count:
                lv, mem, _paged = self._top_level()
                if not mem:  # the head is its level's paged head
                    exp = tail.levels[lv].head_expires_at_ms()
                    if exp is None or exp > now_ms:
                        return out
                    self.page_in(lv)
                    continue
            h = st.expired_head(now_ms)
            if h is None:
                if st.ready_count or tail is None or not tail.count:
                    return out
                exp = tail.head_expires_at_ms()  # memory is empty: the head is the tail's
                if exp is None or exp > now_ms:
                    return out
                self.page_in()
                continue
            out.append(st.discard(h.seq))
            if self._mirror is not None:
                self._mirror.removed(h.seq)

    @property
    def message_count(self) -> int:
        tail = self.tail
        return self.state.ready_count + (tail.count if tail is not None else 0)

    @property
    def paged_count(self) -> int:
        tail = self.tail
        return tail.count if tail is not None else 0

    @property
    def unacked_count(self) -> int:
        return self.state.unacked_count
