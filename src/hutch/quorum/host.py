"""Quorum queues in the broker: one Raft group per queue, the queue state machine applied on
commit by every member, and clients on any node.

The queue's record is in the catalogue (type `quorum`, its Raft members in `member_nodes`,
its group id in `journal_id`). Every node has a `QuorumQueue` handle for it in the vhost;
the members also host the queue's Raft group, whose committed entries each member applies to
its own `hutch.quorum.fifo.QuorumQueueState`. Only the group's leader carries out the
effects: deliveries go to the consumer's node, confirms to the publisher's node, dead letters
are republished from the leader (seed 003; RabbitMQ's Ra runs `rabbit_fifo` the same way).

A client operation becomes a command proposed to the leader: from a member that is not the
leader, or from a node that is not a member, it travels to the leader over the peer
transport (group "q": `["QP", gid, envelope]`). Proposals are retried until they are applied:

- publishes carry `(publisher, publisher_seq)`, a gapless counter per channel and queue, so
  a resend after a leader change is answered with its first outcome and never enqueued twice,
  and the queue takes a channel's publishes in their order (one that reaches the leader ahead
  of an earlier one, say sent before the leader was known, is decided when sent again);
  the confirm goes out on `Accepted` (after a majority has the message) or a nack on `Rejected`;
- consumer registration, basic.get and purge wait for their reply (an `Answer` in the
  leader's `["QE", outcomes]` message to the proposing node);
  with no leader for `metadata_timeout_ms` they fail with 541 and a clear text;
- acks, nacks and rejects are collected per consumer and proposed once per loop iteration.

When a node goes down, each queue's leader proposes `NodeDown`: what that node's consumers
held comes back, redelivered with its `x-delivery-count`. A new leader does the same for the
nodes it finds down.

A delivery that never reaches the consumer's node (its leader stopped between the commit and
the send, or the peer link dropped) is found there when the next one arrives naming it, and the
node proposes `Resend`: the leader answers with what is checked out to the consumer, which the
node gives the client in order, those it already gave left out (`ResentToConsumer`). A new
leader sends each live consumer's node that answer unasked, for what its predecessor may have
committed and never sent.

This module is the host: the node's side of every quorum queue (handles, the groups it hosts,
proposals in flight, the leader's effects). It reaches peers only through `hutch.cluster.peers`
and the broker only through `QuorumPort` (time, policies, dead-lettering, the loop, and
delivering to a consumer's channel). Must never: import anything from `hutch.broker` or above,
touch a channel's fields itself, or name a publisher, consumer or requester by `id()`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from hutch.amqp import codec, spec
from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers, incarnation_in, node_of
from hutch.cluster.raftlog import ENTRY_BYTES_MAX
from hutch.queues.message import Message
from hutch.queues.state import Entry
from hutch.quorum import fifo
from hutch.quorum.handle import QuorumQueue

log = logging.getLogger("hutch.quorum")

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()

RETRY_S = 1.0  # a proposal not answered by then is sent again (to the leader known by then)
# ... except one handed to a leader that is up: that one is sent again at once when another
# leader is known (leader_known) or the leader's node comes back (peer_up), otherwise only after
# this long. Under load an answer can take longer than RETRY_S (10,000 publishes in flight to
# 100 queues confirmed at 4,000 msg/s wait 2.5 s), and resending what is still on its way doubled
# the work of the Raft logs.
RETRY_LEADER_S = 5.0
# Properties with x-delivery-count spliced in, kept per (properties, count) for the deliveries that
# follow (splicing it took 6 % of a leader's loop with its consumer on its node; a delivery's
# preparation 7-10 us -> 0.9 us on a loaded machine); a message whose properties are its own (a
# message id, a timestamp) misses, and the whole cache is dropped when it has this many.
COUNTED_PROPS_MAX = 1024
RESEND_ASK_AGAIN_S = 2.0  # a consumer's node that asked for missed deliveries asks again if no answer came
ONCE_ONLY = (fifo.Get, fifo.Purge)  # not idempotent: never resent once sent
# A leader's verdict from its own view of the cluster: proposed only while this node leads, and
# never sent on to another leader (a suspended leader, resumed, finds its links closed and would
# have the new leader suspend consumers on nodes it saw up all along, with no NodeUp to follow).
# A new leader decides again from its own view (leadership_changed).
LEADER_ONLY = (fifo.NodeDown, fifo.NodeUp)
CLOCK_S = 0.5  # how often a leader lets time pass in queues with something to expire
# publishes a leader keeps at hand per queue for their first delivery (QuorumQueue.recent)
RECENT_MAX = 1024
SNAPSHOT_LOG_FACTOR = 4  # compact a queue's log when it is this many times longer than the queue
SNAPSHOT_MESSAGES_MIN = 2048
# Snapshots a member keeps until the log may be compacted to them (_QuorumApp.checkpoint), and
# how many entries apart it looks whether one may be
CHECKPOINTS_MAX = 3
RELEASE_LOOK_ENTRIES = 2048


# A channel's publisher state on this node (its id and per-queue sequence counters) is kept
# until the channel closes; at most this many at once. Past it the oldest is forgotten here
# without telling the queues (their own records are bounded by fifo.PUBLISHERS_TRACKED_MAX, the
# oldest forgotten first); its channel, if still open, simply gets a new id on its next publish.
# Publishers that never close (the migration's per-message movers) cost no more than this.
PUBLISHERS_MAX = fifo.PUBLISHERS_TRACKED_MAX
# A closed channel's publisher record in each queue's state machine is dropped this long after
# its last publish was answered, so that no resend still on its way can meet a forgotten record.
PUBLISHER_GONE_DELAY_S = 5.0
Q_REQUEST = "q"  # the tag of this host's proposals in the peers' request table


class ContentGone(LookupError):
    """The content of a message named by the snapshot this node installed is not in its log."""


class _PublisherIds:
    """A channel as a publisher to quorum queues: its cluster-wide id (a counter, never the
    channel's address) and, per queue group, the last publisher sequence number it used."""

    __slots__ = ("id", "seqs", "low", "inflight")

    def __init__(self, publisher_id: str):
        self.id = publisher_id
        self.seqs: dict[int, int] = {}  # gid -> last publisher_seq sent to that queue
        self.low: dict[int, int] = {}  # gid -> no publisher_seq below it is unanswered
        self.inflight = 0  # publishes sent and not yet answered


# What a leader sends the node an effect concerns, in one "QE" message per loop iteration.
class ToConsumer(msgspec.Struct, tag="deliver", array_like=True, frozen=True, gc=False):
    """fifo.Deliver, for the consumer's node."""

    gid: int
    consumer_id: str
    msg_id: int
    delivery_count: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    prev_msg_id: int = 0  # fifo.Deliver.prev_msg_id


class ResentToConsumer(msgspec.Struct, tag="resent", array_like=True, frozen=True, gc=False):
    """fifo.Resent, for the consumer's node: the deliveries are ToConsumer without prev_msg_id."""

    gid: int
    consumer_id: str
    upto_msg_id: int
    deliveries: list[ToConsumer]


class PublishDecided(msgspec.Struct, tag="decided", array_like=True, frozen=True, gc=False):
    """fifo.Accepted or fifo.Rejected, for the publisher's node."""

    publisher: str
    publisher_seq: int
    accepted: bool


class Answer(msgspec.Struct, tag="answer", array_like=True, frozen=True, gc=False):
    """The answer to a proposal someone waits for (`req` of the peers' request table)."""

    req: int
    answer: Any
    gid: int


class ConsumerEnded(msgspec.Struct, tag="cancelled", array_like=True, frozen=True, gc=False):
    """fifo.ConsumerCancelled, for the consumer's node."""

    gid: int
    consumer_id: str


Outcome = ToConsumer | PublishDecided | Answer | ConsumerEnded | ResentToConsumer
_HELD_BY_CONSUMERS = (ToConsumer, ResentToConsumer)  # what a NodeDown returns, once applied
_outcomes_dec = msgspec.msgpack.Decoder(list[Outcome])


class QuorumPort(Protocol):
    """The few things the host asks of the broker it serves."""

    def now_ms(self) -> int: ...
    def metadata_timeout_ms(self) -> int: ...
    def queue_settings(self, vhost: str, name: str, queue_type: str, args: dict) -> Any: ...
    def dead_letter(self, q: QuorumQueue, entries: list[Entry], reason: str) -> None: ...
    def schedule(self) -> None: ...
    def dirty(self, q: QuorumQueue) -> None: ...
    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> bool: ...
    def new_stats(self) -> Any: ...
    def delete_queue(self, vhost: str, name: str) -> None: ...
    def window_add(self, session: Any) -> None: ...
    def publish_answered(self, channel: Any, session: Any, seq: int, accepted: bool) -> None: ...
    def deliver(self, consumer: Any, q: QuorumQueue, msg_id: int, delivery_count: int, redelivered: bool,
                route: bytes, props: bytes, body: bytes) -> None: ...
    def cancel_local(self, consumer: Any) -> None: ...


class _QuorumApp:
    """The application of one quorum queue's Raft group on a member node."""

    def __init__(self, host: QuorumHost, q: QuorumQueue):
        self.host = host
        self.q = q
        q.machine = fifo.QuorumQueueState(q.config)
        self.applied_index = 0
        # snapshots taken at these indexes, oldest first, not yet compacted to: (index, membership, data)
        self.checkpoints: deque[tuple[int, Any, bytes]] = deque()
        self._take_new = False  # snapshot_due found a new checkpoint due
        self._looked_at = 0  # the applied index when checkpoint() last looked for one to release
        self._low: tuple[int, int | None] = (-1, None)  # (applied index, first_logged_index then)

    def apply(self, data: bytes, index: int) -> None:
        try:
            origin, req, cmd_bytes = _dec.decode(data)
            cmd = fifo.decode_command(cmd_bytes)
        except (msgspec.DecodeError, ValueError, TypeError):
            log.error("queue '%s' in vhost '%s': undecodable command at index %d; skipped", self.q.name,
                      self.q.vhost, index)
            return
        effects = self.q.machine.apply(cmd, index)
        self.applied_index = index
        host = self.host
        leading = host.is_leader(self.q)
        recent = self.q.recent
        if leading and type(cmd) is fifo.Enqueue:
            recent[index] = cmd
            if len(recent) > RECENT_MAX:
                del recent[next(iter(recent))]
        elif recent and not leading:
            recent.clear()
        if host.proposed_at_ms:
            t = host.proposed_at_ms.pop(self.q.gid, None)
            if t is not None:
                host.commit_latency_ms[self.q.gid] = host.port.now_ms() - t
        if leading:
            self.host.carry_out(self.q, effects, origin, req)
            if type(cmd) in LEADER_ONLY:
                if type(cmd) is fifo.NodeDown:
                    host._down_proposed.discard((self.q.gid, cmd.node))
                self.host.judge_again(self.q, cmd.node)
            if type(cmd) is fifo.Checkout:  # registered by an earlier run of its node, and applied
                self.host._cancel_stale(self.q, node_of(cmd.consumer_id))  # after this node began to lead

    def restore(self, data: bytes) -> None:
        self.q.machine = fifo.QuorumQueueState.restore(data)
        self.checkpoints.clear()  # taken on the way to a state this one replaces
        self._low = (-1, None)

    def snapshot(self) -> bytes:
        return self.q.machine.snapshot()

    def log_needed_from(self) -> int | None:
        """The lowest log index a message in the queue still has its content at (a walk over
        the queue: `checkpoint` has just taken it, at the same applied index)."""
        st = self.q.machine
        if st is None:
            return None
        at, low = self._low
        if at != self.applied_index:
            low = st.first_logged_index()
            self._low = (self.applied_index, low)
        return low

    def snapshot_due(self, entries_kept: int) -> bool:
        """Time to take a snapshot (a checkpoint: the log written since the last is several
        times longer than the queue, so its cost stays a small part per entry), or to look
        whether one kept may be compacted to now (every RELEASE_LOOK_ENTRIES, or the queue's
        length if longer, while some are)."""
        st = self.q.machine
        if st is None:
            return True
        cps = self.checkpoints
        since = self.applied_index - cps[-1][0] if cps else entries_kept
        self._take_new = since >= SNAPSHOT_LOG_FACTOR * (st.messages + SNAPSHOT_MESSAGES_MIN)
        # a look walks the queue (first_logged_index): as far apart as the queue is long, at least
        look = max(RELEASE_LOOK_ENTRIES, st.messages)
        return self._take_new or bool(cps) and self.applied_index - self._looked_at >= look

    def checkpoint(self, index: int, conf: Any, take: Callable[[], bytes | None]) -> tuple[int, Any, bytes] | None:
        """Take a snapshot at the applied `index` if one is due, and keep it; return the newest
        kept whose every message has been settled since (each one still queued was enqueued
        after it: `first_logged_index`), dropping it and the older ones, as what the log may be
        compacted to. A follower sent that snapshot then finds the content of every message it
        may deliver in the entries after it: snapshots hold no bodies, and a member's log keeps
        every entry from the oldest message still queued on, as RabbitMQ's quorum queues do
        (its release cursor)."""
        cps = self.checkpoints
        low = self.log_needed_from()
        if self._take_new or low is None:  # (nothing queued needs the log: a snapshot now is small and goes at once)
            data = take()
            if data is not None:
                if len(cps) >= CHECKPOINTS_MAX:
                    cps.pop()  # the newest gives way: the older ones are released first
                cps.append((index, conf, data))
        self._looked_at = index
        chosen = None
        while cps and (low is None or cps[0][0] < low):
            chosen = cps.popleft()
        return chosen


class QuorumHost:
    """This node's side of every quorum queue: handles, groups it hosts, proposals in flight."""

    def __init__(self, peers: Peers, port: QuorumPort):
        self.peers = peers
        self.port = port
        self.raft: Any = None  # the runtime's group host (ensure_group, drop_group, leader, propose)
        self.queues: dict[int, QuorumQueue] = {}  # gid -> handle
        self._gone_told: set[int] = set()  # queues whose ContentGone this node has logged
        self.consumers: dict[str, Any] = {}  # consumer_id -> the broker's consumer object
        # proposals waiting for an answer live in the peers' one request table (tag Q_REQUEST)
        # (publisher, seq) -> [q, env, channel, seq, session, retry, publisher ids]; bounded by the
        # sessions' publish windows (port.window_add: a session with PUBLISH_WINDOW unanswered
        # publishes is not read from), except the broker's own (dead letters, migration)
        self._pubs: dict[tuple[str, int], list] = {}
        self._publishers: dict[Any, _PublisherIds] = {}  # channel (None: the broker's own) -> ids; PUBLISHERS_MAX
        self._gone_due: list[tuple[float, _PublisherIds]] = []  # channels closed in the last few seconds
        self._out: dict[str, list] = {}  # node -> outcomes to send it; emptied every loop iteration (flush)
        # (group id, node): a NodeDown this node proposed as the queue's leader and has not applied
        # yet; deliveries to consumers on that node are not sent meanwhile (see _propose_node_down)
        self._down_proposed: set[tuple[int, str]] = set()
        self._refused: list[tuple[Any, Any, int]] = []  # publishes too large for an entry, nacked by flush
        self._leading: set[int] = set()
        self._gapped: set[QuorumQueue] = set()  # queues with a consumer here waiting for missed deliveries
        self._gone_seen: set[QuorumQueue] = set()  # on_effects': queues with a delivery to a consumer gone from here
        self._counted: dict[tuple[bytes, int], bytes] = {}  # _delivery's, at most COUNTED_PROPS_MAX
        self._next_clock_s = 0.0
        # commit latency as a leader sees it, one proposal at a time per group (Prometheus'
        # rabbitmq_raft_entry_commit_latency_seconds): gid -> when the one measured was proposed
        self.proposed_at_ms: dict[int, int] = {}
        self.commit_latency_ms: dict[int, int] = {}

    def now_ms(self) -> int:
        return self.port.now_ms()

    def new_id(self) -> int:
        return self.peers.new_id()

    # -- the catalogue's records, applied
    def make_handle(self, rec: cat.QueueRecord, declared: bool = False) -> QuorumQueue | None:
        """The handle of a queue record; a member hosts its group. Only the declare itself
        (`declared`) starts a new group from the bootstrap entry naming the initial members; a
        member that learns of the queue any other way (a snapshot, a restart) starts from its
        own log or empty, and the leader brings it up to date."""
        try:
            config, _warnings = fifo.quorum_config(dict(rec.arguments), rec.name, rec.vhost)
        except fifo.QuorumArgumentError as e:  # checked at declare; a record that slipped through
            log.error("quorum queue '%s' in vhost '%s': %s", rec.name, rec.vhost, e.text)
            return None
        config = self._with_policies(config, dict(rec.arguments))
        q = QuorumQueue(self, rec, config)
        old = self.queues.get(q.gid)
        if old is not None:
            return old
        self.queues[q.gid] = q
        if self.peers.node in q.members and self.raft is not None:
            self.raft.ensure_group(q.gid, q.members, _QuorumApp(self, q), leader_hint=rec.leader_node,
                                   joining=not declared)
        return q

    def members_changed(self, q: QuorumQueue, members: tuple[str, ...]) -> None:
        """The catalogue's member list of a queue changed (add_member, delete_member, grow, shrink)."""
        before = q.members
        q.members = members
        me = self.peers.node
        if self.raft is None:
            return
        if me in members and me not in before:
            self.raft.ensure_group(q.gid, members, _QuorumApp(self, q), joining=True)
        elif me in before and me not in members:
            self.raft.drop_group(q.gid)
            q.machine = None

    def drop_handle(self, q: QuorumQueue) -> None:
        q.deleted = True
        self.queues.pop(q.gid, None)
        self._down_proposed = {d for d in self._down_proposed if d[0] != q.gid}
        for c in list(q.local_consumers.values()):
            q.local_consumers.pop(c.ref, None)
            self.consumers.pop(c.ref, None)
            self.port.cancel_local(c)
        if self.raft is not None and self.peers.node in q.members:
            self.raft.drop_group(q.gid)

    # -- policies
    def _with_policies(self, config: fifo.QuorumConfig, args: dict) -> fifo.QuorumConfig:
        """A queue's config from its arguments, with its policy and operator policy applied
        (hutch.queues.effective: the same resolution as every other queue type)."""
        eff = self.port.queue_settings(config.vhost, config.name, "quorum", args)
        strategy = config.dead_letter_strategy
        wanted = args.get("x-dead-letter-strategy")
        if (wanted.decode() if isinstance(wanted, bytes) else wanted) == fifo.AT_LEAST_ONCE:
            strategy = fifo.AT_LEAST_ONCE if eff.overflow == fifo.REJECT_PUBLISH else fifo.AT_MOST_ONCE
        return msgspec.structs.replace(
            config, max_length=eff.max_length, max_length_bytes=eff.max_length_bytes, overflow=eff.overflow,
            delivery_limit=eff.delivery_limit, dead_letter_exchange=eff.dead_letter_exchange,
            dead_letter_routing_key=eff.dead_letter_routing_key, dead_letter_strategy=strategy,
            message_ttl_ms=eff.message_ttl_ms, expires_ms=eff.expires_ms)

    def reconfigure(self, q: QuorumQueue) -> None:
        """Policies changed: the handle takes the queue's new settings on every node, and the
        leader proposes them to the group (`Configure`), so every member applies them at the same
        point of its log (a lowered max-length drops heads there)."""
        config = self._with_policies(q.config, q.arguments)
        if config != q.config:
            eff = self.port.queue_settings(q.vhost, q.name, "quorum", q.arguments)
            for w in eff.warnings:
                log.warning("%s", w)
        q.config = config
        q.dead_letter_exchange = config.dead_letter_exchange
        q.dead_letter_routing_key = config.dead_letter_routing_key
        st = q.machine
        if st is not None and self.is_leader(q) and not q.deleted:
            current = msgspec.structs.replace(st.config, single_active=config.single_active)
            if current != config:
                self.propose(q, fifo.Configure(config))

    # -- leadership
    def leader_of(self, q: QuorumQueue) -> str | None:
        return self.raft.leader(q.gid) if self.raft is not None else None

    def is_leader(self, q: QuorumQueue) -> bool:
        return self.raft is not None and self.raft.leader(q.gid) == self.peers.node

    def leadership_changed(self, gid: int, leading: bool) -> None:
        """The runtime tells us when this node starts or stops leading a group."""
        q = self.queues.get(gid)
        if q is None:
            return
        if leading and gid not in self._leading:
            self._leading.add(gid)
            log.info("quorum queue '%s' in vhost '%s': this node is the leader", q.name, q.vhost)
            now = self.now_ms()
            for n in q.members:
                if n != self.peers.node and not self.peers.is_up(n):
                    self._propose_node_down(q, n, now)
            for n in self._consumer_nodes(q):
                if not self.peers.is_up(n):
                    self._propose_node_down(q, n, now)
                elif n in self._suspected_nodes(q):  # back before this node led: no NodeUp came
                    self.propose(q, fifo.NodeUp(n, now))
            self._cancel_stale(q)
            self._resend_checked_out(q)  # lost with the old leader, maybe; repeats are dropped
            self.reconfigure(q)  # a policy may have changed while another member led
            pending = q.machine.dead_letters_pending() if q.machine is not None else None
            if pending is not None:
                self._dead_letter(q, pending)
        elif not leading:
            self._leading.discard(gid)
            self._down_proposed = {d for d in self._down_proposed if d[0] != gid}

    def _propose_node_down(self, q: QuorumQueue, node: str, now_ms: int) -> None:
        """As the queue's leader: `node` is unreachable, its consumers are to give back what they
        hold. Until the NodeDown is applied, nothing more is delivered to them: it returns what
        they hold when it is applied, to be delivered elsewhere with `redelivered`, so a delivery
        sent meanwhile (the link may be back by then, the NodeDown committed with the entries
        before it) would reach them as well, perhaps after the other one, without the flag
        (hutch sim cluster, quorum seed 58, before its check asked only that one delivery lack it;
        tests/unit/test_quorum_consumer_deliveries.py)."""
        self._down_proposed.add((q.gid, node))
        self.propose(q, fifo.NodeDown(node, now_ms))

    def judge_again(self, q: QuorumQueue, node: str) -> None:
        """A NodeDown or NodeUp for `node` was applied while this node leads. It may be another
        term's verdict: a leader cut off from the others proposes NodeDown for the nodes it no
        longer reaches, and the entry, left in its log, is committed when it (or a member it reached)
        leads again, with the new term's first entries, after leadership_changed has judged every
        node. When it disagrees with what this node sees now, this node's own verdict follows it
        (else a node up again keeps its consumers suspended, with no NodeUp to come)."""
        if self.peers.is_up(node):
            if node in self._suspected_nodes(q):
                self.propose(q, fifo.NodeUp(node, self.now_ms()))
        elif node in self._serving_nodes(q):
            self._propose_node_down(q, node, self.now_ms())

    def _resend_checked_out(self, q: QuorumQueue, node: str | None = None) -> None:
        """Send each live consumer's node (or only `node`'s) what is checked out to it: after a
        leader change, or when the link to its node was lost and is back (deliveries sent while
        it was down are gone, and if no later one shows the gap its consumer would wait for ever)."""
        if q.machine is None:
            return
        for r in q.machine.resends():
            n = node_of(r.consumer_id)
            if (n == node if node is not None else self.peers.is_up(n)):
                self._queue_out(n, self._resent_out(q, r))

    def _cancel_stale(self, q: QuorumQueue, node: str | None = None) -> None:
        """Consumers registered by an earlier run of a node that is up again (it restarted):
        their channels are gone, so what they held comes back."""
        st = q.machine
        if st is None:
            return
        now = self.now_ms()
        for cid in list(getattr(st, "consumers", {})):
            n = node_of(cid)
            if node is not None and n != node:
                continue
            current = self.peers.incarnation_of(n) if self.peers.is_up(n) else None
            if current is not None and incarnation_in(cid) != current:
                self.propose(q, fifo.Cancel(cid, requeue=True, now_ms=now))

    def _suspected_nodes(self, q: QuorumQueue) -> set[str]:
        """Nodes with consumers the queue holds suspended (NodeDown, and no NodeUp since)."""
        st = q.machine
        if st is None:
            return set()
        return {node_of(cid) for cid, c in st.consumers.items() if c.status == fifo.SUSPECTED_DOWN}

    def _serving_nodes(self, q: QuorumQueue) -> set[str]:
        """Nodes with consumers the queue holds up (not suspended)."""
        st = q.machine
        if st is None:
            return set()
        return {node_of(cid) for cid, c in st.consumers.items() if c.status == fifo.UP}

    def _consumer_nodes(self, q: QuorumQueue) -> set[str]:
        st = q.machine
        if st is None:
            return set()
        return {node_of(cid) for cid in getattr(st, "consumers", {})}

    # -- proposing
    def propose(self, q: QuorumQueue, cmd, callback: Callable[[Any], None] | None = None) -> None:
        """Propose `cmd` to the queue's leader, after the acks, nacks and rejects collected so
        far (a basic.get right after a reject must find the message back)."""
        q.flush_all()
        req = self.new_id()
        env = _enc.encode([self.peers.node, req, fifo.encode_command(cmd)])
        now = self.port.now_ms() / 1000
        # Every command is resent until the leader answers that it is applied (an ack lost with a
        # leader would leave its message checked out for good), except the ones that are not
        # idempotent: a basic.get or purge applied twice would take or remove more. Those are sent
        # once there is somewhere to send them. A client waiting for the answer gets an error
        # after metadata_timeout_ms; the others are resent as long as the queue exists.
        deadline = now + self.port.metadata_timeout_ms() / 1000 if callback is not None else float("inf")
        once = isinstance(cmd, ONCE_ONLY)
        # queue, envelope, resend at, once only, sent, leader only
        item = [q, env, now + RETRY_S, once, False, isinstance(cmd, LEADER_ONLY)]
        self.peers.requests.open(req, callback or _no_answer, None, deadline, Q_REQUEST, item)
        item[2] = now + self._retry_s(q, self._send_call(item))

    def _retry_s(self, q: QuorumQueue, sent: bool) -> float:
        """How long before a proposal just sent (or not: `sent` False) is sent again."""
        if not sent:
            return RETRY_S
        leader = self.raft.leader(q.gid) if self.raft is not None else None
        if leader is not None and (leader == self.peers.node or self.peers.is_up(leader)):
            return RETRY_LEADER_S
        return RETRY_S

    def _send_call(self, item: list) -> bool:
        """Send a proposal waiting for its answer (again); False when it was not sent."""
        q, env, _retry, once, sent, leader_only = item
        if leader_only:
            return self.is_leader(q) and self._send(q, env)
        if not once:
            return self._send(q, env)
        if not sent and (self.raft is None or self.peers.node not in q.members or self.raft.leader(q.gid)):
            # sent once, and by a member only when it knows a leader (a member that does not
            # would drop it): a Get right after a declare waits for the election
            item[4] = self._send(q, env)
        return item[4]

    def _send(self, q: QuorumQueue, env: bytes) -> bool:
        """To the leader (proposed here, or sent to it, or to a member that forwards it); False
        when there was nowhere to send it."""
        raft = self.raft
        if raft is not None and raft.leader(q.gid) == self.peers.node:
            if q.gid not in self.proposed_at_ms:
                self.proposed_at_ms[q.gid] = self.port.now_ms()
            return raft.propose(q.gid, env)
        target = raft.leader(q.gid) if raft is not None else None
        if target is None or target == self.peers.node or not self.peers.is_up(target):
            up = [n for n in q.members if n != self.peers.node and self.peers.is_up(n)]
            target = up[0] if up else None
        return target is not None and self.peers.send(target, ["QP", q.gid, env])

    def on_forwarded(self, gid: int, env: bytes) -> None:
        q = self.queues.get(gid)
        if q is None or self.raft is None:
            return
        leader = self.raft.leader(gid)
        if leader == self.peers.node:
            if gid not in self.proposed_at_ms:
                self.proposed_at_ms[gid] = self.port.now_ms()
            self.raft.propose(gid, env)
        elif leader is not None and self.peers.is_up(leader):
            self.peers.send(leader, ["QP", gid, env])
        # no leader known: dropped; the proposer sends it again

    def leader_known(self, gid: int) -> None:
        """A member learnt of a (new) leader of this queue: what waits for an answer goes to it
        now rather than at the next resend."""
        q = self.queues.get(gid)
        if q is None:
            return
        self._send_calls(q)
        for item in self._pubs.values():
            if item[0] is q:
                self._send(q, item[1])

    def _send_calls(self, q: QuorumQueue) -> None:
        """Send again now, in the order they were made, the proposals to `q` that wait for an answer."""
        for p in self.peers.requests.tagged(Q_REQUEST):
            if p.state[0] is q:
                self._send_call(p.state)

    def tick(self, now_s: float) -> None:
        """Resend what is unanswered (the runtime fails calls past their deadline, once for the
        node's whole request table); as a leader, let time pass in the queues that have something to expire (message TTL at the head, x-expires)."""
        if now_s >= self._next_clock_s:
            self._next_clock_s = now_s + CLOCK_S
            for q in list(self.queues.values()):
                if self.is_leader(q) and self._wants_clock(q, int(now_s * 1000)):
                    self.propose(q, fifo.Tick(int(now_s * 1000)))
        requests = self.peers.requests
        for p in requests.tagged(Q_REQUEST):
            item = p.state
            if (item[0].deleted or item[5] and not self.is_leader(item[0])) and p.callback is _no_answer:
                requests.take(p.rid)
            elif now_s < p.deadline_s and now_s >= item[2]:
                item[2] = now_s + self._retry_s(item[0], self._send_call(item))
        for item in self._pubs.values():
            if now_s >= item[5]:
                item[5] = now_s + self._retry_s(item[0], not item[0].deleted and self._send(item[0], item[1]))
        if self._gone_due:
            self._publishers_gone(now_s)
        if self._gapped:
            for q in list(self._gapped):
                if not q.ask_again(now_s - RESEND_ASK_AGAIN_S):
                    self._gapped.discard(q)

    def _wants_clock(self, q: QuorumQueue, now_ms: int) -> bool:
        st = q.machine
        if st is None:
            return False
        if q.config.expires_ms is not None:
            return True
        head = st.queue.head() if st.messages_ready else None
        return head is not None and head.expires_at_ms is not None and head.expires_at_ms <= now_ms

    # -- publishing
    def publish(self, q: QuorumQueue, msg: Message, channel, seq: int) -> None:
        """Propose the message; the channel's confirm for `seq` waits for its Accepted."""
        session = channel.session if channel is not None else None
        pub = self._publishers.get(channel)
        if pub is None:
            pub = self._new_publisher(channel)
        seqs = pub.seqs
        pseq = seqs.get(q.gid, 0) + 1
        publisher = pub.id
        # the lowest of this publisher's numbers still unanswered: the queue decides them in order
        low = pub.low.get(q.gid, 1)
        while low < pseq and (publisher, low) not in self._pubs:
            low += 1
        now = self.now_ms()
        cmd = fifo.Enqueue(msg.exchange, msg.routing_key, msg.props, msg.body, msg.persistent, msg.priority,
                           msg.expiration_ms, now, publisher, pseq, low)
        env = _enc.encode([self.peers.node, 0, fifo.encode_command(cmd)])
        if session is not None:
            self.port.window_add(session)
        if len(env) > ENTRY_BYTES_MAX:
            # never proposed (the Raft log would refuse its record): nacked after the channel
            # has counted it, at the end of this loop iteration; its publisher number is not used
            log.warning("queue '%s' in vhost '%s': refused a message of %d bytes, over the largest entry "
                        "a quorum queue takes (%d bytes)", q.name, q.vhost, len(env), ENTRY_BYTES_MAX)
            self._refused.append((channel, session, seq))
            self.port.schedule()
            return
        seqs[q.gid] = pseq
        pub.low[q.gid] = low
        pub.inflight += 1
        item = self._pubs[(publisher, pseq)] = [q, env, channel, seq, session, 0.0, pub]
        item[5] = now / 1000 + self._retry_s(q, self._send(q, env))

    def _confirmed(self, publisher: str, pseq: int, accepted: bool) -> None:
        item = self._pubs.pop((publisher, pseq), None)
        if item is None:
            return
        _q, _env, ch, seq, session, _retry, pub = item
        pub.inflight -= 1
        assert pub.inflight >= 0, f"publisher {publisher}: more answers than publishes"
        self.port.publish_answered(ch, session, seq, accepted)

    def _new_publisher(self, channel: Any) -> _PublisherIds:
        """A channel's first publish to a quorum queue: it gets an id of its own, from the
        node's counter (ids are never reused, so a sequence restarting at 1 is always right)."""
        if len(self._publishers) >= PUBLISHERS_MAX:
            del self._publishers[next(iter(self._publishers))]
        pub = self._publishers[channel] = _PublisherIds(self.peers.owner_id())
        return pub

    def channel_closed(self, channel: Any) -> None:
        """The channel is gone: its ids are forgotten here, and each queue it published to is
        told to drop its record once nothing it sent can still arrive (fifo.PublisherGone)."""
        pub = self._publishers.pop(channel, None)
        if pub is not None:
            self._retire(pub)

    def _retire(self, pub: _PublisherIds) -> None:
        self._gone_due.append((self.now_ms() / 1000 + PUBLISHER_GONE_DELAY_S, pub))

    def _publishers_gone(self, now_s: float) -> None:
        due, self._gone_due = self._gone_due, []
        for at, pub in due:
            if at > now_s:
                self._gone_due.append((at, pub))
            elif pub.inflight:  # publishes still unanswered (being resent): wait for them
                self._gone_due.append((now_s + PUBLISHER_GONE_DELAY_S, pub))
            else:
                for gid in pub.seqs:
                    q = self.queues.get(gid)
                    if q is not None and not q.deleted:
                        self.propose(q, fifo.PublisherGone(pub.id))

    # -- effects, on the leader
    def carry_out(self, q: QuorumQueue, effects: list, origin: str, req: int) -> None:
        """Carry out the effects of one command. The answer to the command goes out before what
        else it caused: a client is told basic.consume-ok before its consumer's first delivery
        (as RabbitMQ does; a client may register its consumer only on consume-ok)."""
        reply: Any = [200]
        out: list[tuple[str, Outcome]] = []
        for e in effects:
            t = type(e)
            if t is fifo.Deliver:
                try:
                    out.append((node_of(e.consumer_id), self._to_consumer(q, e)))
                except ContentGone:
                    continue
            elif t is fifo.Accepted or t is fifo.Rejected:
                out.append((node_of(e.publisher), PublishDecided(e.publisher, e.publisher_seq, t is fifo.Accepted)))
            elif t is fifo.GetResult:
                m = e.message
                try:
                    content = self._content_of(q, m) if m is not None else None
                except ContentGone:
                    content = None
                if content is None:
                    reply = [200, None, e.message_count, e.requester]
                else:
                    exchange, routing_key, props, body = content
                    reply = [200, [m.msg_id, m.delivery_count, m.redelivered, exchange, routing_key, props, body],
                             e.message_count, e.requester]
            elif t is fifo.Purged or t is fifo.Deleted:
                reply = [200, e.message_count]
            elif t is fifo.DeadLetter:
                self._dead_letter(q, e)
            elif t is fifo.ConsumerCancelled:
                out.append((node_of(e.consumer_id), ConsumerEnded(q.gid, e.consumer_id)))
            elif t is fifo.DispatchPending:
                self.propose(q, fifo.Tick(self.now_ms()))
            elif t is fifo.QueueExpired:
                self.port.delete_queue(q.vhost, q.name)
            elif t is fifo.Resent:
                out.append((node_of(e.consumer_id), self._resent_out(q, e)))
        if req:
            self._queue_out(origin, Answer(req, reply, q.gid))
        for node, item in out:
            self._queue_out(node, item)
        self.port.schedule()

    def content(self, q: QuorumQueue, index: int) -> tuple[str, str, bytes, bytes]:
        """(exchange, routing key, properties, body) of the message enqueued at log `index` of
        the queue's group on this node. The log keeps every entry a message in the queue still
        needs (fifo.LoggedMessage), so one missing is a defect (LookupError), but for one the
        snapshot this node installed names (ContentGone): every such message was settled by an
        entry this node is still applying, so what applying it before then asks of it (this node
        began to lead before it caught up) was done by the leader of the time."""
        cmd = q.recent.pop(index, None)
        if cmd is not None:
            return cmd.exchange, cmd.routing_key, cmd.props, cmd.body
        data = self.raft.entry_data(q.gid, index) if self.raft is not None else None
        if data is None:
            if self.raft is not None and index <= self.raft.snapshot_index(q.gid):
                if q.gid not in self._gone_told:  # once a queue: a catch-up may meet many
                    self._gone_told.add(q.gid)
                    log.warning("queue '%s' in vhost '%s': this node leads before it applied the entries after "
                                "its snapshot; what they replay for messages settled since (from log entry %d) "
                                "is left out, as the leader of the time carried it out", q.name, q.vhost, index)
                raise ContentGone(f"queue '{q.name}' in vhost '{q.vhost}': message at log entry {index} settled "
                                  f"since this node's snapshot")
            raise LookupError(f"queue '{q.name}' in vhost '{q.vhost}': no log entry {index} for a message's content")
        cmd = fifo.decode_command(_dec.decode(data)[2])
        if type(cmd) is not fifo.Enqueue:
            raise LookupError(f"queue '{q.name}' in vhost '{q.vhost}': log entry {index} is not a publish")
        return cmd.exchange, cmd.routing_key, cmd.props, cmd.body

    def _content_of(self, q: QuorumQueue, m: fifo.Deliver | fifo.DeadMessage) -> tuple[str, str, bytes, bytes]:
        if m.body is None:
            return self.content(q, m.index)
        return m.exchange, m.routing_key, m.props, m.body

    def _to_consumer(self, q: QuorumQueue, d: fifo.Deliver, prev_msg_id: bool = True) -> ToConsumer:
        exchange, routing_key, props, body = self._content_of(q, d)
        return ToConsumer(q.gid, d.consumer_id, d.msg_id, d.delivery_count, d.redelivered, exchange, routing_key,
                          props, body, d.prev_msg_id if prev_msg_id else 0)

    def _resent_out(self, q: QuorumQueue, r: fifo.Resent) -> ResentToConsumer:
        out = []
        for d in r.deliveries:
            try:
                out.append(self._to_consumer(q, d, False))
            except ContentGone:
                continue
        return ResentToConsumer(q.gid, r.consumer_id, r.upto_msg_id, out)

    def _queue_out(self, node: str, item: Outcome) -> None:
        if self._down_proposed and type(item) in _HELD_BY_CONSUMERS and (item.gid, node) in self._down_proposed:
            return  # its NodeDown, when applied, returns it (_propose_node_down)
        self._out.setdefault(node, []).append(item)

    def flush(self) -> None:
        """Send what the groups this node leads decided, once per loop iteration and node (to
        this node itself without encoding), and nack the publishes refused as too large."""
        if self._refused:
            refused, self._refused = self._refused, []
            for channel, session, seq in refused:
                self.port.publish_answered(channel, session, seq, False)
        if self._out:
            out, self._out = self._out, {}
            for node, items in out.items():
                if node == self.peers.node:
                    self.on_effects(items)
                else:
                    self.peers.send(node, ["QE", _enc.encode(items)])

    def _dead_letter(self, q: QuorumQueue, e: fifo.DeadLetter) -> None:
        if e.exchange is not None:
            entries = []
            for m in e.messages:
                try:
                    exchange, routing_key, props, body = self._content_of(q, m)
                except ContentGone as gone:
                    log.warning("%s: not dead-lettered again by this node (its leader of the time did)", gone)
                    continue
                entries.append(Entry(0, Message(exchange, routing_key, codec.route_encoding(exchange, routing_key),
                                                props, body, m.persistent, 0, None), None))
            self.port.dead_letter(q, entries, e.reason)
        if e.strategy == fifo.AT_LEAST_ONCE and e.messages:
            self.propose(q, fifo.DeadLetterSettled([m.seq for m in e.messages]))

    # -- effects, where they land
    def on_effects(self, items: list[Outcome] | bytes) -> None:
        """Outcomes a leader sent this node (encoded when they came over the wire)."""
        if isinstance(items, bytes):
            try:
                items = _outcomes_dec.decode(items)
            except msgspec.DecodeError as e:  # a bug on the sending side: its resends decide again
                log.error("undecodable quorum queue outcomes from a leader: %s", e)
                return
        self._gone_seen.clear()
        for item in items:
            t = type(item)
            if t is ToConsumer:
                self._deliver(item.gid, item.consumer_id, item.msg_id, item.prev_msg_id, item.delivery_count,
                              item.redelivered, item.exchange, item.routing_key, item.props, item.body)
            elif t is PublishDecided:
                self._confirmed(item.publisher, item.publisher_seq, item.accepted)
            elif t is Answer:
                if not self.peers.requests.answer(item.req, item.answer):
                    self._orphan_answer(item.answer, item.gid)
            elif t is ResentToConsumer:
                self._resent(item)
            elif t is ConsumerEnded:
                c = self.consumers.pop(item.consumer_id, None)
                if c is not None:
                    c.queue.local_consumers.pop(c.ref, None)
                    self.port.cancel_local(c)
        self.port.schedule()

    def _orphan_answer(self, answer: list, gid: int) -> None:
        """An answer nobody waits for any more (the call timed out before it committed): a
        message a basic.get took goes back to the queue."""
        q = self.queues.get(gid)
        if q is not None and len(answer) == 4 and answer[1] is not None:
            self.propose(q, fifo.Return(answer[3], [answer[1][0]]))

    def _deliver(self, gid: int, consumer_id: str, msg_id: int, prev_msg_id: int, delivery_count: int,
                 redelivered: bool, exchange: str, routing_key: str, props: bytes, body: bytes) -> None:
        c = self.consumers.get(consumer_id)
        q = self.queues.get(gid)
        if c is None or q is None:
            if q is not None:  # the consumer is gone: give it back, after its Cancel
                # This node's Cancel of it may still wait for its resend (made while no member
                # was reachable): sent again first, so that the leader never applies the Return
                # while the consumer still receives. It would deliver the message to it again, and
                # each round trip raised the count until x-delivery-limit dropped the message
                # (hutch sim cluster, quorum seed 729).
                if q not in self._gone_seen:
                    self._gone_seen.add(q)
                    self._send_calls(q)
                self.propose(q, fifo.Return(consumer_id, [msg_id]))
            return
        q.deliver(c, msg_id, prev_msg_id,
                  *_delivery(delivery_count, redelivered, exchange, routing_key, props, body, self._counted))

    def _resent(self, item: ResentToConsumer) -> None:
        """A leader's answer to a Resend (or a new leader's unasked one): to the consumer's handle.
        For a consumer gone meanwhile nothing is done: its Cancel settled what it held."""
        c = self.consumers.get(item.consumer_id)
        q = self.queues.get(item.gid)
        if c is None or q is None:
            return
        q.resent(c, item.upto_msg_id,
                 [(d.msg_id, *_delivery(d.delivery_count, d.redelivered, d.exchange, d.routing_key, d.props, d.body,
                                        self._counted)) for d in item.deliveries])

    def ask_resend(self, q: QuorumQueue, consumer_id: str, after_msg_id: int) -> None:
        """A consumer's handle found a delivery missing: ask the leader for what is checked out to
        it (asked again by tick() while no answer comes)."""
        self._gapped.add(q)
        self.propose(q, fifo.Resend(consumer_id, after_msg_id))

    # -- nodes
    def peer_down(self, peer: str) -> None:
        now = self.now_ms()
        for q in list(self.queues.values()):
            if self.is_leader(q):
                self._propose_node_down(q, peer, now)
        # calls and publishes in flight are resent to the next leader by tick()

    def peer_up(self, peer: str) -> None:
        now = self.now_ms()
        for q in list(self.queues.values()):
            if self.is_leader(q):
                self.propose(q, fifo.NodeUp(peer, now))
                self._cancel_stale(q, peer)
                self._resend_checked_out(q, peer)
            elif self.leader_of(q) == peer:  # what was on its way may have been lost with the link
                self.leader_known(q.gid)

    def owner_id(self) -> str:
        """A new consumer, requester or publisher id of this run of this node."""
        return self.peers.owner_id()

    # -- membership (hutch-queues add_member, delete_member, grow, shrink)
    def membership_op(self, gid: int, op: str, node: str) -> list:
        """On the node asked to: the queue's leader proposes the change to its group."""
        if self.raft is None:
            return [spec.NOT_FOUND, "no such queue group here"]
        why = self.raft.change_members(gid, op, node)
        return [200] if why is None else [spec.PRECONDITION_FAILED, why]

    def local_status(self, gid: int) -> dict | None:
        st = self.raft.status(gid) if self.raft is not None else None
        q = self.queues.get(gid)
        if st is not None and q is not None and q.machine is not None:
            st["publishers"] = len(q.machine.publishers)  # publishers whose sequence numbers it keeps
        return st

    # -- listings
    def stats(self) -> list:
        return [[q.vhost, q.name, *q._counts()] for q in self.queues.values() if self.is_leader(q)]


def _no_answer(_answer: Any) -> None:
    return None


def _delivery(delivery_count: int, redelivered: bool, exchange: str, routing_key: str, props: bytes,
              body: bytes, counted: dict) -> tuple[int, bool, bytes, bytes, bytes]:
    """A delivery as a consumer's channel takes it: the route encoded, x-delivery-count in the
    properties (RabbitMQ 3.10 sends it on every quorum delivery, 0 included). `counted` keeps the
    properties with their count of the last few kinds of message (most publishers send the same
    properties every time), at most COUNTED_PROPS_MAX."""
    key = (props, delivery_count)
    edited = counted.get(key)
    if edited is None:
        if len(counted) >= COUNTED_PROPS_MAX:
            counted.clear()
        edited = counted[key] = codec.edit_properties(
            props, set_headers={"x-delivery-count": codec.typed_value(delivery_count)})
    return delivery_count, redelivered, codec.route_encoding(exchange, routing_key), edited, body
