"""A client of RabbitMQ's stream protocol (port 5552), asyncio, over `hutch.streamproto`.

One `StreamClient` is one connection: the handshake (peer properties, SASL PLAIN, tune, open),
requests matched to their responses by correlation id (a response code the caller did not
expect raises `StreamError` with the code by the protocol document's name), and callbacks for
what the server sends unasked: publish confirms and errors, and chunks delivered to a
subscription. On top of it, the commands clients need, each one call: metadata (a stream's
leader), stream statistics, a super stream's partitions, store and query a consumer's offset,
declare a publisher and query its last publishing id, and reading a stream's chunks by offset
range (`read_range`), which is how a reader that knows where it stops (a Spark task) reads.

Chunks are handed over as the server sends them, undecoded (`hutch.streamproto.chunk` reads
them); messages are AMQP 1.0 (`hutch.streamproto.amqp10`). `hutch perf --protocol stream` and
the Spark connector (`hutch.pipeline.connector`) are its users. It talks to a node only through
the protocol, as any client does, and imports no broker code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f

DEFAULT_PORT = 5552
DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
STREAM_SCHEMES = ("rabbitmq-stream", "hutch-stream")
FRAME_MAX = 1048576  # what the client proposes (RabbitMQ's default)
HEARTBEAT_S = 60
REQUEST_TIMEOUT_S = 10.0
METADATA_RETRY_S = 0.1
READ_CREDIT = 8  # chunks a range read keeps in flight
SUBSCRIPTIONS_MAX = 256  # a subscription id is a byte


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
    """Where to connect, parsed from a rabbitmq-stream:// URI (RabbitMQ's stream clients' form) or
    hutch-stream://, the same."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"

    @classmethod
    def from_uri(cls, uri: str, amqp: bool = False) -> StreamEndpoint:
        """rabbitmq-stream:// or hutch-stream://; with `amqp`, an amqp:// URI too, whose node is
        asked on the stream port (5552 unless the URI says `?stream_port=N`), not the AMQP one."""
        parts = urlsplit(uri)
        schemes = STREAM_SCHEMES + (("amqp",) if amqp else ())
        if parts.scheme not in schemes + ("",):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} "
                             f"({', '.join(s + '://' for s in schemes)} only)")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        port = parts.port or DEFAULT_PORT
        if parts.scheme == "amqp":
            query = dict(q.split("=", 1) for q in parts.query.split("&") if "=" in q)
            port = int(query.get("stream_port", DEFAULT_PORT))
        return cls(host=parts.hostname or "127.0.0.1", port=port,
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
        self.subscribers: dict[int, Callable[[int, memoryview], None]] = {}  # deliveries by subscription
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
            handler = self.subscribers.get(cmd.subscription_id, self.on_deliver)
            if handler is not None:
                handler(cmd.subscription_id, cmd.chunk)
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
    async def connect(cls, ep: StreamEndpoint, name: str, timeout_s: float = REQUEST_TIMEOUT_S,
                      product: str = "hutch-perf", network: Any = None) -> StreamClient:
        """Connect (through `network`, a simulated host's, or the running loop) and go through the
        handshake (peer properties, SASL PLAIN, tune, open)."""
        network = network or asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            _, client = await network.create_connection(lambda: cls(name), ep.host, ep.port)
        try:
            await client.request(f.PeerProperties(0, {"product": product, "connection_name": name}))
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


    # -- streams, offsets, publishers

    async def stream_stats(self, stream: str) -> dict[str, int]:
        """osiris's figures for a stream: first_chunk_id, and committed_chunk_id (the first offset
        of the last committed chunk, -1 while there is none)."""
        resp = await self.request(f.StreamStats(0, stream))
        return dict(resp.stats)

    async def partitions(self, super_stream: str) -> list[str] | None:
        """A super stream's partition streams in order, None when there is no such super stream."""
        resp = await self.request(f.Partitions(0, super_stream), ok=(f.OK, f.STREAM_DOES_NOT_EXIST))
        return list(resp.streams) if resp.code == f.OK else None

    def store_offset(self, reference: str, stream: str, offset: int) -> None:
        """Store a consumer's offset under its name (the protocol sends no answer)."""
        self.send(f.encode(f.StoreOffset(reference, stream, offset)))

    async def query_offset(self, reference: str, stream: str) -> int | None:
        """The offset stored under `reference`, None when none is."""
        resp = await self.request(f.QueryOffset(0, reference, stream), ok=(f.OK, f.NO_OFFSET))
        return resp.offset if resp.code == f.OK else None

    async def declare_publisher(self, publisher_id: int, reference: str, stream: str) -> None:
        await self.request(f.DeclarePublisher(0, publisher_id, reference, stream))

    async def delete_publisher(self, publisher_id: int) -> None:
        await self.request(f.DeletePublisher(0, publisher_id))

    async def query_publisher_sequence(self, reference: str, stream: str) -> int:
        """The last publishing id the stream holds from the publisher named `reference` (0: none)."""
        resp = await self.request(f.QueryPublisherSequence(0, reference, stream))
        return resp.sequence

    # -- reading by offset

    def _free_subscription(self) -> int:
        for sid in range(SUBSCRIPTIONS_MAX):
            if sid not in self.subscribers:
                return sid
        raise StreamError(f.SUBSCRIPTION_ID_ALREADY_EXISTS, "no free subscription id on this connection")

    async def chunks_from(self, stream: str, offset_type: int, offset: int | None = None,
                          credit: int = READ_CREDIT, timeout_s: float = REQUEST_TIMEOUT_S
                          ) -> AsyncIterator[memoryview]:
        """The stream's chunks from an offset specification, as delivered (the first one may
        start before the offset asked for), one credit granted back per chunk taken; ends the
        subscription when the caller stops. A chunk that does not come within `timeout_s`
        raises TimeoutError: callers read only what they know the stream holds."""
        sid = self._free_subscription()
        got: asyncio.Queue = asyncio.Queue()
        self.subscribers[sid] = lambda _sid, c: got.put_nowait(c)
        try:
            await self.request(f.Subscribe(0, sid, stream, offset_type, offset, credit, {}))
            while True:
                if got.empty():
                    getter = asyncio.ensure_future(got.get())
                    try:
                        done, _ = await asyncio.wait([getter, self.closed], timeout=timeout_s,
                                                     return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        if not getter.done():
                            getter.cancel()
                    if getter not in done:
                        if self.closed.done():
                            raise self.close_error()
                        raise TimeoutError(f"no chunk of stream '{stream}' within {timeout_s}s")
                    c = getter.result()
                else:
                    c = got.get_nowait()
                self.send(f.encode(f.Credit(sid, 1)))  # now: no read may be under way to carry it
                yield c
        finally:
            self.subscribers.pop(sid, None)
            self.credit_due.pop(sid, None)
            if not self.closed.done():
                with contextlib.suppress(Exception):
                    self.send(f.encode(f.Unsubscribe(0, sid)))  # answer ignored: nobody waits for it

    async def read_range(self, stream: str, start: int, end: int, credit: int = READ_CREDIT,
                         timeout_s: float = REQUEST_TIMEOUT_S) -> AsyncIterator[tuple[chunks.ChunkHeader, memoryview]]:
        """The chunks holding offsets [start, end) (whole chunks: the caller skips the records
        outside the range), with their headers."""
        if start >= end:
            return
        it = self.chunks_from(stream, f.OFFSET_TYPE_OFFSET, start, credit, timeout_s)
        try:
            async for c in it:
                h = chunks.read_header(c)
                if h.next_offset <= start:
                    continue
                yield h, c
                if h.next_offset >= end:
                    return
        finally:
            await it.aclose()

    async def first_chunk(self, stream: str, offset_type: int, offset: int | None = None,
                          timeout_s: float = REQUEST_TIMEOUT_S) -> chunks.ChunkHeader:
        """The header of the first chunk a subscription from this offset specification gets."""
        it = self.chunks_from(stream, offset_type, offset, 1, timeout_s)
        try:
            async for c in it:
                return chunks.read_header(c)
        finally:
            await it.aclose()
        raise AssertionError("unreachable")

    async def end_of(self, stream: str) -> tuple[int, int, int | None]:
        """(first offset, next offset after the last committed record, that record's chunk
        timestamp in ms or None for an empty stream), from the stream statistics and the
        header of the last committed chunk."""
        stats = await self.stream_stats(stream)
        first, committed = stats.get("first_chunk_id", 0), stats.get("committed_chunk_id", -1)
        if committed < 0:
            return first, first, None
        h = await self.first_chunk(stream, f.OFFSET_TYPE_OFFSET, committed)
        return first, max(h.next_offset, first), h.timestamp


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


__all__ = ["StreamError", "StreamEndpoint", "StreamClient", "offset_spec", "create_streams", "delete_streams",
           "CODE_NAMES", "DEFAULT_PORT", "DEFAULT_URI", "FRAME_MAX", "REQUEST_TIMEOUT_S"]
