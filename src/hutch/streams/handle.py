"""A stream as the broker holds it in a vhost, on every node (`StreamQueue`), and its AMQP 0-9-1
consumers.

Every node has the handle; the stream's members also hold its replica (`machine`, over the
member's log). Publishing goes through the host to the group's leader. An AMQP 0-9-1 consumer
reads the stream from the offset its `x-stream-offset` names, on this node's replica when this
node is a member, otherwise from a member over the peer protocol; it needs a prefetch, and its
acks only give credit back (RabbitMQ 3.10's rules, with its error texts: a consumer without a
prefetch 406, automatic acknowledgement, basic.get, queue.purge, nack and reject 540). Every
delivery carries the `x-stream-offset` header and the exchange and routing key its message was
published with; its delivery tag's sequence is the offset.

A node without a whole replica reads from a member (`sread`); the member holds a read that is at
its end until more is written (or `PARK_S` has passed), so such a consumer follows the stream
without polling, and a read that failed (no member up) is tried again every `POLL_S`. The
declare-ok counts there are asked of a member.

Must never: touch a channel itself (deliveries go out through the host's port), do I/O other
than through the host's reads, or import anything from `hutch.broker` or above.
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from hutch.amqp import codec, spec
from hutch.amqp.spec import AMQPError
from hutch.cluster import catalogue as cat
from hutch.queues.handle import PENDING, REPLICATED, Figures, GroupHandle, QueueType, register
from hutch.streamproto import amqp10
from hutch.streams.config import StreamConfig, parse_age

STREAM = register(QueueType("stream", (REPLICATED,)))
_OFFSET = struct.Struct(">q")
READ_BYTES = 1 << 20  # what a consumer reads from the log at a time
PARK_S = 5.0  # how long a member holds another node's read at the stream's end before answering it empty
PARKED_MAX = 4096  # such reads held per stream (past it the oldest is answered empty)
ROUTES_CACHED_MAX = 256  # encoded delivery routes kept per stream
POLL_S = 1.0  # how often a node without a whole replica looks again for readers whose read failed


class HostOps(Protocol):
    port: Any
    peers: Any

    def leader_of(self, q: StreamQueue) -> str | None: ...
    def read(self, q: StreamQueue, start: Any, max_bytes: int, callback: Callable[[Any], None]) -> Any: ...
    def read_local(self, q: StreamQueue, start: Any, max_bytes: int) -> Any: ...
    def now_ms(self) -> int: ...
    def owner_id(self) -> str: ...
    def peers_call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None: ...


def resolve_spec(value: Any, now_ms: int) -> Any:
    """An `x-stream-offset` as a start the host resolves on a replica: "first", "last", "next",
    an offset (int), or ("ts", ms). ValueError when it is none of RabbitMQ's forms."""
    if value is None:
        return "next"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return max(value, 0)  # below the stream's first offset: from the first (RabbitMQ's reading)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return ("ts", int(value.timestamp() * 1000))
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return value
        age = parse_age(value)
        if age is not None:
            return ("ts", now_ms - age)
    raise ValueError(value)


_OFFSET_LOW = codec.typed_value(0)
_OFFSET_HIGH = codec.typed_value(-1)
_with_offset_cached: dict[bytes, tuple[bytes, bytes]] = {}
WITH_OFFSET_CACHED_MAX = 1024  # property sets kept with the place of their x-stream-offset header


def with_offset(props: bytes, offset: int) -> bytes:
    """Content properties with the `x-stream-offset` header (a long) set to `offset`. The
    properties with the header are made once per distinct set of properties (most messages
    share theirs) and the offset's 8 bytes are put in their place."""
    parts = _with_offset_cached.get(props)
    if parts is None:
        low = codec.edit_properties(props, set_headers={"x-stream-offset": _OFFSET_LOW})
        high = codec.edit_properties(props, set_headers={"x-stream-offset": _OFFSET_HIGH})
        at = next(i for i, (a, b) in enumerate(zip(low, high, strict=True)) if a != b)
        parts = (low[:at], low[at + 8:])
        if len(_with_offset_cached) >= WITH_OFFSET_CACHED_MAX:
            _with_offset_cached.clear()
        _with_offset_cached[props] = parts
    return parts[0] + _OFFSET.pack(offset) + parts[1]


class _Reader:
    """An AMQP 0-9-1 consumer's place in the stream and what it has read ahead."""

    __slots__ = ("c", "start", "offset", "records", "reading", "filters", "match_unfiltered")

    def __init__(self, c: Any, start: Any, filters: frozenset[str] | None = None, match_unfiltered: bool = False):
        self.c = c
        self.start = start  # the spec until the first read resolves it
        self.offset = -1  # the next offset to deliver (-1: not resolved yet)
        self.records: deque[tuple[int, bytes]] = deque()
        self.reading = False
        self.filters = filters  # x-stream-filter: only messages with one of these filter values
        self.match_unfiltered = match_unfiltered  # x-stream-match-unfiltered: and those with none


class StreamQueue(GroupHandle):
    """A stream's handle in a vhost, on every node."""

    local = False
    quorum = False
    stream = True
    queue_type = STREAM.name
    message_ttl_ms = None
    expires_ms = None
    journal_id = 0
    exclusive_owner = None
    durable = True
    auto_delete = False
    single_active = False
    dead_letter_exchange = None
    dead_letter_routing_key = None

    def __init__(self, host: HostOps, rec: cat.QueueRecord, config: StreamConfig):
        self.host = host
        self.name = rec.name
        self.vhost = rec.vhost
        self.arguments = dict(rec.arguments)
        self.gid = rec.journal_id
        self.members = tuple(rec.member_nodes)
        self.declared_leader = rec.leader_node
        self.config = config
        self.deleted = False
        self.local_consumers: dict[str, Any] = {}
        self._readers: dict[str, _Reader] = {}
        self.machine: Any = None  # the StreamMachine when this node is a member
        self.log: Any = None  # the member's StreamLog
        self.reported = (0, 0, 0)  # first offset, committed end, bytes: from a member when not one
        self.mstats = host.port.new_stats()
        self.last_used_ms = 0
        # reads from other nodes at the end of this member's replica: (deadline s, offset, max bytes, answer)
        self._parked: deque[tuple[float, int, int, Callable[[Any], None]]] = deque()
        self._next_poll_s = 0.0
        self._routes: dict[tuple[str, str], bytes] = {}  # (exchange, routing key) -> encoded, for deliveries

    def __repr__(self) -> str:
        return f"StreamQueue({self.vhost!r}, {self.name!r}, group {self.gid})"

    # -- figures
    def extent(self) -> tuple[int, int, int]:
        """(first offset, committed end, bytes) of the replica here, or as last reported."""
        m = self.machine
        if m is not None and m.missing_from is None:
            log = self.log
            return log.first_offset, m.committed, log.bytes
        return self.reported

    @property
    def message_count(self) -> int:
        first, end, _b = self.extent()
        return max(0, end - first)

    @property
    def unacked_count(self) -> int:
        return sum(c.unacked for c in self.local_consumers.values())

    @property
    def consumer_count(self) -> int:
        return len(self.local_consumers)

    def figures(self) -> Figures:
        first, end, size = self.extent()
        return Figures(max(0, end - first), 0, size, 0, len(self.local_consumers))

    def active_consumer(self) -> Any:
        return None

    # -- acknowledgements give credit back; nothing else
    def settle(self, seq: int) -> None:
        self.host.port.dirty(self)

    def _unsupported(self, what: str) -> AMQPError:
        return AMQPError(spec.NOT_IMPLEMENTED, f"{what} not supported by stream queues queue '{self.name}' in "
                                               f"vhost '{self.vhost}'")

    def requeue(self, seq: int) -> None:
        raise self._unsupported("basic.nack and basic.reject")

    def discard(self, seq: int) -> None:
        raise self._unsupported("basic.nack and basic.reject")

    # -- consumers on this node
    def add_consumer(self, c: Any) -> None:
        self.local_consumers[c.ref] = c

    def remove_consumer(self, c: Any) -> bool:
        self._readers.pop(c.ref, None)
        return self.local_consumers.pop(c.ref, None) is not None

    def consumers(self) -> list[Any]:
        return list(self.local_consumers.values())

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.local_consumers.values())

    # -- deliveries
    def readable(self) -> None:
        """The replica here has more (or a read came back): consumers may get it, here and on the
        nodes whose reads at the end wait here."""
        if self._readers:
            self.host.port.dirty(self)
        if self._parked and self.machine is not None:
            parked, self._parked = self._parked, deque()
            for _deadline, offset, max_bytes, answer in parked:
                answer([200, self.host.read_local(self, offset, max_bytes)])

    def park_read(self, offset: int, max_bytes: int, answer: Callable[[Any], None], now_s: float) -> None:
        """Another node's consumer has read everything this member has: its next read is answered
        when more is written here, or empty after PARK_S (then it asks again)."""
        if len(self._parked) >= PARKED_MAX:
            _d, old_offset, _b, old_answer = self._parked.popleft()
            old_answer([200, (old_offset, [])])
        self._parked.append((now_s + PARK_S, offset, max_bytes, answer))

    def drop_parked_reads(self) -> None:
        parked, self._parked = self._parked, deque()
        for _deadline, _offset, _max_bytes, answer in parked:
            answer([404, None])

    def tick(self, now_s: float) -> None:
        """The host's timer: parked reads past their time are answered empty; without a whole
        replica here, readers whose read failed (no member up, the member went) read again."""
        parked = self._parked
        while parked and parked[0][0] <= now_s:
            _deadline, offset, _max_bytes, answer = parked.popleft()
            answer([200, (offset, [])])
        if self._readers and now_s >= self._next_poll_s and (self.machine is None or self.machine.missing_from is not None):
            self._next_poll_s = now_s + POLL_S
            self.host.port.dirty(self)

    def flush(self) -> None:
        """The broker's per-iteration call for a queue whose messages live elsewhere."""
        self.dispatch()

    def dispatch(self) -> int:
        sent = 0
        for r in list(self._readers.values()):
            sent += self._feed(r)
        return sent

    def _feed(self, r: _Reader) -> int:
        c = r.c
        sent = 0
        deliver = self.host.port.deliver
        records = r.records
        while c.can_take():
            if not records:
                if not r.reading:
                    self._read(r)
                if not records:
                    break
            offset, record = records.popleft()
            try:
                props, body = amqp10.to_basic(record)
                route = self._route_of(amqp10.route(record))
            except ValueError:
                props, body = amqp10.NO_PROPERTIES, record  # not an AMQP 1.0 message: its bytes as the body
                route = self._route
            deliver(c, self, offset, 0, False, route, with_offset(props, offset), body)  # 0 earlier deliveries
            r.offset = offset + 1
            sent += 1
        return sent

    @property
    def _route(self) -> bytes:
        """The route of a message that names none (a stream client's): the default exchange and
        the stream's name."""
        return codec.route_encoding("", self.name)

    def _route_of(self, route: tuple[str, str] | None) -> bytes:
        """A delivery's exchange and routing key: those it was published with, as RabbitMQ gives them."""
        if route is None:
            return self._route
        routes = self._routes
        enc = routes.get(route)
        if enc is None:
            if len(routes) >= ROUTES_CACHED_MAX:
                routes.clear()
            enc = routes[route] = codec.route_encoding(*route)
        return enc

    def _read(self, r: _Reader) -> None:
        """Read on from the reader's place. A replica here answers during the call, so this loops
        (however many messages a filter drops) rather than recursing; a member on another node
        answers later, and that answer reads on."""
        while True:
            start = r.start if r.offset < 0 else r.offset
            r.reading = True
            now: list[Any] = []  # the answer, when it came during the call
            in_call = [True]

            def got(answer: Any, now: list[Any] = now, in_call: list[bool] = in_call) -> None:
                if in_call[0]:
                    now.append(answer)
                    return
                r.reading = False
                if self._took(r, answer):
                    self._read(r)

            self.host.read(self, start, READ_BYTES, got)
            in_call[0] = False
            if not now:
                return
            r.reading = False
            if not self._took(r, now[0]):
                return

    def _took(self, r: _Reader, answer: Any) -> bool:
        """Keep what a read found for the reader; whether to read on at once (everything read
        was filtered out)."""
        if answer is None or self.deleted or self._readers.get(r.c.ref) is not r:
            return False
        first, chunks = answer
        if r.offset < 0:
            r.offset = first
        want = r.offset
        filters = r.filters
        end = want
        for records_first, recs in chunks:
            for i, rec in enumerate(recs):
                o = records_first + i
                if o >= want:
                    end = o + 1
                    if filters is None or _passes(rec, filters, r.match_unfiltered):
                        r.records.append((o, rec))
        if end <= want:
            return False
        r.offset = end
        if r.records:
            self.host.port.dirty(self)
            return False
        return True

    # -- client operations (hutch.queues.handle)
    def stat(self, reply: Callable[[Any], None]) -> Any:
        """declare-ok's counts: from the replica here, or asked of a member (the leader first)."""
        m = self.machine
        up = [n for n in self.online() if n != self.host.peers.node]
        if (m is not None and m.missing_from is None) or not up:
            return self.message_count, self.consumer_count
        leader = self.host.leader_of(self)
        consumers = self.consumer_count

        def got(answer: Any) -> None:
            st = answer[1] if answer is not None and answer[0] == 200 else None
            if isinstance(st, dict):
                self.reported = (st["first_offset"], st["committed_offset"], st["bytes"])
            reply((self.message_count, consumers))
        self.host.peers_call(leader if leader in up else up[0], "sstatus", [self.gid], got)
        return PENDING

    def purge(self, reply: Callable[[Any], None]) -> Any:
        raise self._unsupported("queue.purge")

    def get(self, no_ack: bool, reply: Callable[[Any], None]) -> Any:
        raise self._unsupported("basic.get")

    def consume(self, c: Any, reply: Callable[[Any], None]) -> Any:
        if c.no_ack:
            raise self._unsupported("automatic acknowledgement")
        if not c.prefetch:
            raise AMQPError(spec.PRECONDITION_FAILED, f"consumer prefetch count is not set for 'queue '{self.name}' "
                                                       f"in vhost '{self.vhost}''")
        value = (c.arguments or {}).get("x-stream-offset")
        try:
            start = resolve_spec(value, self.host.now_ms())
        except ValueError:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            raise AMQPError(spec.PRECONDITION_FAILED, f"invalid x-stream-offset for queue '{self.name}' in vhost "
                                                       f"'{self.vhost}': {value}") from None
        filters, match_unfiltered = _filter_arguments(c.arguments or {})
        c.ref = self.host.owner_id()
        self.add_consumer(c)
        self._readers[c.ref] = _Reader(c, start, filters, match_unfiltered)
        self.host.port.dirty(self)
        return None


def _filter_arguments(args: dict) -> tuple[frozenset[str] | None, bool]:
    """x-stream-filter (a string or a list of strings) and x-stream-match-unfiltered (RabbitMQ
    3.13's stream filtering over AMQP 0-9-1)."""
    value = args.get("x-stream-filter")
    if value is None:
        return None, False
    values = value if isinstance(value, list) else [value]
    filters = frozenset(v.decode() if isinstance(v, bytes) else str(v) for v in values)
    return filters, args.get("x-stream-match-unfiltered") is True


def _passes(record: bytes, filters: frozenset[str], match_unfiltered: bool) -> bool:
    """Whether a message goes to a filtering consumer: its filter value is one of the consumer's,
    or it has none and the consumer takes those. RabbitMQ skips whole chunks by their bloom
    filter and leaves the rest to the client; hutch delivers exactly the messages that match."""
    value = amqp10.filter_value(record)
    return value in filters if value is not None else match_unfiltered


__all__ = ["STREAM", "StreamQueue", "resolve_spec"]
