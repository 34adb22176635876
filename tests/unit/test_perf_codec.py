"""The load client's hand-written hot paths against the AMQP 0-9-1 framing rules, and perf's bookkeeping.

No broker here: frames built by the client are decoded with pamqp (the spec's method
table), and frames built with pamqp are fed to the client's parser in every possible
split, as a TCP stream may deliver them.
"""

from __future__ import annotations

import asyncio
import random
import struct

import pytest
from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.commands import Basic

from hutch.lab.client import Channel, Connection, Endpoint, Publisher
from hutch.lab.perf import Coordinator, PerfConfig, split_clients
from hutch.lab.stats import Histogram, bucket_of


def _decode_all(data: bytes) -> list:
    out = []
    while data:
        n, ch, f = frame.unmarshal(data)
        out.append((ch, f))
        data = data[n:]
    return out


async def _connection(frame_max: int = 131072) -> Connection:
    conn = Connection(Endpoint(), heartbeat_s=0, frame_max=frame_max, client_name="test")
    conn.frame_max = frame_max
    return conn


def _publisher(frame_max: int, size: int, props=None, channel_no: int = 3) -> tuple[Publisher, Connection]:
    async def make():
        conn = await _connection(frame_max)
        ch = Channel(conn, channel_no)
        return Publisher(ch, "amq.direct", "rk", size, props), conn

    return asyncio.run(make())


def test_publish_template_is_publish_method_header_and_body_frames():
    pub, _ = _publisher(131072, 16, Basic.Properties(delivery_mode=2))
    frames = _decode_all(pub.encode(bytes(range(16))))
    assert [type(f) for _, f in frames] == [Basic.Publish, header.ContentHeader, ContentBody]
    assert all(ch == 3 for ch, _ in frames)
    method, head, body = (f for _, f in frames)
    assert (method.exchange, method.routing_key, method.mandatory) == ("amq.direct", "rk", False)
    assert head.body_size == 16 and head.properties.delivery_mode == 2
    assert body.value == bytes(range(16))


def test_a_body_of_another_size_only_patches_the_header_body_size():
    pub, _ = _publisher(4096, 16, Basic.Properties(content_type="text/plain"))
    for body in (b"", b"hello", bytes(9000)):
        frames = _decode_all(pub.encode(body))
        head = frames[1][1]
        assert isinstance(frames[0][1], Basic.Publish) and head.properties.content_type == "text/plain"
        assert head.body_size == len(body)
        assert b"".join(f.value for _, f in frames[2:]) == body


def test_body_larger_than_frame_max_is_split_into_body_frames():
    pub, _ = _publisher(4096, 10000)
    body = random.Random(1).randbytes(10000)
    frames = _decode_all(pub.encode(body))
    bodies = [f for _, f in frames if isinstance(f, ContentBody)]
    assert [len(b.value) for b in bodies] == [4088, 4088, 1824]
    assert b"".join(b.value for b in bodies) == body


def test_stamped_batch_carries_timestamp_and_consecutive_ids():
    pub, _ = _publisher(131072, 32)
    frames = _decode_all(bytes(pub.batch_stamped(5, 123456789, 1000)))
    bodies = [f.value for _, f in frames if isinstance(f, ContentBody)]
    assert [struct.unpack_from(">QQ", b) for b in bodies] == [(123456789, 1000 + i) for i in range(5)]
    assert all(len(b) == 32 and b[16:] == bytes(16) for b in bodies)
    ids = [7, 3, 9]
    frames = _decode_all(bytes(pub.batch_stamped_ids(5, ids)))
    assert [struct.unpack_from(">QQ", f.value)[1] for _, f in frames if isinstance(f, ContentBody)] == ids


def _delivery_stream(messages: list[tuple[int, bool, bytes]], channel: int, ctag: str, frame_max: int) -> bytes:
    out = b""
    for tag, redelivered, body in messages:
        out += frame.marshal(Basic.Deliver(consumer_tag=ctag, delivery_tag=tag, redelivered=redelivered,
                                           exchange="", routing_key="q"), channel)
        out += frame.marshal(header.ContentHeader(0, len(body), Basic.Properties(content_type="x")), channel)
        for i in range(0, len(body), frame_max - 8):
            out += frame.marshal(ContentBody(body[i:i + frame_max - 8]), channel)
    return out


@pytest.mark.parametrize("body_sizes", [[16, 16, 16], [0, 5000, 16]])
def test_deliveries_are_parsed_whatever_way_the_stream_is_split(body_sizes):
    rnd = random.Random(7)
    messages = [(i + 1, i % 2 == 1, rnd.randbytes(n)) for i, n in enumerate(body_sizes)]
    frame_max = 4096
    stream = _delivery_stream(messages, 5, "ctag-1", frame_max)
    stream += frame.marshal(Basic.Ack(delivery_tag=9, multiple=True), 5)

    async def feed(cuts: list[int]) -> tuple[list, list]:
        conn = await _connection(frame_max)
        ch = Channel(conn, 5)
        conn._channels[5] = ch
        got, confirms = [], []
        ch._consumers[b"ctag-1"] = lambda tag, red, body: got.append((tag, red, body))
        ch.on_confirm = lambda tag, multiple, ack: confirms.append((tag, multiple, ack))
        prev = 0
        for c in [*cuts, len(stream)]:
            conn.data_received(stream[prev:c])
            prev = c
        assert not conn._buf
        return got, confirms

    for cut in range(1, len(stream)):  # every two-piece split
        got, confirms = asyncio.run(feed([cut]))
        assert got == messages, cut
        assert confirms == [(9, True, True)]
    got, _ = asyncio.run(feed(list(range(1, len(stream)))))  # one byte at a time
    assert got == messages


def test_histogram_buckets_are_within_one_sixty_fourth_of_the_value():
    for v in [0, 1, 127, 128, 129, 1000, 65537, 10**6, 123456789]:
        b = bucket_of(v)
        assert b <= v
        assert v - b <= max(v / 64, 0)


def test_histogram_percentiles_and_merge():
    h = Histogram()
    h.add_ns([i * 1000 for i in range(1, 101)])  # 1..100 µs, exact buckets
    assert h.summary() == {"min": 1, "p50": 50, "p75": 75, "p95": 95, "p99": 99, "p99.9": 100, "max": 100}
    other = Histogram()
    other.add_ns([1_000_000] * 100)
    h.merge(other.counts)
    assert h.total == 200
    assert h.percentile(0.5) == 100 and h.percentile(0.51) == bucket_of(1000)


def test_queue_pattern_names_queues_like_perftest():
    assert PerfConfig(queue="perf-%d", queues=3).queue_names() == ["perf-1", "perf-2", "perf-3"]
    assert PerfConfig(queue="q", queues=2).queue_names() == ["q-1", "q-2"]
    assert PerfConfig(queue="q").queue_names() == ["q"]


def test_clients_are_dealt_over_processes_without_loss():
    cfg = PerfConfig(producers=3, consumers=4, processes=2)
    shares = split_clients(cfg)
    assert len(shares) == 2
    assert sorted(i for p, _ in shares for i in p) == [0, 1, 2]
    assert sorted(j for _, c in shares for j in c) == [0, 1, 2, 3]
    assert len(split_clients(PerfConfig(producers=1, consumers=0, processes=4))) == 1


def test_pmessages_run_stops_when_every_message_has_arrived():
    cfg = PerfConfig(producers=2, consumers=1, pmessages=10)
    c = Coordinator(cfg, 1, echo=lambda line: None)
    c.on_message(("counts", 0, {"sent": 20, "received": 19}, 2))
    assert not c.should_stop(0.0)
    c.on_message(("counts", 0, {"sent": 20, "received": 20}, 2))
    assert c.should_stop(0.0)
    c = Coordinator(PerfConfig(producers=1, consumers=2, cmessages=5), 2, echo=lambda line: None)
    c.on_message(("counts", 0, {"received": 5}, 1))
    assert not c.should_stop(0.0)
    c.on_message(("counts", 1, {"received": 5}, 1))
    assert c.should_stop(0.0)


def test_progress_line_has_perftest_shape():
    lines = []
    c = Coordinator(PerfConfig(confirm=10, run_id="test-1"), 1, echo=lines.append)
    hist = Histogram()
    hist.add_ns([5_000_000])
    c.on_message(("report", 0, 1, 1.0, {"sent": 1000, "confirmed": 1000, "received": 10}, hist.counts,
                  hist.counts, 0))
    assert lines == ["id: test-1, time: 1.0s, sent: 1000 msg/s, confirmed: 1000 msg/s, received: 10 msg/s, "
                     "min/median/75th/95th/99th confirm latency: 4992/4992/4992/4992/4992 µs, "
                     "min/median/75th/95th/99th consumer latency: 4992/4992/4992/4992/4992 µs"]


def test_connection_close_from_broker_fails_waiters_with_its_reply():
    async def go():
        conn = await _connection()

        class T:  # a transport that only remembers what was written
            written = b""

            def write(self, b):
                T.written += bytes(b)

            def is_closing(self):
                return False

            def close(self):
                pass

        conn.transport = T()
        ch = Channel(conn, 1)
        conn._channels[1] = ch
        call = asyncio.ensure_future(ch.qos(10))
        await asyncio.sleep(0)
        conn.data_received(frame.marshal(commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", 0, 0), 0))
        with pytest.raises(Exception) as e:
            await call
        assert getattr(e.value, "reply_code", None) == 320
        assert isinstance(_decode_all(T.written)[-1][1], commands.Connection.CloseOk)

    asyncio.run(go())
