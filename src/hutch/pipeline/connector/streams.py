"""What the Spark connector asks of hutch over the stream protocol, as plain functions: which
streams a name stands for (a stream, or a super stream's partitions), where each begins and ends,
the offsets a starting option means, reading an offset range as Arrow record batches, storing a
consumer's offset, and publishing rows with publishing ids the broker deduplicates by.

Every function connects, does its work and closes (`hutch.streamclient`, each call under
`asyncio.run` or one `asyncio.Runner` per Spark task): the planner's calls are seconds apart and
a Spark worker holds nothing between tasks. Errors come out as `ConnectorError` with the stream,
the node and the protocol's response code named; nothing waits without a timeout.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterator

import pyarrow as pa

from hutch.pipeline.connector.offsets import Partition, resolve_offsets
from hutch.pipeline.connector.options import ConnectorError, Start
from hutch.streamclient import REQUEST_TIMEOUT_S, StreamClient, StreamEndpoint, StreamError
from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f

CLIENT_PRODUCT = "hutch-spark"
ROWS_PER_BATCH = 32_768  # rows of one Arrow record batch a reader yields
PUBLISH_BATCH = 200  # messages per Publish frame
PUBLISH_WINDOW = 20_000  # messages a sink task may have unconfirmed
CONFIRM_TIMEOUT_S = 60.0  # a sink task waiting this long for a confirm fails (Spark retries it)

SCHEMA = pa.schema([
    ("stream", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("routing_key", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
])
SPARK_SCHEMA = ("stream string, partition int, offset long, timestamp timestamp, routing_key string, "
                "properties map<string,string>, body binary")


def _explain(e: BaseException, ep: StreamEndpoint, what: str) -> ConnectorError:
    if isinstance(e, ConnectorError):
        return e
    if isinstance(e, StreamError):
        if e.code == f.AUTHENTICATION_FAILURE or e.code == f.SASL_AUTHENTICATION_FAILURE_LOOPBACK:
            return ConnectorError(f"authentication failed for user '{ep.user}' at {ep}: {e}")
        if e.code == f.VIRTUAL_HOST_ACCESS_FAILURE:
            return ConnectorError(f"user '{ep.user}' may not open virtual host '{ep.vhost}' at {ep}: {e}")
        if e.code == f.STREAM_DOES_NOT_EXIST:
            return ConnectorError(f"{what} does not exist in virtual host '{ep.vhost}' at {ep}")
        return ConnectorError(f"{what} at {ep}: {e}")
    if isinstance(e, TimeoutError):
        return ConnectorError(f"{what} at {ep}: no answer within {REQUEST_TIMEOUT_S:.0f}s")
    return ConnectorError(f"cannot reach hutch's stream port at {ep}: {e}")


async def connect(endpoints: list[StreamEndpoint], name: str) -> tuple[StreamClient, StreamEndpoint]:
    """A connection to the first node that takes one. A refused login is final (every node
    would refuse it); an unreachable node makes the next one be tried."""
    errors = []
    for ep in endpoints:
        try:
            return await StreamClient.connect(ep, name, product=CLIENT_PRODUCT), ep
        except StreamError as e:
            raise _explain(e, ep, "connection") from None
        except (OSError, TimeoutError) as e:
            errors.append(_explain(e, ep, "connection"))
    if len(errors) == 1:
        raise errors[0]
    raise ConnectorError("no node answered: " + "; ".join(str(e) for e in errors))


class Session:
    """One connection for the length of an `async with`, its errors explained."""

    def __init__(self, endpoints: list[StreamEndpoint], name: str):
        self.endpoints = endpoints
        self.name = name
        self.client: StreamClient | None = None
        self.ep = endpoints[0]

    async def __aenter__(self) -> Session:
        self.client, self.ep = await connect(self.endpoints, self.name)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.client is not None:
            await self.client.close()

    async def call(self, what: str, coro):
        try:
            return await coro
        except (StreamError, OSError, TimeoutError) as e:
            raise _explain(e, self.ep, what) from None

    async def resolve(self, name: str) -> list[Partition]:
        """A super stream's partitions, or the stream itself; an error when it is neither."""
        c = self.client
        parts = await self.call(f"super stream '{name}'", c.partitions(name))
        if parts:
            return [Partition(s, i) for i, s in enumerate(parts)]
        await self.call(f"stream '{name}'", c.stream_stats(name))  # raises when there is no such stream
        return [Partition(name, 0)]

    async def bounds(self, stream: str) -> tuple[int, int, int | None]:
        """(first offset, next offset after the last committed one, last chunk's timestamp ms)."""
        return await self.call(f"stream '{stream}'", self.client.end_of(stream))

    async def offset_at(self, stream: str, ts_ms: int) -> int:
        """The first offset of the first chunk written at or after `ts_ms` (the end when none was)."""
        first, end, last_ts = await self.bounds(stream)
        if last_ts is None or ts_ms > last_ts:
            return end
        h = await self.call(f"stream '{stream}'", self.client.first_chunk(stream, f.OFFSET_TYPE_TIMESTAMP, ts_ms))
        return max(first, h.first_offset)


def run(coro):
    """Run one call to hutch from synchronous Spark code."""
    return asyncio.run(coro)


async def describe(endpoints: list[StreamEndpoint], name: str, spec: Start | dict[str, Start] | None = None,
                   option: str = "startingOffsets") -> tuple[list[Partition], dict[str, tuple[int, int]], dict[str, int]]:
    """The partitions of `name`, their (first, end) offsets and the offsets `spec` means."""
    async with Session(endpoints, f"spark-planner-{name}") as s:
        parts = await s.resolve(name)
        bounds, at_ts = {}, {}
        for p in parts:
            first, end, _ts = await s.bounds(p.stream)
            bounds[p.stream] = (first, end)
        starts = {}
        if spec is not None:
            specs = spec.values() if isinstance(spec, dict) else [spec]
            ts = [x.value for x in specs if x.kind == "timestamp"]
            if ts:
                for p in parts:
                    at_ts[p.stream] = await s.offset_at(p.stream, ts[0])
            starts = resolve_offsets(spec, parts, bounds, option, at_ts)
        return parts, bounds, starts


async def ends(endpoints: list[StreamEndpoint], parts: list[Partition]) -> dict[str, int]:
    async with Session(endpoints, "spark-planner") as s:
        return {p.stream: (await s.bounds(p.stream))[1] for p in parts}


async def store_offsets(endpoints: list[StreamEndpoint], consumer: str, offsets: dict[str, int]) -> None:
    """Store, under the consumer's name, the last offset read of each stream (RabbitMQ's meaning:
    a consumer resumes after it)."""
    async with Session(endpoints, f"spark-commit-{consumer}") as s:
        for stream, end in offsets.items():
            if end > 0:
                s.client.store_offset(consumer, stream, end - 1)
        await s.call("stream statistics", s.client.query_offset(consumer, next(iter(offsets))))  # after the stores


# ---------------------------------------------------------------- reading as Arrow


class _Columns:
    def __init__(self, stream: str, index: int):
        self.stream = stream
        self.index = index
        self.clear()

    def clear(self) -> None:
        self.offsets: list[int] = []
        self.ts: list[int] = []
        self.keys: list[str | None] = []
        self.props: list[list[tuple[str, str]]] = []
        self.bodies: list[bytes] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, ts_us: int, record: bytes) -> None:
        body = amqp10.data_only(record)
        if body is not None:  # one data section and nothing else: what stream clients publish
            self.offsets.append(offset)
            self.ts.append(ts_us)
            self.keys.append(None)
            self.props.append([])
            self.bodies.append(body)
            return
        m = amqp10.Message.decode(record)
        ann = m.message_annotations
        app = m.application_properties
        self.offsets.append(offset)
        self.ts.append(ts_us)
        key = ann.get("x-routing-key") if ann else None
        self.keys.append(key if isinstance(key, str) else None)
        self.props.append([(str(k), _text(v)) for k, v in app.items()] if app else [])
        if m.data:
            self.bodies.append(m.body)
        elif m.value is not amqp10.NO_VALUE:
            self.bodies.append(amqp10.encode_value(m.value))
        else:
            self.bodies.append(b"")

    def batch(self) -> pa.RecordBatch:
        n = len(self.offsets)
        b = pa.RecordBatch.from_arrays([
            pa.array([self.stream] * n, pa.string()),
            pa.array([self.index] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.ts, pa.timestamp("us", tz="UTC")),
            pa.array(self.keys, pa.string()),
            pa.array(self.props, pa.map_(pa.string(), pa.string())),
            pa.array(self.bodies, pa.binary()),
        ], schema=SCHEMA)
        self.clear()
        return b


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


async def _read_batches(endpoints: list[StreamEndpoint], stream: str, index: int, start: int, end: int
                        ) -> AsyncIterator[pa.RecordBatch]:
    async with Session(endpoints, f"spark-reader-{stream}") as s:
        cols = _Columns(stream, index)
        it = s.client.read_range(stream, start, end)
        try:
            while True:
                try:
                    h, c = await it.__anext__()
                except StopAsyncIteration:
                    break
                except (StreamError, OSError, TimeoutError) as e:
                    raise _explain(e, s.ep, f"reading stream '{stream}' [{start}, {end})") from None
                ts_us = h.timestamp * 1000
                off = h.first_offset
                for rec in chunks.records(c, h):
                    if start <= off < end:
                        cols.add(off, ts_us, rec)
                    off += 1
                if len(cols) >= ROWS_PER_BATCH:
                    yield cols.batch()
        finally:
            await it.aclose()
        if len(cols):
            yield cols.batch()


def read_arrow(endpoints: list[StreamEndpoint], stream: str, index: int, start: int, end: int
               ) -> Iterator[pa.RecordBatch]:
    """Offsets [start, end) of one stream as Arrow record batches, read on one event loop of this
    task's own: Spark pulls a batch, the loop runs until the next is ready."""
    with asyncio.Runner() as runner:
        agen = _read_batches(endpoints, stream, index, start, end)
        try:
            while True:
                try:
                    yield runner.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            runner.run(agen.aclose())


# ---------------------------------------------------------------- publishing


def message_of(body: bytes, routing_key: str | None, properties: dict[str, str] | None) -> bytes:
    """A row as the AMQP 1.0 message a stream stores: one data section, the routing key as the
    x-routing-key annotation (what an AMQP 0-9-1 publish through the default exchange carries),
    properties as application properties. The annotations of a routing key are encoded once."""
    if properties:
        ann = {amqp10.Symbol("x-exchange"): "", amqp10.Symbol("x-routing-key"): routing_key} if routing_key else None
        return amqp10.Message(body, message_annotations=ann, application_properties=properties).encode()
    n = len(body)
    data = (b"\x00\x53\x75\xa0" + bytes((n,)) if n < 256 else b"\x00\x53\x75\xb0" + n.to_bytes(4, "big"))
    if routing_key:
        return b"".join((_annotations_of(routing_key), data, body))
    return data + body


@functools.lru_cache(maxsize=4096)
def _annotations_of(routing_key: str) -> bytes:
    """The message-annotations section of a row published with `routing_key`."""
    ann = {amqp10.Symbol("x-exchange"): "", amqp10.Symbol("x-routing-key"): routing_key}
    whole = amqp10.Message(b"", message_annotations=ann).encode()
    return whole[:len(whole) - len(amqp10.Message(b"").encode())]


class _Publisher:
    def __init__(self, client: StreamClient, stream: str):
        self.client = client
        self.stream = stream
        self.unconfirmed: set[int] = set()
        self.errors: list[tuple[int, int]] = []
        self.room: asyncio.Event = asyncio.Event()
        client.on_confirm = self.on_confirm
        client.on_publish_error = self.on_error

    def on_confirm(self, _pub: int, ids: list[int]) -> None:
        self.unconfirmed.difference_update(ids)
        self.room.set()

    def on_error(self, _pub: int, errors: list[tuple[int, int]]) -> None:
        for pid, code in errors:
            self.unconfirmed.discard(pid)
            self.errors.append((pid, code))
        self.room.set()

    def check(self) -> None:
        if self.errors:
            pid, code = self.errors[0]
            raise StreamError(code, f"publish refused by stream '{self.stream}' ({len(self.errors)} messages, "
                                    f"the first publishing id {pid})")
        if self.client.closed.done():
            raise self.client.close_error()

    async def wait(self, most: int) -> None:
        """Until at most `most` messages are unconfirmed (0: every one confirmed)."""
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        while len(self.unconfirmed) > most:
            self.check()
            self.room.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.unconfirmed)} messages to stream '{self.stream}' not confirmed "
                                   f"within {CONFIRM_TIMEOUT_S:.0f}s")
            waiter = asyncio.ensure_future(self.room.wait())
            try:
                await asyncio.wait([waiter, self.client.closed], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        self.check()


async def publish(endpoints: list[StreamEndpoint], stream: str, reference: str,
                  messages: Iterator[list[tuple[int, bytes]]]) -> int:
    """Publish every (publishing id, message) of `messages` (lists, one per Arrow batch) to the
    stream's leader under the publisher `reference` ("" for none: no deduplication), and return
    once every one is confirmed (a duplicate the broker drops is confirmed too). Raises on a
    publish error, a lost connection or a confirm that does not come."""
    async with Session(endpoints, f"spark-writer-{reference or stream}") as s:
        first = s.client
        leader = await s.call(f"stream '{stream}'", first.leader_of(s.ep, stream))
        client = first
        if (leader.host, leader.port) != (s.ep.host, s.ep.port):
            try:
                client = await StreamClient.connect(leader, s.name, product=CLIENT_PRODUCT)
            except (OSError, TimeoutError):  # a leader just gone: wait for the stream's next one
                leader = await s.call(f"stream '{stream}'", first.leader_of(s.ep, stream, avoid=(leader.host, leader.port)))
                client = await s.call("stream leader", StreamClient.connect(leader, s.name, product=CLIENT_PRODUCT))
        try:
            await s.call(f"stream '{stream}'", client.declare_publisher(0, reference, stream))
            pub = _Publisher(client, stream)
            n = 0
            for batch in messages:
                for i in range(0, len(batch), PUBLISH_BATCH):
                    part = batch[i:i + PUBLISH_BATCH]
                    if len(pub.unconfirmed) + len(part) > PUBLISH_WINDOW:
                        await s.call(f"stream '{stream}'", pub.wait(PUBLISH_WINDOW - len(part)))
                    pub.check()
                    client.send(f.encode(f.Publish(0, part)))
                    pub.unconfirmed.update(pid for pid, _ in part)
                    n += len(part)
                    if not client.writable:
                        await client.drain()
                await asyncio.sleep(0)
            await s.call(f"stream '{stream}'", pub.wait(0))
            return n
        finally:
            if client is not first:
                await client.close()
