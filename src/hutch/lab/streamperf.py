"""`hutch perf --protocol stream`: producers and consumers on RabbitMQ's stream protocol.

A Python stream client library would be the bottleneck of a throughput test, so this is a
small client of its own on `hutch.streamproto` (the frames codec and the chunk header), shaped
like RabbitMQ's stream-perf-test:

- a producer looks the stream's leader up (Metadata) and connects to it, declares a publisher
  and publishes batches of `--batch-size` messages in one Publish frame each, with at most
  `--confirm` messages unconfirmed (the stream protocol confirms every publish; the window
  bounds what is in flight); confirms are pipelined, never waited for one by one;
- a consumer subscribes from an offset spec (`--offset first|last|next|N`) with an initial
  credit, grants one credit back per chunk delivered, and counts a chunk's records from its
  header without decoding a message; its latency sample is the first record's publish time,
  one per chunk.

Every message is an AMQP 1.0 message with one data section (what stream clients publish, so
AMQP 0-9-1 consumers of the same stream read it too) whose body starts with the publish time
(ns) and the message id, as in the AMQP mode, so the two modes measure alike.

It uses a node only through the stream protocol, as any client does; it imports no broker code.
The progress lines, the worker processes and the summary are `hutch.lab.perf`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f

DEFAULT_PORT = 5552
DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
CONFIRM_WINDOW_DEFAULT = 10_000  # stream-perf-test's default of unconfirmed messages per producer
BATCH_SIZE_DEFAULT = 100  # messages per Publish frame
CREDIT_DEFAULT = 10  # chunks a subscription may have in flight
FRAME_MAX = 1048576  # what the client proposes (RabbitMQ's default)
HEARTBEAT_S = 60
REQUEST_TIMEOUT_S = 10.0
METADATA_RETRY_S = 0.1
RATE_SLEEP_MIN_S = 0.001
PUBLISHER_SHIFT = 32  # msg_id = producer << 32 | seq, as in the AMQP mode
PUBLISH_FRAME_OVERHEAD = 9  # size, key, version, publisher id, message count
MESSAGE_OVERHEAD = 12  # publishing id, size

STAMP = struct.Struct(">QQ")  # publish time (ns), message id: the first 16 bytes of every body
_stamp_ts = struct.Struct(">Q")


# response codes by name, as the protocol document names them
CODE_NAMES = {getattr(f, name): name.lower() for name in (
    "OK", "STREAM_DOES_NOT_EXIST", "SUBSCRIPTION_ID_ALREADY_EXISTS", "SUBSCRIPTION_ID_DOES_NOT_EXIST",
    "STREAM_ALREADY_EXISTS", "STREAM_NOT_AVAILABLE", "SASL_MECHANISM_NOT_SUPPORTED", "AUTHENTICATION_FAILURE",
    "SASL_ERROR", "SASL_CHALLENGE", "SASL_AUTHENTICATION_FAILURE_LOOPBACK", "VIRTUAL_HOST_ACCESS_FAILURE",
    "UNKNOWN_FRAME", "FRAME_TOO_LARGE", "INTERNAL_ERROR", "ACCESS_REFUSED", "PRECONDITION_FAILED",
    "PUBLISHER_DOES_NOT_EXIST", "NO_OFFSET")}


class StreamError(Exception):
    """The server refused a request or closed the connection: its response code and what for."""

    def __init__(self, code: int, text: str):
        super().__init__(f"{text}: {CODE_NAMES.get(code, 'response code')} ({code:#04x})")
        self.code = code
        self.text = text


@dataclass(frozen=True)
class StreamEndpoint:
    """Where to connect, parsed from a rabbitmq-stream:// URI (RabbitMQ's stream clients' form)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"

    @classmethod
    def from_uri(cls, uri: str) -> StreamEndpoint:
        parts = urlsplit(uri)
        if parts.scheme not in ("rabbitmq-stream", ""):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} (rabbitmq-stream:// only)")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or DEFAULT_PORT,
                   user=unquote(parts.username or "guest"), password=unquote(parts.password or "guest"),
                   vhost=unquote(path) if path else "/")

    def at(self, host: str, port: int) -> StreamEndpoint:
        """The same credentials and vhost on another node (an advertised host and port)."""
        return StreamEndpoint(host, port, self.user, self.password, self.vhost)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def offset_spec(text: str) -> tuple[int, int | None]:
    """`first`, `last`, `next` or an offset number, as a Subscribe's offset type and value."""
    named = {"first": f.OFFSET_TYPE_FIRST, "last": f.OFFSET_TYPE_LAST, "next": f.OFFSET_TYPE_NEXT}
    if text in named:
        return named[text], None
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"offset {text!r}: first, last, next or a number") from None
    if n < 0:
        raise ValueError(f"offset {text!r}: not below 0")
    return f.OFFSET_TYPE_OFFSET, n


def create_arguments(queue_args: dict) -> dict[str, str]:
    """--queue-args as a Create command's arguments: the x- prefix of queue.declare arguments is
    dropped and the queue type left out, so one set of arguments serves both protocols."""
    out = {}
    for k, v in queue_args.items():
        k = k[2:] if k.startswith("x-") else k
        if k != "queue-type":
            out[k] = str(v)
    return out


# ---------------------------------------------------------------- messages


class MessageTemplate:
    """Messages of one body size as AMQP 1.0 data sections, stamped per message."""

    def __init__(self, size: int):
        if size < STAMP.size:
            raise ValueError(f"a message body holds at least {STAMP.size} bytes (publish time and message id)")
        encoded = amqp10.Message(bytes(size)).encode()
        self.stamp_at = len(encoded) - size  # where the body starts in a record
        self.head = encoded[:self.stamp_at]
        self.tail = encoded[self.stamp_at + STAMP.size:]
        self.record_size = len(encoded)

    def batch(self, ts_ns: int, first_pid: int, first_id: int, n: int) -> list[tuple[int, bytes]]:
        """n (publishing id, message) pairs with consecutive ids, all stamped `ts_ns`."""
        head, tail, pack = self.head, self.tail, STAMP.pack
        return [(first_pid + j, b"".join((head, pack(ts_ns, first_id + j), tail))) for j in range(n)]

    def batch_ids(self, ts_ns: int, pids: list[int], ids: list[int]) -> list[tuple[int, bytes]]:
        head, tail, pack = self.head, self.tail, STAMP.pack
        return [(p, b"".join((head, pack(ts_ns, i), tail))) for p, i in zip(pids, ids, strict=True)]


def batch_max(frame_max: int, record_size: int, batch_size: int) -> int:
    """Messages per Publish frame: `batch_size`, fewer when the frame would pass frame_max."""
    per_frame = (frame_max - PUBLISH_FRAME_OVERHEAD) // (record_size + MESSAGE_OVERHEAD)
    return max(1, min(batch_size, per_frame))


def first_stamp(chunk: bytes | memoryview, h: chunks.ChunkHeader) -> tuple[int, int] | None:
    """The (publish time ns, message id) of a chunk's first record when it is a message this
    tool wrote (a simple entry holding one data section), else None; nothing else is decoded."""
    at = h.data_at
    if h.data_length < 4 + 5 + STAMP.size or chunk[at] & 0x80:
        return None
    size = (chunk[at] << 24) | (chunk[at + 1] << 16) | (chunk[at + 2] << 8) | chunk[at + 3]
    r = at + 4
    if chunk[r] != 0x00 or chunk[r + 1] != 0x53 or chunk[r + 2] != 0x75:
        return None
    code = chunk[r + 3]
    body = r + (5 if code == 0xA0 else 8 if code == 0xB0 else 0)
    if body == r or body + STAMP.size > r + size or r + size > at + h.data_length:
        return None
    return STAMP.unpack_from(chunk, body)


def record_stamps(chunk: bytes | memoryview) -> list[tuple[int, int]]:
    """Every record's (publish time ns, message id): for checks that each message is there once."""
    return [STAMP.unpack_from(amqp10.Message.decode(rec).body) for rec in chunks.records(chunk)]


# ---------------------------------------------------------------- the connection


class StreamClient(asyncio.Protocol):
    """One client connection: the handshake, requests matched to responses by correlation id,
    and callbacks for what the server sends unasked (confirms, publish errors, deliveries)."""

    def __init__(self, name: str):
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.decoder = f.FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future = self.loop.create_future()
        self.pending: dict[int, asyncio.Future] = {}
        self.next_correlation = 1
        self.tune: asyncio.Future = self.loop.create_future()
        self.properties: dict[str, str] = {}  # the open response's (advertised host and port)
        self.frame_max = FRAME_MAX  # as tuned with the server
        self.on_confirm: Callable[[int, list[int]], None] | None = None
        self.on_publish_error: Callable[[int, list[tuple[int, int]]], None] | None = None
        self.on_deliver: Callable[[int, memoryview], None] | None = None
        self.credit_due: dict[int, int] = {}  # subscription -> credit to grant after this read
        self._writable: asyncio.Future | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._close(exc or ConnectionResetError(f"stream connection {self.name} closed by the server"))

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            for cmd in self.decoder:
                self._dispatch(cmd)
        except f.FrameError as e:
            self._close(StreamError(e.code, f"malformed frame from the server: {e.detail}"))
            self.transport.abort()
            return
        due = self.credit_due
        if due:  # one Credit per subscription for all the chunks of this read
            self.transport.writelines([f.encode(f.Credit(sid, n)) for sid, n in due.items()])
            due.clear()

    def _dispatch(self, cmd: f.Command) -> None:
        t = type(cmd)
        if t is f.PublishConfirm:
            if self.on_confirm is not None:
                self.on_confirm(cmd.publisher_id, cmd.publishing_ids)
        elif t is f.Deliver or t is f.DeliverV2:
            if self.on_deliver is not None:
                self.on_deliver(cmd.subscription_id, cmd.chunk)
        elif t is f.PublishError:
            if self.on_publish_error is not None:
                self.on_publish_error(cmd.publisher_id, cmd.errors)
        elif t is f.Heartbeat:
            self.transport.write(f.encode(f.Heartbeat()))
        elif t is f.Tune:
            if not self.tune.done():
                self.tune.set_result(cmd)
        elif t is f.Close:
            self.transport.write(f.encode(f.CloseResponse(cmd.correlation_id, f.OK)))
            self._close(StreamError(cmd.code, f"connection closed by the server: {cmd.reason}"))
            self.transport.close()
        elif t is f.MetadataUpdate:
            self._close(StreamError(cmd.code, f"stream '{cmd.stream}' is no longer available"))
            self.transport.close()
        elif t is f.CreditResponse:
            self._close(StreamError(cmd.code, f"credit for unknown subscription {cmd.subscription_id}"))
            self.transport.close()
        else:
            fut = self.pending.pop(getattr(cmd, "correlation_id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)

    def _close(self, exc: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()
        if not self.tune.done():
            self.tune.set_exception(exc)
            self.tune.exception()  # retrieved: nobody may be waiting for it
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- sending

    def grant_credit(self, subscription_id: int, n: int = 1) -> None:
        """Credit for a subscription, sent in one Credit frame once the current read is handled."""
        due = self.credit_due
        due[subscription_id] = due.get(subscription_id, 0) + n

    def close_error(self) -> BaseException:
        return self.closed.result() if self.closed.done() else ConnectionResetError("not closed")

    def send(self, frame: bytes) -> None:
        if self.closed.done():
            raise self.close_error()
        self.transport.write(frame)

    @property
    def writable(self) -> bool:
        return self._writable is None or self._writable.done()

    async def drain(self) -> None:
        if not self.writable:
            await self._writable
        if self.closed.done():
            raise self.close_error()

    async def request(self, cmd: f.Command, ok: tuple[int, ...] = (f.OK,),
                      timeout_s: float = REQUEST_TIMEOUT_S) -> f.Command:
        """Send a request with the next correlation id and wait for its response; a response
        code outside `ok` raises StreamError."""
        cid = self.next_correlation
        self.next_correlation += 1
        cmd.correlation_id = cid
        fut = self.loop.create_future()
        self.pending[cid] = fut
        self.send(f.encode(cmd))
        try:
            async with asyncio.timeout(timeout_s):
                resp = await fut
        finally:
            self.pending.pop(cid, None)
        code = getattr(resp, "code", f.OK)
        if code not in ok:
            what = getattr(cmd, "stream", None)
            raise StreamError(code, f"{type(cmd).__name__} refused" + (f" for stream '{what}'" if what else ""))
        return resp

    # -- life cycle

    @classmethod
    async def connect(cls, ep: StreamEndpoint, name: str, timeout_s: float = REQUEST_TIMEOUT_S) -> StreamClient:
        """Connect and go through the handshake (peer properties, SASL PLAIN, tune, open)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            _, client = await loop.create_connection(lambda: cls(name), ep.host, ep.port)
        try:
            await client.request(f.PeerProperties(0, {"product": "hutch-perf", "connection_name": name}))
            await client.request(f.SaslHandshake(0))
            await client.request(f.SaslAuthenticate(0, "PLAIN", f"\0{ep.user}\0{ep.password}".encode()))
            async with asyncio.timeout(timeout_s):
                tune = await client.tune
            frame_max = min(x for x in (tune.frame_max, FRAME_MAX) if x) if tune.frame_max else FRAME_MAX
            heartbeat = min(x for x in (tune.heartbeat, HEARTBEAT_S) if x) if tune.heartbeat else 0
            client.frame_max = frame_max
            client.send(f.encode(f.Tune(frame_max, heartbeat)))
            opened = await client.request(f.Open(0, ep.vhost))
            client.properties = dict(opened.properties or {})
        except BaseException:
            client.abort()
            raise
        return client

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    async def close(self, timeout_s: float = 5.0) -> None:
        """A clean close (Close, wait for its response), else abort."""
        if self.closed.done():
            return
        with contextlib.suppress(Exception):
            await self.request(f.Close(0, f.OK, "OK"), timeout_s=timeout_s)
        self.abort()

    async def leader_of(self, ep: StreamEndpoint, stream: str, timeout_s: float = REQUEST_TIMEOUT_S,
                        avoid: tuple[str, int] | None = None) -> StreamEndpoint:
        """The advertised address of the stream's leader (Metadata), asked again every
        METADATA_RETRY_S while the stream has none (just created, or electing one) or while its
        leader is `avoid` (a node known to be gone), for at most `timeout_s`."""
        deadline = self.loop.time() + timeout_s
        while True:
            resp = await self.request(f.Metadata(0, [stream]))
            brokers = {ref: (host, port) for ref, host, port in resp.brokers}
            code, leader = f.STREAM_DOES_NOT_EXIST, None
            for name, c, ref, _replicas in resp.streams:
                if name == stream:
                    code, leader = c, brokers.get(ref)
            if code == f.OK and leader is not None and leader != avoid:
                return ep.at(*leader)
            if code == f.STREAM_DOES_NOT_EXIST or self.loop.time() >= deadline:
                raise StreamError(code if code != f.OK else f.STREAM_NOT_AVAILABLE, f"no leader for stream '{stream}'")
            await asyncio.sleep(METADATA_RETRY_S)


async def create_streams(uri: str, names: list[str], arguments: dict[str, str], client_name: str) -> None:
    """Create each stream (one that exists already is fine, as PerfTest takes it)."""
    client = await StreamClient.connect(StreamEndpoint.from_uri(uri), client_name)
    try:
        for name in names:
            await client.request(f.Create(0, name, arguments), ok=(f.OK, f.STREAM_ALREADY_EXISTS))
    finally:
        await client.close()


async def delete_streams(uri: str, names: list[str], client_name: str) -> None:
    client = await StreamClient.connect(StreamEndpoint.from_uri(uri), client_name)
    try:
        for name in names:
            await client.request(f.Delete(0, name), ok=(f.OK, f.STREAM_DOES_NOT_EXIST))
    finally:
        await client.close()


# ---------------------------------------------------------------- producers and consumers
#
# Both are driven by a `hutch.lab.perf.Worker` (its counters, `go`, `stopping`, `t0`,
# `client_ready` and `client_done`), as that module's AMQP clients are.


class StreamProducer:
    kind = "producer"

    def __init__(self, worker, index: int):
        self.worker = worker
        self.cfg = worker.cfg
        self.index = index
        self.stats = worker.counters
        self.queue = self.cfg.queue_names()[index % self.cfg.queues]
        self.endpoint = StreamEndpoint.from_uri(self.cfg.uris[index % len(self.cfg.uris)])
        self.template = MessageTemplate(self.cfg.size)
        self.id_base = index << PUBLISHER_SHIFT
        self.seq = 0  # messages published (publishing ids 1..seq)
        self.outstanding: dict[int, int] = {}  # publishing id -> publish time ns
        self.room: asyncio.Future | None = None
        self.ready = False
        self.done = False
        self.client: StreamClient | None = None
        self.batch_max = batch_max(FRAME_MAX, self.template.record_size, self.cfg.batch_size)

    @property
    def name(self) -> str:
        return f"{self.cfg.run_id}-{self.kind}-{self.index}"

    def on_confirm(self, publisher_id: int, ids: list[int]) -> None:
        out = self.outstanding
        now = time.time_ns()
        lats = self.stats.confirm_latencies_ns
        n = 0
        for pid in ids:
            ts = out.pop(pid, None)
            if ts is not None:
                n += 1
                lats.append(now - ts)
        self.stats.confirmed += n
        self._wake()

    def on_publish_error(self, publisher_id: int, errors: list[tuple[int, int]]) -> None:
        n = 0
        for pid, _code in errors:
            if self.outstanding.pop(pid, None) is not None:
                n += 1
        self.stats.nacked += n
        self._wake()

    def _wake(self) -> None:
        room = self.room
        if room is not None and not room.done():
            room.set_result(None)

    async def wait_room(self) -> None:
        self.room = self.worker.loop.create_future()
        await asyncio.wait([self.room, self.client.closed, self.worker.stopping],
                           return_when=asyncio.FIRST_COMPLETED)
        self.room = None
        if self.client.closed.done():
            raise self.client.close_error()

    async def run(self) -> None:
        first = await StreamClient.connect(self.endpoint, self.name)
        try:
            leader = await first.leader_of(self.endpoint, self.queue)
        except BaseException:
            first.abort()
            raise
        if (leader.host, leader.port) != (self.endpoint.host, self.endpoint.port):
            await first.close()
            first = await StreamClient.connect(leader, self.name)
        self.client = client = first
        self.batch_max = batch_max(client.frame_max, self.template.record_size, self.cfg.batch_size)
        try:
            client.on_confirm = self.on_confirm
            client.on_publish_error = self.on_publish_error
            await client.request(f.DeclarePublisher(0, 0, "", self.queue))
            self.ready = True
            await asyncio.wait([self.worker.go, self.worker.stopping], return_when=asyncio.FIRST_COMPLETED)
            await self.publish(client)
        finally:
            if self.worker.stopping.done() and not client.closed.done():
                await client.close()
            else:
                client.abort()

    async def publish(self, client: StreamClient) -> None:
        cfg = self.cfg
        stopping = self.worker.publishing_stopped
        stats = self.stats
        out = self.outstanding
        window = cfg.confirm
        rate = cfg.rate
        limit = cfg.pmessages
        t0 = self.worker.t0
        batch_max = self.batch_max
        template = self.template
        while not stopping.done():
            k = batch_max
            if limit:
                k = min(k, limit - self.seq)
                if k <= 0:
                    if out:
                        await self.wait_room()
                        continue
                    if not self.done:
                        self.done = True
                        self.worker.client_done()
                    await asyncio.wait([stopping, client.closed], return_when=asyncio.FIRST_COMPLETED)
                    if client.closed.done() and not stopping.done():
                        raise client.close_error()
                    return
            if rate:
                elapsed = time.monotonic() - t0
                due = int(rate * elapsed) + 1 - self.seq
                if due <= 0:
                    await asyncio.sleep(max((self.seq - rate * elapsed) / rate, RATE_SLEEP_MIN_S))
                    continue
                k = min(k, due)
            room = window - len(out)
            if room <= 0:
                await self.wait_room()
                continue
            k = min(k, room)
            ts = time.time_ns()
            first_pid = self.seq + 1
            client.send(f.encode(f.Publish(0, template.batch(ts, first_pid, self.id_base + self.seq, k))))
            for pid in range(first_pid, first_pid + k):
                out[pid] = ts
            self.seq += k
            stats.sent += k
            if client.writable:
                await asyncio.sleep(0)
            else:
                await client.drain()
        if client.closed.done():
            raise client.close_error()

    def close(self) -> None:
        pass


class StreamConsumer:
    kind = "consumer"
    SUBSCRIPTION = 0

    def __init__(self, worker, index: int):
        self.worker = worker
        self.cfg = worker.cfg
        self.index = index
        self.stats = worker.counters
        self.queue = self.cfg.queue_names()[index % self.cfg.queues]
        self.endpoint = StreamEndpoint.from_uri(self.cfg.uris[index % len(self.cfg.uris)])
        self.received = 0
        self.done = False
        self.client: StreamClient | None = None

    @property
    def name(self) -> str:
        return f"{self.cfg.run_id}-{self.kind}-{self.index}"

    def make_on_deliver(self, client: StreamClient):
        st = self.stats
        lats = st.consumer_latencies_ns
        clock = time.time_ns
        read_header = chunks.read_header
        limit = self.cfg.cmessages
        grant_credit = client.grant_credit
        worker = self.worker

        def on_deliver(sid: int, chunk: memoryview) -> None:
            h = read_header(chunk)
            n = h.num_records
            if limit:
                n = min(n, limit - self.received)
                if n <= 0:
                    return
            self.received += n
            st.received += n
            stamp = first_stamp(chunk, h)
            now = clock()
            if stamp is not None:
                lats.append(now - stamp[0])
            worker.last_delivery_ns = now
            if limit and self.received >= limit:
                if not self.done:
                    self.done = True
                    worker.client_done()
                return  # no more credit: the run is over for this consumer
            grant_credit(sid)

        return on_deliver

    async def run(self) -> None:
        cfg = self.cfg
        self.client = client = await StreamClient.connect(self.endpoint, self.name)
        try:
            client.on_deliver = self.make_on_deliver(client)
            offset_type, offset = offset_spec(cfg.offset)
            await client.request(f.Subscribe(0, self.SUBSCRIPTION, self.queue, offset_type, offset, cfg.credit, {}))
            self.worker.client_ready()
            await asyncio.wait([self.worker.stopping, client.closed], return_when=asyncio.FIRST_COMPLETED)
            if client.closed.done() and not self.worker.stopping.done():
                raise client.close_error()
        finally:
            if self.worker.stopping.done() and not client.closed.done():
                await client.close()
            else:
                client.abort()

    def close(self) -> None:
        pass


__all__ = ["StreamError", "StreamEndpoint", "StreamClient", "StreamProducer", "StreamConsumer",
           "MessageTemplate", "first_stamp", "record_stamps", "offset_spec", "create_arguments",
           "create_streams", "delete_streams", "DEFAULT_URI", "CONFIRM_WINDOW_DEFAULT",
           "BATCH_SIZE_DEFAULT", "CREDIT_DEFAULT", "STAMP"]
