"""Bounded fuzzing of the AMQP connection core: whatever bytes a peer sends, hutch.amqp's
`Connection` answers with well-formed frames, ends OPEN, CLOSING (it sent connection.close
with a connection-level code, spec 1.7.2) or CLOSED, never raises, never hangs, and never
spends memory on sizes it has not yet checked (a frame is refused from its header alone,
a message from its content header).

Inputs are random bytes, and valid frame streams (publishes with content, acks, methods,
channel open/close, heartbeats) that hypothesis mutates and cuts into random reads. Each
test is bounded by its example count to a few seconds.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from hutch.amqp import codec, spec
from hutch.amqp.connection import CLOSED, CLOSING, OPEN, Connection
from hutch.amqp.events import (
    Ack,
    Authenticate,
    ChannelClosed,
    ChannelFlow,
    ChannelOpened,
    ConnectionClosed,
    Method,
    Nack,
    OpenVhost,
    Publish,
    Reject,
)

FRAME_MAX = 4096
MESSAGE_BYTES_MAX = 20_000

FUZZ = settings(max_examples=150, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

pytestmark = pytest.mark.timeout(120)  # a hang fails the test instead of stalling the run


class Observer:
    """Feeds a Connection and checks, after every read, what the core promised."""

    def __init__(self, amqp, conn: Connection, open_channels: set[int]):
        self.amqp = amqp
        self.conn = conn
        self.open_channels = set(open_channels)
        self.events: list = []
        self.server_close_code: int | None = None
        self.ended_by: ConnectionClosed | None = None

    def feed(self, data: bytes) -> None:
        conn = self.conn
        before = conn.state
        events = list(conn.receive_data(data))  # must never raise
        out = self.amqp.output(conn)
        if before == CLOSED:
            assert events == [] and out == b""
        for ev in events:
            self.check_event(ev)
        self.check_output(out)
        assert conn.state in (OPEN, CLOSING, CLOSED), conn.state
        if conn.state == CLOSING:
            assert self.server_close_code is not None, "closing without having sent connection.close"
        if conn.state == CLOSED:
            assert self.ended_by is not None
        # memory: only a partial frame is kept, and never more than one frame's worth
        assert conn.buffered_bytes < conn.frame_max
        for c in conn._channels.values():
            if c.body_size >= 0:  # a message's body is being received
                assert sum(len(p) for p in c.parts) == c.received <= c.body_size <= conn.message_bytes_max
            else:
                assert c.parts == []

    def check_event(self, ev) -> None:
        t = type(ev)
        assert t in (Publish, Ack, Nack, Reject, Method, ChannelOpened, ChannelClosed, ChannelFlow,
                     ConnectionClosed), ev
        assert self.ended_by is None, f"event {ev!r} after the connection ended"
        if t is ConnectionClosed:
            self.ended_by = ev
            if not ev.by_client:
                assert ev.code == self.server_close_code
            return
        if t is Method and ev.channel == 0:
            assert ev.method.index >> 16 == 10
            return
        assert ev.channel in self.open_channels or t is ChannelOpened, ev
        if t is ChannelOpened:
            # channel_max bounds how many are open, not their numbers (as RabbitMQ's reader does)
            assert ev.channel not in self.open_channels and 0 < ev.channel <= 65535
            assert len(self.open_channels) < self.conn.channel_max
            self.open_channels.add(ev.channel)
        elif t is ChannelClosed:
            self.open_channels.discard(ev.channel)
        elif t is Publish:
            assert len(ev.body) <= self.conn.message_bytes_max
        self.events.append(ev)

    def check_output(self, out: bytes) -> None:
        for f in self.amqp.parse(out):  # well-formed frames only
            assert 8 + len(f.payload) <= self.conn.frame_max
            if f.type == spec.FRAME_HEARTBEAT:
                assert f.channel == 0 and f.payload == b""
                continue
            assert f.type == spec.FRAME_METHOD, "the core itself sends no content"
            m = f.method
            if isinstance(m, commands.Connection.Close):
                assert f.channel == 0 and self.server_close_code is None, "two connection.close"
                assert m.reply_code in spec.CONNECTION_ERRORS, m.reply_text
                assert self.conn.close_reason[0] == m.reply_code
                self.server_close_code = m.reply_code
            elif isinstance(m, commands.Channel.Close):
                assert m.reply_code not in spec.CONNECTION_ERRORS, m.reply_text
            else:
                assert isinstance(m, (commands.Channel.OpenOk, commands.Channel.CloseOk, commands.Channel.FlowOk,
                                      commands.Connection.CloseOk)), m.name


def opened(amqp) -> Connection:
    return amqp.open_connection(client_frame_max=FRAME_MAX, channels=(1, 2),
                                message_bytes_max=MESSAGE_BYTES_MAX)


def feed_in_reads(obs: Observer, data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in zip(points, points[1:], strict=False):
        obs.feed(data[a:b])


# ------------------------------------------------------------------ valid streams to mutate

def _publish(amqp, ch: int, size: int, rk: str) -> bytes:
    props = commands.Basic.Properties(delivery_mode=2, headers={"n": size}).marshal()
    return amqp.publish(ch, bytes(size % 256 for _ in range(size)), routing_key=rk, props=props,
                        frame_max=FRAME_MAX)


def frame_items(amqp):
    ch = st.sampled_from([1, 2, 3])
    return st.one_of(
        st.builds(lambda c, n, rk: _publish(amqp, c, n, rk), ch, st.integers(0, 10_000), st.sampled_from(["a", "b.c"])),
        st.builds(lambda c, t, m: codec.method_frame(c, commands.Basic.Ack(delivery_tag=t, multiple=m)),
                  ch, st.integers(0, 2 ** 63 - 1), st.booleans()),
        st.builds(lambda c, t: codec.method_frame(c, commands.Basic.Nack(delivery_tag=t, requeue=True)),
                  ch, st.integers(0, 100)),
        st.builds(lambda c: codec.method_frame(c, commands.Queue.Declare(queue="q", arguments={"x-max-length": 5})),
                  ch),
        st.builds(lambda c: codec.method_frame(c, commands.Basic.Qos(prefetch_count=10)), ch),
        st.builds(lambda c: codec.method_frame(c, commands.Channel.Open()), ch),
        st.builds(lambda c: codec.method_frame(c, commands.Channel.Close(reply_code=200, reply_text="",
                                                                          class_id=0, method_id=0)), ch),
        st.builds(lambda c: codec.method_frame(c, commands.Channel.CloseOk()), ch),
        st.builds(lambda c, a: codec.method_frame(c, commands.Channel.Flow(active=a)), ch, st.booleans()),
        st.builds(lambda c, n: _publish(amqp, c, n, "big"), ch,
                  st.integers(MESSAGE_BYTES_MAX - 10, MESSAGE_BYTES_MAX + 10)),
        st.just(codec.HEARTBEAT_FRAME),
        st.just(codec.method_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                                                  method_id=0))),
        st.just(codec.method_frame(0, commands.Connection.CloseOk())),
    )


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2 ** 20), st.integers(1, 255)),
    st.tuples(st.just("delete"), st.integers(0, 2 ** 20), st.integers(1, 16)),
    st.tuples(st.just("insert"), st.integers(0, 2 ** 20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("size"), st.integers(0, 2 ** 20), st.integers(0, 2 ** 32 - 1)),
    st.tuples(st.just("truncate"), st.integers(0, 2 ** 20), st.just(0)),
)


# frame-aware mutations keep the framing valid and damage what is inside it
frame_mutation = st.tuples(
    st.sampled_from(["cut", "flip", "type", "channel", "drop", "dup", "swap"]),
    st.integers(0, 2 ** 16), st.integers(0, 2 ** 16))


def mutate_frames(amqp, data: bytes, mutations) -> bytes:
    frames = [[f.type, f.channel, bytearray(f.payload)] for f in amqp.parse(data)]
    for kind, at, arg in mutations:
        if not frames:
            break
        i = at % len(frames)
        f = frames[i]
        if kind == "cut":
            del f[2][arg % (len(f[2]) + 1):]
        elif kind == "flip" and f[2]:
            f[2][arg % len(f[2])] ^= ((arg >> 8) & 0xFF) or 1
        elif kind == "type":
            f[0] = (1, 2, 3, 8, arg & 0xFF)[arg % 5]
        elif kind == "channel":
            f[1] = (0, 1, 2, 3, arg)[arg % 5]
        elif kind == "drop":
            del frames[i]
        elif kind == "dup":
            frames.insert(i, [f[0], f[1], bytearray(f[2])])
        elif kind == "swap" and i + 1 < len(frames):
            frames[i], frames[i + 1] = frames[i + 1], frames[i]
    return b"".join(amqp.frame(t, c, bytes(p)) for t, c, p in frames)


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, pos, arg in mutations:
        if not buf:
            break
        pos %= len(buf)
        if kind == "flip":
            buf[pos] ^= arg
        elif kind == "delete":
            del buf[pos:pos + arg]
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "size" and pos + 7 <= len(buf):
            buf[pos + 3:pos + 7] = struct.pack(">I", arg)  # as if pos were a frame header
        elif kind == "truncate":
            del buf[pos:]
    return bytes(buf)


def test_a_split_header_announcing_an_oversized_frame_is_never_waited_for(amqp):
    """Found by the fuzzer: a read ending exactly 7 bytes into a frame header (its size field
    complete, the 8th byte not yet there) announcing a frame larger than frame_max made the
    connection buffer up to that size before refusing it."""
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    header = bytes([1, 0, 1]) + (1 << 20).to_bytes(4, "big")  # method frame, channel 1, 1 MiB
    obs.feed(header)
    obs.feed(b"\x16" * (FRAME_MAX * 3))  # asserts after each read that at most a frame is held
    assert conn.state in (CLOSING, CLOSED) and obs.server_close_code == 501


# ------------------------------------------------------------------ the fuzz tests

@FUZZ
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=8))
def test_random_bytes_after_the_handshake(amqp, data, cuts):
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    feed_in_reads(obs, data, cuts)


@FUZZ
@given(data=st.data())
def test_mutated_valid_frame_streams(amqp, data):
    items = data.draw(st.lists(frame_items(amqp), min_size=1, max_size=12))
    stream = mutate_frames(amqp, b"".join(items), data.draw(st.lists(frame_mutation, max_size=4)))
    stream = mutate(stream, data.draw(st.lists(mutation, max_size=2)))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    feed_in_reads(obs, stream, cuts)


@FUZZ
@given(data=st.data())
def test_valid_frame_streams_are_never_refused_by_the_framing(amqp, data):
    """Unmutated streams: whatever the order of methods, nothing is a frame error, and
    every message within the size limit arrives whole."""
    items = data.draw(st.lists(frame_items(amqp), min_size=1, max_size=12))
    stream = b"".join(items)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    feed_in_reads(obs, stream, cuts)
    assert obs.server_close_code not in (spec.FRAME_ERROR, spec.SYNTAX_ERROR, spec.UNEXPECTED_FRAME)
    for ev in obs.events:
        if isinstance(ev, Publish):
            assert ev.body == bytes(len(ev.body) % 256 for _ in range(len(ev.body)))


@FUZZ
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 700), max_size=6))
def test_random_bytes_during_the_handshake(amqp, data, cuts):
    conn = Connection(amqp.SERVER_PROPERTIES, message_bytes_max=MESSAGE_BYTES_MAX)
    stream = spec.PROTOCOL_HEADER + data
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for a, b in zip(points, points[1:], strict=False):
        for ev in conn.receive_data(stream[a:b]):
            assert isinstance(ev, (Authenticate, OpenVhost, ConnectionClosed)), ev
            if isinstance(ev, Authenticate):
                conn.login_ok()
            elif isinstance(ev, OpenVhost):
                conn.open_ok()
        amqp.parse(amqp.output(conn))
        assert conn.buffered_bytes < max(conn.frame_max, 8)


@settings(max_examples=100, deadline=None, database=None)
@given(ftype=st.sampled_from([1, 2, 3, 8, 77]), channel=st.integers(0, 0xFFFF),
       size=st.integers(FRAME_MAX + 1, 2 ** 32 - 1))  # payload over frame_max
def test_huge_declared_frame_sizes_are_refused_before_any_buffering(amqp, ftype, channel, size):
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    obs.feed(struct.pack(">BHI", ftype, channel, size) + b"\x00")
    assert conn.buffered_bytes == 0
    assert obs.server_close_code == spec.FRAME_ERROR


@settings(max_examples=100, deadline=None, database=None)
@given(channel=st.sampled_from([1, 2]), body_size=st.integers(MESSAGE_BYTES_MAX + 1, 2 ** 64 - 1))
def test_huge_declared_body_sizes_are_refused_at_the_content_header(amqp, channel, body_size):
    conn = opened(amqp)
    obs = Observer(amqp, conn, {1, 2})
    obs.feed(codec.method_frame(channel, commands.Basic.Publish(routing_key="q")) + amqp.header(channel, body_size)
             + amqp.body(channel, b"x" * (FRAME_MAX - 8)))
    (closed,) = obs.events
    assert isinstance(closed, ChannelClosed) and closed.code == spec.PRECONDITION_FAILED
    assert conn._channels[channel].parts == [] and conn.buffered_bytes == 0 and conn.is_open
