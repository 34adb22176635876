"""`hutch perf --protocol stream`: producers and consumers on RabbitMQ's stream protocol.

A Python stream client library would be the bottleneck of a throughput test, so this runs on
hutch's own client (`hutch.streamclient`, over the frames codec and the chunk header), shaped
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
import struct
import time

from hutch.streamclient import (
    DEFAULT_URI,
    FRAME_MAX,
    StreamClient,
    StreamEndpoint,
    StreamError,
    create_streams,
    delete_streams,
    offset_spec,
)
from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f

CONFIRM_WINDOW_DEFAULT = 10_000  # stream-perf-test's default of unconfirmed messages per producer
BATCH_SIZE_DEFAULT = 100  # messages per Publish frame
CREDIT_DEFAULT = 10  # chunks a subscription may have in flight
RATE_SLEEP_MIN_S = 0.001
PUBLISHER_SHIFT = 32  # msg_id = producer << 32 | seq, as in the AMQP mode
PUBLISH_FRAME_OVERHEAD = 9  # size, key, version, publisher id, message count
MESSAGE_OVERHEAD = 12  # publishing id, size

STAMP = struct.Struct(">QQ")  # publish time (ns), message id: the first 16 bytes of every body
_stamp_ts = struct.Struct(">Q")


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
