"""The server side of one AMQP 0-9-1 connection, as a state machine without I/O.

Bytes go in (`receive_data`), events come out; the broker answers by calling methods that
queue bytes (`send_method`, `send_frames`, `close_channel`, `close`), and the runtime sends
whatever `take_output()` returns. The core never touches a socket, a clock or a file: the
runtime calls `tick()` every half heartbeat interval and the core decides, by counting, when a
heartbeat is due and when the peer has been silent too long (two intervals, as RabbitMQ does).

What the core decides on its own (spec sections 2.2-2.3, 4.2): protocol header negotiation (a
wrong header gets ours back and the connection ends), the handshake order
start/start-ok/tune/tune-ok/open, SASL PLAIN and AMQPLAIN decoding, frame size and
frame-end checks, channel numbering (open, close, close-ok, reuse only after close-ok), and
content assembly: basic.publish + content header + body frames become one `Publish` event,
with the declared body size refused up front when it exceeds the message size limit. What it
never decides: whether credentials are valid, whether a vhost exists, or anything about
exchanges and queues — those are the broker's, asked through events.

`receive_data` is a generator: events are produced as frames are parsed, so a channel the
broker closes while handling one event drops the frames that follow in the same read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from pamqp import commands, decode

from hutch.amqp import codec, spec
from hutch.amqp.events import (
    Ack,
    Authenticate,
    ChannelClosed,
    ChannelFlow,
    ChannelOpened,
    ConnectionClosed,
    Event,
    HeartbeatTimeout,
    Method,
    Nack,
    OpenVhost,
    Publish,
    Reject,
)

_frame_header = struct.Struct(">BHI")
_i = struct.Struct(">I")
_qb = struct.Struct(">QB")
_content_frame = struct.Struct(">BHIHHQ")  # a content header frame's header, class, weight and body size
ROUTE_CACHE_MAX = 1024

# method indexes (class_id << 16 | method_id)
_BASIC_PUBLISH = 0x003C0028
_BASIC_ACK = 0x003C0050
_BASIC_REJECT = 0x003C005A
_BASIC_NACK = 0x003C0078
_CHANNEL_OPEN = 0x0014000A
_CHANNEL_FLOW = 0x00140014
_CHANNEL_CLOSE = 0x00140028
_CHANNEL_CLOSE_OK = 0x00140029
_CONNECTION_CLASS = 10

# connection states
AWAIT_HEADER = "await-header"
AWAIT_START_OK = "await-start-ok"
AUTHENTICATING = "authenticating"
AWAIT_TUNE_OK = "await-tune-ok"
AWAIT_OPEN = "await-open"
OPENING = "opening"
OPEN = "open"
CLOSING = "closing"  # we sent connection.close and wait for close-ok
CLOSED = "closed"


def _tag_and_bits(payload: bytes, idx: int) -> tuple[int, int]:
    """delivery-tag and flag bits of basic.ack / basic.nack / basic.reject."""
    if len(payload) < 13:
        name = {_BASIC_ACK: "Basic.Ack", _BASIC_NACK: "Basic.Nack"}.get(idx, "Basic.Reject")
        raise spec.AMQPError(spec.FRAME_ERROR, f"cannot decode the arguments of {name}", 60, idx & 0xFFFF)
    return _qb.unpack_from(payload, 4)


class _Channel:
    __slots__ = ("closing", "publish", "props", "body_size", "parts", "received")

    def __init__(self) -> None:
        self.closing = False
        self.publish: tuple | None = None  # (exchange, routing_key, route_enc, mandatory, immediate)
        self.props = b""
        self.body_size = -1  # -1: waiting for the content header
        self.parts: list[bytes] = []
        self.received = 0


class Connection:
    """One client connection. See the module docstring for the contract."""

    def __init__(self, server_properties: dict[str, Any], *, channel_max: int = 2047,
                 frame_max: int = 131072, heartbeat_s: int = 60,
                 message_bytes_max: int = 128 * 1024 * 1024,
                 mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN"), locales: str = "en_US"):
        self.server_properties = server_properties
        self.channel_max = channel_max
        self.frame_max = frame_max
        # Largest frame *payload* accepted: frame_max, so 8 bytes more than the spec allows in all.
        # RabbitMQ tolerates exactly this (its FRAME_SIZE_FUDGE) because several clients (amqpstorm,
        # rabbitpy) fill body frames to frame_max bytes of payload; so does hutch.
        self._frame_limit = spec.FRAME_MIN_SIZE  # until tune-ok: frame-min-size (spec 4.2.3)
        self.heartbeat_s = heartbeat_s
        self.message_bytes_max = message_bytes_max
        self.mechanisms = mechanisms
        self.locales = locales
        self.state = AWAIT_HEADER
        self.client_properties: dict[str, Any] = {}
        self.mechanism = ""
        self.vhost = ""
        self.close_reason: tuple[int, str] | None = None
        # asked before a channel opens: None, or why it may not (a connection error 530, as
        # RabbitMQ refuses a channel over the user's max-channels limit)
        self.channel_gate: Callable[[], str | None] | None = None
        self._buf: list[bytes] = []  # pieces of an incomplete frame
        self._buf_len = 0
        self._buf_need = 0  # bytes needed before parsing can make progress
        self._route_cache: dict[bytes, tuple] = {}
        self._out: list[bytes] = []
        self._channels: dict[int, _Channel] = {}
        self._reads = 0
        self._flushes = 0
        self._ticks_silent_in = 0
        self._last_reads = 0
        self._last_flushes = 0
        self._closing_ticks = 0

    # ------------------------------------------------------------ queries

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    @property
    def capabilities(self) -> dict[str, Any]:
        caps = self.client_properties.get("capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def buffered_bytes(self) -> int:
        """Bytes held of a frame that has not fully arrived (bounded by the frame size limit)."""
        return self._buf_len

    def channel_is_open(self, channel: int) -> bool:
        c = self._channels.get(channel)
        return c is not None and not c.closing

    def open_channels(self) -> list[int]:
        return [n for n, c in self._channels.items() if not c.closing]

    # ------------------------------------------------------------ output

    def take_output(self) -> list[bytes]:
        out = self._out
        if out:
            self._out = []
            self._flushes += 1
        return out

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def send_method(self, channel: int, method) -> None:
        self._out.append(codec.method_frame(channel, method))

    def send_frames(self, frames: list[bytes]) -> None:
        self._out += frames

    def send_bytes(self, data: bytes) -> None:
        self._out.append(data)

    # ------------------------------------------------------------ broker's answers

    def login_ok(self) -> None:
        assert self.state == AUTHENTICATING, self.state
        self.state = AWAIT_TUNE_OK
        self.send_method(0, commands.Connection.Tune(channel_max=self.channel_max, frame_max=self.frame_max,
                                                     heartbeat=self.heartbeat_s))

    def login_refused(self, text: str) -> None:
        """Refuse the login: connection.close 403 ACCESS_REFUSED to clients that announced the
        authentication_failure_close capability; the others just lose the socket (spec 0-9-1)."""
        if self.capabilities.get("authentication_failure_close"):
            self.close(spec.ACCESS_REFUSED, text)  # RabbitMQ names no method here
        else:
            self.state = CLOSED
            self.close_reason = (spec.ACCESS_REFUSED, text)

    def open_ok(self) -> None:
        assert self.state == OPENING, self.state
        self.state = OPEN
        self.send_method(0, commands.Connection.OpenOk())

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Start closing the connection from the server side (connection.close)."""
        if self.state in (CLOSING, CLOSED):
            return
        reply = spec.reply_text(code, text)
        if self.state == AWAIT_HEADER:
            self.state = CLOSED
            self.close_reason = (code, reply)
            return
        self.send_method(0, commands.Connection.Close(reply_code=code, reply_text=reply, class_id=class_id,
                                                      method_id=method_id))
        self.state = CLOSING
        self.close_reason = (code, reply)
        self._closing_ticks = 0

    def close_channel(self, channel: int, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Close one channel from the server side (channel.close); frames on it are dropped
        until the client's close-ok."""
        c = self._channels.get(channel)
        if c is None or c.closing:
            return
        c.closing = True
        c.publish = None
        c.parts = []
        reply = spec.reply_text(code, text)
        self.send_method(channel, commands.Channel.Close(reply_code=code, reply_text=reply, class_id=class_id,
                                                         method_id=method_id))

    # ------------------------------------------------------------ timers

    def tick(self) -> list[Event]:
        """Called every heartbeat_s / 2 seconds by the runtime (when heartbeats are on), and
        about once a second while closing. Sends a heartbeat when nothing went out since the
        last tick; reports the peer dead after two heartbeat intervals of silence."""
        events: list[Event] = []
        if self.state == CLOSING:
            self._closing_ticks += 1
            return events
        if self.state == CLOSED or not self.heartbeat_s:
            return events
        if self._flushes == self._last_flushes and not self._out:
            self._out.append(codec.HEARTBEAT_FRAME)
        self._last_flushes = self._flushes
        if self._reads == self._last_reads:
            self._ticks_silent_in += 1
            if self._ticks_silent_in >= 4:
                self.state = CLOSED
                events.append(HeartbeatTimeout(self.heartbeat_s))
        else:
            self._ticks_silent_in = 0
        self._last_reads = self._reads
        return events

    @property
    def closing_ticks(self) -> int:
        return self._closing_ticks

    # ------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> Iterator[Event]:
        if self.state == CLOSED:
            return
        self._reads += 1
        if self._buf:
            if self._buf_len + len(data) < self._buf_need:
                self._buf.append(data)  # still not a whole frame: keep the pieces, copy nothing yet
                self._buf_len += len(data)
                return
            self._buf.append(data)
            data = b"".join(self._buf)
            self._buf = []
            self._buf_len = 0
        if self.state == AWAIT_HEADER:
            if len(data) < 8:
                if data and not spec.PROTOCOL_HEADER.startswith(data[:4][: len(data)]):
                    yield from self._bad_header()
                    return
                self._keep(data)
                return
            if data[:8] != spec.PROTOCOL_HEADER:
                yield from self._bad_header()
                return
            self._start()
            data = data[8:]
        n = len(data)
        off = 0
        channels = self._channels
        limit = self._frame_limit  # (tune-ok raises it: read again after each handshake frame)
        ch = 0
        while n - off >= 8:
            try:
                    ftype, ch, size = _frame_header.unpack_from(data, off)
                    if size > limit:
                        raise spec.AMQPError(spec.FRAME_ERROR, f"type {ftype}, frame size {size + 8} exceeds "
                                             f"negotiated frame_max {limit}")
                    end = off + 7 + size
                    if end >= n:
                        break
                    if data[end] != spec.FRAME_END:
                        raise spec.AMQPError(spec.FRAME_ERROR, f"type {ftype}, frame end octet "
                                             f"{data[end]:#04x} is not {spec.FRAME_END:#04x}")
                    payload = data[off + 7:end]
                    off = end + 1
                    if self.state != OPEN:
                        if self.state == CLOSING:
                            ev = self._while_closing(ftype, ch, payload)
                            if ev is not None:
                                yield ev
                                return
                            continue
                        if ftype == spec.FRAME_HEARTBEAT:
                            continue
                        ev = self._handshake(ftype, ch, payload)
                        limit = self._frame_limit
                        if ev is not None:
                            yield ev
                        if self.state == CLOSED:
                            return
                        continue
                    if ch == 0:
                        if ftype == spec.FRAME_HEARTBEAT:
                            continue
                        ev = self._channel_zero(ftype, payload)
                        if ev is not None:
                            yield ev
                            if self.state == CLOSED:
                                return
                        continue
                    c = channels.get(ch)
                    if c is None:
                        if ftype == spec.FRAME_METHOD and len(payload) >= 4 and _i.unpack_from(payload)[0] == _CHANNEL_OPEN:
                            if len(channels) >= self.channel_max:  # RabbitMQ limits the count, not the number
                                raise spec.AMQPError(spec.NOT_ALLOWED, f"number of channels opened ({len(channels)}) has "
                                                     f"reached the negotiated channel_max ({self.channel_max})", 20, 10)
                            refusal = self.channel_gate() if self.channel_gate is not None else None
                            if refusal is not None:
                                raise spec.AMQPError(spec.NOT_ALLOWED, refusal, 20, 10)
                            channels[ch] = _Channel()
                            self._out.append(codec.method_frame(ch, commands.Channel.OpenOk()))
                            yield ChannelOpened(ch)
                            continue
                        if ftype == spec.FRAME_HEARTBEAT:
                            raise spec.AMQPError(spec.UNEXPECTED_FRAME, f"heartbeat frame on channel {ch}")
                        raise spec.AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'")
                    if c.closing:
                        if ftype == spec.FRAME_METHOD and len(payload) >= 4:
                            idx = _i.unpack_from(payload)[0]
                            if idx == _CHANNEL_CLOSE_OK:
                                del channels[ch]
                            elif idx == _CHANNEL_CLOSE:
                                self._out.append(codec.method_frame(ch, commands.Channel.CloseOk()))
                        continue
                    if ftype == spec.FRAME_METHOD:
                        if c.publish is not None:
                            raise spec.AMQPError(spec.UNEXPECTED_FRAME, "expected content header for class 60, "
                                                 "got non content header frame instead")
                        if len(payload) < 4:
                            raise spec.AMQPError(spec.FRAME_ERROR, "method frame too short")
                        idx = _i.unpack_from(payload)[0]
                        if idx == _BASIC_PUBLISH:
                            # route cache: by the method's whole payload, exchange, routing key and flags
                            # exactly as sent (a ticket other than 0, which nobody sends, is another key)
                            p = self._route_cache.get(payload)
                            if p is None:
                                p = codec.decode_publish(payload)
                                if len(self._route_cache) >= ROUTE_CACHE_MAX:
                                    self._route_cache.clear()
                                self._route_cache[payload] = p
                            # fast path: header and a single body frame already here
                            if n - off >= 22:
                                ht, hch, hsize, class_id, _w, body_size = _content_frame.unpack_from(data, off)
                                hend = off + 7 + hsize
                                if ht == 2 and hch == ch and hsize >= 14 and hend < n and data[hend] == 0xCE \
                                        and hsize <= limit:
                                    if class_id == 60 and body_size <= self.message_bytes_max:
                                        if body_size == 0:
                                            props = data[off + 19:hend]
                                            off = hend + 1
                                            yield Publish(ch, p, props, b"")
                                            if self.state != OPEN:
                                                return
                                            continue
                                        boff = hend + 1
                                        if n - boff >= 8:
                                            bt, bch, bsize = _frame_header.unpack_from(data, boff)
                                            bend = boff + 7 + bsize
                                            if bt == 3 and bch == ch and bsize == body_size and bend < n \
                                                    and data[bend] == 0xCE and bsize <= limit:
                                                props = data[off + 19:hend]
                                                off = bend + 1
                                                yield Publish(ch, p, props,
                                                              data[boff + 7:bend])
                                                if self.state != OPEN:
                                                    return
                                                continue
                            c.publish = p
                            c.body_size = -1
                        elif idx == _BASIC_ACK:
                            tag, bits = _tag_and_bits(payload, idx)
                            yield Ack(ch, tag, bool(bits & 1))
                        elif idx == _BASIC_NACK:
                            tag, bits = _tag_and_bits(payload, idx)
                            yield Nack(ch, tag, bool(bits & 1), bool(bits & 2))
                        elif idx == _BASIC_REJECT:
                            tag, bits = _tag_and_bits(payload, idx)
                            yield Reject(ch, tag, bool(bits & 1))
                        else:
                            ev = self._channel_method(ch, c, idx, payload)
                            if ev is not None:
                                yield ev
                        if self.state != OPEN:
                            return
                    elif ftype == spec.FRAME_HEADER:
                        if c.publish is None or c.body_size >= 0:
                            raise spec.AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method "
                                                 "frame instead")
                        class_id, body_size, props = codec.decode_content_header(payload)
                        if class_id != 60:  # RabbitMQ's command assembler: unexpected_frame
                            raise spec.AMQPError(spec.UNEXPECTED_FRAME, "expected content header for class 60, "
                                                 f"got one for class {class_id} instead", 60, 40)
                        if body_size > self.message_bytes_max:
                            c.publish = None
                            self.close_channel(ch, spec.PRECONDITION_FAILED, f"message size {body_size} is larger "
                                               f"than configured max size {self.message_bytes_max}", 60, 40)
                            yield ChannelClosed(ch, spec.PRECONDITION_FAILED, "message too large")
                            continue
                        if body_size == 0:
                            p = c.publish
                            c.publish = None
                            yield Publish(ch, p, props, b"")
                            if self.state != OPEN:
                                return
                            continue
                        c.props = props
                        c.body_size = body_size
                        c.received = 0
                    elif ftype == spec.FRAME_BODY:
                        if c.publish is None or c.body_size < 0:
                            raise spec.AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method "
                                                 "frame instead")
                        got = c.received + len(payload)
                        if got > c.body_size:
                            raise spec.AMQPError(spec.FRAME_ERROR, f"content body of {got} bytes exceeds the "
                                                 f"declared size {c.body_size}")
                        if got == c.body_size:
                            if c.parts:
                                c.parts.append(payload)
                                body = b"".join(c.parts)
                                c.parts = []
                            else:
                                body = payload
                            p = c.publish
                            c.publish = None
                            c.body_size = -1
                            yield Publish(ch, p, c.props, body)
                            if self.state != OPEN:
                                return
                        else:
                            c.parts.append(payload)
                            c.received = got
                    elif ftype == spec.FRAME_HEARTBEAT:
                        raise spec.AMQPError(spec.UNEXPECTED_FRAME, f"heartbeat frame on channel {ch}")
                    else:
                        raise spec.AMQPError(spec.FRAME_ERROR, f"unknown frame type {ftype}")
            except spec.AMQPError as err:
                if err.connection_level or ch == 0:
                    self.close(err.code, err.text, err.class_id, err.method_id)
                    return
                self.close_channel(ch, err.code, err.text, err.class_id, err.method_id)
                yield ChannelClosed(ch, err.code, err.text)
        if off < n and self.state != CLOSED:
            self._keep(data[off:])

    def _keep(self, rest: bytes) -> None:
        """Hold the start of an incomplete frame until enough bytes have arrived to finish it."""
        self._buf = [rest]
        self._buf_len = len(rest)
        if self.state == AWAIT_HEADER or len(rest) < 7:
            self._buf_need = 8
        else:
            size = _i.unpack_from(rest, 3)[0]
            # a size over the limit is refused when the next byte arrives, not waited for
            self._buf_need = 8 + size if size <= self._frame_limit else 8

    # ------------------------------------------------------------ handshake

    def _bad_header(self) -> Iterator[Event]:
        self._out.append(spec.PROTOCOL_HEADER)
        self.state = CLOSED
        self.close_reason = (0, "bad protocol header")
        yield ConnectionClosed(0, "AMQP protocol header mismatch", by_client=False)

    def _start(self) -> None:
        self.state = AWAIT_START_OK
        self.send_method(0, commands.Connection.Start(
            version_major=0, version_minor=9, server_properties=self.server_properties,
            mechanisms=" ".join(self.mechanisms), locales=self.locales))

    def _handshake(self, ftype: int, ch: int, payload: bytes) -> Event | None:
        if ftype != spec.FRAME_METHOD or ch != 0:
            raise spec.AMQPError(spec.UNEXPECTED_FRAME, f"frame type {ftype} on channel {ch} before the "
                                 "connection is open")
        method = codec.decode_method(payload)
        name = method.name
        if self.state == AWAIT_START_OK and name == "Connection.StartOk":
            return self._start_ok(method)
        if self.state == AWAIT_TUNE_OK and name == "Connection.TuneOk":
            self._tune_ok(method)
            return None
        if self.state == AWAIT_OPEN and name == "Connection.Open":
            self.state = OPENING
            self.vhost = method.virtual_host
            return OpenVhost(method.virtual_host)
        if name == "Connection.Close":
            self.send_method(0, commands.Connection.CloseOk())
            self.state = CLOSED
            return ConnectionClosed(method.reply_code, method.reply_text, by_client=True)
        raise spec.AMQPError(spec.COMMAND_INVALID, f"unexpected method {name} in state {self.state}",
                             *divmod(method.index, 0x10000))

    def _start_ok(self, m) -> Event:
        self.client_properties = m.client_properties or {}
        mech = m.mechanism
        self.mechanism = mech
        if mech not in self.mechanisms:
            # RabbitMQ drops the socket: the client named a mechanism the server never offered
            self.state = CLOSED
            self.close_reason = (spec.COMMAND_INVALID, f"unknown authentication mechanism '{mech}'")
            return ConnectionClosed(spec.COMMAND_INVALID, f"unknown authentication mechanism '{mech}'",
                                    by_client=False)
        response = m.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        username = password = ""
        try:
            if mech == "PLAIN":
                parts = response.split(b"\x00")
                if len(parts) != 3:
                    raise ValueError
                username, password = parts[1].decode(), parts[2].decode()
            elif mech == "EXTERNAL":
                pass  # the identity comes from the TLS client certificate, not the response
            elif mech == "AMQPLAIN":
                _n, table = decode.field_table(_i.pack(len(response)) + response)
                username, password = str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
                if isinstance(table.get("LOGIN"), bytes):
                    username = table["LOGIN"].decode()
                if isinstance(table.get("PASSWORD"), bytes):
                    password = table["PASSWORD"].decode()
        except (ValueError, UnicodeDecodeError, struct.error, RecursionError):
            self.state = AUTHENTICATING
            self.close(spec.ACCESS_REFUSED, f"{mech} login refused: malformed response", 10, 11)
            return ConnectionClosed(spec.ACCESS_REFUSED, "malformed login", by_client=False)
        self.state = AUTHENTICATING
        return Authenticate(mech, username, password, self.client_properties)

    def _tune_ok(self, m) -> None:
        def negotiated(name: str, value: int, server_max: int, minimum: int = 0) -> int:
            if value == 0:
                return server_max
            if server_max and value > server_max:
                raise spec.AMQPError(spec.NOT_ALLOWED, f"{name}={value} > {server_max} max size", 10, 31)
            if value < minimum:
                raise spec.AMQPError(spec.NOT_ALLOWED, f"{name}={value} < {minimum} min size", 10, 31)
            return value

        self.channel_max = negotiated("channel_max", m.channel_max, self.channel_max)
        self.frame_max = negotiated("frame_max", m.frame_max, self.frame_max, spec.FRAME_MIN_SIZE)
        self._frame_limit = self.frame_max
        self.heartbeat_s = m.heartbeat
        self.state = AWAIT_OPEN

    # ------------------------------------------------------------ open connection

    def _channel_zero(self, ftype: int, payload: bytes) -> Event | None:
        if ftype != spec.FRAME_METHOD:
            raise spec.AMQPError(spec.UNEXPECTED_FRAME, f"frame type {ftype} on channel 0")
        method = codec.decode_method(payload)
        if method.index >> 16 != _CONNECTION_CLASS:
            raise spec.AMQPError(spec.CHANNEL_ERROR, "unexpected method in connection state running",
                                 *divmod(method.index, 0x10000))
        if method.name == "Connection.Close":
            self.send_method(0, commands.Connection.CloseOk())
            self.state = CLOSED
            return ConnectionClosed(method.reply_code, method.reply_text, by_client=True)
        if method.name == "Connection.CloseOk":
            return None
        return Method(0, method)  # update-secret, blocked/unblocked from a client, ...

    def _channel_method(self, ch: int, c: _Channel, idx: int, payload: bytes) -> Event | None:
        if idx == _CHANNEL_CLOSE:
            method = codec.decode_method(payload)
            del self._channels[ch]
            self._out.append(codec.method_frame(ch, commands.Channel.CloseOk()))
            return ChannelClosed(ch, method.reply_code, method.reply_text)
        if idx == _CHANNEL_CLOSE_OK:
            return None
        if idx == _CHANNEL_OPEN:
            raise spec.AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        if idx == _CHANNEL_FLOW:
            method = codec.decode_method(payload)
            if not method.active:
                # RabbitMQ 3.x refuses client-initiated flow control; so does hutch
                raise spec.AMQPError(spec.NOT_IMPLEMENTED, "active=false", 20, 20)
            self._out.append(codec.method_frame(ch, commands.Channel.FlowOk(active=True)))
            return ChannelFlow(ch, True)
        if idx >> 16 == _CONNECTION_CLASS:
            raise spec.AMQPError(spec.COMMAND_INVALID, "unimplemented method", *divmod(idx, 0x10000))
        return Method(ch, codec.decode_method(payload))

    def _while_closing(self, ftype: int, ch: int, payload: bytes) -> Event | None:
        if ftype != spec.FRAME_METHOD or ch != 0 or len(payload) < 4:
            return None
        idx = _i.unpack_from(payload)[0]
        if idx == 0x000A0033:  # connection.close-ok
            self.state = CLOSED
            code, text = self.close_reason or (200, "")
            return ConnectionClosed(code, text, by_client=False)
        if idx == 0x000A0032:  # connection.close crossing ours
            self.send_method(0, commands.Connection.CloseOk())
            self.state = CLOSED
            code, text = self.close_reason or (200, "")
            return ConnectionClosed(code, text, by_client=False)
        return None
