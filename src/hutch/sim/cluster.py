"""Whole-cluster simulation: real hutch nodes in one process, on simulated time and network.

`hutch sim cluster --seed N` boots N real nodes (`hutch.server.runtime.Node`: sessions,
channels, routing, queue types, the catalogue on Raft, membership, the peer transport) on one
`VirtualLoop` (hutch.simkernel.aioloop), joined by the in-memory TCP of hutch.simkernel.net.
Simulated clients speak AMQP 0-9-1 to them (hutch.sim.client): publishers with confirms and
consumers with acks on one queue (QUEUE_TYPES: quorum, durable classic, non-durable classic with
transient messages, a stream, or classic mirrored under one of MIRROR_POLICIES); a stream's
publishers may speak the stream protocol instead (hutch.streamclient). A nemesis drawn from the
seed partitions the nodes (every shape `draw_partition` knows), resets peer links and client
connections, crashes nodes (kill -9: tasks stop, sockets reset, files closed as written), cuts
their power (what was not fsynced is lost, the last write may be torn), fails their fsyncs,
fills their disks or slows them for a while (the node stops itself, or its disk alarm blocks
publishers, or its fsyncs in worker threads take long), jumps their wall clocks, and has the
operator replace a node (forget it, then join it afresh) (FAULT_KINDS); it restarts the nodes
from their data directories, then heals everything; the consumer then has `drain_s` to receive
every confirmed message, and the run checks (FAILURE_KINDS):

- no confirmed message lost: every message the publisher saw confirmed is delivered; when the
  consumer falls short, a new consumer on each node in turn tells a starved consumer
  (`starved`) from messages nobody receives (`lost`);
- nothing delivered that was never published;
- a message delivered again is flagged `redelivered` (each message is published once, so a
  second delivery is always a redelivery), power losses and all;
- every node's catalogue is the same (canonical snapshot bytes, once all have applied the
  same index);
- no two nodes lead one Raft group in the same term (sampled every 10 ms of simulated time);
- a mirrored queue has at most one leader accepting: a leader that another leader has
  succeeded in confirming publishes confirms nothing more (sampled with the Raft check);
- a stream delivers each subscription's offsets in sequence, the same message at one offset on
  every read and every node, and a message published once at one offset only;
- a node that resumes from a pause lets clients in only once it has applied every catalogue
  entry committed when it resumed;
- no exception escapes a node's callbacks or tasks, and no node raises on a peer's message.

What is real: every line of the node's code above the socket, and the files. What is simulated:
time (every node's clocks are the loop's, at a rate off by up to DRIFT_PPM_MAX, plus a wall-clock
skew and jumps drawn from the seed: `HostClock`), the network (delays, FIFO per link, cuts that
reset connections), the clients, process crashes, and the disk under the files
(hutch.simkernel.disk: what a power loss keeps, fsync errors, a full disk). Files are real, in a
temporary directory per run (on /dev/shm where there is one, so that an fsync costs nothing);
fsyncs run inline; a crash keeps every byte written (the page cache outlives a process), a
power loss only what was fsynced. Randomness and the clocks hutch reads directly are the seed's:
while a run lasts `os.urandom`, the `secrets` functions hutch calls and the `random` module are
fed from a generator seeded by it, and `time.monotonic` and `time.time` read the simulated
clocks of the host whose code runs (all restored afterwards), so a seed replays in any process.
The disk, power and clock faults draw from a generator of their own: with `--faults net,crash`
(what `run_seed` draws by default) a seed names the run it named before they existed. Not yet
covered (docs/design/simulation.md): slow disks, the loop's timers drifting per node, the
stream protocol.

A failing seed replays exactly; `-v` prints the trace: the nemesis, connections, client
operations, and every log line of every node, stamped with simulated time and the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import click
from pamqp import commands

from hutch.broker.broker import Config
from hutch.broker.journal import COMPACT_INTERVAL_S, Journal
from hutch.cluster import raftlog
from hutch.control import changes
from hutch.control.copies import compare as compare_copies
from hutch.control.digest import copy_digest, mirror_copy
from hutch.control.errors import ApiError
from hutch.control.node import forget_cluster_member
from hutch.control.policies import set_policy_command
from hutch.control.policy import validate_policy
from hutch.raft.group import LEADER
from hutch.server.clock import NodeClock
from hutch.server.runtime import Node
from hutch.sim.client import SimClient
from hutch.simkernel import Kernel, SimResult, draw_partition, run_seeds, run_seeds_on_pool
from hutch.simkernel.aioloop import SimulationLivelock, VirtualLoop
from hutch.simkernel.disk import SimDisk
from hutch.simkernel.net import SimNet, current_host
from hutch.store import StoreFailed, segment_log, stream_log
from hutch.streamclient import StreamClient, StreamEndpoint
from hutch.streamproto import amqp10
from hutch.streamproto import chunk as stream_chunk
from hutch.streamproto import frames as sf

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
    "mirrored-always": {},  # mirrored by ALWAYS_POLICY: RabbitMQ's semantics allow it to lose messages
    "mirrored-nodes": {},  # mirrored by NODES_POLICY: confirmed once both named nodes have it
    "mirrored-automatic-always": {},  # AUTOMATIC_ALWAYS_POLICY: may lose what a mirror had not synchronised
    "stream": {"x-queue-type": "stream"},  # confirmed once a majority of replicas has it on disk
    # the same stream, its publishers on RabbitMQ's stream protocol (port 5552) as deduplicating
    # producers: a named publisher whose publishing ids the stream remembers, so what a publisher
    # sends again after a reconnection is confirmed and stored once
    "stream-protocol": {"x-queue-type": "stream"},
    # a non-durable classic queue and transient messages: confirmed once the queue's home node has
    # the message in memory. The queue and its messages go with that node's process; a node that
    # cannot reach the home node drops what it routes to the queue (confirmed), and the other nodes
    # delete the queue once its home node is down (RabbitMQ's semantics; a publisher that does not
    # declare it again then publishes into nothing, confirmed). The run counts that loss
    # (`lost_allowed`) once a node has gone down or seen another down, and fails on it otherwise
    "transient": {},
    # an exclusive queue: the consumer's connection declares it (non-durable, exclusive) and is its
    # only consumer; the publishers publish to it by name without declaring it. It goes when that
    # connection closes (RabbitMQ's semantics), with its messages, and the consumer declares it
    # afresh on its next connection: that loss is counted (`lost_allowed`) once the consumer's
    # connection has closed or a node has gone down or been seen down, as for `transient`. After
    # the run, once the consumer's last connection has closed, no node's catalogue may still hold
    # the queue (`exclusive`)
    "exclusive": {},
}
STREAM = "stream"
STREAM_PROTOCOL = "stream-protocol"
STREAMS = {STREAM, STREAM_PROTOCOL}  # read by offset, with the stream checks
STREAM_PORT = 5552
TRANSIENT = "transient"
EXCLUSIVE = "exclusive"
VOLATILE = {TRANSIENT, EXCLUSIVE}  # queues that go with a node or a connection, and their messages with them
# the operator's policy for --queue-type mirrored (set as `hutchctl set_policy` would): mirrors on
# every node, synchronised automatically, a leader promoted only from synchronised mirrors; with
# pause_minority (RabbitMQ's advice for mirroring) a partition cannot split the queue in two.
MIRROR_POLICY = {"pattern": "^sim-", "apply-to": "queues",
                 "definition": {"ha-mode": "all", "ha-sync-mode": "automatic", "ha-promote-on-failure": "when-synced",
                                "ha-promote-on-shutdown": "when-synced"}}
# --queue-type mirrored-always: two mirrors wherever the placement puts them, synchronised only
# when asked (never, here), any mirror promoted when the leader fails or stops. A promoted mirror
# that was not synchronised lacks what was published before it joined: RabbitMQ documents that
# loss (seed 000), so the run counts it (`lost_allowed`) instead of failing; every other check
# holds as for any queue.
ALWAYS_POLICY = {"pattern": "^sim-", "apply-to": "queues",
                 "definition": {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "manual",
                                "ha-promote-on-failure": "always", "ha-promote-on-shutdown": "always"}}
# --queue-type mirrored-nodes: mirrors on two named nodes (the third node holds none, so clients
# there reach the queue through another node), synchronised automatically, when-synced promotion.
NODES_POLICY = {"pattern": "^sim-", "apply-to": "queues",
                "definition": {"ha-mode": "nodes", "ha-params": ["hutch@n1", "hutch@n2"],
                               "ha-sync-mode": "automatic", "ha-promote-on-failure": "when-synced",
                               "ha-promote-on-shutdown": "when-synced"}}
# --queue-type mirrored-automatic-always: mirrors on every node, synchronised automatically, but any
# mirror promoted, synchronised or not: a mirror that joined after a restart and had not finished
# its synchronisation may take over without what it lacked (RabbitMQ's documented loss, counted).
AUTOMATIC_ALWAYS_POLICY = {"pattern": "^sim-", "apply-to": "queues",
                           "definition": {"ha-mode": "all", "ha-sync-mode": "automatic",
                                          "ha-promote-on-failure": "always", "ha-promote-on-shutdown": "always"}}
MIRROR_POLICIES = {"mirrored": MIRROR_POLICY, "mirrored-always": ALWAYS_POLICY, "mirrored-nodes": NODES_POLICY,
                   "mirrored-automatic-always": AUTOMATIC_ALWAYS_POLICY}
LOSS_ALLOWED = {"mirrored-always", "mirrored-automatic-always"}
EXCLUSIVE_GONE_S = 10.0  # after the owner's last connection closed: how long its exclusive queue may stay
COPIES_SETTLE_S = 10.0  # after the drain: how long the queue's copies may take to agree
QUORUM_OR_MIRRORED = {"quorum", *MIRROR_POLICIES}  # the queue types whose copies `_check_copies` compares
LEADER_CHECK_S = 0.01  # how often the one-leader-per-term check samples the nodes
BOOT_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 5.0  # a client's connect, declare or consume
CLIENT_BACKOFF_S = (0.05, 0.5)
AUDIT_S = 5.0  # how long the audit's consumer waits on each node
REQUEUE_P = 0.05  # the share of deliveries a consumer rejects with requeue instead of acking
CONSUME_SPELL_S = (0.5, 3.0)  # with "cancel": how long the consumer consumes before it cancels
STREAM_CREDIT = 3  # chunks a stream-protocol consumer lets the node send ahead of what it has read
CONFIRM_TIMEOUT_S = 10.0  # a publisher whose window is full gives its connection up after this long
RETRIES_MAX = 4  # with "retry": the most times a publisher sends one message
RUN_S_MAX = 600.0  # a run that has not ended after this much simulated time is stuck
# The nemesis's fault kinds (--faults): "net" partitions and resets links and client connections,
# "crash" kills a node's process (kill -9), "power" cuts a node's power (its unsynced writes are
# lost, the last may be torn), "fsync" makes a node's fsyncs fail for a while (the node stops
# itself; its page cache is not trusted afterwards), "disk-full" fills a node's disk for a while
# (the disk alarm, and half the time writes failing with ENOSPC), "clock" drifts every node's
# clock and jumps one node's wall clock (a node reads it when it starts), "slow-disk" makes a
# node's fsyncs slow for a while (each takes up to half a second; the node learns of those it
# runs in a worker thread only once they are done), "membership" has the operator replace a node
# once (stop it, forget_cluster_node on another, then start it afresh to join_cluster again: on
# quorum queues and streams, which keep their messages through it).
FAULT_KINDS = ("net", "crash", "power", "fsync", "disk-full", "clock", "slow-disk", "membership")
# what _side_nemesis draws, from a generator of its own
SIDE_KINDS = ("power", "fsync", "disk-full", "clock", "slow-disk", "membership")
MEMBERSHIP_QUEUE_TYPES = {"quorum", "stream", "stream-protocol"}  # where "membership" is drawn
FORGET_TIMEOUT_S = 30.0  # how long the operator waits for forget_cluster_node
# What `run_seed` draws unless told otherwise: the faults the simulation had before it had disks
# and clocks, with which a seed names the same run as it did then (the batches in
# tests/sim/test_cluster_sim.py and their regression seeds). `hutch sim cluster` draws them all.
NET_AND_CRASH = frozenset({"net", "crash"})
# What the clients do besides publishing with confirms and consuming with acks and rejects:
# "get" adds a client that takes messages with basic.get (acked or rejected); "cancel" has the
# consumer cancel its subscription now and then and subscribe again, settling what it holds;
# "nack" has it requeue with basic.nack as often as with basic.reject. They draw from a
# generator of their own: without them a seed names the run it named before they existed.
# "retry" has a publisher send again what a dead connection left unconfirmed, and what was nacked;
# "many" runs two publishers and two consumers instead of one of each.
CLIENT_KINDS = ("get", "cancel", "nack", "retry", "many")
DISK_FAULT_S = (0.5, 3.0)  # how long an fsync error, a full disk or a slow one lasts
SLOW_FSYNC_S = (0.001, 0.5)  # the range a slow disk's fsync times are drawn from: its slowest fsync
DRIFT_PPM_MAX = 200  # each node's clocks run this much fast or slow at most
WALL_JUMP_S_MAX = 300  # the largest jump of a node's wall clock, forward or back
DISK_FREE_LIMIT_BYTES = 50 * 1000 * 1000  # the nodes' disk_free_limit (RabbitMQ's default)
MESSAGE_TTL_MS = 3_600_000  # with clock faults the queue has a message TTL no jump can reach
# What a run can find, in the words SimResult.stats["failed"] uses:
FAILURE_KINDS = frozenset({
    "lost",  # a confirmed message nobody could receive after the heal, not even a new consumer
    "starved",  # a confirmed message the consumer never got though the queue still held it
    "unpublished",  # a delivery of a message that was never published
    "redelivered-flag",  # a message delivered twice without `redelivered`
    "catalogue",  # catalogues that differ at one applied index, or never reach one
    "exclusive",  # an exclusive queue that outlived its owner's connection
    "copies",  # two nodes' copies of the quorum or mirrored queue that differ at the same point
    "two-leaders",  # two leaders of one Raft group in one term, or two confirming leaders of a mirrored queue
    "stale-resume",  # a node let clients in after a pause before it had caught up with the catalogue
    "duplicate",  # a stream holds a message twice, though its publisher (a deduplicating writer) sent it once
    "offsets",  # a stream reader got offsets out of sequence, or two reads of one offset found different messages
    "unhandled",  # an exception that escaped a node's callback or task
    "peer-message",  # a node raised on a peer's message (its transport closed the link)
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
    faults: frozenset[str] = NET_AND_CRASH  # the fault kinds the nemesis draws (FAULT_KINDS)
    clients: frozenset[str] = frozenset()  # what more the clients do (CLIENT_KINDS)
    # classic queues' (and mirrors') memory window in messages (0: the node's default, 8,192, which
    # a run of 40 messages never fills): a small one makes the queue page and the mirrors keep
    # their copy by reference
    memory_window: int = 0
    trace: bool = False


@dataclass(slots=True)
class _History:
    published: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    nacked: set[str] = field(default_factory=set)
    unroutable: set[str] = field(default_factory=set)  # returned (mandatory) and so not confirmed
    delivered: dict[str, int] = field(default_factory=dict)  # message id -> deliveries seen
    unflagged: set[str] = field(default_factory=set)  # message ids delivered once without `redelivered`


class _TraceHandler(logging.Handler):
    def __init__(self, kernel: Kernel, root: str, watch=None) -> None:
        super().__init__(logging.INFO)
        self.kernel = kernel
        self.root = root
        self.watch = watch  # watch(host, message): checks that follow what the nodes log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not end the run
            text = str(record.msg)
        if record.exc_info and record.levelno >= logging.ERROR:
            text += f" [{record.exc_info[0].__name__}: {record.exc_info[1]}]"
        if self.watch is not None:
            self.watch(current_host.get(), text)
        text = _LONG_NUMBER.sub("#", text.replace(self.root, "$DATA"))  # the run's directory differs per run
        self.kernel.log(f"{current_host.get()} {record.levelname.lower()} {record.name}: {text}")


def _memory_fs() -> str | None:
    """A memory file system for the nodes' data (fsyncs there cost nothing), if the host has one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass(slots=True)
class HostClock:
    """One simulated host's clocks. Its monotonic clock runs at the loop's rate times (1 + drift);
    its wall clock is that plus the epoch, the skew it booted with and every jump it was given.
    A node reads the wall clock once, when it starts (hutch.server.clock.NodeClock): a jump
    reaches a running node's time only when it restarts."""
    now_s: Callable[[], float]
    drift: float = 0.0  # 1e-4: 100 ppm fast
    skew_s: float = 0.0  # drawn at each boot
    jumped_s: float = 0.0  # the wall clock's jumps so far, forward or back

    def monotonic(self) -> float:
        return self.now_s() * (1 + self.drift)

    def wall(self) -> float:
        return SIM_EPOCH_S + self.skew_s + self.jumped_s + self.monotonic()


@contextlib.contextmanager
def simulated_clocks(now_s, clocks: dict[str, HostClock] | None = None) -> Iterator[None]:
    """While it lasts, `time.monotonic` and `time.time` read simulated time: the clocks of the
    host whose code runs (`clocks`), or outside every host the loop's clock and the wall clock at
    SIM_EPOCH_S plus it. The few places below the runtime that read a clock directly (the segment
    log's synced mark, the durations store recovery logs, one timestamp) read simulated time."""
    clocks = clocks or {}
    saved = (time.monotonic, time.time)

    def monotonic() -> float:
        c = clocks.get(current_host.get())
        return now_s() if c is None else c.monotonic()

    def wall() -> float:
        c = clocks.get(current_host.get())
        return SIM_EPOCH_S + now_s() if c is None else c.wall()

    time.monotonic, time.time = monotonic, wall
    try:
        yield
    finally:
        time.monotonic, time.time = saved


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
        # the disk, clock and power faults draw from their own generator, so that a run without
        # them (--faults net,crash) is the run the seed named before they existed
        self.rng2 = random.Random(opts.seed * 1_000_003 + 0xD15C)
        self.disk = SimDisk(random.Random(self.rng2.getrandbits(64)))
        self.loop.work_clock = lambda: self.disk.fsync_s  # a slow disk's fsyncs in worker threads take time
        self.rng3 = random.Random(opts.seed * 1_000_037 + 0xC11E)  # the clients' CLIENT_KINDS
        self.clocks = {h: HostClock(self.loop.time) for h in self.hosts}
        if "clock" in opts.faults:
            for c in self.clocks.values():
                c.drift = self.rng2.uniform(-DRIFT_PPM_MAX, DRIFT_PPM_MAX) / 1e6
        self._leaders: dict[tuple, str] = {}  # (group, term) -> the node that led it
        # a mirrored queue's leaders that confirmed, each (host, epoch): how many it had confirmed
        # when last sampled; the one that confirmed last; those that confirmed before it -> the
        # host of the leader that succeeded them
        self._confirmed_by: dict[tuple[str, int], int] = {}
        self._confirming: tuple[str, int] | None = None
        self._superseded: dict[tuple[str, int], str] = {}
        self._resuming: dict[str, int] = {}  # a node resuming from a pause -> the catalogue's commit index then
        self._restarts: list[asyncio.Task] = []
        self._checked = False  # the checks have run; the nodes are being stopped
        # a stream's readers: a client -> [the offset its subscription must deliver next, the host
        # it reads on]; what was found at each offset, and where each message was found
        self._reading: dict[SimClient, list] = {}
        self._at_offset: dict[int, str] = {}
        self._offset_of: dict[str, int] = {}
        self._resume_at: dict[str, int] = {}  # a stream's consumer -> the offset it subscribes at next
        self._stored_offsets: set[int] = set()  # what the first stream-protocol consumer stored (StoreOffset)
        self._next_id = 0  # the next message the publishers send
        self._downs = 0  # how many times a node's process has gone (killed, lost power, stopped itself)
        self._transient_gone = False  # a node saw another down: the non-durable queue may be gone (_watch_log)
        many = "many" in opts.clients
        self._publishers = ["pub", "pub2"] if many else ["pub"]
        self._consumers = ["con", "con2"] if many and opts.queue_type != EXCLUSIVE else ["con"]  # one owner
        self.failures: list[tuple[str, str]] = []  # (kind, what): the checks that failed (FAILURE_KINDS)

    # -- the run

    def run(self) -> SimResult:
        self.root = tempfile.mkdtemp(prefix="hutch-sim-", dir=_memory_fs())
        hutch_log = logging.getLogger("hutch")
        node_log = logging.getLogger("hutch.node")  # its pauses and listeners: _watch_log
        cluster_log = logging.getLogger("hutch.cluster")  # its deletions of non-durable queues: _watch_log
        saved = (hutch_log.level, hutch_log.propagate, Journal.compactor_thread, node_log.level, cluster_log.level,
                 raftlog.MEMORY_ENTRIES)
        handler = _TraceHandler(self.kernel, self.root, self._watch_log)
        hutch_log.addHandler(handler)
        hutch_log.setLevel(logging.INFO if self.opts.trace else logging.ERROR)
        node_log.setLevel(logging.INFO)
        if self.opts.queue_type in VOLATILE:
            cluster_log.setLevel(logging.INFO)
        hutch_log.propagate = False
        Journal.compactor_thread = False
        if self.opts.memory_window:  # the Raft logs keep as few entries in memory, and read the rest back
            raftlog.MEMORY_ENTRIES = self.opts.memory_window
        try:
            for h in self.hosts:
                self.disk.mount(h, os.path.join(self.root, h))
            with (seeded_entropy(self.opts.seed), self.disk.installed(_FSYNCS_BOUND_AT_IMPORT),
                  simulated_clocks(self.loop.time, self.clocks)):
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
            node_log.setLevel(saved[3])
            cluster_log.setLevel(saved[4])
            raftlog.MEMORY_ENTRIES = saved[5]
            shutil.rmtree(self.root, ignore_errors=True)
        violation = "; ".join(text for _, text in self.failures[:5]) or None
        h = self.history
        self.stats.update(published=len(h.published), confirmed=len(h.confirmed), nacked=len(h.nacked),
                          delivered=len(h.delivered), sim_s=round(self.kernel.now / 1e6, 3))
        if h.unroutable:
            self.stats["unroutable"] = len(h.unroutable)
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
        what = what.replace(self.root, "$DATA")
        text = f"unhandled exception on {current_host.get()} ({context.get('message', '')}): {what}"
        self.kernel.log(text)
        if self._checked or any(n.exit_code for n in self.nodes.values()) or isinstance(exc, StoreFailed):
            # while the nodes stop after the checks, or one stops itself (its disk failed), or a
            # store that failed refusing a write (its node stops, or has stopped): reported in the
            # stats only
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
        self.kernel.log(f"sim cluster seed {self.opts.seed}: {len(self.hosts)} nodes, queue type {self.opts.queue_type}")
        self._write_secret()
        boots = [self._spawn_on(h, self._boot(h)) for h in self.hosts]
        try:
            async with asyncio.timeout(BOOT_TIMEOUT_S):
                await asyncio.gather(*boots)
        except TimeoutError:
            self._fail("boot", f"the cluster did not boot within {BOOT_TIMEOUT_S:.0f} s")
            return
        self.kernel.log("cluster booted")
        if self.opts.queue_type in MIRROR_POLICIES:
            await self._set_mirror_policy(MIRROR_POLICIES[self.opts.queue_type])
        self.loop.call_later(LEADER_CHECK_S, self._check_leaders)
        async with asyncio.TaskGroup() as tg:
            publish = self._stream_publisher if self.opts.queue_type == STREAM_PROTOCOL else self._publisher
            publishers = [tg.create_task(publish(who)) for who in self._publishers]
            consumers = [tg.create_task(self._consumer(who)) for who in self._consumers]
            getter = tg.create_task(self._getter()) if "get" in self._client_kinds() else None
            if self.opts.faults & set(SIDE_KINDS):
                tg.create_task(self._side_nemesis())
            await self._nemesis()
            self._heal()
            await self._everyone_back()
            for publisher in publishers:
                await publisher
            drained = await self._drain()
            for consumer in consumers:
                consumer.cancel()
            if getter is not None:
                getter.cancel()
        missing = set(self.history.confirmed) - set(self.history.delivered)
        if self.opts.queue_type in STREAMS:
            await self._read_every_replica()
        elif not drained:
            await self._audit()
        if self.opts.queue_type == EXCLUSIVE:
            await self._check_exclusive_gone()
        await self._check_catalogues()
        await self._check_copies()
        self._check_messages(missing)

    async def _set_mirror_policy(self, policy: dict) -> None:
        """As an operator would with `hutchctl set_policy`, retrying until the catalogue holds the
        default vhost (the first seconds after a cluster forms)."""
        host = self.hosts[0]
        cmd = set_policy_command(validate_policy("/", "ha", policy))
        for _ in range(100):
            try:
                await self._spawn_on(host, changes.commit(self.nodes[host].broker, cmd))
                self.kernel.log(f"policy 'ha' set on {host}: {policy}")
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
        window = {"classic_queue_memory_window_messages": self.opts.memory_window} if self.opts.memory_window else {}
        return Config(node_name=f"hutch@{host}", amqp_host=host, amqp_port=AMQP_PORT,
                      data_dir=os.path.join(self.root, host), mgmt_port=0, prometheus_port=0,
                      stream_port=STREAM_PORT if self.opts.queue_type == STREAM_PROTOCOL else 0,
                      peer_port=PEER_PORT, cluster_nodes=[f"hutch@{h}:{PEER_PORT}" for h in self.hosts],
                      cluster_secret_file=os.path.join(self.root, "secret"), loopback_users=[],
                      net_ticktime_s=self.opts.net_ticktime_s, disk_free_limit_bytes=DISK_FREE_LIMIT_BYTES,
                      vm_memory_high_watermark_bytes=1 << 50, consumer_timeout_ms=None,
                      cluster_partition_handling="pause_minority" if self.opts.queue_type in MIRROR_POLICIES
                      else "ignore", **window)

    async def _boot(self, host: str, join: str | None = None) -> None:
        if host in self.nodes:
            raise RuntimeError(f"node {host} is already running")
        c = self.clocks[host]
        c.skew_s = self.rng.randint(-WALL_SKEW_MS_MAX, WALL_SKEW_MS_MAX) / 1000
        node = Node(self._config(host), network=self.net.host(host), clock=NodeClock(c.monotonic, c.wall))
        if join is not None:  # a node that was forgotten: reset, to join through `join`
            node.join_cluster(f"hutch@{join}", (join, PEER_PORT))
        self.nodes[host] = node
        await node.start()
        self.loop.call_later(COMPACT_INTERVAL_S, self._compact, node)
        if self.opts.faults & {"fsync", "disk-full"}:  # a node that stops itself (fail_stop)
            self._spawn_on(host, self._serve(host, node))

    async def _serve(self, host: str, node: Node) -> None:
        """The node's process after its start: it runs until it stops itself, then exits."""
        try:
            await node.serve_forever()
        except Exception as e:  # noqa: BLE001 - a stop that breaks still ends the process
            self.kernel.log(f"{host}: stopping raised {type(e).__name__}: {str(e).replace(self.root, '$DATA')}")
        if self.nodes.get(host) is node:
            self.loop.call_soon(self._exited, host, node, context=contextvars.Context())

    def _exited(self, host: str, node: Node) -> None:
        """A node that stopped itself (a failed fsync or write) has exited; after a failed fsync
        its page cache is not trusted, so it restarts as after a power failure, once the disk
        works again."""
        if self.nodes.get(host) is not node:
            return
        self.kernel.log(f"nemesis: {host} exited with status {node.exit_code}")
        self.stats["fail_stops"] = self.stats.get("fail_stops", 0) + 1
        self._down(host, power=True)
        self._restarts.append(self.loop.create_task(self._restart(host, self.rng2.uniform(0.2, 3.0))))

    def _compact(self, node: Node) -> None:
        if node.app_running and node.broker.journal.compact_step():
            self.loop.call_later(COMPACT_INTERVAL_S, self._compact, node)

    async def _everyone_back(self) -> None:
        """After the heal: every node restarted and serving again (a restart waits for its disk)."""
        while True:
            for restart in list(self._restarts):
                await restart
            if len(self.nodes) == len(self.hosts) and not any(n.stop_requested for n in self.nodes.values()):
                return
            await asyncio.sleep(0.05)

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
            kind = self.rng.random()
            if ("crash" if 0.5 <= kind < 0.6 else "net") not in self.opts.faults:
                continue
            self.stats["faults"] += 1
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
                client = self.rng.choice(self._publishers + self._consumers)
                self.kernel.log(f"nemesis: reset the connections of client {client}")
                for h in self.hosts:
                    self._reset_between(client, h)

    def _crash(self, rng: random.Random | None = None, power: bool = False) -> None:
        """A node's process dies (kill -9), or its host loses power, and it restarts from its
        data directory a little later. At most a minority is down at once (or has a failing
        disk), so the quorum queue keeps a majority on disk."""
        rng = rng or self.rng
        if len(self._impaired()) >= (len(self.hosts) - 1) // 2:
            return
        host = rng.choice(sorted(self.nodes))
        if not self.nodes[host].app_running or host in self._impaired():
            return
        what, counter = ("power loss", "power_losses") if power else ("crash", "crashes")
        self.stats[counter] = self.stats.get(counter, 0) + 1
        self.kernel.log(f"nemesis: {what} {host}")
        self._down(host, power)
        self._restarts.append(self.loop.create_task(self._restart(host, rng.uniform(0.2, 3.0))))

    def _impaired(self) -> set[str]:
        """The hosts down, or whose disk fails."""
        return set(self.hosts) - set(self.nodes) | self.disk.fsync_failing | self.disk.full

    def _down(self, host: str, power: bool) -> None:
        """The node's process is gone: its tasks stop, its connections reset, its files close.
        What it wrote stays in the page cache, unless the power went too."""
        self.nodes.pop(host, None)
        self._downs += 1
        self._resuming.pop(host, None)
        self.net.kill_host(host)
        self.disk.close_all(host)
        if power:
            loss = self.disk.power_loss(host)
            self.kernel.log(f"nemesis: {host} lost {loss.bytes_lost} unsynced bytes in {loss.files} file(s), "
                            f"{loss.torn} write(s) torn")

    async def _restart(self, host: str, after_s: float, join: str | None = None) -> None:
        """Start the node again after `after_s`, once its disk works; a start that fails (its disk
        failed meanwhile) is a process that exited: it is tried again, as an operator would. With
        `join`, it is reset first and joins the cluster through that node (join_cluster)."""
        while True:
            await asyncio.sleep(after_s)
            while host in self.disk.fsync_failing or host in self.disk.full:  # the operator waits for the disk
                await asyncio.sleep(0.1)
            self.kernel.log(f"nemesis: restart {host}")
            try:
                await self._spawn_on(host, self._boot(host, join))
                return
            except Exception as e:  # noqa: BLE001 - a start the disk failed
                self.kernel.log(f"nemesis: {host} did not start: {type(e).__name__}: {e}")
                if host in self.nodes:
                    self._down(host, power=True)
                after_s = 0.5

    async def _replace(self, host: str) -> None:
        """The operator replaces `host`: stops it, forgets it on another node (its quorum queues
        and streams lose it as a member and keep their messages), then starts it with an empty
        data directory to join the cluster again. A forget that is refused or times out (no
        majority) leaves the node to start as it was."""
        self.kernel.log(f"nemesis: replace {host}: stop it, forget it, start it afresh to join again")
        self._down(host, power=False)
        survivor = self.rng2.choice(sorted(self.nodes))
        node = self.nodes[survivor]
        try:
            async with asyncio.timeout(FORGET_TIMEOUT_S):
                while node.clustering.is_up(f"hutch@{host}"):  # the operator waits until it shows as down
                    await asyncio.sleep(0.1)
                error = await self._spawn_on(survivor, forget_cluster_member(node, node.broker, f"hutch@{host}"))
        except Exception as e:  # noqa: BLE001 - the survivor went down meanwhile, or no majority
            error = f"{type(e).__name__}: {e}"
        if error is not None:
            self.kernel.log(f"nemesis: forgetting {host} on {survivor} failed: {error}; starting it as it was")
            await self._restart(host, 0.5)
            return
        self.kernel.log(f"nemesis: {host} forgotten on {survivor}; it starts afresh and joins via {survivor}")
        await self._restart(host, self.rng2.uniform(0.2, 1.0), join=survivor)

    async def _side_nemesis(self) -> None:
        """The faults below the node and the operator's: power losses, fsync errors, full and slow
        disks, clock jumps and a node replaced, drawn from their own generator (`rng2`) at their
        own times until the heal."""
        rng = self.rng2
        kinds = [k for k in SIDE_KINDS if k in self.opts.faults
                 and (k != "membership" or self.opts.queue_type in MEMBERSHIP_QUEUE_TYPES)]
        if not kinds:
            return
        deadline = self.loop.time() + self.opts.fault_s
        while True:
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            if self.loop.time() >= deadline:
                return
            kind = rng.choice(kinds)
            if kind == "power":
                self._crash(rng, power=True)
            elif kind == "membership":
                # every node up and serving (not one still starting: its start would never end)
                if (not self.stats.get("replaced") and not self._impaired()
                        and all(n.app_running for n in self.nodes.values())):
                    host = rng.choice(self.hosts)
                    self.stats["replaced"] = 1
                    self._restarts.append(self.loop.create_task(self._replace(host)))
            elif kind == "clock":
                host = rng.choice(self.hosts)
                jump_s = rng.choice((-1, 1)) * rng.uniform(1, WALL_JUMP_S_MAX)
                self.clocks[host].jumped_s += jump_s
                self.stats["clock_jumps"] = self.stats.get("clock_jumps", 0) + 1
                self.kernel.log(f"nemesis: {host}'s wall clock jumps {jump_s:+.1f} s")
            elif kind == "slow-disk":
                host = rng.choice(self.hosts)
                slowest_s = rng.uniform(*SLOW_FSYNC_S)
                lasts_s = rng.uniform(*DISK_FAULT_S)
                self.disk.slow[host] = (SLOW_FSYNC_S[0], slowest_s)
                self.stats[kind] = self.stats.get(kind, 0) + 1
                self.kernel.log(f"nemesis: {host}'s fsyncs take up to {1000 * slowest_s:.0f} ms for {lasts_s:.2f} s")
                self.loop.call_later(lasts_s, self._disk_repaired, host)
            else:
                healthy = sorted(set(self.nodes) - self._impaired())
                if not healthy:
                    continue
                host = rng.choice(healthy)
                lasts_s = rng.uniform(*DISK_FAULT_S)
                if kind == "fsync":
                    if len(self._impaired()) >= (len(self.hosts) - 1) // 2:
                        continue
                    self.disk.fsync_failing.add(host)
                    self.kernel.log(f"nemesis: {host}'s fsyncs fail (EIO) for {lasts_s:.2f} s")
                else:
                    enospc = rng.random() < 0.5 and len(self._impaired()) < (len(self.hosts) - 1) // 2
                    self.disk.free_bytes[host] = DISK_FREE_LIMIT_BYTES // 2
                    if enospc:
                        self.disk.full.add(host)
                    self.kernel.log(f"nemesis: {host}'s disk is {'full (ENOSPC)' if enospc else 'nearly full'} "
                                    f"for {lasts_s:.2f} s")
                self.stats[kind] = self.stats.get(kind, 0) + 1
                self.loop.call_later(lasts_s, self._disk_repaired, host)

    def _disk_repaired(self, host: str) -> None:
        disk = self.disk
        if host in disk.fsync_failing or host in disk.full or host in disk.free_bytes or host in disk.slow:
            self.kernel.log(f"nemesis: {host}'s disk works again")
        disk.fsync_failing.discard(host)
        disk.full.discard(host)
        disk.free_bytes.pop(host, None)
        disk.slow.pop(host, None)

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
        for host in self.hosts:
            self._disk_repaired(host)

    # -- clients

    async def _connect(self, who: str, **callbacks) -> tuple[SimClient, str]:
        while True:
            host = self.rng.choice(self.hosts)
            client = SimClient(who, **callbacks)
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.connect(self.net.host(who), host, AMQP_PORT)
                    if self.opts.queue_type != EXCLUSIVE:
                        await client.queue_declare(QUEUE, durable=self.opts.queue_type != TRANSIENT,
                                                   arguments=self._queue_arguments())
                    elif who == self._consumers[0]:  # its owner; the publishers only publish to it
                        await client.queue_declare(QUEUE, durable=False, exclusive=True,
                                                   arguments=self._queue_arguments())
                self.kernel.log(f"client {who}: connected to {host}")
                return client, host
            except asyncio.CancelledError:  # the run is over: a connection half set up closes too
                client.abort()
                raise
            except Exception as e:  # noqa: BLE001 - any failure: retry
                self.kernel.log(f"client {who}: could not set up on {host}: {type(e).__name__}: {e}")
                client.abort()
                self.stats["reconnects"] += 1
                await asyncio.sleep(self.rng.uniform(*CLIENT_BACKOFF_S))

    def _queue_arguments(self) -> dict:
        """The queue's arguments; with clock faults, a message TTL that no jump or drift reaches,
        so that the expiry paths run on every node's clock and a confirmed message that expires
        shows a clock that went wrong."""
        args = dict(QUEUE_TYPES[self.opts.queue_type])
        if "clock" in self.opts.faults and self.opts.queue_type not in STREAMS:
            args["x-message-ttl"] = MESSAGE_TTL_MS
        return args

    async def _publisher(self, who: str) -> None:
        """Publish with confirms, a window of 8, until the messages are all sent. With "retry", a
        copy left unconfirmed when a connection died, or nacked, is sent again (on the next
        connection, or at once) as a new copy, m5 -> m5.2, as a client library that publishes
        at least once would; each copy is its own message to the checks, up to RETRIES_MAX."""
        h = self.history
        window_max = 8
        retrying = "retry" in self.opts.clients
        again: list[str] = []  # copies to send again
        # an exclusive queue exists only while its owner's connection does: a message published
        # when there is none is routed nowhere and confirmed (AMQP's rule); mandatory, it comes
        # back first, and counts as unroutable, not confirmed
        mandatory = self.opts.queue_type == EXCLUSIVE
        while self._next_id < self.opts.messages or again:
            tags: dict[int, str] = {}
            returned: set[str] = set()

            def on_confirm(tag: int, multiple: bool, ack: bool, tags=tags, returned=returned) -> None:
                done = [t for t in tags if t <= tag] if multiple else [tag]
                for t in done:
                    mid = tags.pop(t, None)
                    if mid is None:
                        continue
                    if mid in returned:
                        returned.discard(mid)
                        h.unroutable.add(mid)
                        self.kernel.log(f"client {who}: {mid} returned unroutable")
                        ack = False
                    else:
                        (h.confirmed if ack else h.nacked).add(mid)
                        self.kernel.log(f"client {who}: {'confirmed' if ack else 'nacked'} {mid}")
                    if not ack and retrying:
                        _send_again(again, mid)

            client, _ = await self._connect(who, on_confirm=on_confirm,
                                            on_return=lambda body, returned=returned: returned.add(body.decode()))
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    await client.confirm_select()
                while (self._next_id < self.opts.messages or again) and client.closed is None:
                    if len(tags) >= window_max:
                        await self._confirms_below(client, tags, window_max)
                        continue
                    if again:
                        mid = again.pop(0)
                    else:
                        mid = f"m{self._next_id}"
                        self._next_id += 1
                    props = commands.Basic.Properties(delivery_mode=1 if self.opts.queue_type == TRANSIENT else 2,
                                                      message_id=mid.partition(".")[0])
                    tags[client.publish(QUEUE, mid.encode(), props, mandatory)] = mid
                    h.published.add(mid)
                    self.kernel.log(f"client {who}: published {mid}")
                    await asyncio.sleep(self.rng.uniform(0.005, 0.1))
                while tags and client.closed is None:  # the last confirms
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(STEP_TIMEOUT_S):
                            await client.closed_event.wait()
                    break
            except Exception as e:  # noqa: BLE001 - the connection died: what was not confirmed is unknown
                self.kernel.log(f"client {who}: {type(e).__name__}: {e}")
            self.kernel.log(f"client {who}: {len(tags)} publish(es) left unconfirmed on this connection")
            if retrying:
                for mid in sorted(tags.values(), key=_copy_order):
                    _send_again(again, mid)
            await client.close()

    async def _stream_publisher(self, who: str) -> None:
        """Publish over the stream protocol as a deduplicating producer does (the stream clients'
        named producers): publisher reference `sim-<who>`, publishing ids 1, 2, ... in order, a
        window of 8. After each (re)connection to the stream's leader it sends again, under their
        ids, what it sent and had no answer for; the stream must confirm those and store each
        once (the `duplicate` check). A refused publish is nacked, not sent again."""
        h = self.history
        window_max = 8
        unanswered: dict[int, str] = {}  # publishing id -> message sent and neither confirmed nor refused
        next_pid = 1
        while self._next_id < self.opts.messages or unanswered:
            answered = asyncio.Event()

            def on_confirm(_publisher: int, pids: list[int], answered=answered) -> None:
                for pid in pids:
                    mid = unanswered.pop(pid, None)
                    if mid is not None:
                        h.confirmed.add(mid)
                        self.kernel.log(f"client {who}: confirmed {mid}")
                answered.set()

            def on_error(_publisher: int, errors: list[tuple[int, int]], answered=answered) -> None:
                for pid, code in errors:
                    mid = unanswered.pop(pid, None)
                    if mid is not None:
                        h.nacked.add(mid)
                        self.kernel.log(f"client {who}: refused {mid} (code {code:#x})")
                answered.set()

            client = await self._stream_connect(who)
            client.on_confirm, client.on_publish_error = on_confirm, on_error
            try:
                for pid, mid in sorted(unanswered.items()):
                    _stream_publish(client, pid, mid)
                    self.kernel.log(f"client {who}: sent {mid} again as publishing id {pid}")
                while (self._next_id < self.opts.messages or unanswered) and not client.closed.done():
                    if len(unanswered) >= window_max or self._next_id >= self.opts.messages:
                        answered.clear()
                        waiting = asyncio.ensure_future(answered.wait())
                        try:
                            async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                                await asyncio.wait([waiting, client.closed], return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            waiting.cancel()
                        continue
                    mid, pid = f"m{self._next_id}", next_pid
                    self._next_id += 1
                    next_pid += 1
                    unanswered[pid] = mid
                    h.published.add(mid)
                    _stream_publish(client, pid, mid)
                    self.kernel.log(f"client {who}: published {mid} as publishing id {pid}")
                    await asyncio.sleep(self.rng.uniform(0.005, 0.1))
            except TimeoutError:
                self.kernel.log(f"client {who}: no answer for {CONFIRM_TIMEOUT_S:.0f} s; giving the connection up")
            except Exception as e:  # noqa: BLE001 - the connection died: what was not answered is sent again
                self.kernel.log(f"client {who}: {type(e).__name__}: {e}")
            self.kernel.log(f"client {who}: {len(unanswered)} publish(es) left unanswered on this connection")
            client.abort()

    def _publisher_reference(self, who: str) -> str:
        """The name under which the stream remembers a publisher's last publishing id (without
        one, a publisher's ids are not deduplicated)."""
        return f"sim-{who}"

    async def _stream_connect(self, who: str) -> StreamClient:
        """A stream-protocol connection to the stream's leader (asked of any node: Metadata),
        with the stream created if need be and the publisher declared."""
        network = self.net.host(who)
        while True:
            host = self.rng.choice(self.hosts)
            ep = StreamEndpoint(host, STREAM_PORT)
            client = None
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    client = await StreamClient.connect(ep, who, network=network)
                    await client.request(sf.Create(0, QUEUE, {}), ok=(sf.OK, sf.STREAM_ALREADY_EXISTS))
                    leader = await client.leader_of(ep, QUEUE, timeout_s=STEP_TIMEOUT_S / 2)
                    if (leader.host, leader.port) != (ep.host, ep.port):
                        client.abort()
                        client = await StreamClient.connect(leader, who, network=network)
                    await client.request(sf.DeclarePublisher(0, 0, self._publisher_reference(who), QUEUE))
                self.kernel.log(f"client {who}: publishing to the stream's leader {leader.host} (asked {host})")
                return client
            except Exception as e:  # noqa: BLE001 - any failure: retry
                self.kernel.log(f"client {who}: could not set up on {host}: {type(e).__name__}: {e}")
                if client is not None:
                    client.abort()
                self.stats["reconnects"] += 1
                await asyncio.sleep(self.rng.uniform(*CLIENT_BACKOFF_S))

    def _on_delivery(self, who: str, this: list, tag: int, redelivered: bool, body: bytes, props=None) -> None:
        h = self.history
        mid = body.decode()
        if mid not in h.published:
            self._fail("unpublished", f"delivered {mid!r}, which was never published")
        if self.opts.queue_type in STREAMS:
            self._on_stream_delivery(who, this[0], tag, props, mid)
            return
        seen = h.delivered.get(mid, 0)
        if not redelivered:
            # Only the broker's first delivery of a message may lack the flag. It need not reach
            # its client first: sent to a consumer on another node just before the link broke,
            # it arrives, while the queue, which cannot know that, requeues it and delivers it
            # again, flagged, perhaps sooner (transient seed 65: m30 to a consumer on n1 as n1
            # was cut off; RabbitMQ's classic and quorum queues do the same).
            if mid in h.unflagged:
                self._fail("redelivered-flag", f"{mid} delivered again without the redelivered flag")
            h.unflagged.add(mid)
        h.delivered[mid] = seen + 1
        self.kernel.log(f"client {who}: delivered {mid}{' (redelivered)' if redelivered else ''}")
        settle = self._requeue if self.rng.random() < REQUEUE_P else self._ack
        self.loop.call_later(self.rng.uniform(0, 0.02), settle, this[0], tag)

    def _on_stream_delivery(self, who: str, client: SimClient, tag: int, props, mid: str) -> None:
        """A stream's offsets are dense and every replica numbers them alike: a subscription
        delivers exactly the offsets from where it asked, one after another; every read of an
        offset, on any node, finds the same message; a message published once is at one offset."""
        h = self.history
        offset = (props.headers or {}).get("x-stream-offset") if props is not None else None
        reading = self._reading.get(client)
        if not isinstance(offset, int) or reading is None:
            self._fail("offsets", f"client {who}: {mid} delivered without an x-stream-offset header ({offset!r})")
        else:
            expected, host = reading
            if offset != expected:
                self._fail("offsets", f"client {who} reading on {host}: offset {offset} ({mid}) delivered where "
                                      f"{expected} was next")
            reading[0] = offset + 1
            found = self._at_offset.setdefault(offset, mid)
            if found != mid:
                self._fail("offsets", f"offset {offset} holds {found} on one read and {mid} on another "
                                      f"(client {who} on {host})")
            first_at = self._offset_of.setdefault(mid, offset)
            if first_at != offset:
                self._fail("duplicate", f"{mid}, published once, is in the stream at offsets {first_at} and {offset}")
            if who in self._consumers:
                self._resume_at[who] = offset + 1
        h.delivered[mid] = h.delivered.get(mid, 0) + 1
        self.kernel.log(f"client {who}: delivered {mid} at offset {offset}")
        self.loop.call_later(self.rng.uniform(0, 0.02), self._ack, client, tag)  # the ack gives credit back

    async def _subscribe(self, client: SimClient, host: str, start: int | str) -> str:
        """Consume the queue; on a stream, from `start` (an offset, or "first"), with the checks
        of `_on_stream_delivery` on what the subscription delivers."""
        if self.opts.queue_type not in STREAMS:
            return await client.consume(QUEUE)
        self._reading[client] = [0 if start == "first" else start, host]  # no retention: "first" is 0
        return await client.consume(QUEUE, {"x-stream-offset": start})

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

    async def _reconnecting(self, who: str, session, deliveries: bool = False) -> None:
        """Connect as `who` (its deliveries, if it takes any, to `_on_delivery`), run
        `session(client)` until the connection dies, and connect again, for as long as the run
        lasts."""
        while True:
            this: list = []  # the client these deliveries come through, once it exists
            callbacks = {}
            if deliveries:
                callbacks["on_delivery"] = lambda tag, redelivered, props, body, this=this: self._on_delivery(
                    who, this, tag, redelivered, body, props)
            client, host = await self._connect(who, **callbacks)
            this.append(client)
            try:
                await session(client, host)
                self.kernel.log(f"client {who}: {client.closed}")
            except asyncio.CancelledError:
                await client.close()
                raise
            except Exception as e:  # noqa: BLE001 - reconnect
                self.kernel.log(f"client {who}: {type(e).__name__}: {e}")
            client.abort()
            if self.opts.queue_type == EXCLUSIVE and who == self._consumers[0]:
                self._transient_gone = True  # its exclusive queue goes with the connection

    async def _consumer(self, who: str) -> None:
        if self.opts.memory_window and self.opts.queue_type not in STREAMS | {EXCLUSIVE}:
            # a small window: a backlog builds while the faults begin, so a classic queue pages,
            # is recovered from disk, synchronised and promoted with messages on disk, and a
            # quorum queue's leader reads its messages back from a log that keeps few entries in
            # memory (no random draw: the seed's other choices stay as they were)
            await asyncio.sleep(self.opts.fault_s / 2)
        if self.opts.queue_type == STREAM_PROTOCOL:
            await self._stream_consumer(who)
            return
        await self._reconnecting(who, self._consume, deliveries=True)

    async def _stream_consumer(self, who: str) -> None:
        """Read the stream over the stream protocol, as the stream clients' consumers do: on any
        node (every replica serves reads), subscribed where `_read_spell` says with a credit of a
        few chunks, one granted back per chunk. Each record
        goes through the stream checks (`_on_stream_delivery`); a chunk that starts before the
        offset asked for has its earlier records skipped. With "cancel" it unsubscribes now and
        then and subscribes again on the same connection. Any failure, or no chunk for
        STEP_TIMEOUT_S: it connects again, to a node drawn afresh."""
        network = self.net.host(who)
        reader = _StreamReader(who)
        while True:
            host = self.rng.choice(self.hosts)
            client = None
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    client = await StreamClient.connect(StreamEndpoint(host, STREAM_PORT), who, network=network)
                self.kernel.log(f"client {who}: connected to {host} over the stream protocol")
                while True:
                    await self._read_spell(client, reader, host)
                    self.kernel.log(f"client {who}: unsubscribed")
                    await asyncio.sleep(self.rng3.uniform(0, 0.3))
            except asyncio.CancelledError:
                if client is not None:
                    client.abort()
                raise
            except Exception as e:  # noqa: BLE001 - any failure (a refused subscription, a dead link): again
                self.kernel.log(f"client {who}: {type(e).__name__}: {e}")
            if client is not None:
                client.abort()
            self.stats["reconnects"] += 1
            await asyncio.sleep(self.rng.uniform(*CLIENT_BACKOFF_S))

    async def _read_spell(self, client: StreamClient, reader: _StreamReader, host: str) -> None:
        """One subscription: until the connection fails, or, with "cancel", for a while. The
        first consumer keeps its place on the server, as the stream clients' named consumers
        do: it stores the last offset of every chunk it took (StoreOffset, under `sim-con`) and
        asks for it (QueryOffset) before it subscribes. A node answers from its replica, which
        may be behind, so the answer may be an older offset it stored (it reads a stretch again)
        or none at all, but never one it did not store (`offsets`)."""
        who = reader.name
        tracked = who == self._consumers[0]
        if tracked:
            stored = await client.query_offset(f"sim-{who}", QUEUE)
            if stored is not None and stored not in self._stored_offsets:
                self._fail("offsets", f"client {who}: {host} answered offset {stored} for its reference, "
                                      "which it never stored")
            self.kernel.log(f"client {who}: {host} has offset {stored} stored for it")
            start = 0 if stored is None else stored + 1
        else:
            start = self._resume_at.get(who, 0)
        self._reading[reader] = [start, host]
        self.kernel.log(f"client {who}: subscribes on {host} from offset {start}")
        until = (self.loop.time() + self.rng3.uniform(*CONSUME_SPELL_S)) if "cancel" in self.opts.clients else None
        chunks_in = client.chunks_from(QUEUE, sf.OFFSET_TYPE_OFFSET, start, credit=STREAM_CREDIT,
                                       timeout_s=STEP_TIMEOUT_S)
        try:
            async for raw in chunks_in:
                h = stream_chunk.read_header(raw)
                for i, record in enumerate(stream_chunk.records(raw, h)):
                    offset = h.first_offset + i
                    if offset < self._reading[reader][0]:
                        continue
                    body = amqp10.Message.decode(record).body
                    props = commands.Basic.Properties(headers={"x-stream-offset": offset})
                    self._on_delivery(who, [reader], 0, False, body, props)
                last = h.first_offset + h.num_records - 1
                if tracked and last >= start:
                    client.store_offset(f"sim-{who}", QUEUE, last)
                    self._stored_offsets.add(last)
                if until is not None and self.loop.time() >= until:
                    return
        finally:
            await chunks_in.aclose()

    def _client_kinds(self) -> frozenset[str]:
        """The client kinds this run has: a stream has no basic.get and no requeue (RabbitMQ
        refuses both), so its clients only cancel."""
        if self.opts.queue_type in STREAMS:
            return self.opts.clients & {"cancel"}
        if self.opts.queue_type == EXCLUSIVE:
            return self.opts.clients - {"get"}  # only the owner's connection may take from the queue
        return self.opts.clients

    async def _consume(self, client: SimClient, host: str) -> None:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await client.qos(10)
            tag = await self._subscribe(client, host, self._resume_at.get(client.name, "first"))
        while "cancel" in self.opts.clients:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rng3.uniform(*CONSUME_SPELL_S)):
                    await client.closed_event.wait()
            if client.closed is not None:
                break
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await client.cancel(tag)  # what it holds unacknowledged is still its to settle
            self.kernel.log(f"client {client.name}: cancelled its consumer")
            await asyncio.sleep(self.rng3.uniform(0, 0.3))
            async with asyncio.timeout(STEP_TIMEOUT_S):
                tag = await self._subscribe(client, host, self._resume_at.get(client.name, "first"))
            self.kernel.log(f"client {client.name}: consumes again")
        await client.closed_event.wait()

    async def _getter(self) -> None:
        """A client that takes messages one at a time with basic.get, as a polling worker would."""
        await self._reconnecting("get", self._get)

    async def _get(self, client: SimClient, host: str) -> None:
        while client.closed is None:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                got = await client.get(QUEUE)
            if got is None:
                await asyncio.sleep(self.rng3.uniform(0.05, 0.3))
                continue
            tag, redelivered, body = got
            self._on_delivery("get", [client], tag, redelivered, body)
            await asyncio.sleep(self.rng3.uniform(0.01, 0.2))

    def _ack(self, client, tag: int) -> None:
        if client.closed is None:
            client.ack(tag)

    def _requeue(self, client, tag: int) -> None:
        """basic.reject with requeue: the message comes back, and its next delivery must say so."""
        if client.closed is None:
            if "nack" in self.opts.clients and self.rng3.random() < 0.5:
                self.kernel.log(f"client {client.name}: requeues delivery {tag} (basic.nack)")
                client.nack(tag, requeue=True)
                return
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
            _client, done = await self._read_on("audit", host, lambda _c: h.confirmed <= set(h.delivered))
            if done:
                return

    async def _read_every_replica(self) -> None:
        """After the drain, a stream is read from its first offset on every node: each read must
        find at every offset what every other read found there, and reach the end of what was
        read anywhere (a confirmed message no read finds is lost)."""
        h = self.history

        def reached(client: SimClient) -> int:  # the offset its subscription delivers next
            return self._reading[client][0] if client in self._reading else 0
        for host in self.hosts:
            who = f"read-{host}"
            client, _done = await self._read_on(who, host, lambda c: reached(c) >= self._stream_end()
                                                and h.confirmed <= set(h.delivered))
            self.kernel.log(f"client {who}: read the stream to offset {reached(client)} of {self._stream_end()}")
            if reached(client) < self._stream_end():
                self._fail("starved", f"a reader of the stream on {host} got to offset {reached(client)} of "
                                      f"{self._stream_end()} in {AUDIT_S:.0f} s after the drain")
        self.stats["stream_offsets"] = self._stream_end()

    async def _read_on(self, who: str, host: str, done: Callable[[SimClient], bool]) -> tuple[SimClient, bool]:
        """A new client `who` consumes the queue on `host` (a stream from its first offset) until
        done(client) or AUDIT_S have passed, then closes; the client, and done(client) then."""
        this: list = []
        client = SimClient(who, on_delivery=lambda tag, redelivered, props, body, this=this:
                           self._on_delivery(who, this, tag, redelivered, body, props))
        this.append(client)
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await client.connect(self.net.host(who), host, AMQP_PORT)
                await client.qos(10)
                await self._subscribe(client, host, "first")
            deadline = self.loop.time() + AUDIT_S
            while self.loop.time() < deadline and not done(client):
                await asyncio.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - the caller tries the next node, or reports a read that fell short
            self.kernel.log(f"client {who}: on {host}: {type(e).__name__}: {e}")
        await client.close()
        return client, done(client)

    def _stream_end(self) -> int:
        return max(self._at_offset, default=-1) + 1

    # -- checks

    def _check_messages(self, missing: set[str]) -> None:
        """`missing`: the confirmed messages the consumer had not received by the end of the drain."""
        h = self.history
        lost = sorted(h.confirmed - set(h.delivered), key=_copy_order)
        transient_gone = self.opts.queue_type in VOLATILE and (self._downs or self._transient_gone)
        if lost and (self.opts.queue_type in LOSS_ALLOWED or transient_gone):
            self.stats["lost_allowed"] = len(lost)
            self.kernel.log(f"confirmed message(s) lost as the queue's policy allows: {_names(lost)}")
        elif lost:
            self._fail("lost", f"confirmed message(s) never delivered: {_names(lost)} ({len(lost)} of "
                               f"{len(h.confirmed)} confirmed; not within {self.opts.drain_s:.0f} s after the heal, "
                               f"nor to a new consumer on any node)")
        found = sorted(missing - set(lost), key=_copy_order)
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

    async def _check_exclusive_gone(self) -> None:
        """The consumer's last connection has closed: its exclusive queue must go from every node's
        catalogue within EXCLUSIVE_GONE_S (a queue left behind would refuse its next owner, 405
        RESOURCE_LOCKED, for good)."""
        deadline = self.loop.time() + EXCLUSIVE_GONE_S
        while True:
            holding = sorted(h for h, n in self.nodes.items()
                             if n.clustering is not None and n.clustering.cluster.catalogue.queue("/", QUEUE) is not None)
            if not holding:
                return
            if self.loop.time() >= deadline:
                rec = self.nodes[holding[0]].clustering.cluster.catalogue.queue("/", QUEUE)
                self._fail("exclusive", f"the exclusive queue {QUEUE} outlived its owner's last connection by "
                                        f"{EXCLUSIVE_GONE_S:.0f} s in the catalogue of {', '.join(holding)} "
                                        f"(owner {rec.exclusive_owner}, home node {rec.leader_node})")
                return
            await asyncio.sleep(0.05)

    async def _check_copies(self) -> None:
        """Every node's copy of the queue, once the drain is over. Quorum members that applied the
        same index must agree in every counter and hash, as `GET /api/hutch/digest` describes them
        (hutch.control.digest; members left at different points are compared in groups). A
        mirrored queue's leader and mirrors (`_mirrored_copies`): no mirror may hold a message the
        leader does not (one that missed a removal, or left in a ring nobody broadcasts to, has
        diverged), and a mirror the leader counts as synchronised must hold all it holds; an
        unsynchronised mirror may lack what came before it joined (manual sync). Waited for until
        the copies agree, or COPIES_SETTLE_S has passed."""
        if self.opts.queue_type not in QUORUM_OR_MIRRORED:
            return
        deadline = self.loop.time() + COPIES_SETTLE_S
        while True:
            problems, together, described, compared = (self._quorum_copies() if self.opts.queue_type == "quorum"
                                                       else self._mirrored_copies())
            if (compared >= 2 and together and not problems) or self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        self.kernel.log(f"copies of {QUEUE}: {described}")
        self.stats["copies_compared"] = compared
        for problem in problems:
            self._fail("copies", problem)

    def _quorum_copies(self) -> tuple[list[str], bool, str, int]:
        """(disagreements, whether every member is at one point, a description, copies compared)
        of the quorum queue's members."""
        digests = {}
        for host, node in self.nodes.items():
            v = node.broker.vhosts.get("/") if node.app_running and node.broker is not None else None
            q = v.queues.get(QUEUE) if v is not None else None
            d = copy_digest(node.broker, q) if q is not None else None
            if d is not None:
                digests[host] = d
        together = len({d["applied"] for d in digests.values()}) <= 1
        return compare_copies(digests), together, ", ".join(f"{h} at {d['applied']} {d['state_hash']}" for h, d in sorted(digests.items())), \
            len(digests)

    def _mirrored_copies(self) -> tuple[list[str], bool, str, int]:
        """(disagreements, True, a description, copies compared) of the mirrored queue's leader and
        mirrors."""
        leader: tuple[str, set[int], set[str]] | None = None  # host, its seqs, nodes of synchronised mirrors
        mirrors: dict[str, set[int]] = {}
        for host, node in self.nodes.items():
            v = node.broker.vhosts.get("/") if node.app_running and node.broker is not None else None
            q = v.queues.get(QUEUE) if v is not None else None
            copy = mirror_copy(node.broker, q) if q is not None and not q.quorum else None
            if copy is None:
                continue
            role, seqs, _last = copy
            if role == "leader":
                leader = (host, set(seqs), {mi.node for mi in q.mirror.synchronised()})
            else:
                mirrors[host] = set(seqs)
        if leader is None:
            return [], True, "no leader", 0
        lhost, held, synced = leader
        problems = []
        for host, seqs in sorted(mirrors.items()):
            if seqs - held:
                problems.append(f"the mirror on {host} holds {sorted(seqs - held)[:5]}, which the leader on {lhost} "
                                f"does not hold")
            if f"hutch@{host}" in synced and held - seqs:
                problems.append(f"the synchronised mirror on {host} lacks {sorted(held - seqs)[:5]}, which the "
                                f"leader on {lhost} holds")
        described = f"leader {lhost} holds {len(held)}; " + ", ".join(
            f"{h} {len(s)}{' (synchronised)' if f'hutch@{h}' in synced else ''}" for h, s in sorted(mirrors.items()))
        return problems, True, described, 1 + len(mirrors)

    def _watch_log(self, host: str, text: str) -> None:
        """What the nodes log that the checks follow. A node resuming from a pause lets clients in
        ("started TCP listener") only once it has applied every catalogue entry that was committed
        when it resumed: until then it may take itself for the leader of a queue another node
        leads now. A non-durable queue counts as gone once a node has seen another down (a node
        that cannot reach the queue's home drops what it routes there, confirmed, and the
        catalogue's leader deletes the queue: RabbitMQ's rule), and the loss of its messages is
        then one the run counts. A node that raises on a peer's message fails the run."""
        if self.opts.queue_type in VOLATILE and (text.startswith(f"deleting non-durable queue '{QUEUE}'")
                                                  or (text.startswith("node hutch@") and " down: " in text)):
            self._transient_gone = True
        elif "sent a message on group" in text and "could not be handled" in text:
            # a node raised on a peer's message (the transport closes the link): a defect, never a
            # fault the run injects, however harmless its consequences turn out to be
            self._fail("peer-message", f"{host}: {text}")
        elif "status regained" in text or "recovery detected" in text:
            self._resuming[host] = max((n.clustering.group.commit for n in self.nodes.values()
                                        if n.clustering is not None and hasattr(n.clustering, "group")), default=0)
        elif text.startswith("started TCP listener") and host in self._resuming:
            committed = self._resuming.pop(host)
            node = self.nodes.get(host)
            applied = node.clustering.group.applied if node is not None and node.clustering is not None else 0
            if applied < committed:
                self._fail("stale-resume", f"{host} let clients in after a pause with the catalogue applied to "
                                           f"{applied}, short of {committed}, committed when it resumed")

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
        if self.opts.queue_type in MIRROR_POLICIES:
            self._check_confirming_leader()
        self.loop.call_later(LEADER_CHECK_S, self._check_leaders)

    def _check_confirming_leader(self) -> None:
        """A mirrored queue has at most one leader accepting: once a leader (a node's leader
        object, named by its epoch) has confirmed publishes after another one did, the other
        confirms nothing more. Sampled with the Raft check: leaders that both confirmed within
        one sample are told apart by which of them confirmed before."""
        advanced = []
        for host, node in self.nodes.items():
            cluster = getattr(node.clustering, "cluster", None)
            ld = cluster.mirroring.leaders.get(("/", QUEUE)) if cluster is not None else None
            if ld is None:
                continue
            key = (host, ld.epochs[-1][0])
            if ld.confirmed > self._confirmed_by.get(key, 0):
                self._confirmed_by[key] = ld.confirmed
                advanced.append(key)
        if not advanced:
            return
        for key in advanced:
            if key in self._superseded:
                self._fail("two-leaders", f"the leader of {QUEUE} on {key[0]} (epoch {key[1]:x}) confirmed publishes "
                                          f"after the leader on {self._superseded[key]} had confirmed some")
        newcomers = [k for k in advanced if k != self._confirming and k not in self._superseded]
        if len(newcomers) > 1:
            self._fail("two-leaders", f"leaders of {QUEUE} on {', '.join(k[0] for k in newcomers)} confirmed "
                                      "publishes at the same time")
        if newcomers:
            if self._confirming is not None:
                self._superseded[self._confirming] = newcomers[0][0]
            self._confirming = newcomers[0]


# store modules that bound os.fdatasync at import: the simulated disk replaces it there too
_FSYNCS_BOUND_AT_IMPORT = ((segment_log, "_fdatasync"), (stream_log, "_fdatasync"))


class _StreamReader:
    """A stream-protocol consumer, as the delivery checks see it (they key its reading position
    by it, and settle what it gets: a stream-protocol consumer settles nothing, credit does)."""

    closed = None

    def __init__(self, name: str) -> None:
        self.name = name

    def ack(self, tag: int) -> None:
        pass


def _send_again(again: list[str], mid: str) -> None:
    """Queue the next copy of `mid` (m5 -> m5.2 -> m5.3), unless it has been sent RETRIES_MAX times."""
    number, sent = _copy_order(mid)
    if sent < RETRIES_MAX:
        again.append(f"m{number}.{sent + 1}")


def _copy_order(mid: str) -> tuple[int, int]:
    """m12 -> (12, 1); a copy sent again, m12.2 -> (12, 2)."""
    base, _, attempt = mid.partition(".")
    return int(base[1:]), int(attempt or 1)


def _names(mids: list[str]) -> str:
    return ", ".join(mids[:10]) + (" ..." if len(mids) > 10 else "")


def run_seed(seed: int, nodes: int = 3, messages: int = 40, fault_s: float = 8.0, queue_type: str = "quorum",
             trace: bool = False, faults: frozenset[str] | set[str] | tuple[str, ...] = NET_AND_CRASH,
             clients: frozenset[str] | set[str] | tuple[str, ...] = (), memory_window: int = 0) -> SimResult:
    return ClusterSim(ClusterSimOptions(seed=seed, nodes=nodes, messages=messages, fault_s=fault_s,
                                        queue_type=queue_type, faults=frozenset(faults), clients=frozenset(clients),
                                        memory_window=memory_window, trace=trace)).run()


def parse_faults(text: str, known: tuple[str, ...] = FAULT_KINDS, what: str = "fault") -> frozenset[str]:
    """`--faults net,crash,...`: the kinds named, each one of `known` ("all": every one, "none":
    none)."""
    if text.strip() == "all":
        return frozenset(known)
    if text.strip() == "none":
        return frozenset()
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    unknown = kinds - set(known)
    if unknown:
        raise click.BadParameter(f"unknown {what} kind(s) {', '.join(sorted(unknown))}; "
                                 f"choose from {', '.join(known)}")
    return frozenset(kinds)


def _stream_publish(client: StreamClient, pid: int, mid: str) -> None:
    """One message in a Publish frame of publisher 0: an AMQP 1.0 message whose body is its name."""
    client.send(sf.encode(sf.Publish(0, [(pid, amqp10.Message(mid.encode()).encode())])))


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
                   "with mirrors on every node, when-synced promotion and pause_minority; mirrored-nodes: mirrors "
                   "on two named nodes; mirrored-always: two mirrors, manual sync, any mirror promoted, its "
                   "documented losses counted, not failed; mirrored-automatic-always: mirrors everywhere, "
                   "automatic sync, any mirror promoted, losses counted; stream: read by offset; stream-protocol: "
                   "the same, published to over the stream protocol by deduplicating producers; transient: a "
                   "non-durable classic queue and transient messages, lost with their node's process, counted; "
                   "exclusive: the consumer's connection owns the queue, which goes with it, losses counted).")
@click.option("--faults", default=",".join(FAULT_KINDS), show_default=True,
              help="The fault kinds the nemesis draws, comma-separated: net (partitions, link and client "
                   "resets), crash (kill -9), power (power loss: unsynced writes lost, the last one torn), fsync "
                   "(fsync errors: the node stops), disk-full (the disk alarm, and writes failing with ENOSPC), "
                   "clock (clock drift, wall-clock jumps), slow-disk (fsyncs that take up to half a second), "
                   "membership (the operator replaces a node: stop, forget_cluster_node, join afresh; quorum "
                   "queues and streams).")
@click.option("--clients", "client_kinds", default=",".join(CLIENT_KINDS), show_default=True,
              help="What more the clients do, comma-separated, or none: get (a client taking messages with "
                   "basic.get), cancel (the consumer cancels and subscribes again now and then), nack (it "
                   "requeues with basic.nack as well as basic.reject), retry (the publisher sends again what "
                   "was left unconfirmed or nacked), many (two publishers and two consumers).")
@click.option("--memory-window", type=click.IntRange(0), default=0, show_default=True,
              help="Classic queues' memory window in messages (classic_queue.memory_window_messages; 0: the "
                   "node's default): a small one makes them page to disk, and mirrors keep their copy there. "
                   "Raft logs keep as many entries in memory (hutch.cluster.raftlog.MEMORY_ENTRIES) and read "
                   "the others back.")
@click.option("-v", "--verbose", is_flag=True, help="Print the trace of each run.")
@click.option("--jobs", type=click.IntRange(0, 64), default=1, show_default=True,
              help="Worker processes running the seeds (0: one per core); with -v, one.")
def cluster_cmd(seed: int, seeds: int, nodes: int, messages: int, fault_s: float, queue_type: str, faults: str,
                client_kinds: str, verbose: bool, jobs: int = 1, memory_window: int = 0) -> None:
    """Run real hutch nodes in one process under simulated time, network, disks, clocks and clients;
    any failing seed replays exactly."""
    kinds = parse_faults(faults)
    clients = parse_faults(client_kinds, CLIENT_KINDS, "client")
    named = ",".join(k for k in FAULT_KINDS if k in kinds)
    named_clients = ",".join(k for k in CLIENT_KINDS if k in clients) or "none"
    run = functools.partial(run_seed, nodes=nodes, messages=messages, fault_s=fault_s, queue_type=queue_type,
                            trace=verbose, faults=kinds, clients=clients, memory_window=memory_window)

    def reproduce(s: int) -> str:
        window = f" --memory-window {memory_window}" if memory_window else ""
        return (f"hutch sim cluster --seed {s} --nodes {nodes} --messages {messages} --fault-s {fault_s} "
                f"--queue-type {queue_type} --faults {named} --clients {named_clients}{window}")
    if jobs != 1 and seeds > 1 and not verbose:
        failures = run_seeds_on_pool(run, seed, seeds, reproduce, click.echo, jobs or None, progress_every=100)
    else:
        failures = run_seeds(run, seed, seeds, reproduce, click.echo, verbose, progress_every=10)
    if failures:
        sys.exit(1)


__all__ = ["CLIENT_KINDS", "FAULT_KINDS", "NET_AND_CRASH", "ClusterSim", "ClusterSimOptions", "HostClock", "cluster_cmd", "parse_faults", "run_seed",
           "seeded_entropy", "simulated_clocks", "trace_digest"]
