"""Shared helpers for the unit tests of the sans-I/O AMQP core: a client side that speaks
just enough AMQP 0-9-1 to drive `hutch.amqp.Connection` through its handshake, and a strict
frame parser that checks every byte the server queued is a well-formed frame.

The helpers are exposed as the session-scoped `amqp` fixture (stateless, so hypothesis
tests may use it) rather than imported, so the test files stay independent modules.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands

from hutch.amqp import codec, spec
from hutch.amqp.connection import Connection

SERVER_PROPERTIES = {"product": "hutch", "version": "0.1.0",
                     "capabilities": {"publisher_confirms": True, "basic.nack": True}}

_frame_header = struct.Struct(">BHI")


class Frame:
    __slots__ = ("type", "channel", "payload")

    def __init__(self, ftype: int, channel: int, payload: bytes):
        self.type = ftype
        self.channel = channel
        self.payload = payload

    @property
    def method(self):
        assert self.type == spec.FRAME_METHOD, self
        return codec.decode_method(self.payload)

    def __repr__(self) -> str:
        return f"Frame(type={self.type}, channel={self.channel}, {len(self.payload)} bytes)"


class AMQPClient:
    """The client half, for tests: frame builders and a handshake driver."""

    PROTOCOL_HEADER = spec.PROTOCOL_HEADER
    SERVER_PROPERTIES = SERVER_PROPERTIES

    @staticmethod
    def frame(ftype: int, channel: int, payload: bytes) -> bytes:
        return _frame_header.pack(ftype, channel, len(payload)) + payload + spec.FRAME_END_BYTE

    @staticmethod
    def method(channel: int, method) -> bytes:
        return codec.method_frame(channel, method)

    @staticmethod
    def header(channel: int, body_size: int, props: bytes = b"\x00\x00", class_id: int = 60) -> bytes:
        return AMQPClient.frame(spec.FRAME_HEADER, channel,
                                struct.pack(">HHQ", class_id, 0, body_size) + props)

    @staticmethod
    def body(channel: int, data: bytes) -> bytes:
        return AMQPClient.frame(spec.FRAME_BODY, channel, data)

    @staticmethod
    def publish(channel: int, body: bytes, exchange: str = "", routing_key: str = "q",
                props: bytes = b"\x00\x00", frame_max: int = 131072) -> bytes:
        out = [codec.method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))]
        out += codec.content_frames(channel, props, body, frame_max)
        return b"".join(bytes(p) for p in out)

    @staticmethod
    def parse(data: bytes) -> list[Frame]:
        """Split server output into frames, asserting each is complete and well-formed."""
        frames = []
        off = 0
        while off < len(data):
            assert len(data) - off >= 8, f"truncated frame header at {off}"
            ftype, ch, size = _frame_header.unpack_from(data, off)
            end = off + 7 + size
            assert end < len(data), "truncated frame"
            assert data[end] == spec.FRAME_END, f"bad frame end {data[end]:#x}"
            assert ftype in (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT), ftype
            frames.append(Frame(ftype, ch, bytes(data[off + 7:end])))
            off = end + 1
        return frames

    @staticmethod
    def output(conn: Connection) -> bytes:
        return b"".join(bytes(p) for p in conn.take_output())

    @classmethod
    def frames_out(cls, conn: Connection) -> list[Frame]:
        return cls.parse(cls.output(conn))

    @classmethod
    def methods_out(cls, conn: Connection) -> list[tuple[int, Any]]:
        return [(f.channel, f.method) for f in cls.frames_out(conn) if f.type == spec.FRAME_METHOD]

    @staticmethod
    def feed(conn: Connection, data: bytes) -> list:
        return list(conn.receive_data(data))

    @staticmethod
    def plain_start_ok(username: str = "guest", password: str = "guest") -> bytes:
        return codec.method_frame(0, commands.Connection.StartOk(
            client_properties={"product": "test", "capabilities": {"basic.nack": True}},
            mechanism="PLAIN", response=f"\0{username}\0{password}", locale="en_US"))

    @classmethod
    def open_connection(cls, *, client_frame_max: int | None = None, client_channel_max: int | None = None,
                        client_heartbeat_s: int = 0, channels: tuple[int, ...] = (1,), **server_kw) -> Connection:
        """A Connection taken through header, start-ok (PLAIN), tune-ok and open, with the
        given channels opened and all output so far taken."""
        conn = Connection(SERVER_PROPERTIES, **server_kw)
        cls.feed(conn, spec.PROTOCOL_HEADER)
        (auth,) = cls.feed(conn, cls.plain_start_ok())
        assert type(auth).__name__ == "Authenticate"
        conn.login_ok()
        tune = commands.Connection.TuneOk(
            channel_max=conn.channel_max if client_channel_max is None else client_channel_max,
            frame_max=conn.frame_max if client_frame_max is None else client_frame_max,
            heartbeat=client_heartbeat_s)
        assert cls.feed(conn, codec.method_frame(0, tune)) == []
        (ov,) = cls.feed(conn, codec.method_frame(0, commands.Connection.Open(virtual_host="/")))
        assert type(ov).__name__ == "OpenVhost"
        conn.open_ok()
        for ch in channels:
            (opened,) = cls.feed(conn, codec.method_frame(ch, commands.Channel.Open()))
            assert type(opened).__name__ == "ChannelOpened"
        conn.take_output()
        assert conn.is_open
        return conn


@pytest.fixture(scope="session")
def amqp() -> type[AMQPClient]:
    return AMQPClient
