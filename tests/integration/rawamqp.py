"""A bare AMQP 0-9-1 client on a plain socket, for the tests that must break the protocol.

Real client libraries refuse to send a malformed frame, a method on the wrong channel or
a frame larger than the negotiated frame_max, and hide what the broker answered. This
client sends exactly the bytes a test asks for and hands back every frame the broker
sends, decoded by pamqp (the same codec the broker uses for its method table). It never
reconnects, retries or answers anything on its own, except `connection.close-ok` when
asked to; every read has a deadline.
"""

from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, frame, heartbeat
from pamqp.header import ProtocolHeader

AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
FRAME_HEADER_SIZE = 7
READ_SIZE_MAX = 1 << 20
CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}


class PeerClosed(Exception):
    """The broker closed the TCP connection."""


def raw_frame(frame_type: int, channel: int, payload: bytes, frame_end: int = FRAME_END) -> bytes:
    """Frame bytes built by hand, so that a test can get any field wrong on purpose."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([frame_end])


class RawClient:
    """One TCP connection to a broker, driven frame by frame by the test."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.buf = b""
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None

    # -- bytes and frames out -------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value, channel: int = 0) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def send_heartbeat(self) -> None:
        self.send_frame(heartbeat.Heartbeat(), 0)

    # -- bytes and frames in --------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the broker before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(READ_SIZE_MAX)
        except TimeoutError:
            raise TimeoutError("no frame from the broker before the deadline") from None
        except ConnectionResetError as e:
            raise PeerClosed("connection reset by the broker") from e
        if not chunk:
            raise PeerClosed("the broker closed the connection")
        self.buf += chunk

    def read_bytes(self, n: int, timeout_s: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while len(self.buf) < n:
            self._fill(deadline)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_frame(self, timeout_s: float | None = None):
        """The next frame as (channel, pamqp frame value)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while len(self.buf) < FRAME_HEADER_SIZE:
            self._fill(deadline)
        if self.buf.startswith(b"AMQP"):
            while len(self.buf) < 8:
                self._fill(deadline)
            data, self.buf = self.buf[:8], self.buf[8:]
            return 0, ProtocolHeader(*data[5:8])
        _, _, size = struct.unpack(">BHI", self.buf[:FRAME_HEADER_SIZE])
        total = FRAME_HEADER_SIZE + size + 1
        while len(self.buf) < total:
            self._fill(deadline)
        data, self.buf = self.buf[:total], self.buf[total:]
        _, channel, value = frame.unmarshal(data)
        return channel, value

    def expect(self, kind, timeout_s: float | None = None, skip_heartbeats: bool = True):
        """The next frame, which must be a `kind` (heartbeats skipped unless told otherwise)."""
        while True:
            channel, value = self.read_frame(timeout_s)
            if skip_heartbeats and isinstance(value, heartbeat.Heartbeat):
                continue
            if not isinstance(value, kind):
                raise AssertionError(f"expected {kind.__name__}, got {value!r} on channel {channel}")
            return value

    def wait_closed(self, timeout_s: float = 10.0) -> float:
        """Read and drop frames until the broker closes the socket; the seconds it took."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            while True:
                self.buf = b""
                self._fill(deadline)
        except PeerClosed:
            return time.monotonic() - t0

    # -- conversations --------------------------------------------------------------------
    def handshake(self, username: str = "guest", password: str = "guest", vhost: str = "/",
                  heartbeat_s: int = 0, frame_max: int = 0, channel_max: int = 0,
                  mechanism: str = "PLAIN", open_connection: bool = True) -> None:
        """Header, start/start-ok, tune/tune-ok and (unless told not to) connection.open."""
        self.send(AMQP_0_9_1_HEADER)
        self.start = self.expect(commands.Connection.Start)
        if mechanism == "PLAIN":
            response = f"\x00{username}\x00{password}"
        else:
            raise ValueError(f"RawClient speaks PLAIN only, not {mechanism}")
        self.send_frame(commands.Connection.StartOk(
            client_properties={"product": "hutch-tests", "capabilities": CLIENT_CAPABILITIES},
            mechanism=mechanism, response=response))
        self.tune = self.expect(commands.Connection.Tune)
        self.send_frame(commands.Connection.TuneOk(
            channel_max=channel_max or self.tune.channel_max,
            frame_max=frame_max or self.tune.frame_max,
            heartbeat=heartbeat_s))
        if open_connection:
            self.send_frame(commands.Connection.Open(virtual_host=vhost))
            self.expect(commands.Connection.OpenOk)

    def open_channel(self, channel: int = 1) -> None:
        self.send_frame(commands.Channel.Open(), channel)
        self.expect(commands.Channel.OpenOk)

    def expect_connection_close(self, timeout_s: float | None = None) -> commands.Connection.Close:
        """The broker's connection.close (frames on channels before it are dropped); answers close-ok."""
        while True:
            _, value = self.read_frame(timeout_s)
            if isinstance(value, commands.Connection.Close):
                self.send_frame(commands.Connection.CloseOk())
                return value

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
