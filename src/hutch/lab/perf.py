"""`hutch perf`: a PerfTest-like load tool for AMQP 0-9-1 brokers (hutch and RabbitMQ alike).

It follows RabbitMQ PerfTest's model and option names: producers publish to queues
through the default exchange at a fixed or unlimited rate, optionally in confirm mode
with a window of in-flight confirms; consumers consume with autoack or manual acks
under a prefetch (qos); every message body starts with the publish time (ns) and the
message id, so the consumer measures publish-to-deliver latency and a recorded history
can tell each message apart. Once a second it prints a progress line:

    id: test-063014-123, time: 20.9s, sent: 1000 msg/s, confirmed: 1000 msg/s, received:
    1000 msg/s, min/median/75th/95th/99th consumer latency: 1201/5200/8012/9100/9900 µs

Clients run in one process or are split over `--processes` worker processes, each with
its own event loop (uvloop), which report counters and latency histograms to the parent
through a pipe ten times a second; the parent prints, decides when to stop, and writes
the `--json-out` summary. With `--record DIR` every client writes what it attempted and
observed through `hutch.pipeline.history.HistoryWriter`, and clients reconnect (over
the `--uri` list, with backoff) and re-consume after failures as a careful application
would, republishing only messages that were never confirmed.

A recorded run ends with a drain (`--drain`, on by default with `--record`), so that the
history can tell a lost message from one nobody read: producers stop publishing and wait
for their outstanding confirms (republishing after a reconnect if they must); once every
producer has settled, consumers read on until every queue is empty and nothing has been
delivered for `DRAIN_QUIET_S`, and each consumer records a `drain` row saying whether the
drain completed or ran out of time (`--drain-timeout`).

With `--protocol stream` the same producers and consumers speak RabbitMQ's stream protocol
instead (`hutch.lab.streamperf`): streams are created with the Create command, producers publish
batches to the stream's leader with a window of unconfirmed messages, consumers subscribe from
`--offset` with `--credit`; progress lines, worker processes and the summary are the same.

It uses a node only through AMQP or the stream protocol, as any client does (never the
broker's insides).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import resource
import signal
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

import click
from pamqp.commands import Basic

from hutch.lab import streamperf
from hutch.lab.client import (
    AMQPError,
    Channel,
    Connection,
    Endpoint,
    ProtocolError,
    Publisher,
    new_event_loop,
)
from hutch.lab.stats import Counters, Histogram

BODY_SIZE_MIN = 16  # 8-byte publish timestamp + 8-byte message id
BATCH_MAX = 100  # messages per write when the rate allows
RATE_SLEEP_MIN_S = 0.001
REPORT_INTERVAL_S = 1.0
COUNTS_INTERVAL_S = 0.1
RECONNECT_DELAY_MIN_S = 0.1
RECONNECT_DELAY_MAX_S = 2.0
STOP_TIMEOUT_S = 15.0
SETTLE_TIMEOUT_S = 15.0  # a stopping producer waits this long for its outstanding confirms
DRAIN_QUIET_S = 1.0  # a drain ends once the queues are empty and nothing arrived for this long
DRAIN_TIMEOUT_S_DEFAULT = 30.0
DRAIN_POLL_S = 0.1
READY_TIMEOUT_S = 60.0
PUBLISHER_SHIFT = 32  # msg_id = publisher << 32 | seq, as hutch.pipeline.history defines it
SEQ_MAX = 2**32 - 1

_stamp = struct.Struct(">QQ")
_stamp_ts = struct.Struct(">Q")


@dataclass
class PerfConfig:
    uris: list[str] = field(default_factory=lambda: ["amqp://guest:guest@127.0.0.1:5672/%2F"])
    producers: int = 1
    consumers: int = 1
    rate: float = 0.0  # msg/s per producer, 0 = unlimited
    consumer_rate: float = 0.0  # msg/s per consumer, 0 = unlimited
    size: int = BODY_SIZE_MIN
    confirm: int = 0  # in-flight confirm window, 0 = no confirms
    qos: int = 0
    autoack: bool = False
    queue: str = "hutch-perf"
    queues: int = 1
    queue_args: dict = field(default_factory=dict)
    pmessages: int = 0
    cmessages: int = 0
    duration_s: float = 0.0
    auto_delete: bool = False
    predeclared: bool = False
    persistent: bool = False
    durable: bool = False
    mandatory: bool = False
    processes: int = 1
    record_dir: str | None = None
    reconnect: bool = False
    heartbeat_s: int = 60
    run_id: str = ""
    quiet: bool = False
    drain: bool | None = None  # None: drain when recording (and there are consumers)
    drain_timeout_s: float = DRAIN_TIMEOUT_S_DEFAULT
    protocol: str = "amqp"  # or "stream": RabbitMQ's stream protocol
    offset: str = "next"  # stream consumers: first, last, next or an offset
    credit: int = streamperf.CREDIT_DEFAULT  # stream consumers: chunks in flight
    batch_size: int = streamperf.BATCH_SIZE_DEFAULT  # stream producers: messages per Publish frame

    def __post_init__(self) -> None:
        if not self.run_id:
            now = datetime.now()
            self.run_id = f"test-{now:%H%M%S}-{now.microsecond // 1000:03d}"

    def validate(self) -> None:
        if self.size < BODY_SIZE_MIN:
            raise ValueError(f"--size must be at least {BODY_SIZE_MIN} bytes (publish time and message id)")
        if self.producers < 0 or self.consumers < 0 or self.producers + self.consumers == 0:
            raise ValueError("need at least one producer or consumer")
        if self.queues < 1:
            raise ValueError("--queues must be at least 1")
        if self.processes < 1:
            raise ValueError("--processes must be at least 1")
        if self.pmessages > SEQ_MAX:
            raise ValueError(f"--pmessages at most {SEQ_MAX}")
        if self.drain_timeout_s <= 0:
            raise ValueError("--drain-timeout must be positive")
        if not self.uris:
            raise ValueError("at least one --uri")
        if self.protocol == "stream":
            self._validate_stream()
            return
        if self.protocol != "amqp":
            raise ValueError(f"--protocol {self.protocol!r}: amqp or stream")
        for uri in self.uris:
            Endpoint.from_uri(uri)

    def _validate_stream(self) -> None:
        for uri in self.uris:
            streamperf.StreamEndpoint.from_uri(uri)
        if self.recording or self.drain:
            raise ValueError("--record and --drain are for --protocol amqp")
        if self.autoack or self.qos or self.mandatory or self.persistent:
            raise ValueError("--autoack, --qos, --mandatory and --persistent are for --protocol amqp "
                             "(stream messages are always stored and confirmed)")
        if self.consumer_rate:
            raise ValueError("--consumer-rate is for --protocol amqp")
        streamperf.offset_spec(self.offset)
        if not 1 <= self.credit <= 0xFFFF:
            raise ValueError("--credit must be 1..65535")
        if self.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        if self.confirm < 0:
            raise ValueError("--confirm must not be negative")
        if self.confirm == 0:  # every stream publish is confirmed: the window bounds what is in flight
            self.confirm = streamperf.CONFIRM_WINDOW_DEFAULT

    def queue_names(self) -> list[str]:
        """`--queue perf-%d --queues 3` gives perf-1, perf-2, perf-3 (PerfTest's queue pattern)."""
        if "%d" in self.queue:
            return [self.queue % i for i in range(1, self.queues + 1)]
        if self.queues == 1:
            return [self.queue]
        return [f"{self.queue}-{i}" for i in range(1, self.queues + 1)]

    @property
    def recording(self) -> bool:
        return self.record_dir is not None

    @property
    def draining(self) -> bool:
        """Whether the run ends with a drain: producers settle, consumers read the queues empty."""
        wanted = self.recording if self.drain is None else self.drain
        return bool(wanted and self.consumers and not self.cmessages and not self.autoack
                    and self.protocol == "amqp")


def client_node(uri: str) -> str:
    return str(Endpoint.from_uri(uri))


# -- clients --------------------------------------------------------------------------------


class Client:
    """What producers and consumers share: a connection that comes back when allowed to."""

    kind = "client"

    def __init__(self, worker: Worker, index: int):
        self.worker = worker
        self.cfg = worker.cfg
        self.index = index
        self.stats = worker.counters
        self.queue = self.cfg.queue_names()[index % self.cfg.queues]
        self.uri_index = index % len(self.cfg.uris)
        self.node = client_node(self.cfg.uris[self.uri_index])
        self.history = None
        self.done = False
        self.connection: Connection | None = None
        if self.cfg.recording:
            from hutch.pipeline.history import HistoryWriter

            self.history = HistoryWriter(self.cfg.record_dir, self.cfg.run_id,
                                         f"{self.kind}-{index}", self.node)

    @property
    def name(self) -> str:
        return f"{self.cfg.run_id}-{self.kind}-{self.index}"

    async def connect(self, first: bool) -> Connection | None:
        """Connect to this client's URI; with reconnect on, try them all in turn with backoff.

        None when the run stopped before a connection could be made.
        """
        uris = self.cfg.uris
        if not self.cfg.reconnect:
            conn = await Connection.connect(uris[self.uri_index], heartbeat_s=self.cfg.heartbeat_s,
                                            client_name=self.name)
            self.connection = conn
            return conn
        delay_s = RECONNECT_DELAY_MIN_S
        attempt = 0
        while True:
            i = (self.uri_index + attempt) % len(uris)
            try:
                conn = await Connection.connect(uris[i], heartbeat_s=self.cfg.heartbeat_s,
                                                client_name=self.name, timeout_s=5.0)
            except (TimeoutError, OSError, AMQPError, ProtocolError):
                attempt += 1
                if attempt % len(uris) == 0:
                    if await self.worker.stopped_within(delay_s):
                        return None
                    delay_s = min(delay_s * 2, RECONNECT_DELAY_MAX_S)
                continue
            node = client_node(uris[i])
            if self.history is not None:
                if node != self.node:
                    self.history.flush()  # the rows so far were recorded on the old node
                    self.history.node = node
                if not first:
                    self.history.record("reconnect", self.queue, detail=node)
            self.node = node
            self.connection = conn
            return conn

    def record_disconnect(self, exc: BaseException) -> None:
        if self.history is not None:
            self.history.record("disconnect", self.queue, detail=f"{self.node}: {exc}"[:500])

    async def run(self) -> None:
        first = True
        while not self.worker.stopping.done():
            conn = await self.connect(first)
            if conn is None:
                return
            first = False
            try:
                await self.session(conn)
                return
            except (TimeoutError, AMQPError, OSError, ProtocolError) as e:
                if self.worker.stopping.done():
                    return
                if not self.cfg.reconnect:
                    raise
                self.record_disconnect(e)
                conn.abort()
            finally:
                if self.worker.stopping.done():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout_s=5.0)

    async def session(self, conn: Connection) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.history is not None:
            self.history.close()


class Producer(Client):
    kind = "producer"

    def __init__(self, worker: Worker, index: int):
        super().__init__(worker, index)
        self.id_base = index << PUBLISHER_SHIFT
        self.seq = 0  # messages published for the first time (ids id_base .. id_base+seq-1)
        self.outstanding: dict[int, tuple[int, int]] = {}  # confirm seq -> (publish ns, msg_id)
        self.floor = 0  # every confirm seq <= floor is settled
        self.resend: list[int] = []  # msg_ids to republish after a reconnect
        self.room: asyncio.Future | None = None
        self.ready = False

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        out = self.outstanding
        st = self.stats
        now = time.time_ns()
        lats = st.confirm_latencies_ns
        history = self.history
        settled = 0
        if multiple:
            for s in range(self.floor + 1, tag + 1):
                e = out.pop(s, None)
                if e is not None:
                    settled += 1
                    lats.append(now - e[0])
                    if history is not None:
                        history.record("confirm" if ack else "nack", self.queue, e[1], ts_ns=now)
            if tag > self.floor:
                self.floor = tag
        else:
            e = out.pop(tag, None)
            if e is not None:
                settled = 1
                lats.append(now - e[0])
                if history is not None:
                    history.record("confirm" if ack else "nack", self.queue, e[1], ts_ns=now)
        if ack:
            st.confirmed += settled
        else:
            st.nacked += settled
        room = self.room
        if room is not None and not room.done():
            room.set_result(None)

    def on_return(self, reply_code: int, reply_text: str, body: bytes) -> None:
        self.stats.returned += 1
        if self.history is not None:
            msg_id = _stamp.unpack_from(body)[1]
            self.history.record("return", self.queue, msg_id, detail=f"{reply_code} {reply_text}")

    async def wait_room(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        self.room = loop.create_future()
        await asyncio.wait([self.room, conn.closed, self.worker.stopping], return_when=asyncio.FIRST_COMPLETED)
        self.room = None
        if conn.closed.done():
            raise conn._close_error()

    async def session(self, conn: Connection) -> None:
        cfg = self.cfg
        ch: Channel = await conn.channel()
        if cfg.confirm:
            await ch.confirm_select()
            ch.on_confirm = self.on_confirm
        ch.on_return = self.on_return
        props = Basic.Properties(delivery_mode=2) if cfg.persistent else None
        pub = Publisher(ch, "", self.queue, cfg.size, props, mandatory=cfg.mandatory)
        # unconfirmed messages of a lost connection are republished first, with their ids
        if self.outstanding:
            self.resend.extend(msg_id for _, msg_id in sorted(self.outstanding.values(), key=lambda e: e[1]))
            self.outstanding.clear()
        self.floor = 0
        if not self.ready:
            self.ready = True
            await self.worker.go
        await self.publish_loop(conn, ch, pub)

    async def publish_loop(self, conn: Connection, ch: Channel, pub: Publisher) -> None:
        await self.publish(conn, ch, pub)
        if self.cfg.draining:
            await self.settle(conn)

    async def settle(self, conn: Connection) -> None:
        """After the last publish: wait (bounded) until every outstanding publish is confirmed
        or nacked, so that the history knows what became of each."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.outstanding and not self.worker.stopping.done():
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return
            try:
                async with asyncio.timeout(remaining_s):
                    await self.wait_room(conn)
            except TimeoutError:
                return

    async def publish(self, conn: Connection, ch: Channel, pub: Publisher) -> None:
        cfg = self.cfg
        stopping = self.worker.publishing_stopped
        stats = self.stats
        history = self.history
        queue = self.queue
        out = self.outstanding
        window = cfg.confirm
        rate = cfg.rate
        limit = cfg.pmessages
        t0 = self.worker.t0
        draining = cfg.draining
        # a draining producer still republishes what a reconnect left unconfirmed
        while not stopping.done() or (draining and self.resend and not self.worker.stopping.done()):
            if self.resend:
                ids = self.resend[:BATCH_MAX]
                if window and len(out) + len(ids) > window:
                    await self.wait_room(conn)
                    continue
                del self.resend[:BATCH_MAX]
                ts = time.time_ns()
                last = ch.publish_frames(pub.batch_stamped_ids(ts, ids), len(ids))
                first_seq = last - len(ids) + 1
                for j, msg_id in enumerate(ids):
                    if window:
                        out[first_seq + j] = (ts, msg_id)
                    if history is not None:
                        history.record("publish", queue, msg_id, ts_ns=ts, detail="republish")
                stats.sent += len(ids)
                await conn.drain()
                continue
            k = BATCH_MAX
            if limit:
                k = limit - self.seq
                if k <= 0:
                    if window and out:
                        await self.wait_room(conn)
                        continue
                    if not self.done:
                        self.done = True
                        self.worker.client_done()
                    await asyncio.wait([stopping, conn.closed], return_when=asyncio.FIRST_COMPLETED)
                    if conn.closed.done() and not stopping.done():
                        raise conn._close_error()
                    return
                k = min(k, BATCH_MAX)
            if rate:
                elapsed = time.monotonic() - t0
                due = int(rate * elapsed) + 1 - self.seq
                if due <= 0:
                    # timers are millisecond-grained (libuv): sleep at least 1 ms and send
                    # what fell due meanwhile in one batch, rather than spin
                    await asyncio.sleep(max((self.seq - rate * elapsed) / rate, RATE_SLEEP_MIN_S))
                    continue
                k = min(k, due)
            if window:
                room = window - len(out)
                if room <= 0:
                    await self.wait_room(conn)
                    continue
                k = min(k, room)
            ts = time.time_ns()
            first_id = self.id_base + self.seq
            last = ch.publish_frames(pub.batch_stamped(k, ts, first_id), k)
            if window:
                first_seq = last - k + 1
                for j in range(k):
                    out[first_seq + j] = (ts, first_id + j)
            if history is not None:
                for j in range(k):
                    history.record("publish", queue, first_id + j, ts_ns=ts)
            self.seq += k
            stats.sent += k
            if conn.writable:
                await asyncio.sleep(0)
            else:
                await conn.drain()


class Consumer(Client):
    kind = "consumer"

    def __init__(self, worker: Worker, index: int):
        super().__init__(worker, index)
        self.received = 0
        self.paused = False  # reading paused to hold --consumer-rate
        self.cancelled: asyncio.Future | None = None

    def make_on_message(self, ch: Channel):
        cfg = self.cfg
        st = self.stats
        lats = st.consumer_latencies_ns
        unpack_ts = _stamp_ts.unpack_from
        clock = time.time_ns
        ack_upto = ch.ack_upto
        if not cfg.recording and not cfg.cmessages and not cfg.consumer_rate:
            if cfg.autoack:
                def on_message(tag: int, redelivered: bool, body: bytes) -> None:
                    st.received += 1
                    lats.append(clock() - unpack_ts(body)[0])
            else:
                def on_message(tag: int, redelivered: bool, body: bytes) -> None:
                    st.received += 1
                    lats.append(clock() - unpack_ts(body)[0])
                    ack_upto(tag)
            return on_message

        history = self.history
        queue = self.queue
        unpack = _stamp.unpack_from
        autoack = cfg.autoack
        limit = cfg.cmessages
        rate = cfg.consumer_rate
        conn = ch.connection
        worker = self.worker  # its t0 is set at "go", after this consumer started

        def on_message(tag: int, redelivered: bool, body: bytes) -> None:
            if limit and self.received >= limit:
                return  # past the limit: leave it unacked, the broker requeues it on close
            now = clock()
            ts, msg_id = unpack(body)
            st.received += 1
            self.received += 1
            worker.last_delivery_ns = now
            lats.append(now - ts)
            if history is not None:
                history.record("deliver", queue, msg_id, redelivered, ts_ns=now)
            if not autoack:
                ack_upto(tag)
                if history is not None:
                    history.record("ack", queue, msg_id, ts_ns=now)
            if limit and self.received >= limit and not self.done:
                self.done = True
                conn.pause_reading()  # take no more: what is in flight is requeued on close
                self.worker.client_done()
            if rate and not self.paused:
                ahead_s = self.received / rate - (time.monotonic() - worker.t0)
                if ahead_s > RATE_SLEEP_MIN_S:
                    self.paused = True
                    conn.pause_reading()
                    asyncio.get_running_loop().call_later(ahead_s, self.resume, conn)

        return on_message

    def resume(self, conn: Connection) -> None:
        self.paused = False
        conn.resume_reading()

    def record_drain(self, complete: bool, why: str) -> None:
        if self.history is not None:
            from hutch.pipeline.history import drain_detail

            self.history.record("drain", self.queue, detail=drain_detail(complete, why))

    def on_cancel(self, consumer_tag: str) -> None:
        if self.history is not None:
            self.history.record("cancel", self.queue, detail=f"broker cancelled {consumer_tag}")
        if self.cancelled is not None and not self.cancelled.done():
            self.cancelled.set_result(None)

    async def session(self, conn: Connection) -> None:
        cfg = self.cfg
        ch: Channel = await conn.channel()
        if cfg.qos:
            await ch.qos(cfg.qos)
        self.cancelled = asyncio.get_running_loop().create_future()
        ch.on_cancel = self.on_cancel
        await ch.consume(self.queue, self.make_on_message(ch), no_ack=cfg.autoack)
        self.worker.client_ready()
        await asyncio.wait([self.worker.stopping, conn.closed, self.cancelled],
                           return_when=asyncio.FIRST_COMPLETED)
        if self.worker.stopping.done():
            return
        if conn.closed.done():
            raise conn._close_error()
        raise AMQPError(0, f"consumer on {self.queue} cancelled by the broker")


# -- a worker: some producers and consumers on one event loop ------------------------------------


class Worker:
    """Runs its share of the clients and reports to the coordinator through `send`."""

    def __init__(self, cfg: PerfConfig, wid: int, producer_ids: list[int], consumer_ids: list[int], send):
        self.cfg = cfg
        self.wid = wid
        self.producer_ids = producer_ids
        self.consumer_ids = consumer_ids
        self.send = send
        self.counters = Counters()
        self.t0 = 0.0
        self.cpu0_s = _cpu_seconds()
        self.loop = asyncio.get_running_loop()
        self.stopping: asyncio.Future = self.loop.create_future()
        self.publishing_stopped: asyncio.Future = self.loop.create_future()
        self.drain_requested: asyncio.Future = self.loop.create_future()
        self.last_delivery_ns = 0
        self.go: asyncio.Future = self.loop.create_future()
        self.clients: list[Client] = []
        self.done_count = 0
        self._ready = 0

    async def stopped_within(self, timeout_s: float) -> bool:
        await asyncio.wait([self.stopping], timeout=timeout_s)
        return self.stopping.done()

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.cpu0_s = _cpu_seconds()
        if not self.go.done():
            self.go.set_result(None)

    def stop_publishing(self) -> None:
        """First step of a drained stop: producers stop, settle, and the worker reports `settled`."""
        if not self.publishing_stopped.done():
            self.publishing_stopped.set_result(None)

    def stop(self) -> None:
        """Stop; a draining worker with consumers first reads its queues empty (a second call
        stops at once)."""
        self.stop_publishing()
        if self.cfg.draining and self.consumer_ids and not self.drain_requested.done() and not self.stopping.done():
            self.drain_requested.set_result(None)
            return
        if not self.stopping.done():
            self.stopping.set_result(None)

    def client_ready(self) -> None:
        self._ready += 1
        self._check_ready()

    def _check_ready(self) -> None:
        producers_ready = all(c.ready for c in self.clients if c.kind == "producer")
        if self._ready == len(self.consumer_ids) and producers_ready and not self.go.done():
            self.send(("ready", self.wid))

    def client_done(self) -> None:
        self.done_count += 1
        self.send(("counts", self.wid, self.counters.counts(), self.done_count))

    async def run(self) -> None:
        if self.cfg.protocol == "stream":
            producer, consumer = streamperf.StreamProducer, streamperf.StreamConsumer
        else:
            producer, consumer = Producer, Consumer
        self.clients = ([consumer(self, j) for j in self.consumer_ids]
                        + [producer(self, i) for i in self.producer_ids])
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = {c: tg.create_task(c.run()) for c in self.clients}
                tg.create_task(self._await_producers_ready())
                tg.create_task(self._report())
                if self.cfg.draining:
                    tg.create_task(self._report_settled([t for c, t in tasks.items() if c.kind == "producer"]))
                    if self.consumer_ids:
                        tg.create_task(self._drain())
        finally:
            for c in self.clients:
                c.close()
        c_hist, p_hist = self.counters.take_latencies()
        self.send(("final", self.wid, self.counters.counts(), self.done_count, _cpu_seconds() - self.cpu0_s,
                   c_hist, p_hist))

    async def _report_settled(self, producer_tasks: list[asyncio.Task]) -> None:
        await asyncio.wait([self.publishing_stopped, self.stopping], return_when=asyncio.FIRST_COMPLETED)
        if producer_tasks:
            await asyncio.wait(producer_tasks)
        self.send(("settled", self.wid))

    async def _drain(self) -> None:
        """Read this worker's queues empty: done when each is empty (a passive declare says so)
        and nothing was delivered for DRAIN_QUIET_S; then every consumer records how it ended."""
        await asyncio.wait([self.drain_requested, self.stopping], return_when=asyncio.FIRST_COMPLETED)
        if self.stopping.done():
            return
        consumers = [c for c in self.clients if isinstance(c, Consumer)]
        queues = sorted({c.queue for c in consumers})
        timeout_s = self.cfg.drain_timeout_s
        deadline = time.monotonic() + timeout_s
        probe = _DepthProbe(self.cfg)
        complete, why = False, ""
        try:
            while not self.stopping.done():
                if time.monotonic() >= deadline:
                    why = f"not drained after {timeout_s:g} s: {why or 'deliveries went on'}"
                    break
                if time.time_ns() - self.last_delivery_ns >= DRAIN_QUIET_S * 1e9:
                    depths = await probe.depths(queues)
                    if depths is None:
                        why = "queue depths unknown (no node answered)"
                    elif all(d == 0 for d in depths.values()):
                        complete, why = True, ""
                        break
                    else:
                        why = "messages left: " + ", ".join(f"{q}={d}" for q, d in depths.items())
                await asyncio.wait([self.stopping], timeout=DRAIN_POLL_S)
            else:
                why = "stopped before the queues were empty"
        finally:
            await probe.close()
        for c in consumers:
            c.record_drain(complete, why)
        if not self.stopping.done():
            self.stopping.set_result(None)

    async def _await_producers_ready(self) -> None:
        while not self.go.done() and not self.stopping.done():
            self._check_ready()
            await asyncio.wait([self.go, self.stopping], timeout=0.05)

    async def _report(self) -> None:
        await asyncio.wait([self.go, self.stopping], return_when=asyncio.FIRST_COMPLETED)
        rounds = 0
        ticks = 0
        while not self.stopping.done():
            ticks += 1
            next_t = self.t0 + ticks * COUNTS_INTERVAL_S
            delay = next_t - time.monotonic()
            if delay > 0:
                await asyncio.wait([self.stopping], timeout=delay)
                if self.stopping.done():
                    break
            t = time.monotonic()
            if ticks % round(REPORT_INTERVAL_S / COUNTS_INTERVAL_S) == 0:
                rounds += 1
                c_hist, p_hist = self.counters.take_latencies()
                self.send(("report", self.wid, rounds, t, self.counters.counts(), c_hist, p_hist,
                           self.done_count))
            else:
                self.send(("counts", self.wid, self.counters.counts(), self.done_count))


class _DepthProbe:
    """Queue depths (ready messages) by passive queue.declare on a connection of its own,
    trying the run's URIs in turn."""

    def __init__(self, cfg: PerfConfig):
        self.cfg = cfg
        self.conn: Connection | None = None
        self.ch: Channel | None = None
        self.attempt = 0

    async def depths(self, queues: list[str]) -> dict[str, int] | None:
        try:
            if self.conn is None or self.conn.closed.done():
                uri = self.cfg.uris[self.attempt % len(self.cfg.uris)]
                self.attempt += 1
                self.conn = await Connection.connect(uri, heartbeat_s=self.cfg.heartbeat_s,
                                                     client_name=f"{self.cfg.run_id}-drain", timeout_s=5.0)
                self.ch = await self.conn.channel()
            out = {}
            for q in queues:
                async with asyncio.timeout(5.0):
                    _, ready, _ = await self.ch.declare_queue(q, passive=True)
                out[q] = ready
            return out
        except (TimeoutError, OSError, AMQPError, ProtocolError):
            await self.close()
            return None

    async def close(self) -> None:
        conn, self.conn, self.ch = self.conn, None, None
        if conn is not None:
            if conn.closed.done():
                conn.abort()
                return
            with contextlib.suppress(Exception):
                await conn.close(timeout_s=5.0)


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# -- the coordinator: progress lines, when to stop, the summary -------------------------------------


@dataclass
class Coordinator:
    cfg: PerfConfig
    workers: int
    echo: object = print
    t0: float = 0.0
    ready: set = field(default_factory=set)
    settled: set = field(default_factory=set)  # workers whose producers settled after stop_publishing
    counts: dict = field(default_factory=dict)  # wid -> cumulative counts
    done: dict = field(default_factory=dict)  # wid -> clients done
    rounds: dict = field(default_factory=dict)  # round -> {wid: (t, counts, c_hist, p_hist)}
    last_round: dict = field(default_factory=dict)  # wid -> (t, counts) of the last printed round
    printed: int = 0
    finals: dict = field(default_factory=dict)  # wid -> (counts, cpu_s)
    errors: list = field(default_factory=list)
    consumer_hist: Histogram = field(default_factory=Histogram)
    confirm_hist: Histogram = field(default_factory=Histogram)
    samples: list = field(default_factory=list)
    stopped_at: float = 0.0

    def on_message(self, msg) -> None:
        kind, wid = msg[0], msg[1]
        if kind == "ready":
            self.ready.add(wid)
        elif kind == "settled":
            self.settled.add(wid)
        elif kind == "counts":
            self.counts[wid] = msg[2]
            self.done[wid] = msg[3]
        elif kind == "report":
            _, _, rnd, t, counts, c_hist, p_hist, done = msg
            self.counts[wid] = counts
            self.done[wid] = done
            self.consumer_hist.merge(c_hist)
            self.confirm_hist.merge(p_hist)
            self.rounds.setdefault(rnd, {})[wid] = (t, counts, c_hist, p_hist)
            self._print_complete_rounds()
        elif kind == "final":
            _, _, counts, done, cpu_s, c_hist, p_hist = msg
            self.consumer_hist.merge(c_hist)
            self.confirm_hist.merge(p_hist)
            self.counts[wid] = counts
            self.done[wid] = done
            self.finals[wid] = (counts, cpu_s)
        elif kind == "error":
            self.errors.append(msg[2])

    def total(self, name: str) -> int:
        return sum(c.get(name, 0) for c in self.counts.values())

    def _print_complete_rounds(self) -> None:
        while len(self.rounds.get(self.printed + 1, {})) == self.workers:
            rnd = self.printed + 1
            per_worker = self.rounds.pop(rnd)
            rates = dict.fromkeys(("sent", "confirmed", "nacked", "returned", "received"), 0.0)
            c_hist, p_hist = Histogram(), Histogram()
            t_max = 0.0
            for wid, (t, counts, ch, ph) in per_worker.items():
                prev_t, prev = self.last_round.get(wid, (self.t0, {}))
                dt = max(t - prev_t, 1e-6)
                for k in rates:
                    rates[k] += (counts.get(k, 0) - prev.get(k, 0)) / dt
                c_hist.merge(ch)
                p_hist.merge(ph)
                self.last_round[wid] = (t, counts)
                t_max = max(t_max, t)
            self.printed = rnd
            sample = {"time_s": round(t_max - self.t0, 3), **{k: round(v, 1) for k, v in rates.items()},
                      "consumer_latency_us": c_hist.summary(), "confirm_latency_us": p_hist.summary()}
            self.samples.append(sample)
            if not self.cfg.quiet:
                self.echo(self.progress_line(sample))

    def progress_line(self, s: dict) -> str:
        parts = [f"id: {self.cfg.run_id}", f"time: {s['time_s']:.1f}s", f"sent: {s['sent']:.0f} msg/s"]
        if self.cfg.confirm:
            parts.append(f"confirmed: {s['confirmed']:.0f} msg/s")
            if s["nacked"]:
                parts.append(f"nacked: {s['nacked']:.0f} msg/s")
        if s["returned"]:
            parts.append(f"returned: {s['returned']:.0f} msg/s")
        parts.append(f"received: {s['received']:.0f} msg/s")
        line = ", ".join(parts)
        if self.cfg.confirm and s["confirm_latency_us"]["p50"] is not None:
            line += ", min/median/75th/95th/99th confirm latency: " + _lat(s["confirm_latency_us"]) + " µs"
        if s["consumer_latency_us"]["p50"] is not None:
            line += ", min/median/75th/95th/99th consumer latency: " + _lat(s["consumer_latency_us"]) + " µs"
        return line

    def should_stop(self, now: float) -> bool:
        cfg = self.cfg
        if self.errors:
            return True
        if cfg.duration_s and now - self.t0 >= cfg.duration_s:
            return True
        if not (cfg.pmessages or cfg.cmessages):
            return False
        done = sum(self.done.values())  # producers past --pmessages + consumers past --cmessages
        if cfg.cmessages:
            return done >= (cfg.producers if cfg.pmessages else 0) + cfg.consumers
        if done < cfg.producers:
            return False
        if cfg.consumers == 0:
            return True
        # --pmessages alone: stop once every published message has arrived (every queue
        # needs a consumer for that; otherwise --duration ends the run)
        return self.total("received") >= cfg.producers * cfg.pmessages

    def summary(self) -> dict:
        elapsed = max(self.stopped_at - self.t0, 1e-6)
        totals = {k: self.total(k) for k in ("sent", "confirmed", "nacked", "returned", "received")}
        cpu_s = sum(cpu for _, cpu in self.finals.values())
        return {
            "id": self.cfg.run_id,
            "config": asdict(self.cfg),
            "duration_s": round(elapsed, 3),
            **totals,
            "sent_rate": round(totals["sent"] / elapsed, 1),
            "confirmed_rate": round(totals["confirmed"] / elapsed, 1),
            "received_rate": round(totals["received"] / elapsed, 1),
            "consumer_latency_us": self.consumer_hist.summary(),
            "confirm_latency_us": self.confirm_hist.summary(),
            "client_cpu_s": round(cpu_s, 3),
            "client_cpu_us_per_msg": round(cpu_s * 1e6 / max(totals["sent"] + totals["received"], 1), 3),
            "samples": self.samples,
            "errors": self.errors,
        }

    def summary_line(self, s: dict) -> str:
        line = (f"id: {s['id']}, sending rate avg: {s['sent_rate']:.0f} msg/s")
        if self.cfg.confirm:
            line += f", confirmed rate avg: {s['confirmed_rate']:.0f} msg/s"
        line += f", receiving rate avg: {s['received_rate']:.0f} msg/s"
        if s["consumer_latency_us"]["p50"] is not None:
            line += ", min/median/75th/95th/99th consumer latency: " + _lat(s["consumer_latency_us"]) + " µs"
        return line


def _lat(h: dict) -> str:
    return "/".join(str(h[k]) for k in ("min", "p50", "p75", "p95", "p99"))


def split_clients(cfg: PerfConfig) -> list[tuple[list[int], list[int]]]:
    """Producers and consumers dealt round-robin over the worker processes (empty workers dropped)."""
    n = cfg.processes
    shares = [([i for i in range(cfg.producers) if i % n == w],
               [j for j in range(cfg.consumers) if (j + cfg.producers) % n == w]) for w in range(n)]
    return [s for s in shares if s[0] or s[1]]


async def declare_queues(cfg: PerfConfig) -> None:
    if cfg.protocol == "stream":
        await streamperf.create_streams(cfg.uris[0], cfg.queue_names(), streamperf.create_arguments(cfg.queue_args),
                                        f"{cfg.run_id}-setup")
        return
    conn = await Connection.connect(cfg.uris[0], heartbeat_s=cfg.heartbeat_s, client_name=f"{cfg.run_id}-setup")
    try:
        ch = await conn.channel()
        for q in cfg.queue_names():
            await ch.declare_queue(q, durable=cfg.durable, auto_delete=cfg.auto_delete,
                                   arguments=cfg.queue_args or None)
    finally:
        await conn.close()


# -- drivers ------------------------------------------------------------------------------------------


def run_perf(cfg: PerfConfig, echo=print) -> dict:
    """Run a load test to its end and return the summary (what --json-out writes)."""
    cfg.validate()
    if cfg.record_dir:
        cfg.reconnect = True
    if not cfg.predeclared:
        _run_loop(declare_queues(cfg))
    shares = split_clients(cfg)
    if cfg.processes == 1:
        return _run_loop(_run_in_process(cfg, shares[0], echo))
    return _run_processes(cfg, shares, echo)


def _run_loop(coro):
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


async def _run_in_process(cfg: PerfConfig, share, echo) -> dict:
    coord = Coordinator(cfg, 1, echo)
    worker = Worker(cfg, 0, share[0], share[1], coord.on_message)
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while 0 not in coord.ready:
                if task.done():
                    await task  # raises what went wrong
                await asyncio.wait([task], timeout=0.02)
        coord.t0 = time.monotonic()
        worker.start(coord.t0)
        try:
            while not coord.should_stop(time.monotonic()) and not task.done():
                await asyncio.wait([task], timeout=0.02)
        except asyncio.CancelledError:  # Ctrl-C: stop the clients and report what was done
            asyncio.current_task().uncancel()
    finally:
        coord.stopped_at = time.monotonic()
        if cfg.draining and worker.go.done() and not task.done():
            worker.stop_publishing()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SETTLE_TIMEOUT_S + STOP_TIMEOUT_S):
                    while 0 not in coord.settled and not task.done():
                        await asyncio.wait([task], timeout=0.02)
        worker.stop()
        async with asyncio.timeout(stop_timeout_s(cfg)):
            await task
    return _finish(coord, echo)


def stop_timeout_s(cfg: PerfConfig) -> float:
    """How long stopped workers may take to finish (a drain included)."""
    return STOP_TIMEOUT_S + (cfg.drain_timeout_s if cfg.draining else 0.0)


def _finish(coord: Coordinator, echo) -> dict:
    s = coord.summary()
    if not coord.cfg.quiet:
        echo(coord.summary_line(s))
    return s


def _worker_main(cfg: PerfConfig, wid: int, producer_ids, consumer_ids, pipe) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop

    async def main():
        worker = Worker(cfg, wid, producer_ids, consumer_ids, pipe.send)
        loop = asyncio.get_running_loop()

        def on_command():
            try:
                cmd = pipe.recv()
            except EOFError:
                worker.stop()
                loop.remove_reader(pipe.fileno())
                return
            if cmd[0] == "go":
                worker.start(cmd[1])
            elif cmd[0] == "stop_publishing":
                worker.stop_publishing()
            elif cmd[0] == "stop":
                worker.stop()

        loop.add_reader(pipe.fileno(), on_command)
        await worker.run()

    try:
        _run_loop(main())
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        with contextlib.suppress(Exception):
            pipe.send(("error", wid, f"worker {wid}: {_describe(e)}"))
        raise SystemExit(1) from None


def _describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


def _run_processes(cfg: PerfConfig, shares, echo) -> dict:
    ctx = multiprocessing.get_context("spawn")
    coord = Coordinator(cfg, len(shares), echo)
    pipes, procs = [], []
    wids: dict[int, int] = {}  # id(pipe) -> worker id
    try:
        for wid, (p_ids, c_ids) in enumerate(shares):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(cfg, wid, p_ids, c_ids, child_end), daemon=True)
            proc.start()
            child_end.close()
            pipes.append(parent_end)
            wids[id(parent_end)] = wid
            procs.append(proc)

        def pump(timeout_s: float) -> None:
            for p in multiprocessing.connection.wait(pipes, timeout_s):
                try:
                    coord.on_message(p.recv())
                except EOFError:
                    pipes.remove(p)
                    wid = wids[id(p)]
                    if wid not in coord.finals and not coord.errors:
                        coord.errors.append(f"worker {wid} exited before its final report "
                                            f"(exit code {procs[wid].exitcode})")

        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(coord.ready) < len(shares):
            if coord.errors:
                raise click.ClickException("; ".join(coord.errors))
            if time.monotonic() > deadline:
                raise click.ClickException("workers not ready: could not connect and consume in time")
            pump(0.05)
        coord.t0 = time.monotonic()
        for p in pipes:
            p.send(("go", coord.t0))
        try:
            while not coord.should_stop(time.monotonic()) and pipes:
                pump(0.02)
        except KeyboardInterrupt:
            pass
        coord.stopped_at = time.monotonic()
        if cfg.draining and not coord.errors:
            # every producer settles before any consumer starts its drain
            for p in pipes:
                with contextlib.suppress(OSError):
                    p.send(("stop_publishing",))
            deadline = time.monotonic() + SETTLE_TIMEOUT_S + STOP_TIMEOUT_S
            while len(coord.settled) < len(shares) and not coord.errors and pipes and time.monotonic() < deadline:
                pump(0.05)
        for p in pipes:
            with contextlib.suppress(OSError):
                p.send(("stop",))
        deadline = time.monotonic() + stop_timeout_s(cfg)
        while len(coord.finals) + len(coord.errors) < len(shares) and pipes and time.monotonic() < deadline:
            pump(0.05)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if coord.errors:
        raise click.ClickException("; ".join(coord.errors))
    return _finish(coord, echo)


# -- the command ---------------------------------------------------------------------------------------


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("--uri", "-h", "uris", multiple=True,
              help="Broker URI; repeat for several nodes (clients are spread over them). Default "
                   "amqp://guest:guest@127.0.0.1:5672/%2F, with --protocol stream "
                   "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F.")
@click.option("--protocol", type=click.Choice(["amqp", "stream"]), default="amqp", show_default=True,
              help="AMQP 0-9-1, or RabbitMQ's stream protocol (streams created with --queue-args as "
                   "Create arguments, e.g. '{\"initial-cluster-size\": 3}').")
@click.option("--producers", "-x", default=1, show_default=True, help="Producer count.")
@click.option("--consumers", "-y", default=1, show_default=True, help="Consumer count.")
@click.option("--rate", "-r", default=0.0, show_default=True, help="Msg/s per producer, 0 = unlimited.")
@click.option("--consumer-rate", "-R", default=0.0, show_default=True, help="Msg/s per consumer, 0 = unlimited.")
@click.option("--size", "-s", default=BODY_SIZE_MIN, show_default=True, help="Message body size in bytes (>= 16).")
@click.option("--confirm", "-c", default=0, show_default=True,
              help="Publisher confirms with at most this many messages in flight per producer; 0 = off "
                   f"(stream: every publish is confirmed, 0 = a window of {streamperf.CONFIRM_WINDOW_DEFAULT}).")
@click.option("--qos", "-q", default=0, show_default=True, help="Consumer prefetch count (0 = unlimited).")
@click.option("--autoack", "-a", is_flag=True, help="Consume with autoack (no_ack).")
@click.option("--queue", "-u", default="hutch-perf", show_default=True,
              help="Queue name, or a pattern like perf-%d with --queues.")
@click.option("--queues", default=1, show_default=True, help="Number of queues; clients are spread over them.")
@click.option("--queue-args", default="", help='Queue arguments as JSON, e.g. \'{"x-queue-type": "quorum"}\'.')
@click.option("--pmessages", "-C", default=0, show_default=True, help="Messages per producer, then stop (0 = no limit).")
@click.option("--cmessages", "-D", default=0, show_default=True, help="Messages per consumer, then stop (0 = no limit).")
@click.option("--duration", "-z", "duration_s", default=0.0, show_default=True,
              help="Run for this many seconds (0 = until --pmessages/--cmessages or Ctrl-C).")
@click.option("--auto-delete/--no-auto-delete", default=False, show_default=True, help="Declare queues auto-delete.")
@click.option("--predeclared", "-p", is_flag=True, help="Queues exist already: declare nothing.")
@click.option("--persistent", "-f", is_flag=True, help="Publish persistent messages (delivery mode 2).")
@click.option("--durable", is_flag=True, help="Declare durable queues.")
@click.option("--mandatory", "-m", is_flag=True, help="Publish with the mandatory flag (count returns).")
@click.option("--processes", default=1, show_default=True, help="Worker processes to spread the clients over.")
@click.option("--heartbeat", "heartbeat_s", default=60, show_default=True, help="Heartbeat interval asked for, s.")
@click.option("--id", "run_id", default="", help="Test id shown in every line (default test-HHMMSS-mmm).")
@click.option("--json-out", type=click.Path(dir_okay=False), help="Write the final summary here as JSON.")
@click.option("--record", "record_dir", type=click.Path(file_okay=False),
              help="Record every event as a history (Parquet) under this directory; clients reconnect.")
@click.option("--drain/--no-drain", default=None,
              help="End the run by reading the queues empty (default: on with --record), recorded as a drain.")
@click.option("--drain-timeout", "drain_timeout_s", default=DRAIN_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds a drain may take before the run ends undrained.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--offset", default="next", show_default=True,
              help="Stream consumers start here: first, last, next or an offset.")
@click.option("--credit", default=streamperf.CREDIT_DEFAULT, show_default=True,
              help="Stream consumers: chunks delivered ahead of the consumer (the subscription's credit).")
@click.option("--batch-size", default=streamperf.BATCH_SIZE_DEFAULT, show_default=True,
              help="Stream producers: messages per Publish frame.")
def cli(uris, protocol, producers, consumers, rate, consumer_rate, size, confirm, qos, autoack, queue, queues, queue_args,
        pmessages, cmessages, duration_s, auto_delete, predeclared, persistent, durable, mandatory, processes,
        heartbeat_s, run_id, json_out, record_dir, drain, drain_timeout_s, quiet, offset, credit, batch_size):
    """PerfTest-like load: producers and consumers, rates, confirms, latency, recording."""
    try:
        args = json.loads(queue_args) if queue_args else {}
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--queue-args") from e
    if not uris:
        uris = [streamperf.DEFAULT_URI if protocol == "stream" else "amqp://guest:guest@127.0.0.1:5672/%2F"]
    cfg = PerfConfig(uris=list(uris), producers=producers, consumers=consumers, rate=rate,
                     consumer_rate=consumer_rate, size=size, confirm=confirm, qos=qos, autoack=autoack,
                     queue=queue, queues=queues, queue_args=args, pmessages=pmessages, cmessages=cmessages,
                     duration_s=duration_s, auto_delete=auto_delete, predeclared=predeclared,
                     persistent=persistent, durable=durable, mandatory=mandatory, processes=processes,
                     record_dir=record_dir, reconnect=bool(record_dir), heartbeat_s=heartbeat_s,
                     run_id=run_id, quiet=quiet, drain=drain, drain_timeout_s=drain_timeout_s,
                     protocol=protocol, offset=offset, credit=credit, batch_size=batch_size)
    try:
        summary = run_perf(cfg, echo=lambda line: click.echo(line))
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    except (AMQPError, OSError, ProtocolError, streamperf.StreamError) as e:
        raise click.ClickException(_describe(e)) from e
    except BaseExceptionGroup as eg:
        raise click.ClickException(_describe(eg)) from eg
    if json_out:
        with open(json_out, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    if summary["errors"]:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    cli()

