"""A small, fast asyncio AMQP 0-9-1 client for load generation (`hutch perf`, `bench/compare`).

It speaks the wire protocol of the AMQP 0-9-1 specification (section 4.2, "Frame
format") directly on an `asyncio.Protocol`: every method that is not on the hot path
(handshake, declarations, qos, consume, confirm.select, close) is encoded and decoded
with pamqp's generated method table; the four hot paths are written by hand:

- publish: `Publisher` pre-encodes basic.publish + content header + body frame header
  once per (exchange, routing key, properties, body size); a batch of messages is one
  bytearray (the template repeated) whose bodies are patched with `struct.pack_into`
  and handed to the transport in one write;
- basic.deliver, basic.ack and basic.nack are parsed with `struct.unpack_from` straight
  from the receive buffer; a delivery is handled only once its method, header and body
  frames are all in the buffer, so no per-channel content state machine is needed;
- acks a consumer asks for with `Channel.ack_upto` are coalesced into one
  `basic.ack multiple=True` per loop iteration;
- everything a connection sends during one loop iteration goes out in one write.

What it must never do: block the loop, buffer without bound (writes obey the
transport's high-water mark through `drain()`, a frame larger than the negotiated
`frame_max` is a protocol error), or hide a broker-side close: a connection or channel
closed by the broker fails every waiter with `ConnectionClosed` / `ChannelClosed`
carrying the broker's reply code and text.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pamqp import commands, frame, header, heartbeat
from pamqp.commands import Basic

try:  # uvloop is a declared dependency on Linux; the client also runs on the stock loop
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7-byte frame header + frame-end octet

FRAME_MAX_DEFAULT = 131072
CHANNEL_MAX_DEFAULT = 2047
HEARTBEAT_S_DEFAULT = 60
MESSAGE_SIZE_MAX = 128 * 1024 * 1024  # RabbitMQ's default max_message_size
RPC_TIMEOUT_S = 30.0
WRITE_HIGH_WATER = 512 * 1024

# (class id << 16) | method id, as read with one unpack of the method frame's first 4 bytes
KEY_DELIVER = (60 << 16) | 60
KEY_ACK = (60 << 16) | 80
KEY_NACK = (60 << 16) | 120
KEY_RETURN = (60 << 16) | 50

_frame_header = struct.Struct(">BHI")
_u32 = struct.Struct(">I")
_deliver_tail = struct.Struct(">QB")
_ack = struct.Struct(">QB")
_header_body_size = struct.Struct(">Q")  # at offset 4 of a content header payload
_ack_frame = struct.Struct(">BHIHHQBB")  # whole basic.ack frame
_timestamp_and_id = struct.Struct(">QQ")

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


class AMQPError(Exception):
    """The broker closed a connection or channel; carries what it said."""

    def __init__(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0):
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id


class ConnectionClosed(AMQPError):
    pass


class ChannelClosed(AMQPError):
    pass


class ProtocolError(Exception):
    """The broker broke the framing rules (AMQP reply code 501 frame-error)."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed, else the stock loop."""
    if uvloop is not None:
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro):
    """asyncio.run on uvloop when it is installed."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


@dataclass(frozen=True)
class Endpoint:
    """Where to connect, parsed from an amqp:// URI."""

    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"

    @classmethod
    def from_uri(cls, uri: str) -> Endpoint:
        parts = urlsplit(uri)
        if parts.scheme not in ("amqp", ""):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} (amqp:// only)")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        vhost = unquote(path) if path else "/"
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or 5672,
                   user=unquote(parts.username or "guest"), password=unquote(parts.password or "guest"),
                   vhost=vhost)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _shortstr(s: str) -> bytes:
    b = s.encode()
    if len(b) > 255:
        raise ValueError(f"short string longer than 255 bytes: {s[:40]!r}...")
    return bytes([len(b)]) + b


class Publisher:
    """Pre-encoded frames for messages to one (exchange, routing key, properties).

    `template` holds one whole message of `body_size` bytes (method, header and body
    frames) with a zero body; a batch of k such messages is `template * k` with each
    body patched in place. A body of any other size reuses the encoded method and header
    frames with only the header's body-size field patched.
    """

    def __init__(self, channel: Channel, exchange: str, routing_key: str, body_size: int,
                 properties: Basic.Properties | None = None, mandatory: bool = False):
        if not 0 <= body_size <= MESSAGE_SIZE_MAX:
            raise ValueError(f"body size {body_size} outside 0..{MESSAGE_SIZE_MAX}")
        self.channel = channel
        self.body_size = body_size
        ch = channel.number
        method = frame.marshal(Basic.Publish(exchange=exchange, routing_key=routing_key,
                                             mandatory=mandatory), ch)
        head = frame.marshal(header.ContentHeader(0, body_size, properties or Basic.Properties()), ch)
        chunk_max = channel.connection.frame_max - FRAME_OVERHEAD
        out = bytearray(method + head)
        self._head = bytes(out)
        self._size_offset = len(method) + 7 + 4  # content header payload: class, weight, body size
        self._channel_no = ch
        self._chunk_max = chunk_max
        self.body_offset = len(out) + 7
        offsets = []  # (offset in template, length) of each body piece
        remaining = body_size
        while remaining > 0:
            n = min(remaining, chunk_max)
            out += _frame_header.pack(FRAME_BODY, ch, n)
            offsets.append((len(out), n))
            out += bytes(n)
            out += b"\xce"
            remaining -= n
        self._pieces = offsets
        self.template = bytes(out)
        self.first_piece_len = offsets[0][1] if offsets else 0

    def encode(self, body: bytes) -> bytes:
        """Frames for one message with this body."""
        if len(body) != self.body_size:
            size = len(body)
            if size > MESSAGE_SIZE_MAX:
                raise ValueError(f"body of {size} bytes exceeds {MESSAGE_SIZE_MAX}")
            buf = bytearray(self._head)
            _header_body_size.pack_into(buf, self._size_offset, size)
            for i in range(0, size, self._chunk_max):
                piece = body[i:i + self._chunk_max]
                buf += _frame_header.pack(FRAME_BODY, self._channel_no, len(piece))
                buf += piece
                buf += b"\xce"
            return bytes(buf)
        buf = bytearray(self.template)
        pos = 0
        for off, n in self._pieces:
            buf[off:off + n] = body[pos:pos + n]
            pos += n
        return bytes(buf)

    def batch_stamped(self, count: int, timestamp_ns: int, first_id: int) -> bytearray:
        """`count` messages whose bodies start with (timestamp_ns, id), ids consecutive from first_id."""
        if self.first_piece_len < 16:
            raise ValueError("stamped bodies need at least 16 bytes in the first body frame")
        size = len(self.template)
        buf = bytearray(self.template) * count
        pack_into = _timestamp_and_id.pack_into
        off = self.body_offset
        for i in range(count):
            pack_into(buf, off, timestamp_ns, first_id + i)
            off += size
        return buf

    def batch_stamped_ids(self, timestamp_ns: int, ids: list[int]) -> bytearray:
        """Messages whose bodies start with (timestamp_ns, id) for each id in `ids`."""
        if self.first_piece_len < 16:
            raise ValueError("stamped bodies need at least 16 bytes in the first body frame")
        size = len(self.template)
        buf = bytearray(self.template) * len(ids)
        pack_into = _timestamp_and_id.pack_into
        off = self.body_offset
        for msg_id in ids:
            pack_into(buf, off, timestamp_ns, msg_id)
            off += size
        return buf


# on_message(delivery_tag, redelivered, body) ; on_confirm(delivery_tag, multiple, ack)
MessageCallback = Callable[[int, bool, bytes], None]
ConfirmCallback = Callable[[int, bool, bool], None]
ReturnCallback = Callable[[int, str, bytes], None]
CancelCallback = Callable[[str], None]


class Channel:
    """One AMQP channel: synchronous methods as coroutines, hot methods as plain calls."""

    def __init__(self, connection: Connection, number: int):
        self.connection = connection
        self.number = number
        self.is_open = False
        self.close_reason: AMQPError | None = None
        self.confirm_mode = False
        self.publish_seq = 0  # delivery tag of the last message published in confirm mode
        self.on_confirm: ConfirmCallback | None = None
        self.on_return: ReturnCallback | None = None
        self.on_cancel: CancelCallback | None = None
        self.on_close: Callable[[AMQPError], None] | None = None
        self.flow_active = True
        self._consumers: dict[bytes, MessageCallback] = {}
        self._consume_callback: MessageCallback | None = None
        self._rpc: tuple[tuple[type, ...], asyncio.Future] | None = None
        self._rpc_lock = asyncio.Lock()
        self._ack_upto = 0

    # -- synchronous methods ---------------------------------------------------------

    async def _call(self, method, *replies: type, consume_callback: MessageCallback | None = None):
        if self.close_reason is not None:
            raise self.close_reason
        async with self._rpc_lock:
            if self.close_reason is not None:
                raise self.close_reason
            fut = self.connection.loop.create_future()
            self._rpc = (replies, fut)
            self._consume_callback = consume_callback
            self.connection._send(frame.marshal(method, self.number))
            try:
                async with asyncio.timeout(RPC_TIMEOUT_S):
                    return await fut
            finally:
                self._rpc = None

    async def open(self) -> Channel:
        await self._call(commands.Channel.Open(), commands.Channel.OpenOk)
        self.is_open = True
        return self

    async def close(self) -> None:
        if not self.is_open:
            return
        try:
            await self._call(commands.Channel.Close(200, "Normal shutdown", 0, 0), commands.Channel.CloseOk)
        finally:
            self._closed(None)

    async def declare_queue(self, queue: str = "", durable: bool = False, exclusive: bool = False,
                            auto_delete: bool = False, arguments: dict | None = None,
                            passive: bool = False) -> tuple[str, int, int]:
        """queue.declare; returns (queue name, message count, consumer count)."""
        ok = await self._call(commands.Queue.Declare(queue=queue, durable=durable, exclusive=exclusive,
                                                     auto_delete=auto_delete, passive=passive,
                                                     arguments=arguments or {}),
                              commands.Queue.DeclareOk)
        return ok.queue, ok.message_count, ok.consumer_count

    async def delete_queue(self, queue: str, if_unused: bool = False, if_empty: bool = False) -> int:
        ok = await self._call(commands.Queue.Delete(queue=queue, if_unused=if_unused, if_empty=if_empty),
                              commands.Queue.DeleteOk)
        return ok.message_count

    async def purge_queue(self, queue: str) -> int:
        ok = await self._call(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk)
        return ok.message_count

    async def declare_exchange(self, exchange: str, exchange_type: str = "direct", durable: bool = False,
                               auto_delete: bool = False, arguments: dict | None = None) -> None:
        await self._call(commands.Exchange.Declare(exchange=exchange, exchange_type=exchange_type,
                                                   durable=durable, auto_delete=auto_delete,
                                                   arguments=arguments or {}),
                         commands.Exchange.DeclareOk)

    async def bind_queue(self, queue: str, exchange: str, routing_key: str = "",
                         arguments: dict | None = None) -> None:
        await self._call(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key,
                                             arguments=arguments or {}),
                         commands.Queue.BindOk)

    async def qos(self, prefetch_count: int, global_: bool = False) -> None:
        await self._call(Basic.Qos(prefetch_count=prefetch_count, global_=global_), Basic.QosOk)

    async def confirm_select(self) -> None:
        await self._call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.confirm_mode = True
        self.publish_seq = 0

    async def consume(self, queue: str, on_message: MessageCallback, no_ack: bool = False,
                      consumer_tag: str = "", exclusive: bool = False, arguments: dict | None = None) -> str:
        # deliveries can follow consume-ok in the same read: _on_method registers the
        # callback the moment consume-ok is parsed, before the next frame is looked at
        ok = await self._call(Basic.Consume(queue=queue, consumer_tag=consumer_tag, no_ack=no_ack,
                                            exclusive=exclusive, arguments=arguments or {}),
                              Basic.ConsumeOk, consume_callback=on_message)
        return ok.consumer_tag

    async def cancel(self, consumer_tag: str) -> None:
        await self._call(Basic.Cancel(consumer_tag=consumer_tag), Basic.CancelOk)
        self._consumers.pop(consumer_tag.encode(), None)

    # -- asynchronous methods (no reply) ----------------------------------------------

    def publish(self, publisher: Publisher, body: bytes) -> int:
        """Publish one message; returns its confirm sequence number (0 outside confirm mode)."""
        self.connection._send(publisher.encode(body))
        if self.confirm_mode:
            self.publish_seq += 1
            return self.publish_seq
        return 0

    def publish_frames(self, frames: bytes | bytearray, count: int) -> int:
        """Send pre-encoded frames holding `count` messages; returns the last sequence number."""
        self.connection._send(frames)
        if self.confirm_mode:
            self.publish_seq += count
            return self.publish_seq
        return 0

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self._flush_ack()
        self.connection._send(_ack_frame.pack(FRAME_METHOD, self.number, 13, 60, 80, delivery_tag,
                                              1 if multiple else 0, FRAME_END))

    def ack_upto(self, delivery_tag: int) -> None:
        """Acknowledge everything up to delivery_tag; coalesced into one frame per loop iteration."""
        if delivery_tag > self._ack_upto:
            if not self._ack_upto:
                self.connection._pending_acks.append(self)
            self._ack_upto = delivery_tag
            self.connection._schedule_flush()

    def _flush_ack(self) -> None:
        tag = self._ack_upto
        if tag:
            self._ack_upto = 0
            with contextlib.suppress(ValueError):
                self.connection._pending_acks.remove(self)
            self.connection._send(_ack_frame.pack(FRAME_METHOD, self.number, 13, 60, 80, tag, 1, FRAME_END))

    def nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self._flush_ack()
        self.connection._send(frame.marshal(Basic.Nack(delivery_tag=delivery_tag, multiple=multiple,
                                                       requeue=requeue), self.number))

    def reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self._flush_ack()
        self.connection._send(frame.marshal(Basic.Reject(delivery_tag=delivery_tag, requeue=requeue),
                                            self.number))

    # -- incoming ------------------------------------------------------------------------

    def _on_method(self, method) -> None:
        if self._rpc is not None and isinstance(method, self._rpc[0]):
            replies, fut = self._rpc
            if isinstance(method, Basic.ConsumeOk) and self._consume_callback is not None:
                self._consumers[method.consumer_tag.encode()] = self._consume_callback
                self._consume_callback = None
            if not fut.done():
                fut.set_result(method)
            return
        if isinstance(method, commands.Channel.Close):
            self.connection._send(frame.marshal(commands.Channel.CloseOk(), self.number))
            self._closed(ChannelClosed(method.reply_code, method.reply_text, method.class_id,
                                       method.method_id))
        elif isinstance(method, Basic.Cancel):  # consumer cancelled by the broker
            self._consumers.pop(method.consumer_tag.encode(), None)
            if self.on_cancel is not None:
                self.on_cancel(method.consumer_tag)
        elif isinstance(method, commands.Channel.Flow):
            self.flow_active = method.active
            self.connection._send(frame.marshal(commands.Channel.FlowOk(active=method.active), self.number))
        elif isinstance(method, Basic.Ack):
            if self.on_confirm is not None:
                self.on_confirm(method.delivery_tag, method.multiple, True)
        elif isinstance(method, Basic.Nack):
            if self.on_confirm is not None:
                self.on_confirm(method.delivery_tag, method.multiple, False)
        else:
            raise ProtocolError(f"unexpected {method.name} on channel {self.number}")

    def _closed(self, reason: AMQPError | None) -> None:
        was_open = self.is_open
        self.is_open = False
        if self.close_reason is None:
            self.close_reason = reason or ChannelClosed(200, "channel closed")
        if self._rpc is not None and not self._rpc[1].done():
            self._rpc[1].set_exception(self.close_reason)
        self.connection._channels.pop(self.number, None)
        if was_open and reason is not None and self.on_close is not None:
            self.on_close(reason)


class Connection(asyncio.Protocol):
    """One AMQP connection; create it with `await Connection.connect(...)`."""

    def __init__(self, endpoint: Endpoint, heartbeat_s: int, frame_max: int, client_name: str):
        self.endpoint = endpoint
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.requested_heartbeat_s = heartbeat_s
        self.requested_frame_max = frame_max
        self.client_name = client_name
        self.frame_max = FRAME_MAX_DEFAULT
        self.channel_max = CHANNEL_MAX_DEFAULT
        self.heartbeat_s = 0
        self.server_properties: dict = {}
        self.blocked = False
        self.closed: asyncio.Future = self.loop.create_future()
        self.on_lost: Callable[[Exception | None], None] | None = None
        self._channels: dict[int, Channel] = {}
        self._next_channel = 1
        self._buf = bytearray()
        self._out = bytearray()
        self._flush_scheduled = False
        self._in_receive = False
        self._pending_acks: list[Channel] = []
        self._handshake: asyncio.Future = self.loop.create_future()
        self._close_ok: asyncio.Future | None = None
        self._writable: asyncio.Future | None = None
        self._unblocked: asyncio.Future | None = None
        self._rx_count = 0
        self._tx_count = 0
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._hb_rx_seen = 0
        self._hb_tx_seen = 0
        self._hb_silent_ticks = 0

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    async def connect(cls, endpoint: Endpoint | str, heartbeat_s: int = HEARTBEAT_S_DEFAULT,
                      frame_max: int = FRAME_MAX_DEFAULT, client_name: str = "hutch-perf",
                      timeout_s: float = 30.0) -> Connection:
        if isinstance(endpoint, str):
            endpoint = Endpoint.from_uri(endpoint)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(
                lambda: cls(endpoint, heartbeat_s, frame_max, client_name), endpoint.host, endpoint.port)
            try:
                await conn._handshake
            except BaseException:
                conn.abort()
                raise
        return conn

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.write(PROTOCOL_HEADER)

    def _on_connection_method(self, method) -> None:
        if isinstance(method, commands.Connection.Start):
            self.server_properties = method.server_properties or {}
            e = self.endpoint
            self._send(frame.marshal(commands.Connection.StartOk(
                client_properties={
                    "product": "hutch-perf", "connection_name": self.client_name,
                    "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                                     "basic.nack": True, "connection.blocked": True,
                                     "authentication_failure_close": True,
                                     "exchange_exchange_bindings": True}},
                mechanism="PLAIN", response=f"\0{e.user}\0{e.password}", locale="en_US"), 0))
        elif isinstance(method, commands.Connection.Tune):
            self.channel_max = _negotiate(method.channel_max, CHANNEL_MAX_DEFAULT)
            self.frame_max = _negotiate(method.frame_max, self.requested_frame_max)
            # heartbeat: 0 asked by the client disables them; otherwise the lower non-zero value
            self.heartbeat_s = (_negotiate(method.heartbeat, self.requested_heartbeat_s)
                                if self.requested_heartbeat_s else 0)
            self._send(frame.marshal(commands.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat_s), 0))
            self._send(frame.marshal(commands.Connection.Open(virtual_host=self.endpoint.vhost), 0))
            if self.heartbeat_s:
                self._heartbeat_timer = self.loop.call_later(self.heartbeat_s / 2, self._heartbeat_tick)
        elif isinstance(method, commands.Connection.OpenOk):
            if not self._handshake.done():
                self._handshake.set_result(None)
        elif isinstance(method, commands.Connection.Close):
            self._send(frame.marshal(commands.Connection.CloseOk(), 0))
            self._flush()
            self._lost(ConnectionClosed(method.reply_code, method.reply_text, method.class_id,
                                        method.method_id))
            if self.transport is not None:
                self.transport.close()
        elif isinstance(method, commands.Connection.CloseOk):
            if self._close_ok is not None and not self._close_ok.done():
                self._close_ok.set_result(None)
        elif isinstance(method, commands.Connection.Blocked):
            self.blocked = True
        elif isinstance(method, commands.Connection.Unblocked):
            self.blocked = False
            if self._unblocked is not None and not self._unblocked.done():
                self._unblocked.set_result(None)
            self._unblocked = None
        else:
            raise ProtocolError(f"unexpected {method.name} on channel 0")

    async def channel(self) -> Channel:
        if self.closed.done():
            raise self._close_error()
        for _ in range(self.channel_max):
            n = self._next_channel
            self._next_channel = n % self.channel_max + 1
            if n not in self._channels:
                break
        else:
            raise RuntimeError(f"all {self.channel_max} channels are in use")
        ch = Channel(self, n)
        self._channels[n] = ch
        return await ch.open()

    async def close(self, timeout_s: float = 10.0) -> None:
        if self.closed.done() or self.transport is None:
            return
        self._close_ok = self.loop.create_future()
        self._send(frame.marshal(commands.Connection.Close(200, "Normal shutdown", 0, 0), 0))
        with contextlib.suppress(asyncio.TimeoutError, AMQPError, ConnectionError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._close_ok)
        self._lost(ConnectionClosed(200, "Normal shutdown"))
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- writing ---------------------------------------------------------------------------

    def _send(self, data) -> None:
        if self.transport is None:
            return  # lost: whoever is sending finds out from drain() / closed
        self._out += data
        if not self._in_receive and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _schedule_flush(self) -> None:
        if not self._in_receive and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._pending_acks:
            self._flush_scheduled = True  # the acks below join this write, not a new one
            for ch in list(self._pending_acks):
                ch._flush_ack()
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(self._out)
            self._tx_count += 1
            self._out = bytearray()

    def flush(self) -> None:
        """Write what is buffered now (callers usually let the loop do it)."""
        self._flush()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        w, self._writable = self._writable, None
        if w is not None and not w.done():
            w.set_result(None)

    async def drain(self) -> None:
        """Wait while the transport is above its high-water mark or the broker blocked us."""
        if self.closed.done():
            raise self._close_error()
        while self._writable is not None or self.blocked:
            if self._writable is not None:
                await asyncio.wait([self._writable, self.closed], return_when=asyncio.FIRST_COMPLETED)
            elif self.blocked:
                if self._unblocked is None:
                    self._unblocked = self.loop.create_future()
                await asyncio.wait([self._unblocked, self.closed], return_when=asyncio.FIRST_COMPLETED)
            if self.closed.done():
                raise self._close_error()

    @property
    def writable(self) -> bool:
        return self._writable is None and not self.blocked and not self.closed.done()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- heartbeats ------------------------------------------------------------------------

    def _heartbeat_tick(self) -> None:
        """Every heartbeat/2: send a heartbeat if we sent nothing; give up after 2 silent intervals."""
        if self.closed.done() or self.transport is None:
            return
        if self._tx_count == self._hb_tx_seen:
            self.transport.write(HEARTBEAT_FRAME)
            self._tx_count += 1
        self._hb_tx_seen = self._tx_count
        if self._rx_count == self._hb_rx_seen:
            self._hb_silent_ticks += 1
            if self._hb_silent_ticks >= 4:
                self._lost(ConnectionClosed(0, f"missed heartbeats from {self.endpoint}"))
                self.transport.abort()
                return
        else:
            self._hb_silent_ticks = 0
        self._hb_rx_seen = self._rx_count
        self._heartbeat_timer = self.loop.call_later(self.heartbeat_s / 2, self._heartbeat_tick)

    # -- reading ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._rx_count += 1
        if self._buf:
            self._buf += data
            data = self._buf
        self._in_receive = True
        try:
            pos = self._parse(data)
        except (ProtocolError, AMQPError) as e:
            self._buf = bytearray()
            self._in_receive = False
            self._fail_protocol(e)
            return
        finally:
            self._in_receive = False
        if pos < len(data):
            rest = data[pos:]
            self._buf = rest if isinstance(rest, bytearray) else bytearray(rest)
        else:
            self._buf = bytearray()
        self._flush()

    def _parse(self, data) -> int:
        """Handle every complete frame (and complete delivery) in data; return where we stopped."""
        n = len(data)
        pos = 0
        unpack_frame = _frame_header.unpack_from
        unpack_u32 = _u32.unpack_from
        unpack_size = _header_body_size.unpack_from
        unpack_tail = _deliver_tail.unpack_from
        channels = self._channels
        frame_max = self.frame_max
        while n - pos >= 8:
            ftype, ch, size = unpack_frame(data, pos)
            if size + FRAME_OVERHEAD > frame_max and frame_max:
                if pos == 0 and data[:4] == b"AMQP":
                    raise ProtocolError(f"broker refused AMQP 0-9-1: it offered {bytes(data[:8])!r}")
                raise ProtocolError(f"frame of {size} bytes exceeds frame_max {frame_max}")
            end = pos + 7 + size
            if end >= n:
                break
            if data[end] != FRAME_END:
                raise ProtocolError(f"frame-end octet is {data[end]:#x}, not 0xce")
            if ftype == FRAME_METHOD:
                key = unpack_u32(data, pos + 7)[0]
                if key == KEY_DELIVER:
                    # fast path: method, header and a single body frame all in the buffer
                    h = end + 1
                    if n - h >= 8:
                        htype, _, hsize = unpack_frame(data, h)
                        b = h + 8 + hsize
                        if htype == FRAME_HEADER and n - b >= 8:
                            btype, _, bsize = unpack_frame(data, b)
                            bend = b + 7 + bsize
                            if (btype == FRAME_BODY and bend < n and bsize == unpack_size(data, h + 11)[0]
                                    and data[b - 1] == FRAME_END and data[bend] == FRAME_END):
                                p = pos + 11
                                tl = data[p]
                                tag, redelivered = unpack_tail(data, p + 1 + tl)
                                channel = channels.get(ch)
                                if channel is not None:
                                    cb = channel._consumers.get(bytes(data[p + 1:p + 1 + tl]))
                                    if cb is not None:
                                        cb(tag, redelivered == 1, bytes(data[b + 7:bend]))
                                pos = bend + 1
                                continue
                    nxt = self._on_deliver(data, pos + 11, end + 1, n, ch)
                    if nxt < 0:
                        break  # header or body not all here yet
                    pos = nxt
                    continue
                if key == KEY_ACK or key == KEY_NACK:
                    tag, bits = _ack.unpack_from(data, pos + 11)
                    channel = channels.get(ch)
                    if channel is not None and channel.on_confirm is not None:
                        channel.on_confirm(tag, bool(bits & 1), key == KEY_ACK)
                    pos = end + 1
                    continue
                if key == KEY_RETURN:
                    nxt = self._on_return(data, pos, end + 1, n, ch)
                    if nxt < 0:
                        break
                    pos = nxt
                    continue
                self._on_slow_frame(bytes(data[pos:end + 1]), ch)
            elif ftype == FRAME_HEARTBEAT:
                pass
            else:
                raise ProtocolError(f"unexpected frame type {ftype} on channel {ch}")
            pos = end + 1
        return pos

    def _content(self, data, h: int, n: int) -> tuple[int, int] | None:
        """Locate the content (header + bodies) starting at h; return (body_size, end) or None if incomplete.

        The body is data[h_body_start...]; for a single body frame the caller slices it.
        """
        if n - h < 8:
            return None
        ftype, _, size = _frame_header.unpack_from(data, h)
        if ftype != FRAME_HEADER:
            raise ProtocolError(f"expected a content header frame, got type {ftype}")
        hend = h + 7 + size
        if hend >= n:
            return None
        body_size = _header_body_size.unpack_from(data, h + 11)[0]
        if body_size > MESSAGE_SIZE_MAX:
            raise ProtocolError(f"message body of {body_size} bytes exceeds {MESSAGE_SIZE_MAX}")
        return body_size, hend + 1

    def _bodies(self, data, b: int, n: int, body_size: int) -> tuple[bytes, int] | None:
        """Collect body frames from b until body_size bytes; None if they are not all here."""
        if body_size == 0:
            return b"", b
        if n - b >= 8:
            ftype, _, size = _frame_header.unpack_from(data, b)
            if ftype == FRAME_BODY and size == body_size:
                end = b + 7 + size
                if end < n:
                    if data[end] != FRAME_END:
                        raise ProtocolError("frame-end octet missing after a body frame")
                    return bytes(data[b + 7:end]), end + 1
                return None
        parts = []
        got = 0
        while got < body_size:
            if n - b < 8:
                return None
            ftype, _, size = _frame_header.unpack_from(data, b)
            if ftype != FRAME_BODY:
                raise ProtocolError(f"expected a content body frame, got type {ftype}")
            end = b + 7 + size
            if end >= n:
                return None
            if data[end] != FRAME_END:
                raise ProtocolError("frame-end octet missing after a body frame")
            parts.append(data[b + 7:end])
            got += size
            b = end + 1
        if got != body_size:
            raise ProtocolError(f"body frames carry {got} bytes, the header announced {body_size}")
        return b"".join(parts), b

    def _on_deliver(self, data, p: int, h: int, n: int, ch: int) -> int:
        """basic.deliver at method payload offset p (after class/method ids); content at h."""
        content = self._content(data, h, n)
        if content is None:
            return -1
        body_size, b = content
        got = self._bodies(data, b, n, body_size)
        if got is None:
            return -1
        body, nxt = got
        tl = data[p]
        ctag = bytes(data[p + 1:p + 1 + tl])
        tag, redelivered = _deliver_tail.unpack_from(data, p + 1 + tl)
        channel = self._channels.get(ch)
        if channel is not None:
            cb = channel._consumers.get(ctag)
            if cb is not None:
                cb(tag, bool(redelivered & 1), body)
        return nxt

    def _on_return(self, data, pos: int, h: int, n: int, ch: int) -> int:
        content = self._content(data, h, n)
        if content is None:
            return -1
        body_size, b = content
        got = self._bodies(data, b, n, body_size)
        if got is None:
            return -1
        body, nxt = got
        _, _, method = frame.unmarshal(bytes(data[pos:h]))
        channel = self._channels.get(ch)
        if channel is not None and channel.on_return is not None:
            channel.on_return(method.reply_code, method.reply_text, body)
        return nxt

    def _on_slow_frame(self, raw: bytes, ch: int) -> None:
        _, _, method = frame.unmarshal(raw)
        if isinstance(method, heartbeat.Heartbeat):
            return
        if ch == 0:
            self._on_connection_method(method)
            return
        channel = self._channels.get(ch)
        if channel is None:
            if isinstance(method, commands.Channel.CloseOk):
                return
            raise ProtocolError(f"{method.name} on channel {ch}, which is not open")
        channel._on_method(method)

    # -- closing ---------------------------------------------------------------------------

    def _close_error(self) -> Exception:
        if self.closed.done() and not self.closed.cancelled():
            exc = self.closed.exception()
            if exc is not None:
                return exc
        return ConnectionClosed(320, "connection closed")

    def _fail_protocol(self, e: Exception) -> None:
        if isinstance(e, ProtocolError) and self.transport is not None and not self.transport.is_closing():
            self._out += frame.marshal(commands.Connection.Close(501, f"FRAME_ERROR - {e}"[:255], 0, 0), 0)
            self._flush()
        self._lost(e if isinstance(e, AMQPError) else ConnectionClosed(501, str(e)))
        if self.transport is not None:
            self.transport.close()

    def _lost(self, exc: Exception) -> None:
        if self.closed.done():
            return
        self.closed.set_exception(exc)
        self.closed.exception()  # mark retrieved: a lost connection is reported through on_lost
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if not self._handshake.done():
            self._handshake.set_exception(exc)
            self._handshake.exception()  # connect() re-raises it; nobody else has to look
        for channel in list(self._channels.values()):
            channel._closed(exc if isinstance(exc, AMQPError) else ConnectionClosed(320, str(exc)))
        for fut in (self._writable, self._unblocked, self._close_ok):
            if fut is not None and not fut.done():
                fut.set_result(None)
        if self.on_lost is not None:
            self.on_lost(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc or ConnectionClosed(320, f"connection to {self.endpoint} lost"))
        self.transport = None


def _negotiate(server: int, client: int) -> int:
    """AMQP tune rule: 0 means 'no limit' on either side; otherwise the lower value wins."""
    if server == 0 or client == 0:
        return max(server, client)
    return min(server, client)

