"""A TCP fault proxy for one directed peer link: the lab's way to break the network on purpose.

The lab points node A's address for node B at a ``FaultProxy`` that forwards to B's real peer
port, then breaks that link on command:

- ``partition(mode="reset")``: every open connection is cut with a TCP reset and new ones are
  reset as soon as they arrive — the peer sees the failure at once;
- ``partition(mode="blackhole")``: connections stay open but nothing passes and new ones get
  no answer past the TCP handshake — the peer only finds out through its own timeouts
  (net_ticktime), as with a pulled cable. Bytes are held, not dropped, as TCP would retransmit
  them: if the link heals before either end gives up, the streams continue intact;
- ``delay(ms)``: every chunk is held ``ms`` milliseconds before it is forwarded (order kept);
- ``heal()``: back to forwarding.

It is a plain TCP proxy: it knows nothing of hutch's protocols and imports none of the node's
insides. Every task and socket it opens is closed by ``close()``. Buffers are bounded: a
direction with ``chunks_in_flight_max`` chunks awaiting their delay stops reading (TCP
backpressure does the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time

log = logging.getLogger("hutch.lab.proxy")

READ_SIZE = 64 * 1024

MODES = ("reset", "blackhole")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN (SO_LINGER 0), as a middlebox dropping the flow would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, listen_port: int, target_host: str, target_port: int, *,
                 listen_host: str = "127.0.0.1", chunks_in_flight_max: int = 1024,
                 connect_timeout_s: float = 5.0):
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.chunks_in_flight_max = chunks_in_flight_max
        self.connect_timeout_s = connect_timeout_s
        self.delay_ms = 0.0
        self.mode: str | None = None  # None when healed, else the partition mode
        self.connections_accepted = 0
        self.bytes_forwarded = 0
        self._open = asyncio.Event()
        self._open.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None

    @property
    def connections_open(self) -> int:
        """Client connections currently held open by the proxy."""
        return sum(1 for t in self._tasks if t.get_name().startswith("proxy-conn"))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def partition(self, mode: str = "reset") -> None:
        if mode not in MODES:
            raise ValueError(f"partition mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self._open.clear()
        log.info("proxy :%d -> %s:%d partitioned (%s)", self.listen_port, self.target_host,
                 self.target_port, mode)
        if mode == "reset":
            for writer in list(self._writers):
                _reset(writer)

    def heal(self) -> None:
        self.mode = None
        self._open.set()
        log.info("proxy :%d -> %s:%d healed", self.listen_port, self.target_host, self.target_port)

    def delay(self, ms: float) -> None:
        if ms < 0:
            raise ValueError("delay must be >= 0 ms")
        self.delay_ms = float(ms)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Run each connection in a task of our own, so close() can cancel and await it.
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer),
                                                      name=f"proxy-conn:{self.listen_port}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.mode == "reset":
                _reset(writer)
                return
            await self._open.wait()  # a blackholed link answers nothing until healed
            async with asyncio.timeout(self.connect_timeout_s):
                up_reader, upstream = await asyncio.open_connection(self.target_host, self.target_port)
            self._writers.add(upstream)
            if self.mode == "reset":
                return
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pipe(reader, upstream))
                tg.create_task(self._pipe(up_reader, writer))
        except (OSError, TimeoutError, ExceptionGroup):
            pass  # the link is broken; both ends are closed below
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.chunks_in_flight_max)

        async def read() -> None:
            while True:
                await self._open.wait()
                data = await reader.read(READ_SIZE)
                # The system clock, not the loop's: uvloop's loop time is cached per iteration in
                # whole milliseconds, which would let a chunk go up to a millisecond early.
                await chunks.put((time.monotonic(), data))
                if not data:
                    return

        async def write() -> None:
            while True:
                read_at_s, data = await chunks.get()
                release_s = read_at_s + self.delay_ms / 1000.0
                # A timer may fire a little before its deadline (uvloop rounds to milliseconds):
                # sleep again until the whole delay has passed.
                while (wait_s := release_s - time.monotonic()) > 0:
                    await asyncio.sleep(wait_s)
                await self._open.wait()
                if not data:
                    # Half-close: pass the FIN on, then the whole connection ends.
                    raise ConnectionResetError("peer closed")
                writer.write(data)
                self.bytes_forwarded += len(data)
                await writer.drain()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(read())
            tg.create_task(write())
