"""One connection of RabbitMQ's stream protocol, on the broker's side: what its commands do.

`hutch.streamproto.connection.StreamConnection` does the protocol (frames, handshake, tune,
heartbeats); this session answers the events it hands over: credentials and the vhost, then
publishers (declare, publish with confirms and deduplication by publisher reference, query
sequence, delete), subscriptions (offset specifications, credit, chunks delivered as stored,
filtering by bloom filter; a single active consumer is delivered to only while its group has it
active, `hutch.broker.streamsac`), stored offsets, streams created and deleted through the catalogue,
metadata (each member's advertised host and port), super stream routes and partitions, and
stream statistics. Streams themselves are `hutch.streams` (through `cluster.streams`).

A subscription reads whole chunks as stored, from the replica here or a member's, while it has
credit; at the end of the stream it waits: a member's replica here wakes the session when more
is written, a node without one holds a read at a member's end, and the runtime's tick (about a
second) reads again after a member did not answer. A create is answered once the stream has a
leader (RabbitMQ answers once its writer runs); a stream deleted under a publisher or a
subscription gets one metadata update, and they go.

The runtime (`hutch.server.stream_listener`) feeds it bytes and events, calls `tick()` on its
timer and writes what it returns; it never decides anything here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hutch.amqp.spec import AMQPError
from hutch.broker import operations as ops
from hutch.broker import superstreams
from hutch.broker.streamq import advertised_address
from hutch.broker.streamreg import registry_of
from hutch.broker.streamsac import offset_start, sac_of
from hutch.cluster import catalogue as cat
from hutch.streamproto import chunk as chunks
from hutch.streamproto import connection as sc
from hutch.streamproto import frames as f
from hutch.streams.config import NAMED_ARGUMENTS
from hutch.streams.handle import STREAM
from hutch.streams.host import BATCH_BYTES_MAX

log = logging.getLogger("hutch.stream")

CHUNK_READ_BYTES = 1 << 20  # what a subscription reads from the log at a time
PUBLISH_WINDOW = 10_000  # messages a connection may have unconfirmed before it is not read from
PUBLISH_WINDOW_BYTES = 16 << 20  # and bytes of them (a stream without a majority confirms nothing)
SUB_BATCH_RECORDS_MAX = 65535
# what a published sub-batch may inflate to: its messages are stored uncompressed, as one batch
# (one entry, one chunk a consumer gets in one frame); a frame of 1 MiB of gzip could otherwise
# make a node hold a gigabyte (a gzip bomb), or propose an entry its Raft log cannot take
SUB_BATCH_BYTES_MAX = BATCH_BYTES_MAX
CREATE_WAIT_TICKS = 10  # timer ticks a create waits for its stream's leader before it is answered anyway

# stream arguments of a Create command -> queue.declare arguments

def _declare_arguments(arguments: dict[str, str] | None) -> dict[str, Any] | None:
    """A Create's (or CreateSuperStream's) arguments as the streams' declare arguments; an
    argument RabbitMQ does not know is ignored, as RabbitMQ ignores it; None for a value that is
    not of its argument's kind, or an integer out of range."""
    args: dict[str, Any] = {"x-queue-type": "stream"}
    for k, v in (arguments or {}).items():
        spec_ = NAMED_ARGUMENTS.get(k)
        if spec_ is not None:
            try:
                value = args[spec_[0]] = spec_[1](v)
            except ValueError:
                return None
            if type(value) is int and not -(1 << 63) <= value < 1 << 63:
                return None  # (a queue argument is a signed 64-bit integer, as over AMQP 0-9-1)
    return args


def _code_of(e: AMQPError) -> int:
    if e.code == 403:
        return f.ACCESS_REFUSED
    if e.code == 404:
        return f.STREAM_DOES_NOT_EXIST
    return f.PRECONDITION_FAILED


class _Publisher:
    __slots__ = ("id", "q", "reference", "writer", "record")

    def __init__(self, pid: int, q: Any, reference: str, writer: str):
        self.id = pid
        self.q = q
        self.reference = reference
        self.writer = writer
        self.record: dict[str, Any] = {}  # its row in the node's StreamRegistry (listings)


class _Subscription:
    __slots__ = ("id", "q", "offset", "credit", "reading", "idle", "waiting", "filters", "match_unfiltered",
                 "properties", "ahead", "record", "sac")

    def __init__(self, sid: int, q: Any, start: Any, credit: int, properties: dict):
        self.id = sid
        self.q = q
        self.offset: Any = start  # the next offset to read from (a spec until the first read resolves it)
        self.credit = credit
        self.reading = False
        self.idle = False  # its last read found nothing new: read again on the next tick
        self.waiting = False  # a read held at a member's end, to hear of more (no replica here)
        self.properties = properties
        self.filters = [v.encode() for k, v in sorted(properties.items()) if k.startswith("filter.")]
        self.match_unfiltered = properties.get("match-unfiltered", "false") == "true"
        # chunks read and not yet delivered (no credit left): the next credit takes them first,
        # instead of reading the log again
        self.ahead: list[tuple[Any, int, int, int]] = []  # (chunk, committed chunk id, records, end offset)
        self.record: dict[str, Any] = {}  # its row in the node's StreamRegistry (listings)
        self.sac: Any = None  # its place in a single-active-consumer group (hutch.broker.streamsac)


class StreamSession:
    """The broker's side of one stream-protocol connection."""

    def __init__(self, broker: Any, conn: sc.StreamConnection, peer: str, flush: Callable[[], None],
                 pause: Callable[[bool], None]):
        self.broker = broker
        self.conn = conn
        self.peer = peer
        self._flush = flush
        self._pause = pause
        self.user: Any = None
        self.vhost: Any = None
        self.publishers: dict[int, _Publisher] = {}
        self.subscriptions: dict[int, _Subscription] = {}
        self.closed = False
        self.unconfirmed = 0
        self.unconfirmed_bytes = 0
        self.paused = False
        self._pump_due = False
        self._creating: dict[str, tuple[f.Create, int]] = {}  # created streams waiting for a leader
        self.publishers_declared = 0
        self.write_blocked = False  # the socket's buffer is full: no chunk is read until it drains
        self.id = broker.cluster.peers.owner_id() if broker.cluster is not None else peer
        self.name = peer  # the connection's name in listings ("client:port -> server:port"; set by the runtime)
        self.addresses: tuple[str, int, str, int] = (peer, 0, "", 0)  # peer host/port, host/port
        self.registry = registry_of(broker)
        self.sac = sac_of(broker)
        self.record: dict[str, Any] | None = None

    @property
    def streams(self) -> Any:
        return self.broker.cluster.streams

    # ---------------------------------------------------------------- events

    def handle(self, ev: Any) -> None:
        t = type(ev)
        if t is sc.Authenticate:
            user = self.broker.authenticate(ev.username, ev.password, self.peer)
            if user is None:
                log.warning("stream connection %s: user '%s' failed to authenticate", self.peer, ev.username)
                self.conn.reject_auth(f.AUTHENTICATION_FAILURE)
            else:
                self.user = user
                self.conn.accept_auth()
        elif t is sc.OpenVhost:
            v = self.broker.vhosts.get(ev.vhost)
            if v is None or self.user is None or not self.broker.may_access_vhost(self.user, ev.vhost):
                self.conn.open_refused(f.VIRTUAL_HOST_ACCESS_FAILURE)
            else:
                self.vhost = v
                host, port = self.advertised()
                self.conn.open_ok({"advertised_host": host, "advertised_port": str(port)})
                peer_host, peer_port, local_host, local_port = self.addresses
                self.record = self.registry.add_connection(self.name, {
                    "vhost": ev.vhost, "user": self.user.name, "host": local_host, "port": local_port,
                    "peer_host": peer_host, "peer_port": peer_port, "connection_state": "running",
                    "auth_mechanism": self.conn.mechanism, "heartbeat": self.conn.heartbeat_s,
                    "frame_max": self.conn.frame_max, "client_properties": dict(self.conn.client_properties),
                    "connected_at": int(time.time() * 1000), "subscriptions": 0, "ssl": False,
                    "node": self.broker.config.node_name})
                log.info("stream connection %s: user '%s' authenticated and granted access to vhost '%s'",
                         self.peer, self.user.name, ev.vhost)
        elif t is sc.ProtocolError:
            log.warning("stream connection %s: %s", self.peer, ev.detail)
            self.close()
        elif t is sc.ConnectionTimedOut:
            log.warning("stream connection %s: %s", self.peer, ev.reason)
            self.close()
        elif t is sc.ConnectionClosed:
            self.close()
        else:
            handler = _HANDLERS.get(t)
            if handler is not None:
                handler(self, ev)

    def advertised(self) -> tuple[str, int]:
        return advertised_address(self.broker.config)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for s in self.subscriptions.values():
            self.sac.gone(s)
        self.subscriptions.clear()
        streams = self.streams if self.broker.cluster is not None else None
        if streams is not None:
            for p in self.publishers.values():
                if not p.reference:
                    streams.forget_writer(p.writer)
        self.publishers.clear()
        if self.record is not None:
            self.registry.remove_connection(self.name)
        if streams is not None:
            streams.watchers.pop(self, None)

    def _stream(self, name: str, perm: str) -> tuple[Any, int]:
        """The stream `name` in this connection's vhost after the permission check, or a code."""
        q = self.vhost.queues.get(name) if self.vhost is not None else None
        if q is None or q.deleted or q.queue_type != STREAM.name:
            return None, f.STREAM_DOES_NOT_EXIST
        try:
            self.broker.check_permission(self.user, self.vhost.name, perm, "queue", name)
        except AMQPError:
            return None, f.ACCESS_REFUSED
        return q, f.OK

    # ---------------------------------------------------------------- publishers

    def declare_publisher(self, cmd: f.DeclarePublisher) -> None:
        q, code = self._stream(cmd.stream, "write")
        if q is None or cmd.publisher_id in self.publishers or (cmd.reference and any(
                p.reference == cmd.reference and p.q is q for p in self.publishers.values())):
            # an id, or a reference on the stream, already taken on this connection
            self.conn.respond(cmd, code if q is None else f.PRECONDITION_FAILED)
            return
        # without a reference: an id of its own, never used again (the stream remembers the last
        # record number of every writer, and a publisher declared again under the same publisher
        # id starts numbering afresh)
        self.publishers_declared += 1
        writer = cmd.reference or f"{self.id}/{self.publishers_declared}"
        p = self.publishers[cmd.publisher_id] = _Publisher(cmd.publisher_id, q, cmd.reference or "", writer)
        p.record = self.registry.add_publisher(self.name, cmd.publisher_id, {
            "stream": q.name, "vhost": q.vhost, "reference": cmd.reference or ""})
        self.streams.watchers.setdefault(self, None)  # to hear of the stream's deletion
        self.conn.respond(cmd, f.OK)

    def publish(self, cmd: Any) -> None:
        p = self.publishers.get(cmd.publisher_id)
        v2 = type(cmd) is f.PublishV2
        if p is None or p.q.deleted:
            code = f.PUBLISHER_DOES_NOT_EXIST if p is None else f.STREAM_NOT_AVAILABLE
            errs = [(m[0], code) for m in cmd.messages]
            self.conn.send(f.PublishError(cmd.publisher_id, errs))
            self._flush()
            return
        msgs = cmd.messages
        if type(msgs) is f.FramedMessages:  # the usual frame: simple messages, framed as a chunk's
            if not msgs.pids:
                self._flush()
                return
            written = self._publishing(p, msgs.pids, msgs.size)
            self.streams.write_framed(p.q, p.writer, msgs.pids if p.reference else None, msgs.parts, len(msgs),
                                      msgs.size, written)
            return
        pids: list[int] = []
        records: list[bytes] = []
        filters: list[bytes | None] | None = [] if v2 else None
        confirm: list[int] = []
        bad: list[tuple[int, int]] = []
        for m in msgs:
            if v2:
                pid, fv, body = m
            else:
                pid, body = m
                fv = None
            if type(body) is f.SubBatch:
                if body.uncompressed_size > SUB_BATCH_BYTES_MAX:
                    bad.append((pid, f.PRECONDITION_FAILED))
                    continue
                try:
                    recs = chunks.sub_batch_records(body.compression, body.record_count, body.uncompressed_size,
                                                    bytes(body.data))
                except chunks.ChunkError:
                    bad.append((pid, f.PRECONDITION_FAILED))
                    continue
            else:
                recs = [bytes(body)]
            for r in recs:
                pids.append(pid)
                records.append(r)
                if filters is not None:
                    filters.append(fv.encode() if isinstance(fv, str) and fv else None)
            confirm.append(pid)
        if bad:
            self.conn.send(f.PublishError(cmd.publisher_id, bad))
        if not records:
            self._flush()
            return
        written = self._publishing(p, confirm, sum(map(len, records)))
        # without a reference the publisher's ids are not deduplicated (as in RabbitMQ); the node
        # numbers its records itself (StreamHost.write)
        self.streams.write(p.q, p.writer, pids if p.reference else None, records, filters, written)

    def _publishing(self, p: _Publisher, confirm: list[int], size: int) -> Callable[[Any], None]:
        """Count publishing ids `confirm` (answered together) and their `size` bytes as
        unconfirmed; the callback that answers them once the stream has them."""
        self.unconfirmed += len(confirm)
        self.unconfirmed_bytes += size
        if (self.unconfirmed >= PUBLISH_WINDOW or self.unconfirmed_bytes >= PUBLISH_WINDOW_BYTES) and not self.paused:
            self.paused = True
            self._pause(True)
        pub_id = p.id
        rec = p.record
        rec["messages_published"] = rec.get("messages_published", 0) + len(confirm)

        def written(w: Any) -> None:
            self.unconfirmed -= len(confirm)
            self.unconfirmed_bytes -= size
            if (self.paused and self.unconfirmed < PUBLISH_WINDOW // 2
                    and self.unconfirmed_bytes < PUBLISH_WINDOW_BYTES // 2):
                self.paused = False
                self._pause(False)
            if self.closed:
                return
            if w is None:
                rec["messages_errored"] = rec.get("messages_errored", 0) + len(confirm)
                self.conn.send(f.PublishError(pub_id, [(pid, f.STREAM_NOT_AVAILABLE) for pid in confirm]))
            else:
                rec["messages_confirmed"] = rec.get("messages_confirmed", 0) + len(confirm)
                self.conn.send(f.PublishConfirm(pub_id, confirm))
            self._flush()
        return written

    def query_publisher_sequence(self, cmd: f.QueryPublisherSequence) -> None:
        q, code = self._stream(cmd.stream, "read")
        if q is None:
            self.conn.send(f.QueryPublisherSequenceResponse(cmd.correlation_id, code, 0))
            self._flush()
            return

        def got(seq: Any) -> None:
            if not self.closed:
                ok = seq is not None
                self.conn.send(f.QueryPublisherSequenceResponse(cmd.correlation_id, f.OK if ok else
                                                                f.STREAM_NOT_AVAILABLE, seq or 0))
                self._flush()
        self.streams.query(q, "writer", cmd.reference, got)

    def delete_publisher(self, cmd: f.DeletePublisher) -> None:
        p = self.publishers.pop(cmd.publisher_id, None)
        code = f.OK if p is not None else f.PUBLISHER_DOES_NOT_EXIST
        if p is not None and not p.reference:
            self.streams.forget_writer(p.writer)
        self.registry.remove_publisher(self.name, cmd.publisher_id)
        self.conn.respond(cmd, code)

    # ---------------------------------------------------------------- subscriptions

    def subscribe(self, cmd: f.Subscribe) -> None:
        q, code = self._stream(cmd.stream, "read")
        if q is None:
            self.conn.respond(cmd, code)
            return
        if cmd.subscription_id in self.subscriptions:
            self.conn.respond(cmd, f.SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        s = _Subscription(cmd.subscription_id, q, offset_start(cmd.offset_type, cmd.offset), cmd.credit,
                          dict(cmd.properties or {}))
        s.record = {}
        code = self.sac.subscribe(self, s, q)  # a single active consumer waits to be activated
        if code != f.OK:
            self.conn.respond(cmd, code)
            return
        self.subscriptions[s.id] = s
        s.record = self.registry.add_consumer(self.name, s.id, {
            "stream": q.name, "vhost": q.vhost, "properties": dict(s.properties), "credits": s.credit, **s.record})
        if self.record is not None:
            self.record["subscriptions"] = len(self.subscriptions)
        self.streams.watchers.setdefault(self, None)
        self.conn.respond(cmd, f.OK)
        self.pump()

    def credit(self, cmd: f.Credit) -> None:
        s = self.subscriptions.get(cmd.subscription_id)
        if s is None:
            self.conn.send(f.CreditResponse(f.SUBSCRIPTION_ID_DOES_NOT_EXIST, cmd.subscription_id))
            self._flush()
            return
        s.credit += cmd.credit
        self.pump()

    def unsubscribe(self, cmd: f.Unsubscribe) -> None:
        s = self.subscriptions.pop(cmd.subscription_id, None)
        if s is not None:
            self.sac.gone(s)
        self.registry.remove_consumer(self.name, cmd.subscription_id)
        if self.record is not None:
            self.record["subscriptions"] = len(self.subscriptions)
        self.conn.respond(cmd, f.OK if s is not None else f.SUBSCRIPTION_ID_DOES_NOT_EXIST)

    def pump(self) -> None:
        """Deliver what the subscriptions have credit for (called when credit comes or the
        stream grows)."""
        if self.closed:
            return
        if self._creating:
            self._answer_creates()
        gone: dict[str, None] = {}  # streams deleted under this connection's publishers and subscriptions
        for p in list(self.publishers.values()):
            if p.q.deleted:
                del self.publishers[p.id]
                gone[p.q.name] = None
        for s in list(self.subscriptions.values()):
            if s.q.deleted:
                del self.subscriptions[s.id]
                self.sac.gone(s)
                gone[s.q.name] = None
            elif s.credit > 0 and not s.reading:
                self._read(s)
        if gone:
            for name in gone:  # as RabbitMQ, once per stream: its publishers and subscriptions are gone
                self.conn.send(f.MetadataUpdate(f.STREAM_NOT_AVAILABLE, name))
            self._flush()

    def _read(self, s: _Subscription) -> None:
        """Deliver from `s.offset` while the subscription has credit and the stream has more. A
        replica here answers at once (so this loops rather than recursing, however many chunks a
        filter skips); a member's on another node answers later, and its answer reads on."""
        if s.sac is not None and not s.sac.delivering:
            return  # a single active consumer that is not (yet) active gets nothing
        while True:
            if self.write_blocked:
                return  # `writable` pumps again once the socket drains
            if s.ahead:
                self._send_ahead(s)
                if s.ahead or s.credit <= 0:
                    return
            s.reading = True
            s.idle = False
            now: list[Any] = []  # the answer, when it comes during the call
            in_call = [True]

            def got(answer: Any, now: list[Any] = now, in_call: list[bool] = in_call) -> None:
                if in_call[0]:
                    now.append(answer)
                    return
                s.reading = False
                if self._delivered(s, answer):
                    self._read(s)
            self.streams.read_chunks(s.q, s.offset, CHUNK_READ_BYTES, got)
            in_call[0] = False
            if not now:
                return
            s.reading = False
            if not self._delivered(s, now[0]):
                return

    def _delivered(self, s: _Subscription, answer: Any) -> bool:
        """Send what a read found that the subscription takes; whether to read on."""
        if self.closed or self.subscriptions.get(s.id) is not s or (s.sac is not None and not s.sac.delivering):
            return False
        if answer is None:  # no member answered (a leader change, say): again on the next tick
            s.idle = True
            return False
        start, raw, committed = answer
        if not isinstance(s.offset, int):
            s.offset = start
        before = s.offset
        for c in raw:
            h = chunks.read_header(c)
            if h.next_offset <= s.offset:
                continue
            s.offset = h.next_offset
            if s.filters and h.bloom_size and not any(
                    chunks.bloom_may_contain(chunks.bloom_of_chunk(c, h), v) for v in s.filters):
                continue  # no record of this chunk has one of the subscription's filter values
            if s.filters and not h.bloom_size and not s.match_unfiltered:
                continue
            s.ahead.append((c if self.conn_filters() else chunks.without_bloom(c, h), committed, h.num_records,
                            h.next_offset))
        self._send_ahead(s)
        if s.offset == before:
            # at the end: a member's replica here wakes the session when more is written; on a
            # node without one, a read held at a member's end says when more is (and the tick
            # reads again if no member answers)
            s.idle = True
            if self.broker.cluster.node not in s.q.members:
                self._await_more(s)
            return False
        return s.credit > 0 and not s.ahead  # more may follow (or every chunk read was filtered out)

    def _send_ahead(self, s: _Subscription) -> None:
        """Deliver the chunks read for `s` while it has credit; the rest wait for more credit."""
        ahead = s.ahead
        n = 0
        records = 0
        while ahead and s.credit > 0:
            c, committed, num, end = ahead[n]
            self.conn.send_deliver(s.id, c, committed)
            s.credit -= 1
            records += num
            n += 1
            if n == len(ahead):
                break
        if n:
            last_end = ahead[n - 1][3]
            del ahead[:n]
            rec = s.record
            rec["messages_consumed"] = rec.get("messages_consumed", 0) + records
            rec["offset"] = last_end - 1
            rec["credits"] = s.credit
            self._flush()

    def _await_more(self, s: _Subscription) -> None:
        """On a node without a replica: a read at the subscription's offset that a member holds
        until more is written there (or answers empty after a while, then again)."""
        if s.waiting or not isinstance(s.offset, int):
            return
        s.waiting = True

        def got(answer: Any) -> None:
            s.waiting = False
            if self.closed or self.subscriptions.get(s.id) is not s or answer is None:
                return  # gone, or no member answered: the tick reads again
            if not answer[1]:
                self._await_more(s)  # held long enough with nothing new: hold again
            elif s.credit > 0 and not s.reading:
                self._read(s)
        self.streams.read(s.q, s.offset, 1, got)

    def conn_filters(self) -> bool:
        """Whether the client takes chunks with their bloom filter (it speaks Deliver v2)."""
        return getattr(self.conn, "deliver_version", 1) >= 2

    # ---------------------------------------------------------------- offsets

    def store_offset(self, cmd: f.StoreOffset) -> None:
        q, _code = self._stream(cmd.stream, "read")
        if q is not None and cmd.reference:
            self.streams.store_offset(q, cmd.reference, int(cmd.offset))

    def query_offset(self, cmd: f.QueryOffset) -> None:
        q, code = self._stream(cmd.stream, "read")
        if q is None:
            self.conn.send(f.QueryOffsetResponse(cmd.correlation_id, code, 0))
            self._flush()
            return

        def got(offset: Any) -> None:
            if not self.closed:
                self.conn.send(f.QueryOffsetResponse(cmd.correlation_id, f.OK if offset is not None else f.NO_OFFSET,
                                                     offset or 0))
                self._flush()
        self.streams.query(q, "offset", cmd.reference, got)

    def stream_stats(self, cmd: f.StreamStats) -> None:
        q, code = self._stream(cmd.stream, "read")
        if q is None:
            self.conn.send(f.StreamStatsResponse(cmd.correlation_id, code, {}))
            self._flush()
            return

        def got(answer: Any) -> None:
            if self.closed:
                return
            if answer is None:
                self.conn.send(f.StreamStatsResponse(cmd.correlation_id, f.STREAM_NOT_AVAILABLE, {}))
            else:
                # osiris's figures: the first chunk's id, and the id (first offset) of the last
                # committed chunk, -1 while there is none
                first, raw, committed = answer
                self.conn.send(f.StreamStatsResponse(cmd.correlation_id, f.OK, {
                    "first_chunk_id": first, "committed_chunk_id": committed if raw else -1}))
            self._flush()
        self.streams.read_chunks(q, "first", 1, got)

    # ---------------------------------------------------------------- streams

    def create(self, cmd: f.Create) -> None:
        # rabbit_stream_utils:enforce_correct_name: line breaks go, no empty name, no amq. prefix
        cmd.stream = cmd.stream.replace("\n", "").replace("\r", "")
        if not cmd.stream or cmd.stream.startswith("amq."):
            self.conn.respond(cmd, f.PRECONDITION_FAILED)
            return
        args = _declare_arguments(cmd.arguments)
        if args is None:
            self.conn.respond(cmd, f.PRECONDITION_FAILED)
            return
        if cmd.stream in self.vhost.queues:
            self.conn.respond(cmd, f.STREAM_ALREADY_EXISTS)
            return
        try:
            _q, command = ops.declare_queue(self.broker, self.vhost, self.user, cmd.stream, durable=True,
                                           exclusive=False, auto_delete=False, args=args, owner=None)
        except AMQPError as e:
            self.conn.respond(cmd, _code_of(e))
            return
        if command is None:
            self.conn.respond(cmd, f.STREAM_ALREADY_EXISTS)
            return
        self._catalogue(cmd, command)

    def delete(self, cmd: f.Delete) -> None:
        q, code = self._stream(cmd.stream, "configure")
        if q is None:
            self.conn.respond(cmd, code)
            return
        self._catalogue(cmd, cat.DeleteQueue(self.vhost.name, cmd.stream))

    def _catalogue(self, cmd: Any, command: cat.Command) -> None:
        def done(res: cat.Result) -> None:
            if self.closed:
                return
            if res.ok and type(cmd) is f.Create:
                # as RabbitMQ, a created stream is answered once it has a leader, so that the
                # client's metadata request that follows finds one
                self._creating[cmd.stream] = (cmd, CREATE_WAIT_TICKS)
                self.streams.watchers.setdefault(self, None)
                self._answer_creates()
                return
            self.conn.respond(cmd, f.OK if res.ok else (f.STREAM_ALREADY_EXISTS if res.code == 405
                                                        else f.PRECONDITION_FAILED))
            self._flush()
        self.broker.cluster.submit(command, done)

    def _answer_creates(self, tick: bool = False) -> None:
        """Answer the creates whose stream has a leader now (or that waited long enough)."""
        answered = False
        for name, (cmd, ticks) in list(self._creating.items()):
            q = self.vhost.queues.get(name) if self.vhost is not None else None
            member = q is not None and not q.deleted and self.broker.cluster.node in q.members
            if not member or self.streams.leader_of(q) is not None or ticks <= 0:
                del self._creating[name]
                self.conn.respond(cmd, f.OK)
                answered = True
            elif tick:
                self._creating[name] = (cmd, ticks - 1)
        if answered:
            self._flush()

    def writable(self, on: bool) -> None:
        """The runtime's socket buffer went over its high-water mark (False) or drained (True):
        deliveries follow what the client reads, however much credit it gave."""
        self.write_blocked = not on
        if on:
            self.pump()

    def tick(self) -> None:
        """The runtime's timer, about once a second."""
        if self.closed:
            return
        if self._creating:
            self._answer_creates(tick=True)
        for s in list(self.subscriptions.values()):
            if s.idle and s.credit > 0 and not s.reading and not s.waiting and not s.q.deleted:
                self._read(s)

    def metadata(self, cmd: f.Metadata) -> None:
        cl = self.broker.cluster
        refs: dict[str, int] = {}
        brokers: list[tuple[int, str, int]] = []

        def ref(node: str) -> int:
            r = refs.get(node)
            if r is None:
                host, port = self.node_address(node)
                r = refs[node] = len(refs)
                brokers.append((r, host, port))
            return r
        out = []
        for name in cmd.streams:
            q = self.vhost.queues.get(name) if self.vhost is not None else None
            if q is None or q.deleted or q.queue_type != STREAM.name:
                out.append((name, f.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
                continue
            leader = cl.streams.leader_of(q)
            online = [n for n in q.members if cl.peers.is_up(n) or n == cl.node]
            if leader is None or leader not in online:
                out.append((name, f.STREAM_NOT_AVAILABLE, 0xFFFF, []))
                continue
            out.append((name, f.OK, ref(leader), [ref(n) for n in online if n != leader]))
        self.conn.send(f.MetadataResponse(cmd.correlation_id, brokers, out))
        self._flush()

    def node_address(self, node: str) -> tuple[str, int]:
        cl = self.broker.cluster
        if node == cl.node:
            return self.advertised()
        info = cl.peer_info.get(node) or {}
        adv = info.get("stream_advertised") or {}
        return adv.get("host") or "localhost", int(adv.get("port") or 5552)

    # ---------------------------------------------------------------- super streams

    def route(self, cmd: f.Route) -> None:
        streams = superstreams.route(self.vhost, cmd.super_stream, cmd.routing_key)
        self.conn.send(f.RouteResponse(cmd.correlation_id, f.STREAM_DOES_NOT_EXIST if streams is None else f.OK,
                                       streams or []))
        self._flush()

    def partitions(self, cmd: f.Partitions) -> None:
        streams = superstreams.partitions(self.vhost, cmd.super_stream)
        self.conn.send(f.PartitionsResponse(cmd.correlation_id, f.STREAM_DOES_NOT_EXIST if streams is None
                                            else f.OK, streams or []))
        self._flush()

    def create_super_stream(self, cmd: f.CreateSuperStream) -> None:
        """The exchange, the partitions and their bindings, one catalogue change after the other;
        what was done is undone when a step fails (hutch.broker.superstreams)."""
        if not cmd.name or cmd.name.startswith("amq.") or len(cmd.partitions) != len(cmd.binding_keys):
            self.conn.respond(cmd, f.PRECONDITION_FAILED)
            return
        if cmd.name in self.vhost.exchanges:
            self.conn.respond(cmd, f.STREAM_ALREADY_EXISTS)
            return
        args = _declare_arguments(cmd.arguments)
        if args is None:
            self.conn.respond(cmd, f.PRECONDITION_FAILED)
            return
        try:
            steps = superstreams.creation(self.broker, self.vhost, self.user, cmd.name, list(cmd.partitions),
                                          list(cmd.binding_keys), args)
        except AMQPError as e:
            self.conn.respond(cmd, _code_of(e))
            return
        done: list[cat.Command] = []

        def undo(code: int) -> None:
            for c in reversed(done):
                self.broker.cluster.submit(c, lambda _r: None)
            if not self.closed:
                self.conn.respond(cmd, code)
                self._flush()

        def step(res: cat.Result | None) -> None:
            if res is not None and not res.ok:
                done.pop()  # this change did not happen
                undo(f.PRECONDITION_FAILED)
                return
            try:
                command, back = next(steps)
            except StopIteration:
                log.info("super stream '%s' in vhost '%s' created with %d partition(s)", cmd.name,
                         self.vhost.name, len(cmd.partitions))
                if not self.closed:
                    self.conn.respond(cmd, f.OK)
                    self._flush()
                return
            except AMQPError as e:
                undo(_code_of(e))
                return
            done.append(back)
            self.broker.cluster.submit(command, step)
        step(None)

    def delete_super_stream(self, cmd: f.DeleteSuperStream) -> None:
        try:
            commands = superstreams.deletion(self.broker, self.vhost, self.user, cmd.name)
        except AMQPError as e:
            self.conn.respond(cmd, _code_of(e))
            return
        if not commands:
            self.conn.respond(cmd, f.STREAM_DOES_NOT_EXIST)
            return

        def step(_res: cat.Result | None) -> None:
            if commands:
                self.broker.cluster.submit(commands.pop(0), step)
            elif not self.closed:
                self.conn.respond(cmd, f.OK)
                self._flush()
        step(None)

    def consumer_update_response(self, cmd: f.ConsumerUpdateResponse) -> None:
        self.sac.answered(self, cmd)


_HANDLERS: dict[type, Callable[[StreamSession, Any], None]] = {
    f.DeclarePublisher: StreamSession.declare_publisher,
    f.Publish: StreamSession.publish,
    f.PublishV2: StreamSession.publish,
    f.QueryPublisherSequence: StreamSession.query_publisher_sequence,
    f.DeletePublisher: StreamSession.delete_publisher,
    f.Subscribe: StreamSession.subscribe,
    f.Credit: StreamSession.credit,
    f.Unsubscribe: StreamSession.unsubscribe,
    f.StoreOffset: StreamSession.store_offset,
    f.QueryOffset: StreamSession.query_offset,
    f.StreamStats: StreamSession.stream_stats,
    f.Create: StreamSession.create,
    f.Delete: StreamSession.delete,
    f.Metadata: StreamSession.metadata,
    f.Route: StreamSession.route,
    f.Partitions: StreamSession.partitions,
    f.CreateSuperStream: StreamSession.create_super_stream,
    f.DeleteSuperStream: StreamSession.delete_super_stream,
    f.ConsumerUpdateResponse: StreamSession.consumer_update_response,
}
