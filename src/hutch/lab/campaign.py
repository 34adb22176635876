"""A randomized fault campaign against quorum queues, in the style of RabbitMQ's Jepsen test,
against classic queues mirrored the way that promises the same (`--queue-type mirrored`, on
every node or on exactly two), and against streams (`--queue-type stream`).

RabbitMQ tests its quorum queues with Jepsen (rabbitmq/jepsen): clients publish numbered
messages with publisher confirms and consume them by basic.consume, basic.get or both, while
a nemesis partitions the network; at the end every client drains the queue and the
*total-queue* checker demands that every confirmed message came out (``lost`` empty) and
that nothing came out that nobody put in (``unexpected`` empty); duplicates are
reported, not forbidden. This module runs the same experiment on a `hutch lab`:

- one or a few durable quorum queues (``x-queue-type: quorum``) on a lab of 3 or 5 nodes;
- **publishers** in confirm mode, each message numbered ``publisher << 32 | seq``
  (`hutch.pipeline.history.message_id`), each publisher connected to a random node; after a
  connection failure, or a confirm that does not come within ``confirm_timeout_s``, it
  reconnects to a random node and republishes every message it has no confirm for, as a
  careful application does. A nacked message is republished too. Republishing a message
  whose confirm was lost may duplicate it: allowed. Losing a confirmed one is not;
- **consumers** that push-consume (basic.consume + ack), poll (basic.get + ack) or pick one
  of the two at each (re)connection, connected to random nodes, reconnecting on failure;
- a **nemesis** that draws faults from a seeded RNG (`plan_fault`), holds each for a few
  seconds and undoes it: a node isolated, the queue leader isolated, a majority/minority
  split, kill -9 + restart, SIGSTOP + SIGCONT, a slow link; and disk faults through the
  nodes' fault switches (`hutch.server.faults`, one file per node under the lab's
  ``fault-switches/``): a node's fsyncs fail (it must stop at the next one, the fsyncgate
  rule; it counts as a kill and is started again), or its disk reads as full (the disk alarm
  blocks its publishers until it clears); then everything is healed;
- a **drain**: publishers stop and finish their republishing, the lab is healed, consumers
  read until every queue is empty and nothing has arrived for ``drain_quiet_s``;
- a **comparison of the copies**: every node's digest of its copy of each queue
  (GET /api/hutch/digest, `hutch.control.digest`) once they have reached the same point;
  copies at the same point that differ fail the run.

On a stream, consumers read from the first offset and, after a reconnection, from the one
after the last they read; a stream keeps its messages, so every consumer reads every one. The
history records each offset once, as its first reader saw it: a message's deliveries are the
copies the stream stores, so a duplicate is a second copy (allowed only when its publisher sent
it twice), and an offset read as two different messages (two replicas that disagree) fails the
run.

Everything clients attempt and observe is recorded as a history
(`hutch.pipeline.history.HistoryWriter`) with the lab's faults (faults.jsonl) as fault
windows, so ``hutch check`` can judge the run too; the campaign itself checks the run
twice: with its own tallies, and with the reference checker (`hutch.pipeline.reference`).

A *bridge* (two halves that each see one middle node) or a *majorities ring* cannot be
expressed with the lab's partitions: `Lab.partition` cuts every link across one split of
the nodes into two sides, and partitions only add up, so any set of cut links it can make
is a union of such cuts; a bridge needs the middle node linked to both halves, which every
split separates from one of them. It would need a controller request that cuts single
links. (A long `Lab.delay` is no substitute: bytes held by a delay are delivered after it
even when the link is healed.)

The campaign uses nodes only as a user does (AMQP, the management HTTP API, the lab's
controller); it never imports a node's insides. Publishers use `hutch.lab.client`, whose
confirm callback sees each basic.ack/basic.nack frame as sent, so confirms are settled by the
AMQP rule and nothing else; consumers use aiormq, a widely used asyncio client, because
`hutch.lab.client` has no basic.get. What it must never do: hang
(every network wait has a timeout, the drain has a deadline and a hang is reported as
such), or call a run good that it could not check (a run whose drain did not finish is
not ``ok``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import re
import shutil
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from hutch.control.copies import compare
from hutch.lab.cluster import (
    BASE_PORT_DEFAULT,
    Lab,
    LabError,
    NodeSpec,
    fault_history_rows,
    http_get_json,
    plan_nodes,
)

log = logging.getLogger("hutch.lab.campaign")

FAULT_KINDS = ("partition-node", "partition-leader", "partition-halves", "kill", "suspend", "delay")
# disk faults, through hutch.server.faults' switches on the nodes the campaign starts: the next fsync
# fails (the node must stop: the fsyncgate rule), or the disk monitor reads a full disk (the disk
# alarm blocks publishers until it clears)
DISK_FAULT_KINDS = ("fsync-error", "disk-full")
ALL_FAULT_KINDS = FAULT_KINDS + DISK_FAULT_KINDS
CONSUMER_MODES = ("push", "poll", "mixed")
DELAYS_MS = (50, 200, 500, 1500)
BODY = struct.Struct(">QQ")  # msg_id, first publish time (ns)
QUEUE_ARGS = {"x-queue-type": "quorum"}
QUEUE_TYPES = ("quorum", "mirrored", "stream", "classic")
HA_MODES = ("all", "exactly")
HA_EXACTLY_COPIES = 2  # ha-params of `--ha-mode exactly`: the leader and one mirror
# the mirroring that promises what a quorum queue does: every node, synchronised automatically, and
# only a synchronised mirror promoted; a node cut off from the majority pauses (seed 000, 002)
MIRROR_POLICY = {"ha-mode": "all", "ha-sync-mode": "automatic", "ha-promote-on-failure": "when-synced",
                 "ha-promote-on-shutdown": "when-synced"}
MIRRORED_NODE_ARGS = ("--cluster-partition-handling", "pause_minority")

QUEUES_MAX = 16
CLIENTS_MAX = 64
RATE_MAX = 5000.0
IN_FLIGHT_MAX = 1000
CONNECT_TIMEOUT_S = 5.0
RPC_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 2.0
RECONNECT_DELAY_MIN_S = 0.1
RECONNECT_DELAY_MAX_S = 2.0
POLL_EMPTY_SLEEP_S = 0.05
NACK_BACKOFF_S = 0.1
WATCH_INTERVAL_S = 0.25
HEARTBEAT_S = 2
FSYNC_STOP_WAIT_S = 30.0  # how long a node with failing fsyncs may take to stop (it stops at its next fsync)
DIGEST_SETTLE_S = 30.0  # after the drain, how long replicas may take to reach the same point
LAB_CALL_RETRIES = 3
EXAMPLES_MAX = 20


class CampaignError(Exception):
    """The campaign could not be set up or run; the message says why."""


# ---------------------------------------------------------------------------------------------
# Configuration and the nemesis's plan (pure)


@dataclass(frozen=True)
class CampaignConfig:
    seed: int = 1
    nodes: int = 3
    duration_s: float = 60.0
    queues: int = 1
    publishers: int = 3
    consumers: int = 3
    consumer_mode: str = "mixed"
    rate_per_publisher: float = 40.0  # messages per second
    in_flight_max: int = 32  # unconfirmed messages per publisher
    prefetch: int = 16
    confirm_timeout_s: float = 5.0
    faults: tuple[str, ...] = FAULT_KINDS
    healthy_s: tuple[float, float] = (2.0, 5.0)  # between two faults
    fault_hold_s: tuple[float, float] = (4.0, 10.0)  # how long a fault lasts
    partition_modes: tuple[str, ...] = ("blackhole", "blackhole", "reset")
    drain_quiet_s: float = 5.0
    late_confirms_s: float = 30.0  # after the run, how long a publisher keeps republishing for missing confirms
    drain_timeout_s: float = 180.0
    net_ticktime_s: float = 4.0
    group_size: int | None = None  # x-quorum-initial-group-size; None: every node (Jepsen's "all")
    # or "mirrored": classic queues under MIRROR_POLICY; or "stream"; or "classic": durable classic
    # queues with no mirror, one copy on its home node (confirmed once on its disk; unavailable while
    # that node is down or cut off, and nothing confirmed lost)
    queue_type: str = "quorum"
    ha_mode: str = "all"  # mirrored: on every node, or on exactly HA_EXACTLY_COPIES nodes

    def __post_init__(self) -> None:
        if self.queue_type not in QUEUE_TYPES:
            raise CampaignError(f"queue type is one of {', '.join(QUEUE_TYPES)}")
        if self.queue_type == "mirrored" and self.group_size is not None:
            raise CampaignError("a group size is for quorum queues and streams; a mirrored queue's copies "
                                "follow its ha-mode")
        if self.ha_mode not in HA_MODES:
            raise CampaignError(f"ha-mode is one of {', '.join(HA_MODES)}")
        if self.ha_mode != "all" and self.queue_type != "mirrored":
            raise CampaignError("an ha-mode is for mirrored queues")
        if self.nodes not in (3, 5):
            raise CampaignError("a campaign runs on 3 or 5 nodes")
        if not 1 <= self.queues <= QUEUES_MAX:
            raise CampaignError(f"1 to {QUEUES_MAX} queues")
        if not 1 <= self.publishers <= CLIENTS_MAX or not 1 <= self.consumers <= CLIENTS_MAX:
            raise CampaignError(f"1 to {CLIENTS_MAX} publishers and consumers")
        if self.consumers < self.queues or self.publishers < self.queues:
            raise CampaignError("every queue needs a publisher and a consumer: publishers, consumers >= queues")
        if self.consumer_mode not in CONSUMER_MODES:
            raise CampaignError(f"consumer mode is one of {', '.join(CONSUMER_MODES)}")
        if not 0 < self.rate_per_publisher <= RATE_MAX:
            raise CampaignError(f"rate per publisher in (0, {RATE_MAX:g}] msg/s")
        if not 1 <= self.in_flight_max <= IN_FLIGHT_MAX:
            raise CampaignError(f"in-flight limit 1..{IN_FLIGHT_MAX}")
        unknown = set(self.faults) - set(ALL_FAULT_KINDS)
        if unknown:
            raise CampaignError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(ALL_FAULT_KINDS)}")
        if self.group_size is not None and not 1 <= self.group_size <= self.nodes:
            raise CampaignError(f"group size 1..{self.nodes}")
        if self.duration_s <= 0 or self.drain_timeout_s <= 0:
            raise CampaignError("duration and drain timeout must be positive")


@dataclass(frozen=True)
class FaultPlan:
    """One fault the nemesis will apply, then undo after `hold_s` seconds."""

    kind: str
    nodes: tuple[str, ...]  # the isolated side, the killed/suspended node, or the delayed pair
    hold_s: float
    mode: str = ""  # partition mode
    delay_ms: float = 0.0
    target: str = ""  # what was aimed at: "leader of Q" or "random"

    def describe(self) -> str:
        what = " ".join(n.split("@", 1)[0] for n in self.nodes)
        extra = f" {self.mode}" if self.mode else (f" {self.delay_ms:g} ms" if self.delay_ms else "")
        return f"{self.kind} {what}{extra} for {self.hold_s:.1f} s ({self.target})"


def plan_fault(rng: random.Random, kinds: tuple[str, ...], names: list[str], leaders: dict[str, str | None],
               hold_s: tuple[float, float], partition_modes: tuple[str, ...]) -> FaultPlan:
    """The next fault, drawn from `rng`. The same RNG state and inputs give the same plan; every
    call draws the same number of values whatever the leaders are, so a seed replays the same
    sequence of fault kinds and holds even when leadership moved differently."""
    kind = rng.choice(kinds)
    hold = round(rng.uniform(*hold_s), 1)
    mode = rng.choice(partition_modes)
    delay_ms = float(rng.choice(DELAYS_MS))
    shuffled = list(names)
    rng.shuffle(shuffled)
    queue = rng.choice(sorted(leaders)) if leaders else ""
    aim_at_leader = rng.random() < 0.5
    minority = rng.randint(1, (len(names) - 1) // 2)
    leader = leaders.get(queue) if queue else None
    if leader not in names:
        leader = None
    if kind == "partition-node":
        return FaultPlan(kind, (shuffled[0],), hold, mode=mode, target="random")
    if kind == "partition-leader":
        node = leader or shuffled[0]
        return FaultPlan(kind, (node,), hold, mode=mode, target=f"leader of {queue}" if leader else "random")
    if kind == "partition-halves":
        side = tuple(sorted(shuffled[:minority], key=names.index))
        return FaultPlan(kind, side, hold, mode=mode, target=f"{minority}|{len(names) - minority}")
    if kind in ("kill", "suspend", "fsync-error", "disk-full"):
        node = leader if (aim_at_leader and leader) else shuffled[0]
        return FaultPlan(kind, (node,), hold, target=f"leader of {queue}" if node == leader else "random")
    if kind == "delay":
        pair = tuple(sorted(shuffled[:2], key=names.index))
        return FaultPlan(kind, pair, hold, delay_ms=delay_ms, target="random")
    raise CampaignError(f"unknown fault kind {kind!r}")


def percentiles_ms(values_ns: list[int]) -> dict[str, float | int | None]:
    """p50/p95/p99 (nearest rank) and max of latencies in ns, as milliseconds."""
    if not values_ns:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}
    v = sorted(values_ns)

    def rank(p: float) -> float:
        return round(v[max(0, min(len(v) - 1, int(-(-p * len(v) // 1)) - 1))] / 1e6, 1)

    return {"count": len(v), "p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "max": round(v[-1] / 1e6, 1)}


# ---------------------------------------------------------------------------------------------
# What the clients saw (tallied in memory as well as recorded)


@dataclass
class Tally:
    """The campaign's own account of every message: the total-queue check needs nothing else."""

    published: dict[int, int] = field(default_factory=dict)  # msg_id -> first publish ns
    publish_attempts: int = 0
    confirmed: dict[int, int] = field(default_factory=dict)  # msg_id -> first confirm ns
    nacks: int = 0
    deliveries: dict[int, int] = field(default_factory=dict)  # msg_id -> deliveries
    deliveries_total: int = 0
    redelivered_total: int = 0
    malformed: int = 0
    last_delivery_mono: float = 0.0
    queue_of: dict[int, str] = field(default_factory=dict)
    # streams: what each offset was read as (by any consumer); a message's "deliveries" are the
    # offsets it is stored at, so a duplicate is a second copy in the stream, not a second reader
    stream_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    offset_conflicts: int = 0  # an offset read as two different messages (from two replicas)
    offset_gaps: int = 0  # a consumer's next delivery skipped offsets

    def stream_read(self, queue: str, offset: int, msg_id: int) -> bool:
        """Note that `offset` of `queue` holds `msg_id`; True when no consumer had read it before."""
        seen = self.stream_offsets.get((queue, offset))
        if seen is None:
            self.stream_offsets[(queue, offset)] = msg_id
            return True
        if seen != msg_id:
            self.offset_conflicts += 1
        return False

    def check(self) -> dict[str, Any]:
        lost = sorted(m for m in self.confirmed if m not in self.deliveries)
        unexpected = sorted(m for m in self.deliveries if m not in self.published)
        duplicates = sum(n - 1 for n in self.deliveries.values() if n > 1)
        unconfirmed = [m for m in self.published if m not in self.confirmed]
        recovered = sum(1 for m in unconfirmed if m in self.deliveries)
        return {
            "published": len(self.published),
            "publish_attempts": self.publish_attempts,
            "confirmed": len(self.confirmed),
            "nacks": self.nacks,
            "unconfirmed": len(unconfirmed),
            "unconfirmed_delivered": recovered,
            "delivered": len(self.deliveries),
            "deliveries": self.deliveries_total,
            "redelivered_flagged": self.redelivered_total,
            "duplicates": duplicates,
            "lost": len(lost),
            "unexpected": len(unexpected) + self.malformed,
            "offset_conflicts": self.offset_conflicts,
            "offset_gaps": self.offset_gaps,
            "lost_examples": [_id_text(m, self.queue_of.get(m)) for m in lost[:EXAMPLES_MAX]],
            "unexpected_examples": [_id_text(m, None) for m in unexpected[:EXAMPLES_MAX]],
            "confirm_latency_ms": percentiles_ms([self.confirmed[m] - self.published[m] for m in self.confirmed
                                                  if m in self.published]),
        }


def _id_text(msg_id: int, queue: str | None) -> str:
    return f"{msg_id >> 32}:{msg_id & 0xFFFFFFFF}" + (f" on {queue}" if queue else "")


class _Shared:
    """What every client of one campaign shares: the lab's nodes, the tally, the stop signals."""

    def __init__(self, cfg: CampaignConfig, nodes: list[NodeSpec], run_id: str, history_dir: Path | None,
                 queues: list[str]):
        self.cfg = cfg
        self.nodes = nodes
        self.run_id = run_id
        self.history_dir = history_dir
        self.queues = queues
        self.tally = Tally()
        self.stop_publishing = asyncio.Event()
        self.stop_consuming = asyncio.Event()
        self.reconnects: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.confirms_for_settled_tags = 0  # basic.ack/nack frames whose tag was already settled
        self.stream_next: dict[str, int] = {}  # streams: consumer -> the offset it reads next

    def writer(self, client_id: str):
        if self.history_dir is None:
            return _NoHistory()
        from hutch.pipeline.history import HistoryWriter

        return HistoryWriter(self.history_dir, run_id=self.run_id, client_id=client_id, node=None)

    def note_error(self, exc: BaseException) -> str:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        return f"{name}: {exc}"[:200]


class _NoHistory:
    node: str | None = None

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _connect(node: NodeSpec, name: str):
    import aiormq

    url = f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/?heartbeat={HEARTBEAT_S}&name={urllib.parse.quote(name)}"
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        return await aiormq.connect(url)


async def _close(conn) -> None:
    """Close an aiormq or `hutch.lab.client` connection, giving up (and aborting) after a moment:
    the node at the other end may be suspended."""
    if conn is None:
        return
    with contextlib.suppress(Exception, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await conn.close()
    abort = getattr(conn, "abort", None)
    if abort is not None:
        abort()


class _Client:
    """Connect to random nodes until told to stop; one `_session` per connection."""

    kind = "client"

    def __init__(self, shared: _Shared, index: int, queue: str):
        self.s = shared
        self.index = index
        self.queue = queue
        self.client_id = f"{self.kind}-{index}"
        self.rng = random.Random(f"{shared.cfg.seed}/{self.client_id}")
        self.history = shared.writer(self.client_id)
        self.node: NodeSpec | None = None

    def done(self) -> bool:
        raise NotImplementedError

    async def _open(self, node: NodeSpec):
        return await _connect(node, self.client_id)

    async def _session(self, conn) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        delay_s = RECONNECT_DELAY_MIN_S
        first = True
        try:
            while not self.done():
                self.node = self.rng.choice(self.s.nodes)
                self.history.flush()  # rows so far carry the previous node
                self.history.node = self.node.name
                conn = None
                try:
                    conn = await self._open(self.node)
                    if not first:
                        self.s.reconnects[self.kind] = self.s.reconnects.get(self.kind, 0) + 1
                    self.history.record("reconnect", self.queue, detail=f"connected to {self.node.name}")
                    first = False
                    delay_s = RECONNECT_DELAY_MIN_S
                    await self._session(conn)
                except Exception as e:  # noqa: BLE001 - every failure means: reconnect elsewhere
                    why = self.s.note_error(e)
                    self.history.record("disconnect", self.queue, detail=f"{self.node.name}: {why}")
                    log.debug("%s on %s: %s", self.client_id, self.node.name, why)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, RECONNECT_DELAY_MAX_S)
                finally:
                    await _close(conn)
        finally:
            self.history.close()


class _Publisher(_Client):
    """Publishes at a fixed rate in confirm mode through `hutch.lab.client` (whose confirm
    callback sees every basic.ack / basic.nack frame as it is, tag and multiple flag), so the
    campaign settles confirms by the AMQP rule itself: a multiple ack or nack settles every
    outstanding tag up to its tag."""

    kind = "publisher"

    def __init__(self, shared: _Shared, index: int, queue: str):
        super().__init__(shared, index, queue)
        self.next_seq = 0
        self.unconfirmed: dict[int, int] = {}  # seq -> first publish ns (published, no confirm yet)
        self.retry: set[int] = set()  # nacked, or unconfirmed when the connection changed: republish
        self.retry_not_before = 0.0  # monotonic time: a nack says "not now"
        self.give_up_at: float | None = None

    def done(self) -> bool:
        if not self.s.stop_publishing.is_set():
            return False
        if self.give_up_at is None:
            self.give_up_at = time.monotonic() + self.s.cfg.late_confirms_s
        return not self.unconfirmed or time.monotonic() > self.give_up_at

    async def _open(self, node: NodeSpec):
        from hutch.lab.client import Connection

        return await Connection.connect(node.amqp_url, heartbeat_s=HEARTBEAT_S, client_name=self.client_id,
                                        timeout_s=CONNECT_TIMEOUT_S)

    def _next_retry(self) -> int | None:
        """The lowest nacked (or not yet republished) seq that still has no confirm."""
        while self.retry:
            seq = min(self.retry)
            self.retry.discard(seq)
            if seq in self.unconfirmed:
                return seq
        return None

    async def _session(self, conn) -> None:
        from pamqp.commands import Basic

        from hutch.lab.client import Publisher

        async with asyncio.timeout(RPC_TIMEOUT_S):
            channel = await conn.channel()
            await channel.confirm_select()
        # persistent, as Jepsen publishes: a durable queue's leader and mirrors journal and fsync them
        encoder = Publisher(channel, "", self.queue, BODY.size, properties=Basic.Properties(delivery_mode=2))
        tally = self.s.tally
        cfg = self.s.cfg
        outstanding: dict[int, tuple[int, float]] = {}  # delivery tag -> (seq, monotonic publish time)
        wake = asyncio.Event()

        def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
            if multiple:
                settled = []
                for t in outstanding:  # tags are in publish order
                    if t > tag:
                        break
                    settled.append(t)
            else:
                settled = [tag] if tag in outstanding else []
            if tag not in outstanding:
                # not wrong for a multiple ack, but RabbitMQ never does it, and a client that looks
                # the tag up (aiormq does) drops the whole frame: worth counting
                self.s.confirms_for_settled_tags += 1
            ts = time.time_ns()
            for t in settled:
                seq, _ = outstanding.pop(t)
                mid = (self.index << 32) | seq
                if ack:
                    progress[0] = time.monotonic()
                    self.history.record("confirm", self.queue, msg_id=mid, ts_ns=ts)
                    tally.confirmed.setdefault(mid, ts)
                    self.unconfirmed.pop(seq, None)
                else:
                    tally.nacks += 1
                    self.history.record("nack", self.queue, msg_id=mid, ts_ns=ts)
                    self.retry.add(seq)
                    self.retry_not_before = time.monotonic() + NACK_BACKOFF_S
            wake.set()

        progress = [time.monotonic()]  # when this channel last confirmed something (or opened)
        channel.on_confirm = on_confirm
        # A careful client republishes, on the new connection, everything it has no confirm for.
        self.retry.update(self.unconfirmed)
        interval_s = 1.0 / cfg.rate_per_publisher
        next_at = time.monotonic()
        while True:
            if conn.closed.done() or not channel.is_open:
                raise ConnectionError("connection or channel closed")
            now = time.monotonic()
            if outstanding and now - next(iter(outstanding.values()))[1] > cfg.confirm_timeout_s:
                seq = next(iter(outstanding.values()))[0]
                self.history.record("disconnect", self.queue, msg_id=(self.index << 32) | seq,
                                    detail=f"no confirm in {cfg.confirm_timeout_s:g} s")
                raise TimeoutError(f"no confirm in {cfg.confirm_timeout_s:g} s")
            refused_s = now - progress[0]
            if self.retry and refused_s > cfg.confirm_timeout_s:
                # nothing but nacks for a while: a careful client opens a new channel elsewhere
                self.history.record("disconnect", self.queue, detail=f"only nacks for {refused_s:.1f} s")
                raise ConnectionRefusedError(f"only nacks for {refused_s:.1f} s")
            if self.done():
                return
            stopping = self.s.stop_publishing.is_set()
            seq = None
            full = len(outstanding) >= cfg.in_flight_max
            if not full:
                if self.retry and now >= self.retry_not_before:
                    seq = self._next_retry()
                elif not stopping and now >= next_at:
                    next_at = max(next_at + interval_s, now - 1.0)
                    seq = self.next_seq
                    self.next_seq += 1
            if seq is None:
                wake.clear()
                wake_at = now + WATCH_INTERVAL_S
                if not full:
                    if not stopping:
                        wake_at = min(wake_at, next_at)
                    if self.retry:
                        wake_at = min(wake_at, self.retry_not_before)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.001, wake_at - now)):
                        await wake.wait()
                continue
            mid = (self.index << 32) | seq
            first_ns = self.unconfirmed.setdefault(seq, time.time_ns())
            now_ns = time.time_ns()
            tally.published.setdefault(mid, now_ns)
            tally.queue_of.setdefault(mid, self.queue)
            tally.publish_attempts += 1
            self.history.record("publish", self.queue, msg_id=mid, ts_ns=now_ns)
            tag = channel.publish(encoder, BODY.pack(mid, first_ns))
            outstanding[tag] = (seq, now)
            async with asyncio.timeout(cfg.confirm_timeout_s):
                await conn.drain()


class _Consumer(_Client):
    """Push-consumes (basic.consume + ack), polls (basic.get + ack) or picks one of the two at each
    connection. On a stream it push-consumes from an offset (x-stream-offset), as a stream
    reader does: from the first at the start, and after a reconnection from the offset after
    the last it read; a stream keeps its messages, so every consumer reads all of them."""

    kind = "consumer"

    def __init__(self, shared: _Shared, index: int, queue: str):
        super().__init__(shared, index, queue)
        self.next_offset = 0  # streams: the offset to read next

    def done(self) -> bool:
        return self.s.stop_consuming.is_set()

    def _deliver_stream(self, body: bytes, offset: int | None) -> int | None:
        """A delivery from a stream, recorded in the history only by the first consumer to read
        its offset (the history's deliveries are the stream's stored copies)."""
        tally = self.s.tally
        tally.last_delivery_mono = time.monotonic()
        tally.deliveries_total += 1
        if len(body) != BODY.size or offset is None:
            tally.malformed += 1
            self.history.record("deliver", self.queue, msg_id=None,
                                detail=f"malformed: body of {len(body)} bytes, x-stream-offset {offset}")
            return None
        mid, _ = BODY.unpack(body)
        if offset < self.next_offset:
            return mid  # read before this reconnection
        if offset > self.next_offset:
            tally.offset_gaps += 1
        self.next_offset = offset + 1
        self.s.stream_next[self.client_id] = self.next_offset
        if tally.stream_read(self.queue, offset, mid):
            tally.deliveries[mid] = tally.deliveries.get(mid, 0) + 1
            self.history.record("deliver", self.queue, msg_id=mid, detail=f"offset {offset}")
        return mid

    def _deliver(self, body: bytes, redelivered: bool) -> int | None:
        tally = self.s.tally
        tally.last_delivery_mono = time.monotonic()
        tally.deliveries_total += 1
        tally.redelivered_total += bool(redelivered)
        if len(body) != BODY.size:
            tally.malformed += 1
            self.history.record("deliver", self.queue, msg_id=None, redelivered=redelivered,
                                detail=f"malformed body of {len(body)} bytes")
            return None
        mid, _ = BODY.unpack(body)
        tally.deliveries[mid] = tally.deliveries.get(mid, 0) + 1
        self.history.record("deliver", self.queue, msg_id=mid, redelivered=redelivered)
        return mid

    async def _session(self, conn) -> None:
        mode = self.s.cfg.consumer_mode
        if self.s.cfg.queue_type == "stream":
            mode = "stream"
        elif mode == "mixed":
            mode = self.rng.choice(("push", "poll"))
        channel = await asyncio.wait_for(conn.channel(), RPC_TIMEOUT_S)
        if mode == "stream":
            await self._push(conn, channel, stream=True)
        elif mode == "push":
            await self._push(conn, channel)
        else:
            await self._poll(conn, channel)

    async def _push(self, conn, channel, stream: bool = False) -> None:
        await asyncio.wait_for(channel.basic_qos(prefetch_count=self.s.cfg.prefetch), RPC_TIMEOUT_S)

        async def on_message(message) -> None:
            if stream:
                headers = message.header.properties.headers or {}
                offset = headers.get("x-stream-offset")
                self._deliver_stream(message.body, offset if isinstance(offset, int) else None)
                await channel.basic_ack(message.delivery.delivery_tag)
                return
            mid = self._deliver(message.body, bool(message.delivery.redelivered))
            await channel.basic_ack(message.delivery.delivery_tag)
            self.history.record("ack", self.queue, msg_id=mid)

        args = {"x-stream-offset": self.next_offset} if stream else None
        ok = await asyncio.wait_for(channel.basic_consume(self.queue, on_message, arguments=args), RPC_TIMEOUT_S)
        tag = ok.consumer_tag
        while not self.done():
            if conn.is_closed or channel.is_closed:
                raise ConnectionError("connection or channel closed")
            if tag not in channel.consumers:
                self.history.record("cancel", self.queue, detail="consumer cancelled by the broker")
                raise ConnectionError("consumer cancelled by the broker")
            await asyncio.sleep(WATCH_INTERVAL_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.basic_cancel(tag), RPC_TIMEOUT_S)

    async def _poll(self, conn, channel) -> None:
        from pamqp.commands import Basic

        while not self.done():
            message = await channel.basic_get(self.queue, timeout=RPC_TIMEOUT_S)
            if isinstance(message.delivery, Basic.GetEmpty):
                await asyncio.sleep(POLL_EMPTY_SLEEP_S)
                continue
            mid = self._deliver(message.body, bool(message.delivery.redelivered))
            await asyncio.wait_for(channel.basic_ack(message.delivery.delivery_tag), RPC_TIMEOUT_S)
            self.history.record("ack", self.queue, msg_id=mid)


# ---------------------------------------------------------------------------------------------
# The nemesis


def leader_of(view: dict) -> str | None:
    """The leader in a GET /api/queues/%2F/QUEUE answer: a quorum queue's Raft leader, a classic
    (mirrored) queue's node."""
    return view.get("leader") or (view.get("node") if view.get("type", "classic") == "classic" else None)


def queue_leader(nodes: list[NodeSpec], queue: str, rng: random.Random) -> str | None:
    """The queue's leader as the first node that answers says (GET /api/queues/%2F/QUEUE)."""
    for node in rng.sample(nodes, len(nodes)):
        try:
            leader = leader_of(http_get_json(f"{node.http_url}/api/queues/%2F/{urllib.parse.quote(queue, safe='')}"))
        except (OSError, ValueError, urllib.error.HTTPError):
            continue
        if leader:
            return leader
    return None


def queue_depths(nodes: list[NodeSpec], queues: list[str]) -> dict[str, int | None]:
    """messages (ready + unacknowledged) per queue, as the queue's leader reports it: a follower
    may lag its leader, and a stale replica's larger count must not stand for the queue. None
    when the leader is unknown or does not answer."""
    out: dict[str, int | None] = {}
    views = queue_views(nodes, queues)
    for q in queues:
        leaders = {v.get("leader") for v in views[q].values() if v.get("leader")}
        leader_view = views[q].get(leaders.pop()) if len(leaders) == 1 else None
        out[q] = int(leader_view["messages"] or 0) if leader_view and "messages" in leader_view else None
    return out


def queue_views(nodes: list[NodeSpec], queues: list[str]) -> dict[str, dict]:
    """Per queue and node: what GET /api/queues/%2F/QUEUE says (ready, unacked, leader, online)."""
    keys = ("messages", "messages_ready", "messages_unacknowledged", "consumers", "leader", "members", "online",
            "slave_nodes", "synchronised_slave_nodes")
    out: dict[str, dict] = {}
    for q in queues:
        out[q] = {}
        for node in nodes:
            try:
                view = http_get_json(f"{node.http_url}/api/queues/%2F/{urllib.parse.quote(q, safe='')}")
                out[q][node.name] = {**{k: view.get(k) for k in keys}, "leader": leader_of(view)}
            except (OSError, ValueError, urllib.error.HTTPError) as e:
                out[q][node.name] = {"error": str(e)[:120]}
    return out


async def _sweep(shared: _Shared, nodes: list[NodeSpec], per_node_max: int = 1000) -> dict[str, list[str]]:
    """basic.get (with ack) through each node on a fresh connection until the queue says empty;
    what comes out is recorded as deliveries of a client ``sweeper``."""
    from pamqp.commands import Basic

    sweeper = _Consumer(shared, 0, shared.queues[0])
    sweeper.client_id = "sweeper"
    sweeper.history = shared.writer("sweeper")
    got: dict[str, list[str]] = {}
    try:
        for node in nodes:
            conn = None
            got[node.name] = []
            sweeper.history.flush()
            sweeper.history.node = node.name
            try:
                conn = await _connect(node, "sweeper")
                ch = await asyncio.wait_for(conn.channel(), RPC_TIMEOUT_S)
                for q in shared.queues:
                    sweeper.queue = q
                    for _ in range(per_node_max):
                        m = await ch.basic_get(q, timeout=RPC_TIMEOUT_S)
                        if isinstance(m.delivery, Basic.GetEmpty):
                            break
                        mid = sweeper._deliver(m.body, bool(m.delivery.redelivered))
                        await asyncio.wait_for(ch.basic_ack(m.delivery.delivery_tag), RPC_TIMEOUT_S)
                        got[node.name].append("malformed" if mid is None else _id_text(mid, q))
            except Exception as e:  # noqa: BLE001 - report and go on with the next node
                got[node.name].append(f"error: {type(e).__name__}: {e}"[:160])
            finally:
                await _close(conn)
    finally:
        sweeper.history.close()
    return got


FAULT_SWITCH_DIR = "fault-switches"
FAULT_SWITCH_VARS = {"fsync": "HUTCH_FAULT_FSYNC_FILE", "disk-free": "HUTCH_FAULT_DISK_FREE_FILE"}


def fault_switch(lab_dir: Path, node: str, kind: str) -> Path:
    """The file that turns a `hutch.server.faults` switch of one lab node on while it exists."""
    return Path(lab_dir).resolve() / FAULT_SWITCH_DIR / f"{node.split('@', 1)[0]}.{kind}"


def fault_switch_env(lab_dir: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """Per node, the environment that points its fault switches at `fault_switch` files."""
    (Path(lab_dir) / FAULT_SWITCH_DIR).mkdir(parents=True, exist_ok=True)
    return {n: {var: str(fault_switch(lab_dir, n, kind)) for kind, var in FAULT_SWITCH_VARS.items()} for n in names}


class Nemesis:
    """Applies faults drawn by `plan_fault` one at a time, holding each, then undoing it."""

    def __init__(self, lab: Lab, cfg: CampaignConfig, queues: list[str]):
        self.lab = lab
        self.cfg = cfg
        self.queues = queues
        self.rng = random.Random(cfg.seed)
        self.leader_rng = random.Random(f"{cfg.seed}/leader")
        self.applied: list[dict] = []
        self.failures: list[str] = []
        self.names = [n.name for n in lab.nodes]

    async def _lab(self, what: str, *args: Any, **kwargs: Any) -> dict | None:
        """One lab call in a thread (they block), retried a few times; failures are reported."""
        for attempt in range(LAB_CALL_RETRIES):
            try:
                return await asyncio.to_thread(getattr(self.lab, what), *args, **kwargs)
            except LabError as e:
                msg = f"lab {what} {' '.join(map(str, args))}: {e}"
                if attempt == LAB_CALL_RETRIES - 1:
                    self.failures.append(msg)
                    log.warning("%s", msg)
                    return None
                await asyncio.sleep(1.0)
        return None

    async def run(self, until_mono: float) -> None:
        while True:
            await asyncio.sleep(round(self.rng.uniform(*self.cfg.healthy_s), 1))
            if time.monotonic() >= until_mono:
                return
            leaders = {}
            for q in self.queues:
                leaders[q] = await asyncio.to_thread(queue_leader, self.lab.nodes, q, self.leader_rng)
            plan = plan_fault(self.rng, self.cfg.faults, self.names, leaders, self.cfg.fault_hold_s,
                              self.cfg.partition_modes)
            started = time.time_ns()
            rec = await self.apply(plan)
            log.info("nemesis: %s%s", plan.describe(), "" if rec is not None else " (failed)")
            # a failing fsync stops its node only at the node's next fsync: the hold counts from the start
            held_s = (time.time_ns() - started) / 1e9 if plan.kind == "fsync-error" else 0.0
            await asyncio.sleep(max(0.0, plan.hold_s - held_s))
            await self.undo(plan)
            self.applied.append({"kind": plan.kind, "nodes": list(plan.nodes), "hold_s": plan.hold_s,
                                 "mode": plan.mode, "delay_ms": plan.delay_ms, "target": plan.target,
                                 "leaders": leaders, "applied": rec is not None, "ts_ns": started,
                                 "undone_ns": time.time_ns(),
                                 **({"stopped_node": rec.get("stopped"), "stop_s": rec.get("stop_s")}
                                    if plan.kind == "fsync-error" and rec is not None else {})})

    async def apply(self, plan: FaultPlan) -> dict | None:
        if plan.kind.startswith("partition"):
            return await self._lab("partition", *plan.nodes, mode=plan.mode)
        if plan.kind == "kill":
            return await self._lab("kill", plan.nodes[0])
        if plan.kind == "suspend":
            return await self._lab("suspend", plan.nodes[0])
        if plan.kind == "delay":
            return await self._lab("delay", plan.nodes[0], plan.nodes[1], plan.delay_ms)
        if plan.kind == "fsync-error":
            return await self._fsync_error(plan.nodes[0], plan.hold_s)
        if plan.kind == "disk-full":
            fault_switch(self.lab.dir, plan.nodes[0], "disk-free").write_text("0\n")
            return {"node": plan.nodes[0]}
        raise CampaignError(f"unknown fault kind {plan.kind!r}")

    async def _fsync_error(self, node: str, hold_s: float) -> dict:
        """Make the node's fsyncs fail, and wait (up to the hold, at least FSYNC_STOP_WAIT_S) for it
        to stop, as it must at its next fsync; a node that did not fsync meanwhile runs on."""
        fault_switch(self.lab.dir, node, "fsync").write_text("")
        t0 = time.monotonic()
        stopped = False
        while time.monotonic() - t0 < max(hold_s, FSYNC_STOP_WAIT_S) and not stopped:
            await asyncio.sleep(WATCH_INTERVAL_S)
            rows = await asyncio.to_thread(self.lab.status)
            stopped = any(r["name"] == node and r["state"] == "stopped" for r in rows)
        stop_s = round(time.monotonic() - t0, 1)
        log.info("nemesis: fsync fails on %s: %s", node, f"stopped in {stop_s} s" if stopped else "still running")
        return {"node": node, "stopped": stopped, "stop_s": stop_s if stopped else None}

    async def undo(self, plan: FaultPlan) -> None:
        if plan.kind.startswith("partition") or plan.kind == "delay":
            await self._lab("heal")
        elif plan.kind == "kill":
            await self._lab("start", plan.nodes[0])
        elif plan.kind == "suspend":
            await self._lab("resume", plan.nodes[0])
        elif plan.kind == "fsync-error":
            fault_switch(self.lab.dir, plan.nodes[0], "fsync").unlink(missing_ok=True)
            rows = await asyncio.to_thread(self.lab.status)
            if any(r["name"] == plan.nodes[0] and r["state"] == "stopped" for r in rows):
                await self._lab("start", plan.nodes[0])
        elif plan.kind == "disk-full":
            fault_switch(self.lab.dir, plan.nodes[0], "disk-free").unlink(missing_ok=True)

    async def heal_all(self) -> None:
        """Every link open, every disk healthy, every node running: the state a drain needs."""
        for path in (self.lab.dir / FAULT_SWITCH_DIR).glob("*"):
            path.unlink(missing_ok=True)
        await self._lab("heal")
        for row in await asyncio.to_thread(self.lab.status):
            if row["state"] == "suspended":
                await self._lab("resume", row["name"])
            elif row["state"] == "stopped":
                await self._lab("start", row["name"])


# ---------------------------------------------------------------------------------------------
# The campaign


@dataclass
class CampaignResult:
    seed: int
    run_id: str
    ok: bool
    verdict: str
    config: dict
    lab_dir: str
    history_dir: str | None
    duration_s: float
    drain_s: float
    drained: bool
    faults: list[dict]
    fault_counts: dict[str, int]
    fault_failures: list[str]
    check: dict
    reference: dict | None
    gaps: list[dict]
    reconnects: dict[str, int]
    client_errors: dict[str, int]
    queue_depths_after: dict[str, int | None]
    # when not drained, or filled again after the drain: per queue, per node; what basic.get still got
    queue_views_after: dict[str, dict] = field(default_factory=dict)
    swept_after: dict[str, list[str]] = field(default_factory=dict)
    replicas: dict[str, dict] = field(default_factory=dict)  # per queue: its copies' digests compared
    confirms_for_settled_tags: int = 0
    nack_only_channels: int = 0

    def as_json(self) -> dict:
        return asdict(self)


def queue_arguments(queue_type: str, group_size: int) -> dict:
    """The x-arguments of the campaign's queues: a quorum queue or stream on `group_size` nodes,
    or a classic queue (mirrored by policy)."""
    if queue_type == "quorum":
        return {**QUEUE_ARGS, "x-quorum-initial-group-size": group_size}
    if queue_type == "stream":
        return {"x-queue-type": "stream", "x-initial-cluster-size": group_size}
    return {}


def mirror_policy(ha_mode: str) -> dict:
    """MIRROR_POLICY on every node (`all`) or on HA_EXACTLY_COPIES nodes (`exactly`)."""
    if ha_mode == "exactly":
        return {**MIRROR_POLICY, "ha-mode": "exactly", "ha-params": HA_EXACTLY_COPIES}
    return dict(MIRROR_POLICY)


async def _declare(nodes: list[NodeSpec], queues: list[str], group_size: int, queue_type: str = "quorum",
                   deadline_s: float = 60.0, ha_mode: str = "all") -> None:
    """Declare the queues through any node that will (the catalogue needs a leader): quorum
    queues, streams, or classic queues that a policy (`mirror_policy`) mirrors."""
    from pamqp.commands import Basic  # noqa: F401 - aiormq needs pamqp; fail early and clearly

    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        for node in nodes:
            conn = None
            try:
                conn = await _connect(node, "campaign-setup")
                ch = await asyncio.wait_for(conn.channel(), RPC_TIMEOUT_S)
                if queue_type == "mirrored":
                    await asyncio.to_thread(_put_mirror_policy, node, queues, ha_mode)
                for q in queues:
                    args = queue_arguments(queue_type, group_size)
                    await asyncio.wait_for(ch.queue_declare(q, durable=True, arguments=args), RPC_TIMEOUT_S * 2)
                return
            except Exception as e:  # noqa: BLE001 - try the next node
                last = e
            finally:
                await _close(conn)
        await asyncio.sleep(0.5)
    raise CampaignError(f"could not declare the {queue_type} queues {queues}: {last!r}")


def _put_mirror_policy(node: NodeSpec, queues: list[str], ha_mode: str = "all") -> None:
    pattern = "^(" + "|".join(re.escape(q) for q in queues) + ")$"
    body = json.dumps({"pattern": pattern, "definition": mirror_policy(ha_mode), "apply-to": "queues"}).encode()
    token = base64.b64encode(b"guest:guest").decode()
    req = urllib.request.Request(f"{node.http_url}/api/policies/%2F/campaign-mirroring", data=body, method="PUT",
                                 headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as resp:
        resp.read()


async def _drain(shared: _Shared, nodes: list[NodeSpec], deadline_mono: float) -> bool:
    """Wait until every queue is empty (as the HTTP API says) and nothing was delivered for
    `drain_quiet_s`. False when the deadline passes first: the run did not drain."""
    quiet_s = shared.cfg.drain_quiet_s
    while time.monotonic() < deadline_mono:
        await asyncio.sleep(0.5)
        if time.monotonic() - shared.tally.last_delivery_mono < quiet_s:
            continue
        if shared.cfg.queue_type == "stream":
            if await asyncio.to_thread(_streams_read, shared):
                return True
            continue
        depths = await asyncio.to_thread(queue_depths, nodes, shared.queues)
        if all(d == 0 for d in depths.values()):
            return True
    return False


def _streams_read(shared: _Shared) -> bool:
    """A stream is drained when every consumer of it has read to the end of its longest replica."""
    ends = stream_ends(shared.nodes, shared.queues)
    for i in range(shared.cfg.consumers):
        q = shared.queues[i % shared.cfg.queues]
        if ends.get(q) is None or shared.stream_next.get(f"consumer-{i}", 0) < ends[q]:
            return False
    return True


def stream_ends(nodes: list[NodeSpec], queues: list[str]) -> dict[str, int | None]:
    """Per stream, the committed end (next offset) of its longest replica, as the first node that
    answers GET /api/hutch/streams/%2F/STREAM/status says."""
    out: dict[str, int | None] = {}
    for q in queues:
        out[q] = None
        for node in nodes:
            try:
                rows = http_get_json(f"{node.http_url}/api/hutch/streams/%2F/{urllib.parse.quote(q, safe='')}/status",
                                     timeout_s=RPC_TIMEOUT_S)
            except (OSError, ValueError, urllib.error.HTTPError):
                continue
            ends = [r["committed_offset"] + 1 for r in rows if r.get("committed_offset") is not None]
            if ends:
                out[q] = max(ends)
                break
    return out


def replica_digests(nodes: list[NodeSpec], queue: str, query: str = "") -> dict[str, dict]:
    """Every answering node's digest of its copy of `queue` (GET /api/hutch/digest/%2F/QUEUE);
    nodes without a copy, or not answering, are left out."""
    out: dict[str, dict] = {}
    for node in nodes:
        try:
            d = http_get_json(f"{node.http_url}/api/hutch/digest/%2F/{urllib.parse.quote(queue, safe='')}{query}",
                              timeout_s=RPC_TIMEOUT_S)
        except (OSError, ValueError, urllib.error.HTTPError):
            continue
        if d.get("replica"):
            out[node.name] = d
    return out


async def compare_replicas(nodes: list[NodeSpec], queues: list[str], queue_type: str,
                           settle_s: float = DIGEST_SETTLE_S) -> dict[str, dict]:
    """After the drain: wait (up to `settle_s`) until every copy of each queue has reached the same
    point (applied index, last sequence number, committed end), then compare their digests
    (`hutch.control.copies.compare`). A stream's copies are compared over their common range."""

    out: dict[str, dict] = {}
    for q in queues:
        t0 = time.monotonic()
        while True:
            digests = await asyncio.to_thread(replica_digests, nodes, q)
            points = {d["applied"] for d in digests.values()}
            if len(points) <= 1 or time.monotonic() - t0 > settle_s:
                break
            await asyncio.sleep(0.5)
        key = "applied"
        if queue_type == "stream" and digests:
            lo = max(d["first_offset"] for d in digests.values())
            hi = min(d["applied"] for d in digests.values())
            digests = await asyncio.to_thread(replica_digests, nodes, q, f"?from={lo}&to={hi}")
            key = "range"
        out[q] = {"copies": len(digests), "points": sorted({str(d[key]) for d in digests.values()}),
                  "settle_s": round(time.monotonic() - t0, 1), "problems": compare(digests, key=key),
                  "digests": digests}
    return out


async def run_campaign_async(lab: Lab, cfg: CampaignConfig, out_dir: Path, record: bool = True) -> CampaignResult:
    nodes = lab.nodes
    if len(nodes) != cfg.nodes:
        raise CampaignError(f"the lab in {lab.dir} has {len(nodes)} nodes, the campaign asks for {cfg.nodes}")
    run_id = f"campaign-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    queues = [f"jepsen.{run_id}.q{i}" for i in range(cfg.queues)]
    out_dir.mkdir(parents=True, exist_ok=True)
    history_dir = out_dir / "history" if record else None
    await _declare(nodes, queues, cfg.group_size or cfg.nodes, cfg.queue_type, ha_mode=cfg.ha_mode)
    shared = _Shared(cfg, nodes, run_id, history_dir, queues)
    publishers = [_Publisher(shared, i, queues[i % cfg.queues]) for i in range(cfg.publishers)]
    consumers = [_Consumer(shared, i, queues[i % cfg.queues]) for i in range(cfg.consumers)]
    nemesis = Nemesis(lab, cfg, queues)
    started_ns = time.time_ns()
    started = time.monotonic()
    drained = False
    log.info("campaign %s: %d nodes, queues %s, %d publishers, %d %s consumers, %g s", run_id, cfg.nodes,
             queues, cfg.publishers, cfg.consumers, cfg.consumer_mode, cfg.duration_s)
    async with asyncio.TaskGroup() as tg:
        for c in consumers:
            tg.create_task(c.run(), name=c.client_id)
        pub_tasks = [tg.create_task(p.run(), name=p.client_id) for p in publishers]
        await nemesis.run(started + cfg.duration_s)
        shared.stop_publishing.set()
        await nemesis.heal_all()
        ended = time.monotonic()
        await asyncio.wait(pub_tasks)
        drain_started = time.monotonic()
        drained = await _drain(shared, nodes, drain_started + cfg.drain_timeout_s)
        drain_s = time.monotonic() - drain_started
        shared.stop_consuming.set()
    stream = cfg.queue_type == "stream"
    # a stream keeps what was read: its depth is no measure of the drain
    depths = {q: None for q in queues} if stream else await asyncio.to_thread(queue_depths, nodes, queues)
    replicas = await compare_replicas(nodes, queues, cfg.queue_type)
    views: dict[str, dict] = {}
    swept: dict[str, list[str]] = {}
    if not stream and (not drained or any(depths.values())):
        # what is stuck, as each node sees it, and what a fresh basic.get through each node still
        # gets. A drained queue can fill again: a publish that reached a suspended node before
        # its publisher gave up on it (and sent it again elsewhere) is taken once the node runs
        # again, after the drain. Swept, such a copy is checked like any delivery: a repeat
        # only the publisher's own second publish explains.
        views = await asyncio.to_thread(queue_views, nodes, queues)
        swept = await _sweep(shared, nodes)
        if drained:
            depths = await asyncio.to_thread(queue_depths, nodes, queues)
    if history_dir is not None:
        from hutch.pipeline.history import HistoryWriter, drain_detail

        with HistoryWriter(history_dir, run_id=run_id, client_id="lab", node=None) as w:
            for ts_ns, detail in fault_history_rows(lab.dir / "faults.jsonl"):
                if ts_ns >= started_ns:
                    w.record("fault", "", ts_ns=ts_ns, detail=detail)
            for f in nemesis.applied:  # the controller does not see disk faults: their windows from here
                if f["kind"] in DISK_FAULT_KINDS and f["applied"]:
                    name = f"{f['kind']}-{f['nodes'][0].split('@', 1)[0]}"
                    w.fault_start(name, f"{f['kind']} on {f['nodes'][0]}", ts_ns=f["ts_ns"])
                    w.fault_end(name, "stopped, started again" if f.get("stopped_node") else "switched off",
                                ts_ns=f["undone_ns"])
            for q in queues:  # the checker calls a missing message lost only on a drained queue
                w.record("drain", q, detail=drain_detail(drained, f"depth {depths.get(q)} after "
                                                                   f"{cfg.drain_timeout_s:g} s"))
    check = shared.tally.check()
    reference, gaps = _reference_check(history_dir, run_id) if history_dir is not None else (None, [])
    counts: dict[str, int] = {}
    for f in nemesis.applied:
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
        if f.get("stopped_node"):  # a node that stopped on a failed fsync went down as a killed one does
            counts["kill"] = counts.get("kill", 0) + 1
    problems = []
    if check["lost"]:
        problems.append(f"{check['lost']} confirmed message(s) lost")
    if check["unexpected"]:
        problems.append(f"{check['unexpected']} unexpected message(s)")
    if not drained:
        what = "the streams were not read to their end" if stream else f"the queues did not drain (depths {depths})"
        problems.append(f"{what} in {cfg.drain_timeout_s:g} s")
    if check["offset_conflicts"]:
        problems.append(f"{check['offset_conflicts']} stream offset(s) read as two different messages")
    for q, r in replicas.items():
        if r["problems"]:
            problems.append(f"the copies of {q} disagree: {'; '.join(r['problems'])}")
    if reference is not None and (reference["lost"] != check["lost"] or reference["unexpected"] != check["unexpected"]):
        problems.append(f"the reference checker disagrees: lost {reference['lost']}, "
                        f"unexpected {reference['unexpected']}")
    # a quorum queue, and a mirrored one promoting only synchronised mirrors, flag every redelivery
    # and keep one publisher's messages in order; only a publisher's own second publish may bring a
    # message again unflagged, or behind later ones
    if reference is not None and reference["duplicates_unexplained"]:
        problems.append(f"{reference['duplicates_unexplained']} delivery(ies) repeated without the redelivered flag "
                        "and not published again")
    # a stream promises no loss and no copy beyond a second publish; its order is reported (a writer's
    # batch that a leader change held back is written after a later one: hutch.streams.machine)
    if reference is not None and reference["reordered_unexplained"] and not stream:
        problems.append(f"{reference['reordered_unexplained']} message(s) delivered out of their publisher's order "
                        "and not published again")
    result = CampaignResult(
        seed=cfg.seed, run_id=run_id, ok=not problems, verdict="; ".join(problems) or "ok",
        config={**asdict(cfg), "faults": list(cfg.faults)}, lab_dir=str(lab.dir),
        history_dir=str(history_dir) if history_dir else None, duration_s=round(ended - started, 1),
        drain_s=round(drain_s, 1), drained=drained, faults=nemesis.applied, fault_counts=counts,
        fault_failures=nemesis.failures, check=check, reference=reference, gaps=gaps,
        reconnects=dict(shared.reconnects), client_errors=dict(shared.errors), queue_depths_after=depths,
        queue_views_after=views, swept_after=swept, replicas=replicas,
        confirms_for_settled_tags=shared.confirms_for_settled_tags,
        nack_only_channels=shared.errors.get("ConnectionRefusedError", 0))
    (out_dir / "campaign.json").write_text(json.dumps(result.as_json(), indent=2) + "\n")
    return result


def _reference_check(history_dir: Path, run_id: str) -> tuple[dict, list[dict]]:
    """The reference checker's verdict on the recorded history (all queues added up) and its gaps."""
    from hutch.pipeline.reference import check_history

    findings = check_history(history_dir)
    queues = findings.summary["runs"].get(run_id, {}).get("queues", {})
    keys = ("published", "confirmed", "nacked", "unconfirmed", "delivered", "deliveries", "lost", "duplicates",
            "duplicates_without_redelivered", "duplicates_unexplained", "unexpected", "reordered", "reordered_unexplained")
    total = {k: sum(int(q.get(k) or 0) for q in queues.values()) for k in keys}
    total["max_gap_ms"] = max((q.get("max_gap_ms") or 0 for q in queues.values()), default=0)
    gaps = [{"queue": g.queue, "kind": g.kind, "start_ns": g.start_ns, "gap_ms": round(g.gap_ms),
             "recovered": g.recovered, "cause": g.cause,
             "recovery_ms": None if g.recovery_ms is None else round(g.recovery_ms)}
            for g in sorted(findings.gaps, key=lambda g: g.start_ns)]
    return total, gaps


def run_campaign(cfg: CampaignConfig, out_dir: str | os.PathLike, lab_dir: str | os.PathLike | None = None,
                 base_port: int = BASE_PORT_DEFAULT, record: bool = True, tied_to_caller: bool = False) -> CampaignResult:
    """Run one campaign. With a lab running in `lab_dir` the campaign uses it (and leaves it running);
    otherwise it starts one there (default OUT/lab, wiped first) and stops it afterwards, keeping its
    logs. OUT/history is replaced; OUT/campaign.json holds the result."""
    from hutch.lab.client import run as run_loop

    out = Path(out_dir)
    lab_path = Path(lab_dir) if lab_dir is not None else out / "lab"
    lab = Lab(lab_path)
    ours = not lab.controller_running()
    # OUT holds one campaign: an earlier one's history (and lab, when the campaign made it) goes
    if record and (out / "history").is_dir():
        shutil.rmtree(out / "history")
    if ours and lab_dir is None and (lab_path / "lab.json").exists():
        lab.down(wipe=True)
    disk_faults = sorted(set(cfg.faults) & set(DISK_FAULT_KINDS))
    if disk_faults and not ours:
        raise CampaignError(f"{', '.join(disk_faults)} need the fault switches of nodes the campaign starts; "
                            f"leave out --dir, or these fault kinds")
    if ours:
        names = [s.name for s in plan_nodes(cfg.nodes, base_port, lab_path)]
        lab = Lab.up(cfg.nodes, lab_path, base_port=base_port, net_ticktime_s=cfg.net_ticktime_s,
                     metadata_timeout_ms=4000, tied_to_caller=tied_to_caller,
                     node_args=list(MIRRORED_NODE_ARGS) if cfg.queue_type == "mirrored" else None,
                     node_env=fault_switch_env(lab_path, names))
    try:
        return run_loop(run_campaign_async(lab, cfg, out, record))
    finally:
        if ours:
            lab.down()


def summary_lines(r: CampaignResult) -> list[str]:
    c = r.check
    lat = c["confirm_latency_ms"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(r.fault_counts.items())) or "none"
    lines = [
        f"seed {r.seed} ({r.run_id}): {'OK' if r.ok else 'FAILED: ' + r.verdict}",
        f"  {r.duration_s:g} s of faults, drained in {r.drain_s:g} s; faults: {faults}"
        + (f"; {len(r.fault_failures)} fault action(s) failed" if r.fault_failures else ""),
        f"  published {c['published']} ({c['publish_attempts']} attempts, {c['nacks']} nacks), "
        f"confirmed {c['confirmed']}, unconfirmed {c['unconfirmed']} ({c['unconfirmed_delivered']} of them delivered)",
        f"  delivered {c['delivered']} in {c['deliveries']} deliveries: lost {c['lost']}, unexpected {c['unexpected']}, "
        f"duplicates {c['duplicates']} ({c['redelivered_flagged']} flagged redelivered)",
        f"  confirm latency ms p50 {lat['p50']} p95 {lat['p95']} p99 {lat['p99']} max {lat['max']}",
        f"  reconnects {r.reconnects}; client errors {r.client_errors}; "
        f"confirm frames for already settled tags {r.confirms_for_settled_tags}; "
        f"publisher channels given up after only nacks {r.nack_only_channels}",
    ]
    if r.reference is not None:
        ref = r.reference
        lines.append(f"  reference checker: lost {ref['lost']}, unexpected {ref['unexpected']}, duplicates "
                     f"{ref['duplicates']} ({ref['duplicates_without_redelivered']} unflagged, "
                     f"{ref['duplicates_unexplained']} not explained by a second publish), reordered "
                     f"{ref['reordered']} ({ref['reordered_unexplained']} not explained), longest stall {ref['max_gap_ms']} ms, {len(r.gaps)} stall(s) > 1 s")
    for q, rep in r.replicas.items():
        state = "agree" if not rep["problems"] else "DISAGREE"
        lines.append(f"  copies of {q}: {rep['copies']} {state} at {', '.join(rep['points']) or 'nothing'} "
                     f"(settled in {rep['settle_s']:g} s)")
        lines += [f"    {p}" for p in rep["problems"][:5]]
    if c.get("offset_gaps"):
        lines.append(f"  stream reads that skipped offsets: {c['offset_gaps']}")
    for g in r.gaps[:8]:
        lines.append(f"    stall: {g['kind']} on {g['queue']} for {g['gap_ms']} ms, cause {g['cause']}, "
                     f"recovered {g['recovered']}")
    for q, per_node in r.queue_views_after.items():
        lines.append(f"  {'after the drain' if r.drained else 'not drained'}, {q} as each node sees it:")
        lines += [f"    {n}: {json.dumps(v)}" for n, v in per_node.items()]
    for n, ids in r.swept_after.items():
        lines.append(f"  a fresh basic.get through {n} still got: {', '.join(ids[:10]) or 'nothing'}")
    if c["lost_examples"]:
        lines.append(f"  lost (publisher:seq): {', '.join(c['lost_examples'])}")
    if r.fault_failures:
        lines += [f"  fault action failed: {f}" for f in r.fault_failures[:5]]
    return lines


# ---------------------------------------------------------------------------------------------
# The command


def _pair(text: str) -> tuple[float, float]:
    a, _, b = text.partition("-")
    lo, hi = float(a), float(b or a)
    if not 0 <= lo <= hi:
        raise click.BadParameter(f"{text!r}: MIN-MAX seconds with 0 <= MIN <= MAX")
    return lo, hi


@click.command(name="campaign")
@click.option("--seed", "seeds", type=int, multiple=True, help="RNG seed (repeat for several campaigns) [default 1].")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True)
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds of faults and load per seed (then heal and drain).")
@click.option("--queues", type=click.IntRange(1, QUEUES_MAX), default=1, show_default=True)
@click.option("--publishers", type=click.IntRange(1, CLIENTS_MAX), default=3, show_default=True)
@click.option("--consumers", type=click.IntRange(1, CLIENTS_MAX), default=3, show_default=True)
@click.option("--consumer-mode", type=click.Choice(CONSUMER_MODES), default="mixed", show_default=True,
              help="push: basic.consume; poll: basic.get; mixed: one of the two at each connection.")
@click.option("--queue-type", type=click.Choice(QUEUE_TYPES), default="quorum", show_default=True,
              help="quorum; mirrored: classic queues mirrored (see --ha-mode), synchronised automatically, "
                   "promoted only when synchronised, on nodes with pause_minority; stream: consumers read "
                   "from the first offset (x-stream-offset) and on from where they were after a reconnection; "
                   "or classic: durable classic queues without mirrors, each on one home node.")
@click.option("--ha-mode", type=click.Choice(HA_MODES), default="all", show_default=True,
              help=f"Mirrored queues: a mirror on every node, or exactly {HA_EXACTLY_COPIES} copies.")
@click.option("--group-size", type=click.IntRange(1, 5), default=None,
              help="Members per queue (x-quorum-initial-group-size) [default: every node].")
@click.option("--rate", type=float, default=40.0, show_default=True, help="Messages per second per publisher.")
@click.option("--faults", default=",".join(FAULT_KINDS), show_default=True,
              help=f"Fault kinds to draw from, of: {', '.join(ALL_FAULT_KINDS)} (the disk faults need nodes the "
                   "campaign starts).")
@click.option("--healthy", default="2-5", show_default=True, help="Seconds between faults, MIN-MAX.")
@click.option("--hold", default="4-10", show_default=True, help="Seconds a fault lasts, MIN-MAX.")
@click.option("--confirm-timeout", type=float, default=5.0, show_default=True,
              help="Seconds without a confirm before a publisher reconnects and republishes.")
@click.option("--drain-timeout", type=float, default=180.0, show_default=True)
@click.option("--out", "out_dir", default="./var/campaign", show_default=True, type=click.Path(file_okay=False),
              help="Results: OUT/seed-N/{campaign.json,history/,lab/}.")
@click.option("--dir", "lab_dir", default=None, type=click.Path(file_okay=False),
              help="Use the lab running in this directory (default: start one in OUT/seed-N/lab).")
@click.option("--base-port", type=int, default=BASE_PORT_DEFAULT, show_default=True,
              help="Base port of the labs the campaign starts.")
@click.option("--no-record", is_flag=True, help="Do not record a history.")
@click.option("-v", "--verbose", is_flag=True, help="Log every fault as it is applied.")
def campaign_cli(seeds, nodes, duration_s, queues, publishers, consumers, consumer_mode, queue_type, ha_mode, group_size, rate,
                 faults, healthy, hold, confirm_timeout, drain_timeout, out_dir, lab_dir, base_port, no_record, verbose):
    """Jepsen-style fault campaign on quorum (or mirrored) queues: publishers with confirms and consumers
    (push, poll or both) on random nodes while a seeded nemesis partitions, kills, suspends and
    slows nodes; then heal, drain and check that no confirmed message was lost (lost = 0) and
    nothing unexpected was delivered. Exit status 1 when any seed fails."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # connections break on purpose here: aiormq's tracebacks about it are noise
    logging.getLogger("aiormq").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip())
    failed = 0
    for seed in seeds or (1,):
        try:
            cfg = CampaignConfig(seed=seed, nodes=int(nodes), duration_s=duration_s, queues=queues,
                                 publishers=publishers, consumers=consumers, consumer_mode=consumer_mode,
                                 group_size=group_size, queue_type=queue_type, ha_mode=ha_mode, rate_per_publisher=rate,
                                 faults=kinds, healthy_s=_pair(healthy),
                                 fault_hold_s=_pair(hold), confirm_timeout_s=confirm_timeout,
                                 drain_timeout_s=drain_timeout)
            result = run_campaign(cfg, Path(out_dir) / f"seed-{seed}", lab_dir=lab_dir, base_port=base_port,
                                  record=not no_record)
        except (CampaignError, LabError) as e:
            raise click.ClickException(str(e)) from None
        for line in summary_lines(result):
            click.echo(line)
        click.echo(f"  results: {Path(out_dir) / f'seed-{seed}' / 'campaign.json'}")
        failed += not result.ok
    if failed:
        raise SystemExit(1)

