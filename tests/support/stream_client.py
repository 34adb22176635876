"""A stream protocol client for tests, on a plain socket: frames out as
hutch.streamproto.frames encodes them, frames in as it decodes them, so a test sees every frame
as it comes (deliveries, confirms, closes) and can send what no client library would (garbage,
truncated or oversized frames, commands out of order). Every wait has a deadline (the socket's
timeout); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import socket
import uuid
from collections.abc import Iterator

from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f

TIMEOUT_S = 20.0


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------- a raw client


class Raw:
    """A stream protocol client on a plain socket: frames out as hutch.streamproto.frames
    encodes them, frames in as it decodes them; every wait has a deadline."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.decoder = f.FrameDecoder()
        self.inbox: collections.deque = collections.deque()
        self._ids = itertools.count(1)
        self.open_properties: dict[str, str] = {}
        self.eof = False

    def cid(self) -> int:
        return next(self._ids)

    def send(self, *cmds: f.Command) -> None:
        self.sock.sendall(b"".join(f.encode(c) for c in cmds))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self) -> bool:
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.decoder.feed(data)
        for cmd in self.decoder:
            if type(cmd) in (f.Deliver, f.DeliverV2):
                cmd.chunk = bytes(cmd.chunk)
            self.inbox.append(cmd)
        return True

    def recv(self, *types: type) -> f.Command:
        """The next frame (of one of `types`, the others kept for later)."""
        while True:
            for i, cmd in enumerate(self.inbox):
                if not types or type(cmd) in types:
                    del self.inbox[i]
                    return cmd
            if not self._read():
                raise EOFError("the server closed the connection")

    def call(self, cmd: f.Command) -> f.Command:
        self.send(cmd)
        while True:
            for i, got in enumerate(self.inbox):
                if getattr(got, "correlation_id", None) == cmd.correlation_id and got.KEY == cmd.KEY | f.RESPONSE:
                    del self.inbox[i]
                    return got
            if not self._read():
                raise EOFError(f"the server closed the connection instead of answering {cmd!r}")

    def until_closed(self) -> list[f.Command]:
        """Everything the server sends until it closes the socket."""
        while self._read():
            pass
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def handshake(self, vhost: str = "/", user: str = "guest", password: str = "guest",
                  frame_max: int = 1048576, heartbeat_s: int = 0) -> None:
        self.call(f.PeerProperties(self.cid(), {"product": "hutch tests"}))
        assert self.call(f.SaslHandshake(self.cid())).code == f.OK
        auth = self.call(f.SaslAuthenticate(self.cid(), "PLAIN", f"\0{user}\0{password}".encode()))
        assert auth.code == f.OK, auth
        tune = self.recv(f.Tune)
        self.send(f.Tune(min(frame_max, tune.frame_max) if tune.frame_max else frame_max, heartbeat_s))
        opened = self.call(f.Open(self.cid(), vhost))
        assert opened.code == f.OK, opened
        self.open_properties = dict(opened.properties or {})

    def sync(self) -> list[f.Command]:
        """A round trip (a metadata request): what came before its answer."""
        self.call(f.Metadata(self.cid(), []))
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@contextlib.contextmanager
def raw(node, handshake: bool = True) -> Iterator[Raw]:
    c = Raw(node.stream_port)
    try:
        if handshake:
            c.handshake()
        yield c
    finally:
        c.close()


def amqp_body(text: str) -> bytes:
    """An AMQP 1.0 message of one data section, as clients publish it."""
    return amqp10.Message([text.encode()]).encode()


def body_of(record: bytes) -> bytes:
    return amqp10.Message.decode(record).body


def chunk_bodies(chunk: bytes) -> list[bytes]:
    return [body_of(r) for r in chunks.records(chunk)]


def publish_chunks(c: Raw, stream: str, batches: list[list[str]], publisher_id: int = 9) -> None:
    """Each batch in its own publish frame, confirmed before the next goes (one chunk each on
    hutch; RabbitMQ's writer may split a batch over two chunks)."""
    assert c.call(f.DeclarePublisher(c.cid(), publisher_id, "", stream)).code == f.OK
    pid = 0
    for batch in batches:
        msgs = []
        for text in batch:
            pid += 1
            msgs.append((pid, amqp_body(text)))
        c.send(f.Publish(publisher_id, msgs))
        confirmed: set[int] = set()
        while len(confirmed) < len(msgs):
            confirmed.update(c.recv(f.PublishConfirm).publishing_ids)
    assert c.call(f.DeletePublisher(c.cid(), publisher_id)).code == f.OK


def create(c: Raw, stream: str, **arguments: str) -> None:
    assert c.call(f.Create(c.cid(), stream, dict(arguments))).code == f.OK


def read_all(c: Raw, stream: str, count: int, sub: int = 1) -> list[bytes]:
    """`count` message bodies from the start of `stream` (credit granted as chunks come)."""
    assert c.call(f.Subscribe(c.cid(), sub, stream, f.OFFSET_TYPE_FIRST, None, 10)).code == f.OK
    out: list[bytes] = []
    while len(out) < count:
        d = c.recv(f.Deliver, f.DeliverV2)
        out.extend(chunk_bodies(d.chunk))
        c.send(f.Credit(sub, 1))
    assert c.call(f.Unsubscribe(c.cid(), sub)).code == f.OK
    return out


def run(coro):
    async def bounded():
        async with asyncio.timeout(60):
            return await coro
    return asyncio.run(bounded())
