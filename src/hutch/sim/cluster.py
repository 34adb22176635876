"""Whole-cluster simulation: real hutch nodes in one process, on simulated time and network.

`hutch sim cluster --seed N` boots N real nodes (`hutch.server.runtime.Node`: sessions,
channels, routing, queue types, the catalogue on Raft, membership, the peer transport) on one
`VirtualLoop` (hutch.simkernel.aioloop), joined by the in-memory TCP of hutch.simkernel.net.
Simulated clients speak AMQP 0-9-1 to them (hutch.sim.client): a publisher with confirms and a
consumer with acks on one quorum queue. A nemesis drawn from the seed partitions the nodes
(every shape `draw_partition` knows), resets peer links and client connections, crashes nodes
(kill -9: tasks stop, sockets reset, files closed as written) and restarts them from their data
directories, then heals everything; the consumer then has `drain_s` to receive every confirmed
message, and the run checks (FAILURE_KINDS):

- no confirmed message lost: every message the publisher saw confirmed is delivered; when the
  consumer falls short, a new consumer on each node in turn tells a starved consumer
  (`starved`) from messages nobody receives (`lost`);
- nothing delivered that was never published;
- a message delivered again is flagged `redelivered` (each message is published once, so a
  second delivery is always a redelivery);
- every node's catalogue is the same (canonical snapshot bytes, once all have applied the
  same index);
- no two nodes lead one Raft group in the same term (sampled every 10 ms of simulated time);
- no exception escapes a node's callbacks or tasks.

What is real: every line of the node's code above the socket, and the files. What is simulated:
time (every node's clock is the loop's, plus a per-node wall-clock offset drawn from the seed),
the network (delays, FIFO per link, cuts that reset connections), the clients, process
crashes. Files are real, in a temporary directory per run (on /dev/shm where there is one, so
that an fsync costs nothing); fsyncs run inline; a crash keeps every byte written (the page
cache outlives a process), so lost unsynced writes are not modelled. Randomness and the clocks
hutch reads directly are the seed's: while a run lasts `os.urandom`, the `secrets` functions
hutch calls and the `random` module are fed from a generator seeded by it, and `time.monotonic`
and `time.time` read simulated time (all restored afterwards), so a seed replays in any process.
Not yet covered (docs/design/simulation.md): disk faults, clock jumps, classic and mirrored
queues, streams.

A failing seed replays exactly; `-v` prints the trace: the nemesis, connections, client
operations, and every log line of every node, stamped with simulated time and the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field

import click
from pamqp import commands

from hutch.broker.broker import Config
from hutch.broker.journal import COMPACT_INTERVAL_S, Journal
from hutch.control import changes
from hutch.control.errors import ApiError
from hutch.control.policies import set_policy_command
from hutch.control.policy import validate_policy
from hutch.raft.group import LEADER
from hutch.server.clock import NodeClock
from hutch.server.runtime import Node
from hutch.sim.client import SimClient
from hutch.simkernel import Kernel, SimResult, draw_partition, run_seeds
from hutch.simkernel.aioloop import SimulationLivelock, VirtualLoop
from hutch.simkernel.net import SimNet, current_host

SIM_EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the wall clock every simulated node starts near
WALL_SKEW_MS_MAX = 50  # each node's wall clock is off by up to this much
AMQP_PORT = 5672
PEER_PORT = 25672
QUEUE = "sim-q"
# the arguments of the queue the workload declares, by --queue-type, and what a confirm promises
QUEUE_TYPES = {
    "quorum": {"x-queue-type": "quorum"},  # confirmed once a majority of members has it on disk
    "classic": {},  # durable, persistent messages: confirmed once fsynced on the queue's home node
    "mirrored": {},  # the same, mirrored by MIRROR_POLICY: confirmed once every mirror has it
}
# the operator's policy for --queue-type mirrored (set as `hutchctl set_policy` would): mirrors on
# every node, synchronised automatically, a leader promoted only from synchronised mirrors; with
# pause_minority (RabbitMQ's advice for mirroring) a partition cannot split the queue in two.
MIRROR_POLICY = {"pattern": "^sim-", "apply-to": "queues",
                 "definition": {"ha-mode": "all", "ha-sync-mode": "automatic", "ha-promote-on-failure": "when-synced",
                                "ha-promote-on-shutdown": "when-synced"}}
LEADER_CHECK_S = 0.01  # how often the one-leader-per-term check samples the nodes
BOOT_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 5.0  # a client's connect, declare or consume
CLIENT_BACKOFF_S = (0.05, 0.5)
AUDIT_S = 5.0  # how long the audit's consumer waits on each node
REQUEUE_P = 0.05  # the share of deliveries a consumer rejects with requeue instead of acking
CONFIRM_TIMEOUT_S = 10.0  # a publisher whose window is full gives its connection up after this long
RUN_S_MAX = 600.0  # a run that has not ended after this much simulated time is stuck
# What a run can find, in the words SimResult.stats["failed"] uses:
FAILURE_KINDS = frozenset({
    "lost",  # a confirmed message nobody could receive after the heal, not even a new consumer
    "starved",  # a confirmed message the consumer never got though the queue still held it
    "unpublished",  # a delivery of a message that was never published
    "redelivered-flag",  # a second delivery without `redelivered`
    "catalogue",  # catalogues that differ at one applied index, or never reach one
    "two-leaders",  # two leaders of one Raft group in one term
    "unhandled",  # an exception that escaped a node's callback or task
    "boot",  # the cluster did not boot
    "stuck",  # the run did not end in RUN_S_MAX of simulated time, or its clock stopped (a livelock)
    "error",  # the run itself broke (the trace has the traceback)
})
_LONG_NUMBER = re.compile(r"\b\d{10,}\b")  # object ids in log lines: masked, they are addresses


@dataclass(slots=True)
class ClusterSimOptions:
    seed: int
    nodes: int = 3
    messages: int = 40
    fault_s: float = 8.0  # faults are injected from the boot to this much later
    drain_s: float = 60.0  # after the heal: how long the consumer has to receive every confirmed message
    net_ticktime_s: float = 4.0
    queue_type: str = "quorum"  # one of QUEUE_TYPES
    trace: bool = False


@dataclass(slots=True)
class _History:
    published: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    nacked: set[str] = field(default_factory=set)
    delivered: dict[str, int] = field(default_factory=dict)  # message id -> deliveries seen


class _TraceHandler(logging.Handler):
    def __init__(self, kernel: Kernel, root: str) -> None:
        super().__init__(logging.INFO)
        self.kernel = kernel
        self.root = root

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not end the run
            text = str(record.msg)
        text = _LONG_NUMBER.sub("#", text.replace(self.root, "$DATA"))
        if record.exc_info and record.levelno >= logging.ERROR:
            text += f" [{record.exc_info[0].__name__}: {record.exc_info[1]}]"
        self.kernel.log(f"{current_host.get()} {record.levelname.lower()} {record.name}: {text}")


def _memory_fs() -> str | None:
    """A memory file system for the nodes' data (fsyncs there cost nothing), if the host has one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_real_open, _real_close = os.open, os.close


@contextlib.contextmanager
def simulated_clocks(now_s) -> Iterator[None]:
    """While it lasts, `time.monotonic` is the simulation's clock and `time.time` the wall clock
    at SIM_EPOCH_S plus it: the few places below the runtime that read a clock directly (the
    segment log's synced mark, the durations store recovery logs) read simulated time."""
    saved = (time.monotonic, time.time)
    time.monotonic = now_s
    time.time = lambda: SIM_EPOCH_S + now_s()
    try:
        yield
    finally:
        time.monotonic, time.time = saved


@contextlib.contextmanager
def _owned_fds(owners: dict[int, str]) -> Iterator[None]:
    """While it lasts, `os.open` notes which simulated host opened each descriptor, so that a
    crash can close the files of the process that died (hutch's stores open theirs with it)."""

    def sim_open(*args, **kwargs) -> int:
        fd = _real_open(*args, **kwargs)
        owners[fd] = current_host.get()
        return fd

    def sim_close(fd: int) -> None:
        owners.pop(fd, None)
        _real_close(fd)

    os.open, os.close = sim_open, sim_close
    try:
        yield
    finally:
        os.open, os.close = _real_open, _real_close


@contextlib.contextmanager
def seeded_entropy(seed: int) -> Iterator[None]:
    """While it lasts, every random draw hutch makes comes from `seed` (see the module's text)."""
    rng = random.Random(seed ^ 0x5EED)
    saved = (os.urandom, secrets.token_bytes, secrets.token_hex, secrets.randbits, random.getstate())
    os.urandom = rng.randbytes
    secrets.token_bytes = lambda n=32: rng.randbytes(32 if n is None else n)
    secrets.token_hex = lambda n=32: rng.randbytes(32 if n is None else n).hex()
    secrets.randbits = rng.getrandbits
    random.seed(rng.getrandbits(64))
    try:
        yield
    finally:
        os.urandom, secrets.token_bytes, secrets.token_hex, secrets.randbits, state = saved
        random.setstate(state)


class ClusterSim:
    def __init__(self, opts: ClusterSimOptions) -> None:
        self.opts = opts
        self.kernel = Kernel(opts.seed, trace=opts.trace)
        self.rng = self.kernel.rng
        self.loop = VirtualLoop(self.kernel)
        self.net = SimNet(self.kernel, self.loop)
        self.hosts = [f"n{i + 1}" for i in range(opts.nodes)]
        self.nodes: dict[str, Node] = {}
        self.history = _History()
        self.stats: dict = {"faults": 0, "reconnects": 0}
        self.root = ""
        self._leaders: dict[tuple, str] = {}  # (group, term) -> the node that led it
        self._fds: dict[int, str] = {}  # open file descriptor -> the host that opened it
        self._restarts: list[asyncio.Task] = []
        self._checked = False  # the checks have run; the nodes are being stopped
        self.failures: list[tuple[str, str]] = []  # (kind, what): the checks that failed (FAILURE_KINDS)

    # -- the run

    def run(self) -> SimResult:
        self.root = tempfile.mkdtemp(prefix="hutch-sim-", dir=_memory_fs())
        hutch_log = logging.getLogger("hutch")
        saved = (hutch_log.level, hutch_log.propagate, Journal.compactor_thread)
        handler = _TraceHandler(self.kernel, self.root)
        hutch_log.addHandler(handler)
        hutch_log.setLevel(logging.INFO if self.opts.trace else logging.ERROR)
        hutch_log.propagate = False
        Journal.compactor_thread = False
        try:
            with seeded_entropy(self.opts.seed), _owned_fds(self._fds), simulated_clocks(self.loop.time):
                try:
                    self.loop.run_until_complete(self._bounded(self._main()))
                except SimulationLivelock as e:
                    self._fail("stuck", str(e))
                except Exception as e:  # noqa: BLE001 - a run that breaks is a failed run, with its trace
                    self.kernel.log("".join(traceback.format_exception(e)))
                    self._fail("error", f"the run stopped: {type(e).__name__}: {e}")
                finally:
                    self._checked = True
                    self._stop_all()
        finally:
            hutch_log.removeHandler(handler)
            hutch_log.setLevel(saved[0])
            hutch_log.propagate = saved[1]
            Journal.compactor_thread = saved[2]
            shutil.rmtree(self.root, ignore_errors=True)
        violation = "; ".join(text for _, text in self.failures[:5]) or None
        h = self.history
        self.stats.update(published=len(h.published), confirmed=len(h.confirmed), nacked=len(h.nacked),
                          delivered=len(h.delivered), sim_s=round(self.kernel.now / 1e6, 3))
        if self.failures:
            self.stats["failed"] = sorted({kind for kind, _ in self.failures})
        if violation is not None:
            self.kernel.log(f"VIOLATION {violation}")
        return self.kernel.result(violation, self.stats)

    def _stop_all(self) -> None:
        """Stop the nodes still running and close the loop, whatever state the run ended in."""
        try:
            self.loop.run_until_complete(self._shutdown())
            self._close_loop()
        except Exception as e:  # noqa: BLE001 - a run whose nodes do not stop has failed, and must still end
            if not self.failures:
                self._fail("error", f"the nodes could not be stopped: {type(e).__name__}: {e}")
            self.loop.close()

    def _close_loop(self) -> None:
        pending = self.loop.living_tasks()
        for t in pending:
            t.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def _fail(self, kind: str, text: str) -> None:
        assert kind in FAILURE_KINDS, kind
        if (kind, text) not in self.failures:
            self.failures.append((kind, text))
            self.kernel.log(f"FAILED ({kind}): {text}")

    def _unhandled(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """An exception nothing caught, in a node's callback or task: a node would only log it, and
        run on with state that may have left its peers'; the simulation calls it a failure."""
        exc = context.get("exception")
        what = f"{type(exc).__name__}: {exc}" if exc is not None else context.get("message", "?")
        text = f"unhandled exception on {current_host.get()} ({context.get('message', '')}): {what}"
        self.kernel.log(text)
        if self._checked:  # while the nodes stop after the checks: reported in the stats only
            self.stats["errors_at_stop"] = self.stats.get("errors_at_stop", 0) + 1
        else:
            self._fail("unhandled", text)

    async def _bounded(self, main) -> None:
        try:
            async with asyncio.timeout(RUN_S_MAX):
                await main
        except TimeoutError:
            self._fail("stuck", f"the run did not end within {RUN_S_MAX:.0f} s of simulated time")

    async def _main(self) -> None:
        self.loop.set_exception_handler(self._unhandled)
        self.kernel.log(f"sim cluster seed {self.opts.seed}: {len(self.hosts)} nodes, a {self.opts.queue_type} queue")
        self._write_secret()
        boots = [self._spawn_on(h, self._boot(h)) for h in self.hosts]
        try:
            async with asyncio.timeout(BOOT_TIMEOUT_S):
                await asyncio.gather(*boots)
        except TimeoutError:
            self._fail("boot", f"the cluster did not boot within {BOOT_TIMEOUT_S:.0f} s")
            return
        self.kernel.log("cluster booted")
        if self.opts.queue_type == "mirrored":
            await self._set_mirror_policy()
        self.loop.call_later(LEADER_CHECK_S, self._check_leaders)
        async with asyncio.TaskGroup() as tg:
            publisher = tg.create_task(self._publisher())
            consumer = tg.create_task(self._consumer())
            await self._nemesis()
            self._heal()
            for restart in self._restarts:
                await restart
            await publisher
            drained = await self._drain()
            consumer.cancel()
        missing = set(self.history.confirmed) - set(self.history.delivered)
        if not drained:
            await self._audit()
        await self._check_catalogues()
        self._check_messages(missing)

    async def _set_mirror_policy(self) -> None:
        """As an operator would with `hutchctl set_policy`, retrying until the catalogue holds the
        default vhost (the first seconds after a cluster forms)."""
        host = self.hosts[0]
        cmd = set_policy_command(validate_policy("/", "ha", MIRROR_POLICY))
        for _ in range(100):
            try:
                await self._spawn_on(host, changes.commit(self.nodes[host].broker, cmd))
                self.kernel.log(f"policy 'ha' set on {host}: {MIRROR_POLICY}")
                return
            except ApiError as e:
                self.kernel.log(f"setting policy 'ha' on {host}: {e}")
                await asyncio.sleep(0.1)
        self._fail("boot", "policy 'ha' could not be set")

    def _spawn_on(self, host: str, coro) -> asyncio.Task:
        """A task that runs as part of `host` (its log lines name it)."""
        return self.loop.create_task(coro, context=self.net.context(host))

    def _write_secret(self) -> None:
        with open(os.path.join(self.root, "secret"), "w") as f:
            f.write(f"sim-{self.opts.seed}")

    def _config(self, host: str) -> Config:
        return Config(node_name=f"hutch@{host}", amqp_host=host, amqp_port=AMQP_PORT,
                      data_dir=os.path.join(self.root, host), mgmt_port=0, prometheus_port=0, stream_port=0,
                      peer_port=PEER_PORT, cluster_nodes=[f"hutch@{h}:{PEER_PORT}" for h in self.hosts],
                      cluster_secret_file=os.path.join(self.root, "secret"), loopback_users=[],
                      net_ticktime_s=self.opts.net_ticktime_s, disk_free_limit_bytes=0,
                      vm_memory_high_watermark_bytes=1 << 50, consumer_timeout_ms=None,
                      cluster_partition_handling="pause_minority" if self.opts.queue_type == "mirrored" else "ignore")

    async def _boot(self, host: str) -> None:
        if host in self.nodes:
            raise RuntimeError(f"node {host} is already running")
        skew_s = self.rng.randint(-WALL_SKEW_MS_MAX, WALL_SKEW_MS_MAX) / 1000
        clock = NodeClock(monotonic=self.loop.time, wall=lambda: SIM_EPOCH_S + skew_s + self.loop.time())
        node = Node(self._config(host), network=self.net.host(host), clock=clock)
        self.nodes[host] = node
        await node.start()
        self.loop.call_later(COMPACT_INTERVAL_S, self._compact, node)

    def _compact(self, node: Node) -> None:
        if node.app_running and node.broker.journal.compact_step():
            self.loop.call_later(COMPACT_INTERVAL_S, self._compact, node)

    async def _shutdown(self) -> None:
        for restart in self._restarts:
            restart.cancel()
        for host, node in list(self.nodes.items()):
            with contextlib.suppress(Exception):
                await self._spawn_on(host, node.shutdown())

    # -- the nemesis

    async def _nemesis(self) -> None:
        deadline = self.loop.time() + self.opts.fault_s
        while True:
            await asyncio.sleep(self.rng.uniform(0.2, 1.5))
            if self.loop.time() >= deadline:
                return
            self.stats["faults"] += 1
            kind = self.rng.random()
            if kind < 0.5:
                cut = draw_partition(self.rng, self.hosts)
                self.kernel.log(f"nemesis: partition {sorted(cut) or 'healed'}")
                self.net.set_cut(cut)
            elif kind < 0.6:
                self._crash()
            elif kind < 0.8:
                a, b = self.rng.sample(self.hosts, 2)
                self.kernel.log(f"nemesis: reset the link {a} <-> {b}")
                self._reset_between(a, b)
            else:
                client = self.rng.choice(["pub", "con"])
                self.kernel.log(f"nemesis: reset the connections of client {client}")
                for h in self.hosts:
                    self._reset_between(client, h)

    def _crash(self) -> None:
        """A node's process dies (kill -9) and restarts from its data directory a little later.
        At most a minority is down at once, so the quorum queue keeps a majority on disk."""
        down = len(self.hosts) - len(self.nodes)
        if down >= (len(self.hosts) - 1) // 2:
            return
        host = self.rng.choice(sorted(self.nodes))
        if not self.nodes[host].app_running:
            return
        self.stats["crashes"] = self.stats.get("crashes", 0) + 1
        self.kernel.log(f"nemesis: crash {host}")
        del self.nodes[host]
        self.net.kill_host(host)
        for fd, owner in sorted(self._fds.items()):
            if owner == host:  # the process's files close with it; what it wrote stays in the page cache
                del self._fds[fd]
                _real_close(fd)
        self._restarts.append(self.loop.create_task(self._restart(host, self.rng.uniform(0.2, 3.0))))

    async def _restart(self, host: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        self.kernel.log(f"nemesis: restart {host}")
        await self._spawn_on(host, self._boot(host))

    def _reset_between(self, a: str, b: str) -> None:
        was = {(a, b): self.net.network.link(a, b).blocked, (b, a): self.net.network.link(b, a).blocked}
        self.net.cut(a, b)
        self.net.cut(b, a)
        for (x, y), blocked in was.items():
            if not blocked:
                self.net.restore(x, y)

    def _heal(self) -> None:
        self.kernel.log("nemesis: heal everything")
        self.net.set_cut(set())

    # -- clients

    async def _connect(self, who: str, **callbacks) -> tuple[SimClient, str]:
        while True:
            host = self.rng.choice(self.hosts)
            client = SimClient(who, **callbacks)
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.connect(self.net.host(who), host, AMQP_PORT)
                    await client.queue_declare(QUEUE, durable=True, arguments=QUEUE_TYPES[self.opts.queue_type])
                self.kernel.log(f"client {who}: connected to {host}")
                return client, host
            except Exception as e:  # noqa: BLE001 - any failure: retry
                self.kernel.log(f"client {who}: could not set up on {host}: {type(e).__name__}: {e}")
                client.abort()
                self.stats["reconnects"] += 1
                await asyncio.sleep(self.rng.uniform(*CLIENT_BACKOFF_S))

    async def _publisher(self) -> None:
        h = self.history
        next_id = 0
        window_max = 8
        while next_id < self.opts.messages:
            tags: dict[int, str] = {}

            def on_confirm(tag: int, multiple: bool, ack: bool, tags=tags) -> None:
                done = [t for t in tags if t <= tag] if multiple else [tag]
                for t in done:
                    mid = tags.pop(t, None)
                    if mid is None:
                        continue
                    (h.confirmed if ack else h.nacked).add(mid)
                    self.kernel.log(f"client pub: {'confirmed' if ack else 'nacked'} {mid}")

            client, _ = await self._connect("pub", on_confirm=on_confirm)
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.confirm_select()
                while next_id < self.opts.messages and client.closed is None:
                    if len(tags) >= window_max:
                        await self._confirms_below(client, tags, window_max)
                        continue
                    mid = f"m{next_id}"
                    next_id += 1
                    props = commands.Basic.Properties(delivery_mode=2, message_id=mid)
                    tags[client.publish(QUEUE, mid.encode(), props)] = mid
                    h.published.add(mid)
                    self.kernel.log(f"client pub: published {mid}")
                    await asyncio.sleep(self.rng.uniform(0.005, 0.1))
                while tags and client.closed is None:  # the last confirms
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(STEP_TIMEOUT_S):
                            await client.closed_event.wait()
                    break
            except Exception as e:  # noqa: BLE001 - the connection died: what was not confirmed is unknown
                self.kernel.log(f"client pub: {type(e).__name__}: {e}")
            self.kernel.log(f"client pub: {len(tags)} publish(es) left unconfirmed on this connection")
            await client.close()

    def _on_delivery(self, who: str, this: list, tag: int, redelivered: bool, body: bytes) -> None:
        h = self.history
        mid = body.decode()
        if mid not in h.published:
            self._fail("unpublished", f"delivered {mid!r}, which was never published")
        seen = h.delivered.get(mid, 0)
        if seen and not redelivered:
            self._fail("redelivered-flag", f"{mid} delivered again without the redelivered flag")
        h.delivered[mid] = seen + 1
        self.kernel.log(f"client {who}: delivered {mid}{' (redelivered)' if redelivered else ''}")
        settle = self._requeue if self.rng.random() < REQUEUE_P else self._ack
        self.loop.call_later(self.rng.uniform(0, 0.02), settle, this[0], tag)

    async def _confirms_below(self, client: SimClient, tags: dict, window_max: int) -> None:
        """Wait for a place in the publisher's window; a connection whose confirms stop for
        CONFIRM_TIMEOUT_S is given up (what was not confirmed stays unknown)."""
        try:
            async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                while len(tags) >= window_max and client.closed is None:
                    await asyncio.sleep(0.005)
        except TimeoutError:
            self.kernel.log(f"client pub: no confirm for {CONFIRM_TIMEOUT_S:.0f} s; giving the connection up")
            client.abort()

    async def _consumer(self) -> None:
        while True:
            this: list = []  # the client these deliveries come through, once it exists
            client, _ = await self._connect(
                "con", on_delivery=lambda tag, redelivered, props, body, this=this:
                self._on_delivery("con", this, tag, redelivered, body))
            this.append(client)
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.qos(10)
                    await client.consume(QUEUE)
                await client.closed_event.wait()
                self.kernel.log(f"client con: {client.closed}")
            except asyncio.CancelledError:
                await client.close()
                raise
            except Exception as e:  # noqa: BLE001 - reconnect
                self.kernel.log(f"client con: {type(e).__name__}: {e}")
            client.abort()

    def _ack(self, client, tag: int) -> None:
        if client.closed is None:
            client.ack(tag)

    def _requeue(self, client, tag: int) -> None:
        """basic.reject with requeue: the message comes back, and its next delivery must say so."""
        if client.closed is None:
            self.kernel.log(f"client {client.name}: requeues delivery {tag}")
            client.reject(tag, requeue=True)

    async def _drain(self) -> bool:
        """After the heal: wait until every confirmed message has been delivered, or time is up."""
        deadline = self.loop.time() + self.opts.drain_s
        h = self.history
        while self.loop.time() < deadline:
            if h.confirmed <= set(h.delivered):
                return True
            await asyncio.sleep(0.05)
        return False

    async def _audit(self) -> None:
        """The consumer did not get every confirmed message: a new consumer on each node in turn
        tells a queue that still holds them (a consumer left starving) from one that lost them."""
        h = self.history
        for host in self.hosts:
            this: list = []
            client = SimClient("audit", on_delivery=lambda tag, redelivered, props, body, this=this:
                               self._on_delivery("audit", this, tag, redelivered, body))
            this.append(client)
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.connect(self.net.host("audit"), host, AMQP_PORT)
                    await client.qos(10)
                    await client.consume(QUEUE)
                deadline = self.loop.time() + AUDIT_S
                while self.loop.time() < deadline and not h.confirmed <= set(h.delivered):
                    await asyncio.sleep(0.05)
            except Exception as e:  # noqa: BLE001 - try the next node
                self.kernel.log(f"client audit: on {host}: {type(e).__name__}: {e}")
            await client.close()
            if h.confirmed <= set(h.delivered):
                return

    # -- checks

    def _check_messages(self, missing: set[str]) -> None:
        """`missing`: the confirmed messages the consumer had not received by the end of the drain."""
        h = self.history
        lost = sorted(h.confirmed - set(h.delivered), key=_number)
        if lost:
            self._fail("lost", f"confirmed message(s) never delivered: {_names(lost)} ({len(lost)} of "
                               f"{len(h.confirmed)} confirmed; not within {self.opts.drain_s:.0f} s after the heal, "
                               f"nor to a new consumer on any node)")
        found = sorted(missing - set(lost), key=_number)
        if found:
            self._fail("starved", f"the consumer was left without confirmed message(s) the queue still held "
                                  f"{self.opts.drain_s:.0f} s after the heal (a new consumer got them): {_names(found)}")

    async def _check_catalogues(self) -> None:
        """Once every node has applied the same catalogue index, their snapshots must be equal."""
        deadline = self.loop.time() + self.opts.drain_s
        while True:
            applied = {h: n.clustering.group.applied for h, n in self.nodes.items()}
            if len(set(applied.values())) == 1:
                break
            if self.loop.time() >= deadline:
                self._fail("catalogue", f"the catalogue did not converge after the heal: applied indexes {applied}")
                return
            await asyncio.sleep(0.05)
        digests = {h: hashlib.sha256(n.clustering.cluster.catalogue.snapshot()).hexdigest()[:12]
                   for h, n in self.nodes.items()}
        self.kernel.log(f"catalogues at index {next(iter(applied.values()))}: {digests}")
        if len(set(digests.values())) != 1:
            self._fail("catalogue", f"catalogues differ at the same applied index: {digests}")

    def _check_leaders(self) -> None:
        for host, node in self.nodes.items():
            c = node.clustering
            if c is None or not hasattr(c, "multi"):
                continue
            for gid, g in c.multi.groups.items():
                if g.role != LEADER:
                    continue
                other = self._leaders.setdefault((gid, g.term), host)
                if other != host:
                    self._fail("two-leaders", f"two leaders of Raft group {gid!r} in term {g.term}: {other} and {host}")
        self.loop.call_later(LEADER_CHECK_S, self._check_leaders)


def _number(mid: str) -> int:
    return int(mid[1:])


def _names(mids: list[str]) -> str:
    return ", ".join(mids[:10]) + (" ..." if len(mids) > 10 else "")


def run_seed(seed: int, nodes: int = 3, messages: int = 40, fault_s: float = 8.0, queue_type: str = "quorum",
             trace: bool = False) -> SimResult:
    return ClusterSim(ClusterSimOptions(seed=seed, nodes=nodes, messages=messages, fault_s=fault_s,
                                        queue_type=queue_type, trace=trace)).run()


def trace_digest(result: SimResult) -> str:
    return hashlib.sha256("\n".join(result.trace).encode()).hexdigest()


@click.command("cluster")
@click.option("--seed", type=int, default=1, show_default=True, help="First seed.")
@click.option("--seeds", type=int, default=1, show_default=True, help="How many consecutive seeds to run.")
@click.option("--nodes", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--messages", type=int, default=40, show_default=True, help="Messages the publisher sends.")
@click.option("--fault-s", type=float, default=8.0, show_default=True,
              help="Seconds of simulated time during which faults are injected.")
@click.option("--queue-type", type=click.Choice(sorted(QUEUE_TYPES)), default="quorum", show_default=True,
              help="The queue the clients use (classic: durable, with persistent messages; mirrored: the same, "
                   "with mirrors on every node, when-synced promotion and pause_minority).")
@click.option("-v", "--verbose", is_flag=True, help="Print the trace of each run.")
def cluster_cmd(seed: int, seeds: int, nodes: int, messages: int, fault_s: float, queue_type: str,
                verbose: bool) -> None:
    """Run real hutch nodes in one process under simulated time, network and clients; any
    failing seed replays exactly."""
    failures = run_seeds(
        lambda s: run_seed(s, nodes=nodes, messages=messages, fault_s=fault_s, queue_type=queue_type,
                           trace=verbose),
        seed, seeds,
        lambda s: (f"hutch sim cluster --seed {s} --nodes {nodes} --messages {messages} --fault-s {fault_s} "
                   f"--queue-type {queue_type}"),
        click.echo, verbose, progress_every=10)
    if failures:
        sys.exit(1)


__all__ = ["ClusterSim", "ClusterSimOptions", "cluster_cmd", "run_seed", "seeded_entropy", "trace_digest"]
