"""A simulated AMQP 0-9-1 client: real frames, through the in-memory network, into real sessions.

The whole-cluster simulation (hutch.sim.cluster) drives hutch's own session, channel and
routing code the way a client library would: it opens a connection (protocol header, Start-Ok
with PLAIN, Tune-Ok, Open), a channel, and speaks the methods a publisher with confirms and a
consumer with acks use. Frames are encoded and decoded by pamqp, the codec the broker itself
uses for its method table, so what the node receives is byte for byte what a client sends.

It is a test client, small on purpose: one synchronous method at a time per channel, no
automatic recovery (the workload decides what to do when a connection dies), and every wait
bounded by the caller's `asyncio.timeout`. It must never read a real clock or real socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pamqp import body, commands, frame, header, heartbeat
from pamqp.exceptions import UnmarshalingException

READ_SIZE = 65536
CLIENT_PROPERTIES = {
    "product": "hutch-sim",
    "capabilities": {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                     "authentication_failure_close": True},
}


class ClientClosed(Exception):
    """The connection or channel is gone; `reply_code`/`reply_text` say why when the broker said."""

    def __init__(self, reason: str, reply_code: int = 0) -> None:
        super().__init__(reason)
        self.reply_code = reply_code


class SimClient:
    """One AMQP connection with one channel (number 1)."""

    def __init__(self, name: str, on_confirm: Callable[[int, bool, bool], None] | None = None,
                 on_delivery: Callable[[int, bool, Any, bytes], None] | None = None,
                 on_return: Callable[[bytes], None] | None = None) -> None:
        self.name = name
        self.on_confirm = on_confirm  # (delivery tag, multiple, ack?) for publisher confirms
        self.on_delivery = on_delivery  # (delivery tag, redelivered, properties, body)
        self.on_return = on_return  # (body) of a mandatory publish that no queue took
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.closed: ClientClosed | None = None
        self.closed_event = asyncio.Event()
        self._buf = b""
        self._waiting: tuple[tuple[type, ...], asyncio.Future] | None = None
        self._content: list | None = None  # [deliver method, header, body parts, size left]
        self._read_task: asyncio.Task | None = None
        self.publish_seq = 0

    # -- connection

    async def connect(self, network: Any, host: str, port: int, vhost: str = "/") -> None:
        self.reader, self.writer = await network.open_connection(host, port)
        self.writer.write(frame.marshal(header.ProtocolHeader(), 0))
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop(), name=f"{self.name}:read")
        await self._wait_for((commands.Connection.Start,))
        self._send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism="PLAIN",
                                                  response="\0guest\0guest"))
        tune = await self._wait_for((commands.Connection.Tune,))
        self._send(0, commands.Connection.TuneOk(channel_max=tune.channel_max or 16, frame_max=tune.frame_max,
                                                 heartbeat=0))
        await self._rpc(0, commands.Connection.Open(virtual_host=vhost), (commands.Connection.OpenOk,))
        await self._rpc(1, commands.Channel.Open(), (commands.Channel.OpenOk,))

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self._closed(ClientClosed("aborted by the client"))

    async def close(self) -> None:
        if self.closed is None and self._waiting is None:
            self._send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            try:
                await self._wait_for((commands.Connection.CloseOk,))
            except ClientClosed:
                pass
        self.abort()
        if self._read_task is not None:
            self._read_task.cancel()
            await asyncio.gather(self._read_task, return_exceptions=True)

    # -- channel methods

    async def confirm_select(self) -> None:
        await self._rpc(1, commands.Confirm.Select(), (commands.Confirm.SelectOk,))

    async def queue_declare(self, queue: str, durable: bool = True, arguments: dict | None = None,
                            exclusive: bool = False) -> None:
        await self._rpc(1, commands.Queue.Declare(queue=queue, durable=durable, exclusive=exclusive,
                                                  arguments=arguments), (commands.Queue.DeclareOk,))

    async def qos(self, prefetch_count: int) -> None:
        await self._rpc(1, commands.Basic.Qos(prefetch_count=prefetch_count), (commands.Basic.QosOk,))

    async def consume(self, queue: str, arguments: dict | None = None) -> str:
        ok = await self._rpc(1, commands.Basic.Consume(queue=queue, arguments=arguments), (commands.Basic.ConsumeOk,))
        return ok.consumer_tag

    def publish(self, routing_key: str, body_bytes: bytes, properties: commands.Basic.Properties,
                mandatory: bool = False) -> int:
        """Publish on the default exchange; returns the publish sequence number (confirm tag).
        `mandatory`: a message no queue takes comes back (basic.return, before its confirm)."""
        self._check_open()
        self.publish_seq += 1
        out = [frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key, mandatory=mandatory), 1),
               frame.marshal(header.ContentHeader(0, len(body_bytes), properties), 1),
               frame.marshal(body.ContentBody(body_bytes), 1)]
        self.writer.write(b"".join(out))
        return self.publish_seq

    def ack(self, delivery_tag: int) -> None:
        self._send(1, commands.Basic.Ack(delivery_tag=delivery_tag))

    def reject(self, delivery_tag: int, requeue: bool) -> None:
        self._send(1, commands.Basic.Reject(delivery_tag=delivery_tag, requeue=requeue))

    def nack(self, delivery_tag: int, requeue: bool) -> None:
        self._send(1, commands.Basic.Nack(delivery_tag=delivery_tag, requeue=requeue))

    async def cancel(self, consumer_tag: str) -> None:
        await self._rpc(1, commands.Basic.Cancel(consumer_tag=consumer_tag), (commands.Basic.CancelOk,))

    async def get(self, queue: str) -> tuple[int, bool, bytes] | None:
        """basic.get with acknowledgement: (delivery tag, redelivered, body), or None if empty."""
        got = await self._rpc(1, commands.Basic.Get(queue=queue), (_GotMessage, commands.Basic.GetEmpty))
        if isinstance(got, commands.Basic.GetEmpty):
            return None
        return got.ok.delivery_tag, got.ok.redelivered, got.body

    # -- frames

    def _check_open(self) -> None:
        if self.closed is not None:
            raise self.closed

    def _send(self, channel: int, method: Any) -> None:
        self._check_open()
        self.writer.write(frame.marshal(method, channel))

    async def _rpc(self, channel: int, method: Any, replies: tuple[type, ...]) -> Any:
        self._send(channel, method)
        return await self._wait_for(replies)

    async def _wait_for(self, replies: tuple[type, ...]) -> Any:
        self._check_open()
        assert self._waiting is None, "one synchronous method at a time"
        fut = asyncio.get_running_loop().create_future()
        self._waiting = (replies, fut)
        try:
            return await fut
        finally:
            self._waiting = None

    async def _read_loop(self) -> None:
        reason = ClientClosed("connection lost")
        try:
            while True:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                self._buf += data
                while self._buf:
                    try:
                        used, channel, value = frame.unmarshal(self._buf)
                    except UnmarshalingException:
                        break
                    self._buf = self._buf[used:]
                    self._frame(channel, value)
                if self.closed is not None:
                    return
        except ClientClosed as e:
            reason = e
        except (ConnectionError, OSError) as e:
            reason = ClientClosed(f"connection lost: {e}")
        self._closed(reason)

    def _closed(self, reason: ClientClosed) -> None:
        if self.closed is None:
            self.closed = reason
            self.closed_event.set()
        if self._waiting is not None and not self._waiting[1].done():
            self._waiting[1].set_exception(self.closed)

    def _frame(self, channel: int, value: Any) -> None:
        if isinstance(value, heartbeat.Heartbeat):
            return
        if isinstance(value, header.ContentHeader):
            if self._content is not None:
                self._content[1] = value
                self._content[3] = value.body_size
                if value.body_size == 0:
                    self._content_done()
            return
        if isinstance(value, body.ContentBody):
            if self._content is not None:
                self._content[2].append(value.value)
                self._content[3] -= len(value.value)
                if self._content[3] <= 0:
                    self._content_done()
            return
        if isinstance(value, (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)):
            self._content = [value, None, [], 0]
        elif isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
            if self.on_confirm is not None:
                self.on_confirm(value.delivery_tag, value.multiple, isinstance(value, commands.Basic.Ack))
        elif isinstance(value, commands.Channel.Close):
            self.writer.write(frame.marshal(commands.Channel.CloseOk(), channel))
            raise ClientClosed(f"channel closed: {value.reply_code} {value.reply_text}", value.reply_code)
        elif isinstance(value, commands.Connection.Close):
            self.writer.write(frame.marshal(commands.Connection.CloseOk(), 0))
            raise ClientClosed(f"connection closed: {value.reply_code} {value.reply_text}", value.reply_code)
        elif isinstance(value, commands.Basic.Cancel):
            raise ClientClosed(f"consumer cancelled by the broker ({value.consumer_tag})")
        elif self._waiting is not None and isinstance(value, self._waiting[0]):
            if not self._waiting[1].done():
                self._waiting[1].set_result(value)

    def _content_done(self) -> None:
        deliver, head, parts, _ = self._content
        self._content = None
        if isinstance(deliver, commands.Basic.GetOk):
            if self._waiting is not None and not self._waiting[1].done():
                self._waiting[1].set_result(_GotMessage(deliver, b"".join(parts)))
        elif isinstance(deliver, commands.Basic.Return):
            if self.on_return is not None:
                self.on_return(b"".join(parts))
        elif self.on_delivery is not None:
            self.on_delivery(deliver.delivery_tag, deliver.redelivered, head.properties, b"".join(parts))


class _GotMessage:
    """A basic.get-ok with its content, as `get` waits for it."""

    __slots__ = ("ok", "body")

    def __init__(self, ok: commands.Basic.GetOk, body: bytes) -> None:
        self.ok, self.body = ok, body


__all__ = ["ClientClosed", "SimClient"]
