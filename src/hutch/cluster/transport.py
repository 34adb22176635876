"""The peer transport: one authenticated TCP connection per pair of nodes, multiplexed by group.

Every node listens on its peer port and dials each peer it knows of (addresses come from the
caller, so the lab can route a link through a fault proxy). A connection is usable once the
mutual challenge handshake of ``wire.py`` has shown that both ends know the cluster secret.
At most one connection per pair is kept, decided during the handshake by the listener:

- while we are dialling a peer that dials us, the connection dialled by the lower node name
  wins (the other is refused with "simultaneous connect" and its dialler backs off);
- a peer that reconnects while we still hold a link to it either restarted (its incarnation
  changed) or has given the link up (it says it saw our current link): the old link is
  stale, is reported down and is replaced; any other duplicate is refused.

Liveness follows Erlang distribution: heartbeat frames go out every ``net_ticktime/4`` (more
often when the adaptive detector wants them, every 100 ms by default), and a peer from which
nothing at all arrived for ``net_ticktime_s`` is down — logged as RabbitMQ does, "node X down:
net_tick_timeout". The phi-accrual ``FailureDetector`` fed by those heartbeats only reports
suspicion (``on_peer_suspected``), in seconds, for the Raft layers; it never closes a link.

Sends are batched: frames queued to one peer during a loop iteration leave in one write.
Nothing is resent across connections: a message queued on a link that dies is lost, and the
layers above (Raft, GM) recover it. Messages on one link arrive in the order they were sent,
so order holds per (peer, group) while the link lives.

All tasks are owned by the transport; ``close()`` cancels and awaits them and closes every
socket.

Sockets come from ``network``: anything with asyncio's ``start_server`` and ``open_connection``;
the asyncio module itself by default, an in-memory network (hutch.simkernel.net) in simulation.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets as _secrets
from collections.abc import Callable, Mapping
from typing import Any

from hutch.cluster.detector import FailureDetector
from hutch.cluster.wire import (
    FRAME_SIZE_MAX_DEFAULT,
    Group,
    HandshakeFailed,
    HandshakeRefused,
    Heartbeat,
    MalformedMessage,
    Message,
    PeerCodec,
    PeerProtocolError,
    PeerUp,
    PeerVerified,
)

log = logging.getLogger("hutch.cluster.transport")

READ_SIZE = 256 * 1024

OnMessage = Callable[[str, Group, Any], None]
OnPeerUp = Callable[[str], None]
OnPeerDown = Callable[[str, str], None]
OnPeerSuspected = Callable[[str, bool], None]


class _Link:
    """An established, authenticated connection to one peer."""

    def __init__(self, transport: PeerTransport, peer: str, incarnation: int, number: int, dialled_by: str,
                 codec: PeerCodec, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, now_s: float,
                 detector: FailureDetector):
        self.transport = transport
        self.peer = peer
        self.incarnation = incarnation
        self.number = number
        self.dialled_by = dialled_by
        self.codec = codec
        self.reader = reader
        self.writer = writer
        self.last_recv_s = now_s
        self.detector = detector
        self.suspected = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.flush_scheduled = False
        self.closed = asyncio.Event()
        self.reader_task: asyncio.Task | None = None

    def queue(self, frame: bytes, *more: bytes) -> None:
        """Queue a frame (in parts, when `more`: they are written one after the other)."""
        self.pending.append(frame)
        self.pending_bytes += len(frame)
        for part in more:
            self.pending.append(part)
            self.pending_bytes += len(part)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.closed.is_set() or not self.pending:
            return
        if self.writer.transport.is_closing():  # the link is going down: its reader reports it
            self.pending.clear()
            self.pending_bytes = 0
            return
        pending, self.pending = self.pending, []
        self.pending_bytes = 0
        # one gathered write (the event loop's writelines), not a joined copy of every frame
        self.writer.writelines(pending)
        self.transport.writes += 1

    def buffered_bytes(self) -> int:
        return self.pending_bytes + self.writer.transport.get_write_buffer_size()


class PeerTransport:
    def __init__(self, node_name: str, listen_host: str, listen_port: int, secret: bytes | str, *,
                 peers: Mapping[str, tuple[str, int]] | None = None, net_ticktime_s: float = 60.0,
                 on_message: OnMessage | None = None, on_peer_up: OnPeerUp | None = None,
                 on_peer_down: OnPeerDown | None = None, on_peer_suspected: OnPeerSuspected | None = None,
                 heartbeat_interval_s: float = 0.1, detector_threshold: float = 8.0,
                 detector_acceptable_pause_ms: float = 1000.0,
                 frame_size_max: int = FRAME_SIZE_MAX_DEFAULT, send_buffer_max_bytes: int = 64 * 1024 * 1024,
                 reconnect_backoff_min_s: float = 0.05, reconnect_backoff_max_s: float = 2.0,
                 handshake_timeout_s: float | None = None, network: Any = asyncio):
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if net_ticktime_s <= 0:
            raise ValueError("net_ticktime_s must be positive")
        self.node_name = node_name
        self.network = network  # start_server / open_connection
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.net_ticktime_s = net_ticktime_s
        self.tick_interval_s = min(net_ticktime_s / 4, heartbeat_interval_s)
        self.handshake_timeout_s = handshake_timeout_s or min(10.0, net_ticktime_s)
        self.frame_size_max = frame_size_max
        self.send_buffer_max_bytes = send_buffer_max_bytes
        self.reconnect_backoff_min_s = reconnect_backoff_min_s
        self.reconnect_backoff_max_s = reconnect_backoff_max_s
        self.incarnation = _secrets.randbits(63) | 1
        self.writes = 0  # socket writes of data, for tests of batching
        self._secret = secret
        self._peers: dict[str, tuple[str, int]] = dict(peers or {})
        self._on_message = on_message
        self._on_peer_up = on_peer_up
        self._on_peer_down = on_peer_down
        self._on_peer_suspected = on_peer_suspected
        self._detector_args = {"threshold": detector_threshold,
                               "heartbeat_interval_ms": self.tick_interval_s * 1000.0,
                               "acceptable_pause_ms": detector_acceptable_pause_ms}
        self._links: dict[str, _Link] = {}
        self._dialling: dict[str, asyncio.Task] = {}
        self._last_link: dict[str, tuple[int, int]] = {}  # peer -> (its incarnation, last link number)
        self._dial_loops: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._dial_failure_logged: dict[str, str] = {}
        self._server: asyncio.Server | None = None
        self._closing = False

    # -- public API --------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await self.network.start_server(self._accept, self.listen_host, self.listen_port)
        self._spawn(self._ticker(), "ticker")
        for peer in self._peers:
            self._start_dialling(peer)

    def isolate(self) -> None:
        """Close every link and accept or dial no more, at once (`close` finishes the job): peers
        see this node go as after a crash; this node reports no peer down."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in [*self._dial_loops.values(), *self._dialling.values()]:
            task.cancel()
        for link in list(self._links.values()):
            self._forget(link)

    async def close(self) -> None:
        self.isolate()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> PeerTransport:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_peers(self, peers: Mapping[str, tuple[str, int]]) -> None:
        """Replace the address book; new peers are dialled, removed ones no longer are."""
        self._peers = dict(peers)
        for peer in list(self._dial_loops):
            if peer not in self._peers:
                self._dial_loops.pop(peer).cancel()
        for peer in self._peers:
            self._start_dialling(peer)

    def send(self, peer: str, group: Group, payload: Any) -> bool:
        """Queue one message for a peer; False (dropped) if the peer is not up or is too far behind.

        Raises FrameTooLarge when the encoded message exceeds frame_size_max.
        """
        link = self._links.get(peer)
        if link is None:
            return False
        parts = link.codec.encode_parts(group, payload)
        size = sum(map(len, parts))
        if link.buffered_bytes() + size > self.send_buffer_max_bytes:
            log.warning("Dropping a message to node %s: %d bytes already buffered (limit %d)",
                        peer, link.buffered_bytes(), self.send_buffer_max_bytes)
            return False
        link.queue(*parts)
        return True

    def flush(self) -> None:
        """Write what is queued for every peer now rather than at the end of the loop's
        iteration (for a caller that knows nothing more is coming this iteration that could
        share the write, and that the peers wait for it)."""
        for link in self._links.values():
            if link.pending:
                link.flush()

    def is_up(self, peer: str) -> bool:
        return peer in self._links

    @property
    def up_peers(self) -> list[str]:
        return sorted(self._links)

    def is_suspected(self, peer: str) -> bool:
        link = self._links.get(peer)
        return link is None or link.detector.is_suspected(asyncio.get_running_loop().time())

    def link_info(self, peer: str) -> dict[str, Any] | None:
        link = self._links.get(peer)
        if link is None:
            return None
        return {"peer": peer, "dialled_by": link.dialled_by, "link": link.number,
                "incarnation": link.incarnation}

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    # -- tasks -------------------------------------------------------------------------------

    def _spawn(self, coro: Any, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.node_name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if ":connect:" in task.get_name():
            return  # a dial attempt: the dial loop that awaits it handles and logs its failure
        if not task.cancelled() and task.exception() is not None:
            log.error("Peer transport task %s failed", task.get_name(), exc_info=task.exception())

    def _start_dialling(self, peer: str) -> None:
        if peer == self.node_name or self._closing:
            return
        loop_task = self._dial_loops.get(peer)
        if loop_task is None or loop_task.done():
            self._dial_loops[peer] = self._spawn(self._dial_loop(peer), f"dial:{peer}")

    async def _dial_loop(self, peer: str) -> None:
        backoff_s = self.reconnect_backoff_min_s
        while not self._closing:
            link = self._links.get(peer)
            if link is not None:
                await link.closed.wait()
                backoff_s = self.reconnect_backoff_min_s
                continue
            attempt = self._spawn(self._dial_once(peer), f"connect:{peer}")
            self._dialling[peer] = attempt
            try:
                await attempt
                backoff_s = self.reconnect_backoff_min_s
                self._dial_failure_logged.pop(peer, None)
                continue
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                # Abandoned: the peer's own connection to us was accepted instead.
                continue
            except (OSError, TimeoutError, PeerProtocolError, ConnectionError) as e:
                self._log_dial_failure(peer, e)
            finally:
                if self._dialling.get(peer) is attempt:
                    del self._dialling[peer]
            await asyncio.sleep(backoff_s * random.uniform(0.5, 1.0))
            backoff_s = min(backoff_s * 2, self.reconnect_backoff_max_s)

    def _log_dial_failure(self, peer: str, e: BaseException) -> None:
        if isinstance(e, HandshakeRefused):
            if e.reason in ("simultaneous connect", "already connected"):
                return
            message = f"Connection to node {peer} refused: {e.reason}"
        elif isinstance(e, PeerProtocolError):
            message = str(e)
        elif isinstance(e, TimeoutError):
            message = f"Connection to node {peer} timed out"
        else:
            message = f"Could not connect to node {peer}: {e!r}"
        # Log a failure once per streak of identical failures, not every backoff round.
        if self._dial_failure_logged.get(peer) != message:
            self._dial_failure_logged[peer] = message
            level = logging.WARNING if isinstance(e, PeerProtocolError) else logging.INFO
            log.log(level, "%s", message)

    async def _dial_once(self, peer: str) -> None:
        host, port = self._peers[peer]
        seen_incarnation, seen_link = self._last_link.get(peer, (0, 0))
        codec = PeerCodec(self.node_name, self._secret, "dialler", incarnation=self.incarnation,
                          expected_peer=peer, seen_incarnation=seen_incarnation, seen_link=seen_link,
                          frame_size_max=self.frame_size_max)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                reader, writer = await self.network.open_connection(host, port)
                writer.write(codec.data_to_send())
                up: PeerUp | None = None
                events: list = []
                while up is None:
                    data = await reader.read(READ_SIZE)
                    if not data:
                        raise ConnectionError(f"node {peer} closed the connection during the handshake")
                    events = codec.feed(data)
                    out = codec.data_to_send()
                    if out:
                        writer.write(out)
                    for i, event in enumerate(events):
                        if isinstance(event, PeerUp):
                            up, events = event, events[i + 1:]
                            break
        except BaseException:
            if writer is not None:
                writer.transport.abort()
            raise
        # From here to registration nothing awaits, so the decision cannot be overtaken.
        if self._closing:  # isolated while the handshake ran
            writer.transport.abort()
            raise ConnectionError(f"not linking to node {peer}: this node is shutting down")
        if peer in self._links:
            writer.transport.abort()
            raise PeerProtocolError(f"node {peer} accepted a second connection", peer)
        self._last_link[peer] = (up.incarnation, up.link)
        link = self._register(peer, up.incarnation, up.link, self.node_name, codec, reader, writer)
        self._dispatch(link, events)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closing:
            writer.transport.abort()
            return
        self._tasks.add(task)
        try:
            await self._handshake_incoming(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        finally:
            self._tasks.discard(task)

    async def _handshake_incoming(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        codec = PeerCodec(self.node_name, self._secret, "listener", incarnation=self.incarnation,
                          frame_size_max=self.frame_size_max)
        verified: PeerVerified | None = None
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                while verified is None:
                    data = await reader.read(READ_SIZE)
                    if not data:
                        writer.transport.abort()
                        return
                    events = codec.feed(data)
                    out = codec.data_to_send()
                    if out:
                        writer.write(out)
                    verified = next((e for e in events if isinstance(e, PeerVerified)), None)
        except HandshakeFailed as e:
            log.warning("%s", e)
            writer.write(codec.data_to_send())  # the Refuse frame, if any, tells the dialler why
            writer.close()
            return
        except (PeerProtocolError, OSError, TimeoutError) as e:
            log.info("Incoming peer connection from %s dropped during the handshake: %s",
                     writer.get_extra_info("peername"), e or type(e).__name__)
            writer.transport.abort()
            return
        peer = verified.node
        refusal = self._decide(verified)
        if refusal is not None:
            codec.refuse(refusal)
            writer.write(codec.data_to_send())
            writer.close()
            return
        stored_incarnation, stored_link = self._last_link.get(peer, (0, 0))
        number = max(stored_link if stored_incarnation == verified.incarnation else 0,
                     verified.seen_link if verified.seen_incarnation == self.incarnation else 0) + 1
        codec.accept(number)
        writer.write(codec.data_to_send())
        self._last_link[peer] = (verified.incarnation, number)
        link = self._register(peer, verified.incarnation, number, peer, codec, reader, writer)
        try:
            events = codec.pending_events()
        except PeerProtocolError as e:
            self._link_down(link, str(e))
            return
        self._dispatch(link, events)

    def _decide(self, v: PeerVerified) -> str | None:
        """Accept an authenticated incoming connection (None) or say why it is refused."""
        if self._closing:
            return "shutting down"
        link = self._links.get(v.node)
        if link is not None:
            if link.incarnation != v.incarnation:
                self._link_down(link, "connection_closed (the node restarted)")
            elif v.seen_incarnation == self.incarnation and v.seen_link >= link.number:
                self._link_down(link, "connection_closed (the node reconnected)")
            else:
                return "already connected"
        dial = self._dialling.get(v.node)
        if dial is not None:
            if self.node_name < v.node:
                return "simultaneous connect"
            del self._dialling[v.node]
            dial.cancel()
        return None

    def _register(self, peer: str, incarnation: int, number: int, dialled_by: str, codec: PeerCodec,
                  reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Link:
        assert peer not in self._links, peer
        now = asyncio.get_running_loop().time()
        detector = FailureDetector(**self._detector_args)
        detector.heartbeat(now)
        link = _Link(self, peer, incarnation, number, dialled_by, codec, reader, writer, now, detector)
        self._links[peer] = link
        link.reader_task = self._spawn(self._read_loop(link), f"read:{peer}")
        self._dial_failure_logged.pop(peer, None)
        log.info("node %s up", peer)
        self._callback(self._on_peer_up, peer)
        return link

    async def _read_loop(self, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        reason = "connection_closed"
        try:
            while True:
                data = await link.reader.read(READ_SIZE)
                if not data:
                    break
                link.last_recv_s = loop.time()
                events = link.codec.feed(data)
                self._dispatch(link, events)
                if link.closed.is_set():
                    return
        except PeerProtocolError as e:
            reason = f"protocol error: {e}"
        except OSError as e:
            reason = f"connection_closed ({e.strerror or type(e).__name__})"
        self._link_down(link, reason)

    def _dispatch(self, link: _Link, events: list) -> None:
        now = asyncio.get_running_loop().time()
        for event in events:
            if link.closed.is_set():
                return
            if isinstance(event, Message):
                if self._on_message is None:
                    continue
                try:
                    self._on_message(link.peer, event.group, event.payload)
                except MalformedMessage as e:
                    log.warning("node %s: %s; closing the link", link.peer, e)
                    self._link_down(link, f"protocol error: {e}")
                    return
                except Exception as e:
                    # a message this node cannot handle: whatever sent it, the link is not to be trusted
                    log.error("node %s sent a message on group %r that could not be handled (%s: %s); closing the "
                              "link", link.peer, event.group, type(e).__name__, e, exc_info=True)
                    self._link_down(link, f"protocol error: a message on group {event.group!r} could not be handled")
                    return
            elif isinstance(event, Heartbeat):
                link.detector.heartbeat(now)

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        last_s = loop.time()
        while True:
            await asyncio.sleep(self.tick_interval_s)
            now = loop.time()
            # If this loop was itself stalled (a long GC, a SIGSTOP of this process), the bytes
            # peers sent meanwhile have not been read yet: judge nobody this round.
            stalled = now - last_s > 2 * self.tick_interval_s + 0.1
            last_s = now
            for link in list(self._links.values()):
                if stalled:
                    link.last_recv_s = max(link.last_recv_s, now - self.tick_interval_s)
                    link.detector.reset()
                    link.detector.heartbeat(now)
                elif now - link.last_recv_s > self.net_ticktime_s:
                    self._link_down(link, "net_tick_timeout")
                    continue
                link.queue(link.codec.encode_tick())
                suspected = link.detector.is_suspected(now)
                if suspected != link.suspected:
                    link.suspected = suspected
                    if suspected:
                        log.warning("node %s suspected: no heartbeat for %.0f ms (phi %.1f)", link.peer,
                                    (now - link.last_recv_s) * 1000, link.detector.phi(now))
                    else:
                        log.info("node %s no longer suspected", link.peer)
                    self._callback(self._on_peer_suspected, link.peer, suspected)

    # -- links going away --------------------------------------------------------------------

    def _forget(self, link: _Link) -> bool:
        """Close a link's socket and drop it from the table. True if it was the current link."""
        current = self._links.get(link.peer) is link
        if current:
            del self._links[link.peer]
        if not link.closed.is_set():
            link.closed.set()
            link.writer.transport.abort()
            if link.reader_task is not None and link.reader_task is not asyncio.current_task():
                link.reader_task.cancel()
        return current

    def _link_down(self, link: _Link, reason: str) -> None:
        if self._forget(link) and not self._closing:
            log.warning("node %s down: %s", link.peer, reason)
            self._callback(self._on_peer_down, link.peer, reason)

    def _callback(self, fn: Callable | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            log.exception("Peer transport callback %s failed", getattr(fn, "__name__", fn))
