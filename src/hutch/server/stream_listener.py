"""The stream protocol's listener (port 5552, `stream.listeners.tcp.default`): sockets to
`StreamConnection` (the protocol) and `StreamSession` (what its commands do), with a timer per
connection for heartbeats and handshake timeouts. It makes no protocol decisions of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from hutch import __version__
from hutch.broker.streamsession import StreamSession
from hutch.streamproto import connection as sc

log = logging.getLogger("hutch.stream")


class StreamProtocol(asyncio.Protocol):
    """One stream-protocol client connection."""

    def __init__(self, listener: StreamListener):
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.conn: sc.StreamConnection | None = None
        self.session: StreamSession | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.peer = ""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"
        b = self.listener.broker
        cfg = b.config
        self.conn = sc.StreamConnection(sc.server_properties(__version__, cfg.cluster_name or cfg.node_name),
                                        frame_max=cfg.stream_frame_max, heartbeat_s=cfg.stream_heartbeat_s)
        self.session = StreamSession(b, self.conn, str(peer[0]), self.flush, self.pause)
        self.session.name = self.peer
        self.session.addresses = (str(peer[0]), int(peer[1]), str(local[0]), int(local[1]))
        self.listener.protocols.add(self)
        log.info("accepting stream connection (%s)", self.peer)
        self._arm()

    def _arm(self) -> None:
        conn = self.conn
        if conn is not None and not conn.closed:
            self.timer = asyncio.get_running_loop().call_later(conn.tick_interval_s, self._tick)

    def _tick(self) -> None:
        conn = self.conn
        if conn is None or self.session is None:
            return
        for ev in conn.tick(time.monotonic()):
            self.session.handle(ev)
        self.session.tick()
        self.flush()
        self._arm()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        session = self.session
        if conn is None or session is None:
            return
        try:
            for ev in conn.receive_data(data):
                session.handle(ev)
        except Exception:  # a defect in handling one client: that connection ends, the node goes on
            log.exception("stream connection %s: error while handling a command; closing the connection",
                          self.peer)
            session.close()
            conn.close(0x0F, "internal error")  # INTERNAL_ERROR
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        self.flush()

    def flush(self) -> None:
        conn = self.conn
        t = self.transport
        if conn is None or t is None:
            return
        out = conn.data_to_send()
        if out and not t.is_closing():
            t.writelines(out)
        if conn.closed and not t.is_closing():
            t.close()

    def pause(self, on: bool) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if on:
            t.pause_reading()
        else:
            t.resume_reading()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.writable(False)

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.writable(True)
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.session is not None:
            self.session.close()
        self.listener.protocols.discard(self)
        log.info("closing stream connection (%s)", self.peer)
        self.transport = None

    def close(self, code: int, reason: str) -> None:
        if self.conn is not None:
            self.conn.close(code, reason)
            self.flush()
        if self.transport is not None:
            self.transport.close()


class StreamListener:
    """The node's stream-protocol listener and its connections."""

    def __init__(self, broker: Any):
        self.broker = broker
        self.server: asyncio.AbstractServer | None = None
        self.protocols: set[StreamProtocol] = set()

    async def start(self, host: str | None, port: int, backlog: int, listen: Any = None) -> bool:
        """Listen on `port` through `listen` (the node's network, or the running loop)."""
        listen = listen or asyncio.get_running_loop()
        try:
            self.server = await listen.create_server(lambda: StreamProtocol(self), host=host or None, port=port,
                                                     reuse_address=True, backlog=backlog)
        except OSError as e:
            log.error("could not start the stream protocol listener on port %d: %s", port, e)
            return False
        for sock in self.server.sockets:
            addr = sock.getsockname()
            log.info("started stream protocol listener on %s:%s", addr[0], addr[1])
        return True

    @property
    def port(self) -> int:
        if self.server is None or not self.server.sockets:
            return 0
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for p in list(self.protocols):
            p.close(0x0F, "broker forced connection closure with reason 'shutdown'")
        self.server = None
