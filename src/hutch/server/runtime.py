"""The asyncio runtime of one node: listeners, sockets, timers; no protocol decisions of its own.

Each client socket gets an `AMQPProtocol` that feeds bytes to its broker `Session` and writes
what the broker hands back. The broker's per-iteration work (`Broker.run`) is scheduled with
`loop.call_soon` at most once per iteration, so every socket gets at most one write per loop
iteration carrying all its frames. Transport flow control maps onto the broker: a socket whose
send buffer passes the high-water mark stops receiving deliveries until it drains, and a blocked
publisher's socket is not read from.

Timers: heartbeats per connection (every heartbeat/2 s), the broker's expiry tick (100 ms while
any queue has a TTL), and the memory check (1 s) that raises and clears the memory alarm.

Two things can be handed in instead of the real ones, for the whole-cluster simulation
(hutch.sim.cluster): the `network` that AMQP listeners and peer links are opened through
(anything with asyncio's `create_server`, `start_server` and `open_connection`; by default the
loop and the asyncio module) and the node's `clock`. The journal's fsync goes through
`loop.run_in_executor`, so a loop that runs it inline runs it inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import time

import psutil
from pamqp import commands

from hutch import __version__
from hutch.amqp import connection as amqp_conn
from hutch.amqp import spec
from hutch.broker.broker import Broker, Config
from hutch.broker.session import CONSUMER_TIMEOUT_CHECK_S, Session, check_consumer_timeouts
from hutch.cluster.raftlog import RaftLogError
from hutch.control import definitions, migrate
from hutch.control.app import API, HttpListener
from hutch.control.node import node_info
from hutch.control.prometheus import MetricsService
from hutch.control.prometheus import default_host as prometheus_host
from hutch.control.sessions import local_listing
from hutch.server import faults, logs, sdnotify
from hutch.server.clock import NodeClock
from hutch.server.cluster_file import CLUSTER_FILE, write_cluster_file
from hutch.server.clustering import ClusterRuntime
from hutch.server.partitions import PAUSING_MODES, pause_reason, should_pause
from hutch.server.stream_listener import StreamListener
from hutch.server.tasks import TaskSet
from hutch.server.worker import WorkerThread

log = logging.getLogger("hutch.node")

EXIT_STORAGE_FAILED = 74  # the node stopped because its storage failed (EX_IOERR)
CLOSE_OK_WAIT_S = 3.0  # a client that started closing gets this long to answer before its socket closes
HEARTBEAT_MIN_INTERVAL_S = 0.25  # heartbeats go out every heartbeat/2 s, never more often than this
BROKER_TICK_S = 0.1  # the broker's expiry and flow-control tick
# The broker's flow control holds publishers back behind consumers only while the node is the
# bottleneck: its process used at least this share of a core over the last LOAD_WINDOW_S.
SATURATED_CPU_SHARE = 0.75
LOAD_WINDOW_S = 0.5
LISTEN_BACKLOG = 1024  # pending connections each AMQP listener queues
LISTENER_CLOSE_WAIT_S = 2.0  # closing listeners: how long to wait for each to finish
SYNC_DRAIN_POLL_S = 0.01  # stop_app: how often to check whether the last fsync returned
SYNC_DRAIN_POLLS = 100  # ... and how many times (a second in all) before closing storage anyway
# The cyclic GC's generation thresholds for a node. A queue's backlog is many small objects that
# live a while (each message and its queue entry): at CPython's (700, 10, 10) every few hundred
# publishes start a young collection that walks them, and their promotions start full
# collections over the whole heap (P1: 0.76 µs of CPU per message in the GC). Young collections
# 14 times rarer, and the middle generation's 5 times, bring that to 0.2 µs; what a collection
# reclaims is cyclic garbage only, which the broker's paths make little of.
GC_THRESHOLDS = (10_000, 50, 10)
# How long a thread waiting for the GIL lets the loop's thread run on before asking for it
# (Python's default 5 ms). The Raft host's fsync thread hands each fsync's result back to the
# loop through the GIL; at 1,000 msg/s on a quorum queue 1 ms gave a narrower confirm tail in
# one series of six alternated pairs and no difference in a later one (docs/performance.md).
GIL_SWITCH_INTERVAL_S = 0.001


class AMQPProtocol(asyncio.Protocol):
    __slots__ = ("node", "transport", "session", "_hb_handle", "_closing", "tls")

    def __init__(self, node: Node, tls: bool = False):
        self.node = node
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self._hb_handle: asyncio.TimerHandle | None = None
        self._closing = False

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        high = self.node.config.socket_write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        cert = None
        if self.tls:
            ssl_obj = transport.get_extra_info("ssl_object")
            cert = ssl_obj.getpeercert() if ssl_obj is not None else None
        s = Session(self.node.broker, f"{peer[0]}:{peer[1]}", f"{local[0]}:{local[1]}", tls=self.tls,
                    peer_cert=cert)
        s.transport_hooks = self
        self.session = s
        self.node.broker.session_opened(s)
        log.info("accepting AMQP connection %s (%s)", id(s), s.name)

    def data_received(self, data: bytes) -> None:
        s = self.session
        s.receive(data)
        state = s.proto.state
        if state == amqp_conn.OPEN:
            if self._hb_handle is None and s.proto.heartbeat_s:
                self._schedule_heartbeat()
            return
        if state == amqp_conn.CLOSED:
            self.close_after_flush()
        elif state == amqp_conn.CLOSING and not self._closing:
            self._closing = True
            self.node.loop.call_later(CLOSE_OK_WAIT_S, self._close_wait_over)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        if self.session is not None:
            self.session.connection_lost()
        self.node.protocols.pop(self, None)

    def pause_writing(self) -> None:
        self.session.writable = False

    def resume_writing(self) -> None:
        self.session.writable = True
        self.node.broker.kick_session(self.session)

    # -- hooks the broker calls

    def write(self, chunks: list[bytes]) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            # one contiguous buffer: far cheaper than handing the transport thousands of pieces
            data = b"".join(chunks)
            self.session.send_oct += len(data)  # the management API's send_oct
            t.write(data)

    def close_after_flush(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        out = self.session.take_output()
        if out:
            t.writelines(out)
        t.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- timers

    def _schedule_heartbeat(self) -> None:
        interval = max(self.session.proto.heartbeat_s / 2, HEARTBEAT_MIN_INTERVAL_S)
        self._hb_handle = self.node.loop.call_later(interval, self._heartbeat)

    def _heartbeat(self) -> None:
        s = self.session
        self._hb_handle = None
        if s.proto.state != amqp_conn.OPEN:
            return
        for ev in s.proto.tick():
            s.handle(ev)
        if s.proto.state == amqp_conn.CLOSED:
            self.abort()
            return
        if s.proto.has_output and not s.output_pending:
            s.output_pending = True
            self.node.broker.output_due(s)
        self._schedule_heartbeat()

    def _close_wait_over(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.close_after_flush()


class AppStateError(Exception):
    """An operation that needs the application stopped (or running) found it otherwise."""


class Node:
    def __init__(self, config: Config, network=None, clock: NodeClock | None = None):
        self.config = config
        self.network = network  # None: real sockets (the loop's create_server, asyncio's streams)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.broker: Broker | None = None
        # the client connections, in the order they were accepted (a set would close them in the
        # order of their addresses, a different order on every run)
        self.protocols: dict[AMQPProtocol, None] = {}
        self.streams: StreamListener | None = None  # the stream protocol's listener
        self.servers: list[asyncio.base_events.Server] = []
        self._stopping: asyncio.Event | None = None
        self.http: HttpListener | None = None  # the management HTTP API
        self.metrics: MetricsService | None = None  # message-rate sampler and Prometheus listener
        self._proc = psutil.Process()
        self.clock = clock or NodeClock()  # the time this node's broker, catalogue and queues share
        self._app_running = False
        self.paused = False  # pause_minority / pause_if_all_down: clients closed until the condition clears
        self._resumes = 0  # resumes begun (only the newest may open the listeners)
        self.clustering = None
        self._tasks = TaskSet("node", log)  # closing and reopening client listeners on pause and resume
        self._total_mem = psutil.virtual_memory().total
        self.exit_code = 0  # set by fail_stop
        # the process's CPU time, to tell the broker whether the node is saturated: a real node's
        # only (a simulated cluster's nodes share one process; their brokers keep `saturated`)
        self._cpu_time = time.process_time if network is None else None
        self._load_mark = (0.0, 0.0)  # (monotonic, CPU) seconds when the window began

    def _schedule_run(self) -> None:
        self.loop.call_soon(self.broker.run)

    def _protocol(self) -> AMQPProtocol:
        p = AMQPProtocol(self)
        self.protocols[p] = None
        return p

    def _tls_protocol(self) -> AMQPProtocol:
        p = AMQPProtocol(self, tls=True)
        self.protocols[p] = None
        return p

    def tls_context(self) -> ssl.SSLContext | None:
        """The AMQPS listener's context, from ssl_options (None when no certificate is set)."""
        cfg = self.config
        if not cfg.tls_certfile or not cfg.tls_keyfile:
            return None
        return server_tls_context(cfg.tls_certfile, cfg.tls_keyfile, cfg.tls_cacertfile, cfg.tls_verify_peer,
                                  cfg.tls_fail_if_no_peer_cert)

    def mgmt_tls_context(self) -> ssl.SSLContext:
        """The management API's HTTPS context, from management.ssl.* (the same options as ssl_options)."""
        cfg = self.config
        return server_tls_context(cfg.mgmt_tls_certfile, cfg.mgmt_tls_keyfile, cfg.mgmt_tls_cacertfile,
                                  cfg.mgmt_tls_verify_peer, cfg.mgmt_tls_fail_if_no_peer_cert, cfg.mgmt_tls_password)

    async def _start_http(self) -> None:
        """The management API's listeners, as rabbitmq_management picks them: plain HTTP unless only
        management.ssl.* is configured, HTTPS when management.ssl.port is set, both when both are."""
        cfg = self.config
        plain = bool(cfg.mgmt_port) and (cfg.mgmt_ssl_port is None or cfg.mgmt_tcp_configured)
        if not plain and cfg.mgmt_ssl_port is None:
            return
        self.http = HttpListener(self.broker)
        self.http.app[API].node_ops = self
        self._wire_node_info()
        if plain:
            for host, port in await self.http.start(cfg.mgmt_host or cfg.amqp_host or None, cfg.mgmt_port):
                log.info("started HTTP listener on %s:%s", host, port)
        if cfg.mgmt_ssl_port is not None:
            bind = cfg.mgmt_ssl_host or cfg.mgmt_host or cfg.amqp_host or None
            for host, port in await self.http.start(bind, cfg.mgmt_ssl_port, self.mgmt_tls_context()):
                log.info("started HTTPS listener on %s:%s", host, port)

    async def _start_metrics(self) -> None:
        """The message-rate sampler, and the Prometheus listener unless prometheus_port is 0. A port
        already taken is logged and the node runs without it (several nodes on one host)."""
        self.metrics = MetricsService(self)
        self.metrics.start_sampling()
        if not self.config.prometheus_port:
            return
        try:
            for host, port in await self.metrics.start(prometheus_host(self.config), self.config.prometheus_port):
                log.info("started Prometheus metrics listener on %s:%s", host, port)
        except OSError as e:
            log.error("Prometheus metrics listener could not start on port %s: %s", self.config.prometheus_port, e)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self._stopping is None:  # a stop asked for during the boot is kept: it runs once booted
            self._stopping = asyncio.Event()
        os.makedirs(self.config.data_dir, exist_ok=True)
        log.info("\n Starting hutch %s on Python %s\n node           : %s\n data dir       : %s\n",
                 __version__, sys.version.split()[0], self.config.node_name, os.path.abspath(self.config.data_dir))
        await self.start_app()
        await self._start_http()
        await self._start_metrics()
        self._baseline_rss = self._proc.memory_info().rss
        self._tick_task = self.loop.call_later(BROKER_TICK_S, self._tick)
        self._mem_task = self.loop.call_later(self.config.memory_check_interval_ms / 1000, self._memory_check)
        self._consumer_timeout_task = self.loop.call_later(CONSUMER_TIMEOUT_CHECK_S, self._consumer_timeout_check)
        self._disk_check()
        log.info("Server startup complete; node %s is ready to accept connections", self.config.node_name)

    # ---------------------------------------------------------------- the application

    @property
    def app_running(self) -> bool:
        return self.broker is not None and self._app_running

    async def start_app(self) -> None:
        """Start the broker proper: the cluster runtime, storage and AMQP listeners (what
        `rabbitmqctl start_app` starts; the HTTP API stays up while the app is stopped)."""
        if self.broker is not None and self._app_running:
            raise AppStateError(f"the hutch application is already running on node {self.config.node_name}")
        if not self.config.cluster_nodes:
            # a standalone node is a cluster of one (joining nodes start that way too)
            self.config.cluster_nodes = [f"{self.config.node_name}:{self.config.peer_port}"]
        self.broker = Broker(self.config, schedule=self._schedule_run, clock_ms=self.clock.now_ms,
                             call_later=self.loop.call_later)
        self._sync_running = False
        self.broker.request_sync = self._request_sync
        if self.http is not None:
            self.http.app[API].broker = self.broker
        # a real node's Raft log is fsynced in a thread of its own (hutch.server.worker)
        worker = WorkerThread("raft-fsync") if self.network is None else None
        self.clustering = ClusterRuntime(self.config, self.broker, self.partition_changed, self.fail_stop,
                                         network=self.network or asyncio, worker=worker)
        await self.clustering.start()
        self._wire_node_info()
        # a catalogue still behind may declare some of this node's queues late: their messages wait
        self.broker.open_storage(self.config.data_dir, keep_unknown=not self.clustering.caught_up)
        if self.config.load_definitions:  # before clients are let in, as RabbitMQ's boot step
            await definitions.load_at_boot(self.broker, self.config.load_definitions)
        await self._open_listeners()
        self._app_running = True

    async def _open_listeners(self) -> None:
        self.servers = []
        listen = self.network or self.loop
        server = await listen.create_server(self._protocol, host=self.config.amqp_host or None,
                                            port=self.config.amqp_port, reuse_address=True, backlog=LISTEN_BACKLOG)
        self.servers.append(server)
        for sock in server.sockets:
            addr = sock.getsockname()
            log.info("started TCP listener on %s:%s", addr[0], addr[1])
        if self.config.stream_port:
            self.streams = StreamListener(self.broker)
            await self.streams.start(self.config.amqp_host, self.config.stream_port, LISTEN_BACKLOG, listen)
        ctx = self.tls_context()
        if ctx is not None:
            tls_server = await listen.create_server(self._tls_protocol, host=self.config.amqp_host or None,
                                                    port=self.config.amqps_port, reuse_address=True,
                                                    backlog=LISTEN_BACKLOG, ssl=ctx)
            self.servers.append(tls_server)
            for sock in tls_server.sockets:
                addr = sock.getsockname()
                log.info("started TLS (SSL) listener on %s:%s", addr[0], addr[1])

    async def _close_clients(self) -> None:
        """Listeners stop and every client connection is closed (stop_app, pause_minority)."""
        if self.streams is not None:
            await self.streams.stop()
            self.streams = None
        for server in self.servers:
            server.close()
        for p in list(self.protocols):
            s = p.session
            if s is not None and s.proto.state == amqp_conn.OPEN:
                s.proto.close(spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'")
                out = s.take_output()
                if out:
                    p.write(out)
        await asyncio.sleep(0)
        for p in list(self.protocols):
            if p.transport is not None:
                p.transport.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), LISTENER_CLOSE_WAIT_S)
        self.servers = []

    def partition_changed(self, up: set[str], members: list[str], partial: bool = False) -> None:
        """pause_minority / pause_if_all_down (hutch.server.partitions): a node that should pause
        closes its clients and AMQP listeners, and opens them again once it should not; the HTTP
        API stays up throughout, so cluster_status can say why. `partial`: pause_minority after a
        partial partition, until every member is reachable again."""
        cfg = self.config
        if cfg.cluster_partition_handling not in PAUSING_MODES or not self._app_running:
            return
        args = (cfg.cluster_partition_handling, cfg.node_name, members, up, cfg.pause_if_all_down_nodes, partial)
        pause = should_pause(*args)
        if pause and not self.paused:
            self.paused = True
            log.warning("Cluster %s status detected (%s): pausing node %s (cluster_partition_handling = %s)",
                        "minority" if cfg.cluster_partition_handling == "pause_minority" else "secondary",
                        pause_reason(*args), cfg.node_name, cfg.cluster_partition_handling)
            self._tasks.spawn(self._close_clients(), "pause")
        elif not pause and self.paused:
            self.paused = False
            reached = sorted(m for m in members if m in up and m != cfg.node_name)
            log.warning("Cluster %s (reachable: %s): resuming node %s",
                        "majority status regained" if cfg.cluster_partition_handling == "pause_minority"
                        else "recovery detected", ", ".join(reached) or "none", cfg.node_name)
            self._tasks.spawn(self._resume(), "resume")

    async def _resume(self) -> None:
        """Clients come back once this node has applied everything the cluster committed while
        it was paused (a catalogue barrier): until then it may still take itself for the leader
        of a queue that another node leads now."""
        self._resumes += 1
        this = self._resumes

        def current() -> bool:  # not paused again (a later resume opens the listeners), nor stopping
            return this == self._resumes and not self.paused and self._app_running

        while current() and not await self.clustering.barrier():
            if self.config.cluster_partition_handling != "pause_minority":
                # pause_if_all_down resumes on reaching a listed node, which need not make a
                # majority: this node may not catch up before the partition ends, and serves
                # as RabbitMQ's would
                log.warning("node %s lets clients in again without having caught up with the cluster "
                            "metadata store (no majority reachable)", self.config.node_name)
                break
            log.warning("node %s waits for the cluster metadata store before it lets clients in again",
                        self.config.node_name)
        if current():
            await self._open_listeners()

    def _wire_node_info(self) -> None:
        """Peers show this node in their /api/nodes as it describes itself."""
        if self.broker.cluster is not None and self.http is not None:
            api = self.http.app[API]
            self.broker.cluster.local_info = lambda: node_info(api)
            self.broker.cluster.lister = lambda what, params: local_listing(api, what, params)
            self.broker.cluster.migrator = lambda args, reply: migrate.run_for_peer(api.broker, args, reply)
            if self.clustering is not None:
                self.clustering.announce_info()

    async def stop_app(self) -> None:
        """Stop the broker: listeners and client connections close, the node leaves its
        cluster's running nodes (peers see it down), its storage is closed."""
        if not self.app_running:
            raise AppStateError(f"the hutch application is not running on node {self.config.node_name}")
        self._app_running = False
        self.paused = False
        log.info("Stopping hutch application on node %s", self.config.node_name)
        await self._tasks.close()  # a pause or resume under way ends before the listeners close for good
        await self._close_clients()
        for _ in range(SYNC_DRAIN_POLLS):
            if not self._sync_running:
                break
            await asyncio.sleep(SYNC_DRAIN_POLL_S)
        if self.clustering is not None:
            await self.clustering.stop(failed=self.exit_code != 0)
        try:
            self.broker.close_storage()
        except OSError as e:  # a failing disk: what was not synced is not claimed durable
            log.error("message store could not be closed cleanly: %s", e)
        log.info("Stopped hutch application on node %s", self.config.node_name)

    def _require_stopped(self, what: str) -> None:
        if self.app_running:
            raise AppStateError(f"the hutch application is running on node {self.config.node_name}; stop it "
                                f"first ('hutchctl stop_app') before {what}")

    def reset(self) -> None:
        """Return the node to a blank state: its catalogue log, messages, definitions and
        cluster membership are deleted (rabbitmqctl reset). The app must be stopped."""
        self._require_stopped("resetting it")
        for entry in ("raft", "msgs", "definitions.json", CLUSTER_FILE):
            path = os.path.join(self.config.data_dir, entry)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        self.config.cluster_nodes = []
        log.info("Resetting node %s", self.config.node_name)

    def join_cluster(self, seed: str, address: tuple[str, int] | None = None) -> None:
        """Prepare to join the cluster that `seed` belongs to (rabbitmqctl join_cluster): the node is
        reset, and the next start_app asks the seed to add it."""
        self._require_stopped("joining a cluster")
        if seed == self.config.node_name:
            raise AppStateError("a node cannot join itself")
        if address is None:
            address = (seed.split("@", 1)[1], self.config.peer_port)
        self.reset()
        write_cluster_file(self.config.data_dir, {"join": seed, "address": [address[0], address[1]]})
        self.config.cluster_nodes = [f"{self.config.node_name}:{self.config.peer_port}"]
        log.info("Clustering node %s with %s", self.config.node_name, seed)

    def forget_cluster_node(self, name: str, callback) -> None:
        """Remove a stopped node from the cluster (rabbitmqctl forget_cluster_node)."""
        if self.clustering is None or not self.app_running:
            raise AppStateError(f"node {self.config.node_name} is not running as a member of a cluster")
        self.clustering.forget(name, callback)

    def _request_sync(self) -> None:
        """Group commit: one fsync at a time, in a worker thread, covering every record
        appended before it started; the next one starts as soon as it returns."""
        if self._sync_running:
            return
        self._sync_running = True
        fut = self.loop.run_in_executor(None, self._journal_sync)
        fut.add_done_callback(self._sync_done)

    def _journal_sync(self) -> int:
        faults.check_fsync()
        return self.broker.journal.sync()

    def _sync_done(self, fut) -> None:
        self._sync_running = False
        exc = None if fut.cancelled() else fut.exception()  # retrieved even while stopping: no "never retrieved"
        if self._stopping.is_set():
            return  # shutdown syncs and closes the store itself
        if exc is not None:
            # After a failed fsync the page cache cannot be trusted to hold what was written (the
            # "fsyncgate" lesson); carrying on would mean never confirming again, or confirming
            # what may be lost. Stop, so clients fail over and republish what was not confirmed.
            self.fail_stop(f"message store fsync failed: {exc}")
            return
        self.broker.durable_done(fut.result())
        if self.broker.journal.unsynced:
            self._request_sync()

    def _tick(self) -> None:
        if self._cpu_time is not None:
            self._measure_load()
        if self.broker.ttl_queues or self.broker.flow_limited:
            self.broker.tick()
        self._tick_task = self.loop.call_later(BROKER_TICK_S, self._tick)

    def _measure_load(self) -> None:
        """Every LOAD_WINDOW_S: whether the node used most of a core meanwhile (`Broker.saturated`)."""
        now, cpu = self.loop.time(), self._cpu_time()
        began, cpu_then = self._load_mark
        if now - began >= LOAD_WINDOW_S:
            if began:
                self.broker.saturated = (cpu - cpu_then) / (now - began) >= SATURATED_CPU_SHARE
            self._load_mark = (now, cpu)

    def _disk_check(self) -> None:
        try:
            free = shutil.disk_usage(self.config.data_dir).free
        except OSError as e:  # pragma: no cover - the data directory vanished
            log.error("cannot read free disk space of %s: %s", self.config.data_dir, e)
            free = 0
        self.broker.disk_check(faults.disk_free(free))
        self._disk_task = self.loop.call_later(self.config.disk_check_interval_ms / 1000, self._disk_check)

    def _memory_check(self) -> None:
        self.broker.memory_check(self._baseline_rss + self.broker.accounted_bytes(), self._total_mem)
        self._mem_task = self.loop.call_later(self.config.memory_check_interval_ms / 1000, self._memory_check)

    def _consumer_timeout_check(self) -> None:
        self._consumer_timeout_task = self.loop.call_later(CONSUMER_TIMEOUT_CHECK_S, self._consumer_timeout_check)
        if self.app_running:
            check_consumer_timeouts(self.broker)

    async def serve_forever(self) -> None:
        await self._stopping.wait()
        await self.shutdown()

    @property
    def stop_requested(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def fail_stop(self, reason: str) -> None:
        """Storage this node cannot trust: log why, and stop with a non-zero exit status."""
        if self.exit_code == 0:
            log.critical("%s; stopping node %s", reason, self.config.node_name)
        self.exit_code = EXIT_STORAGE_FAILED
        if self.clustering is not None:
            self.clustering.isolate()
        self.request_stop()

    def request_stop(self) -> None:
        log.info("hutch is asked to stop...")
        sdnotify.stopping(f"node {self.config.node_name} is stopping")
        if self._stopping is None:
            self._stopping = asyncio.Event()
        self._stopping.set()

    async def shutdown(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        if self.http is not None:
            await self.http.stop()
        if self.app_running:
            await self.stop_app()
        log.info("Successfully stopped hutch node %s", self.config.node_name)


def server_tls_context(certfile: str, keyfile: str, cacertfile: str | None, verify_peer: bool,
                       fail_if_no_peer_cert: bool, password: str | None = None) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 and later) from RabbitMQ's certificate options."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile, password=password)
    if cacertfile:
        ctx.load_verify_locations(cacertfile)
    if verify_peer:
        ctx.verify_mode = ssl.CERT_REQUIRED if fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def setup_logging(config: Config) -> None:
    """RabbitMQ-style lines (a UTC timestamp, the level in lower case, the component, the text) to
    the sinks the log.* settings and HUTCH_LOGS / HUTCH_LOG_BASE ask for; by default to standard
    error and to DATA_DIR/log/NODE_NAME.log (hutch.server.logs)."""
    logs.configure(config.log_settings, config.log_level, config.data_dir, config.node_name)


def run_node(config: Config) -> int:
    setup_logging(config)
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    for warning in config.config_warnings:
        logging.getLogger("hutch.config").warning("%s", warning)
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None

    exit_code = 0

    async def main() -> None:
        nonlocal exit_code
        node = Node(config)
        loop = asyncio.get_running_loop()
        boot = asyncio.ensure_future(node.start())

        def stop() -> None:
            if not boot.done():
                boot.cancel()  # a stop during the boot (waiting for peers, say) ends the boot there
            node.request_stop()

        # installed before the boot, so that SIGTERM at any moment is a stop, never a plain kill
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        try:
            await boot
        except asyncio.CancelledError:
            if not node.stop_requested:
                raise
            log.info("hutch was asked to stop while booting")
            await node.shutdown()
            return
        # Type=notify units: the node is booted and listening
        sdnotify.ready(f"node {config.node_name} is running")
        await node.serve_forever()
        exit_code = node.exit_code

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            runner.run(main())
        except definitions.BootImportError as e:
            log.error("%s", e)
            log.error("node %s: boot failed: definitions could not be imported", config.node_name)
            return 1
        except RaftLogError as e:
            log.critical("%s", e)
            log.critical("node %s: boot failed: its Raft log cannot be trusted", config.node_name)
            return EXIT_STORAGE_FAILED
    return exit_code


__all__ = ["Node", "run_node", "commands"]
