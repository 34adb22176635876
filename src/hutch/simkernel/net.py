"""In-memory TCP for nodes on a `VirtualLoop`: listeners, connections, delays, cuts and resets.

A `SimNet` joins hosts (named by strings; a host's name is its address) over the kernel's
`Network` of directed FIFO links. Each host gets a `HostNet`, which offers what a node's runtime
asks of asyncio's network — `create_server`, `create_connection`, `start_server`,
`open_connection` — with the same shapes (protocols and transports; stream readers and
writers). Under it:

- bytes written on a connection arrive after a delay drawn from the kernel's `rng` (between
  `delay_min_us` and `delay_max_us`), never ahead of bytes written earlier on the same link;
- a connection is made by a SYN that travels the link (refused when nothing listens on the
  port; lost, so the dialler waits for its own timeout, when the link is cut);
- `cut(a, b)` cuts the link a -> b: every connection between a and b is reset at both ends
  (`connection_lost(ConnectionResetError)`), as a fault proxy or a RST does, and bytes in flight
  are lost; new connections across it are not answered until `restore(a, b)`;
- `close()` delivers what was written, then the end of the stream; `abort()` resets both ends.

Every callback runs on the loop at a time the kernel's clock gives it, in the `contextvars`
context of the host it is delivered to, so log records can say which node they come from, and
`kill_host` (a process crash) can stop all of them at once.
What it must never do: touch a real socket, or draw randomness from anything but the kernel.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

from hutch.simkernel.aioloop import Life, life_var
from hutch.simkernel.kernel import Kernel, Network

STREAM_LIMIT = 2**16  # asyncio's default StreamReader limit
EPHEMERAL_PORT_FIRST = 40000

current_host: contextvars.ContextVar[str] = contextvars.ContextVar("sim_host", default="-")


class _SockName:
    """What `server.sockets` holds for a listener: enough for `getsockname()`."""

    def __init__(self, host: str, port: int) -> None:
        self._addr = (host, port)

    def getsockname(self) -> tuple[str, int]:
        return self._addr


class SimServer:
    """A listener: what `loop.create_server` returns, in the parts hutch uses."""

    def __init__(self, hostnet: HostNet, port: int, factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self.hostnet = hostnet
        self.port = port
        self.factory = factory
        self.sockets = [_SockName(hostnet.host, port)]
        self._serving = True

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        if self._serving:
            self._serving = False
            self.hostnet.net.listeners.pop((self.hostnet.host, self.port), None)

    async def wait_closed(self) -> None:
        return None

    async def __aenter__(self) -> SimServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class SimTransport(asyncio.Transport):
    """One end of an in-memory TCP connection."""

    def __init__(self, net: SimNet, conn: _Conn, local: tuple[str, int], remote: tuple[str, int]) -> None:
        super().__init__()
        self.net = net
        self.conn = conn
        self.local = local
        self.remote = remote
        self.protocol: asyncio.BaseProtocol | None = None
        self.peer: SimTransport | None = None
        self.closing = False  # close() or abort() was called here
        self.lost = False  # connection_lost has been called (or is scheduled)
        self.paused = False
        self.held: list[bytes] = []  # data received while reading is paused
        self.eof_held = False

    # -- asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.remote, "sockname": self.local}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing or self.lost

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing() or not data:
            return
        self.net.send(self, ("data", bytes(data)))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if not self.paused:
            return
        self.paused = False
        self._flush_held()

    def _flush_held(self) -> None:
        held, self.held = self.held, []
        for data in held:
            if not self.lost:
                self.protocol.data_received(data)
        if self.eof_held and not self.lost:
            self.eof_held = False
            self._eof()

    def is_reading(self) -> bool:
        return not self.paused

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def close(self) -> None:
        """Orderly close: what was written arrives, then the end of the stream."""
        if self.is_closing():
            return
        self.closing = True
        self.net.send(self, ("fin", None))
        self._lose(None)

    def abort(self) -> None:
        """Reset: the peer's end is reset once the RST arrives; bytes not yet delivered are lost."""
        if self.lost:
            return
        self.closing = True
        self.net.send(self, ("rst", None))
        self._lose(None)

    # -- deliveries (called by SimNet)

    def _receive(self, kind: str, data: bytes | None) -> None:
        if self.lost:
            return
        if kind == "data":
            if self.paused or self.protocol is None:
                self.held.append(data)
            else:
                self.protocol.data_received(data)
        elif kind == "fin":
            if self.paused or self.protocol is None:
                self.eof_held = True
            else:
                self._eof()
        else:  # rst
            self._lose(ConnectionResetError(104, "Connection reset by peer"))

    def _eof(self) -> None:
        keep_open = self.protocol.eof_received() if isinstance(self.protocol, asyncio.Protocol) else None
        if not keep_open:
            self.closing = True
            self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        if self.protocol is None:
            return  # a dialler's end not yet established: `_established` sees `lost` and fails the dial
        self.net.loop.call_soon(self.protocol.connection_lost, exc, context=self.net.context(self.local[0]))


class _Conn:
    """The two ends of one connection, for cuts to find."""

    __slots__ = ("a", "b", "client", "server")

    def __init__(self, client: str, server: str) -> None:
        self.client = client
        self.server = server
        self.a: SimTransport | None = None
        self.b: SimTransport | None = None


class SimNet:
    """Hosts joined by the kernel's FIFO links, with seeded delays."""

    def __init__(self, kernel: Kernel, loop: asyncio.AbstractEventLoop, delay_min_us: int = 100,
                 delay_max_us: int = 2000, trace_bytes: bool = False) -> None:
        self.kernel = kernel
        self.loop = loop
        self.network = Network()
        self.delay_min_us = delay_min_us
        self.delay_max_us = delay_max_us
        self.trace_bytes = trace_bytes
        self.listeners: dict[tuple[str, int], SimServer] = {}
        self.conns: list[_Conn] = []
        self._contexts: dict[str, contextvars.Context] = {}
        self._next_port: dict[str, int] = {}
        self.hosts: dict[str, HostNet] = {}

    def host(self, name: str) -> HostNet:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = HostNet(self, name)
        return h

    def context(self, host: str) -> contextvars.Context:
        ctx = self._contexts.get(host)
        if ctx is None:
            ctx = contextvars.Context()
            ctx.run(current_host.set, host)
            ctx.run(life_var.set, Life(host))
            self._contexts[host] = ctx
        return ctx

    def kill_host(self, host: str) -> None:
        """The host's process dies: its callbacks stop (`VirtualLoop.kill`), its connections are
        reset at the other end, its listeners vanish; the next `context(host)` is a new life."""
        self.reset_host(host)  # the dead end's callbacks are scheduled in its old life, and die with it
        ctx = self._contexts.pop(host, None)
        if ctx is not None:
            self.loop.kill(ctx[life_var])

    def ephemeral_port(self, host: str) -> int:
        port = self._next_port.get(host, EPHEMERAL_PORT_FIRST)
        self._next_port[host] = port + 1
        return port

    # -- links

    def _arrival_s(self, src: str, dst: str) -> float | None:
        """When something sent now from src reaches dst, or None if the link is cut."""
        if src == dst:
            return self.kernel.now / 1e6
        link = self.network.link(src, dst)
        if link.blocked:
            return None
        delay = self.kernel.rng.randint(self.delay_min_us, self.delay_max_us)
        # strictly after everything sent before on the link: equal due times would leave the
        # order to the loop's heap
        t = max(self.kernel.now + delay, link.last_us + 1)
        link.last_us = t
        return t / 1e6

    def send(self, t: SimTransport, item: tuple[str, bytes | None]) -> None:
        peer = t.peer
        if peer is None or peer.lost:
            return
        when = self._arrival_s(t.local[0], peer.local[0])
        if when is None:  # cut since: the connection is being reset anyway
            return
        kind, data = item
        if self.trace_bytes:
            self.kernel.log(f"net {t.local[0]}:{t.local[1]} -> {peer.local[0]}:{peer.local[1]} {kind} "
                            f"{len(data) if data else 0}")
        self.loop.call_at(when, peer._receive, kind, data, context=self.context(peer.local[0]))

    def cut(self, a: str, b: str) -> None:
        """Cut the link a -> b; every connection between a and b is reset at both ends."""
        link = self.network.link(a, b)
        if link.blocked:
            return
        link.blocked = True
        link.epoch += 1
        self.kernel.log(f"net cut {a} -> {b}")
        for conn in list(self.conns):
            if {conn.client, conn.server} == {a, b}:
                self._reset(conn)

    def restore(self, a: str, b: str) -> None:
        link = self.network.link(a, b)
        if not link.blocked:
            return
        link.blocked = False
        link.epoch += 1
        self.kernel.log(f"net restore {a} -> {b}")

    def set_cut(self, cut: set[tuple[str, str]]) -> None:
        """Exactly the directed links in `cut` are cut (a partition); the others are restored."""
        for (a, b), link in sorted(self.network.links.items()):
            if link.blocked and (a, b) not in cut:
                self.restore(a, b)
        for a, b in sorted(cut):
            self.cut(a, b)

    def reset_host(self, host: str) -> None:
        """Every connection of a host is reset at both ends (its process died)."""
        for conn in list(self.conns):
            if host in (conn.client, conn.server):
                self._reset(conn)
        for key in [k for k in self.listeners if k[0] == host]:
            self.listeners.pop(key).close()

    def _reset(self, conn: _Conn) -> None:
        self.conns.remove(conn)
        for t in (conn.a, conn.b):
            if t is not None and not t.lost:
                t.closing = True
                t._lose(ConnectionResetError(104, "Connection reset by peer"))

    # -- connecting

    async def connect(self, src: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
                      port: int) -> tuple[SimTransport, asyncio.BaseProtocol]:
        loop = self.loop
        syn = self._arrival_s(src, host)
        fut: asyncio.Future = loop.create_future()
        local = (src, self.ephemeral_port(src))
        conn = _Conn(src, host)

        def accept() -> None:
            server = self.listeners.get((host, port))
            back = self._arrival_s(host, src)
            if back is None:
                return  # the answer is lost: the dialler times out
            if server is None or not server.is_serving():
                loop.call_at(back, _refused, context=self.context(src))
                return
            a = SimTransport(self, conn, local, (host, port))
            b = SimTransport(self, conn, (host, port), local)
            a.peer, b.peer = b, a
            conn.a, conn.b = a, b
            self.conns.append(conn)
            loop.call_at(back, _established, a, context=self.context(src))  # ahead of anything b writes
            proto_b = server.factory()
            b.protocol = proto_b
            proto_b.connection_made(b)

        def _refused() -> None:
            if not fut.done():
                fut.set_exception(ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})"))

        def _established(a: SimTransport) -> None:
            if fut.cancelled() or a.lost:
                a.closing = True
                a.net.send(a, ("rst", None))
                a.lost = True
                if conn in self.conns:
                    self.conns.remove(conn)
                if not fut.done():
                    fut.set_exception(ConnectionResetError(104, "Connection reset by peer"))
                return
            proto = factory()
            a.protocol = proto
            proto.connection_made(a)
            fut.set_result((a, proto))
            if not a.paused:
                a._flush_held()

        if syn is not None:  # a SYN across a cut link is never answered
            loop.call_at(syn, accept, context=self.context(host))
        return await fut


class HostNet:
    """One host's view of the network: asyncio's connection functions, in memory."""

    def __init__(self, net: SimNet, host: str) -> None:
        self.net = net
        self.host = host

    async def create_server(self, factory: Callable[[], asyncio.BaseProtocol], host: str | None = None,
                            port: int = 0, **_options: Any) -> SimServer:
        if not port:
            port = self.net.ephemeral_port(self.host)
        key = (self.host, port)
        if key in self.net.listeners:
            raise OSError(98, f"[Errno 98] error while attempting to bind on address ('{self.host}', {port}): "
                              "address already in use")
        server = SimServer(self, port, factory)
        self.net.listeners[key] = server
        return server

    async def create_connection(self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                                **_options: Any) -> tuple[SimTransport, asyncio.BaseProtocol]:
        return await self.net.connect(self.host, factory, host, port)

    async def start_server(self, client_connected_cb: Callable, host: str | None = None, port: int = 0,
                           limit: int = STREAM_LIMIT, **options: Any) -> SimServer:
        loop = self.net.loop

        def factory() -> asyncio.StreamReaderProtocol:
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            return asyncio.StreamReaderProtocol(reader, client_connected_cb, loop=loop)
        return await self.create_server(factory, host, port, **options)

    async def open_connection(self, host: str, port: int, limit: int = STREAM_LIMIT,
                              **options: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = self.net.loop
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await self.create_connection(lambda: protocol, host, port, **options)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


__all__ = ["HostNet", "SimNet", "SimServer", "SimTransport", "current_host"]
