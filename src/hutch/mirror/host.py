"""Mirrored classic queues: a leader and its mirrors joined by a GM ring (seed 000, seed 004 §4.2).

A classic queue that a policy with `ha-mode` matches has, in the catalogue, a leader node
(`leader_node`) and mirror nodes (`member_nodes`); the catalogue leader keeps the mirror nodes
in line with the policy (`hutch.mirror.placement`). On the leader node the queue is an
ordinary `ClassicQueue` with a `Leader` attached as `q.mirror`: every change the queue makes
is recorded as an operation (`hutch.mirror.replica`) and once per loop iteration they go out
in one broadcast on the queue's GM group. Each mirror node runs a `Mirror`: a GM member that
joined the leader's ring and a `Replica` built from the operations. Consumers and publishers
anywhere talk to the leader (the queue is a `RemoteQueue` on every other node).

This module is the whole mirroring strategy of a node (`MirrorHost`: the leader side, the
mirrors, synchronisation, promotion). It sees the broker only through `MirrorCluster` (peers,
the catalogue, ha-* settings, re-attaching consumers after a promotion) and the queue objects
it is given. Must never: import anything from `hutch.broker` or above, or write to a
client's connection.

- **Confirms.** A publish is accepted (basic.ack, or the accept another node waits for) once
  the broadcast that carried it is stable: it went round the ring, so every mirror has it.
  tx.commit-ok waits the same way. A mirror that stops acknowledging stalls the ring and the
  publishers (their confirms and, through flow control, their sockets) until the failure
  detector declares it down.
- **Synchronisation.** A mirror starts empty and gets new messages only; the leader knows from
  which sequence number on it has everything (`since`). It is synchronised when no older
  message is left in the queue. `sync_queue` (or `ha-sync-mode: automatic` when a mirror joins)
  sends the queue's messages in batches of `ha-sync-batch-size`, paced by
  `mirroring_sync_max_throughput`; the queue delivers nothing and answers no basic.get until
  it is done, as RabbitMQ's does.
- **Promotion.** GM reports the leader's death to every mirror after the same last operation.
  Every mirror then picks the same successor from the leader's last view: the longest-running
  mirror (synchronised only, under `ha-promote-on-failure: when-synced`, or after a controlled
  shutdown under `ha-promote-on-shutdown: when-synced`). The successor commits itself as leader
  in the catalogue (so a minority side of a partition cannot promote) and builds the queue from
  its replica: checked-out messages return, marked redelivered. Publishes the old leader had
  not accepted are sent again by their nodes to the new leader, which drops those it already
  has; consumers on other nodes are attached to the new leader, or cancelled if they asked for
  `x-cancel-on-ha-failover`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hutch.amqp import codec, spec
from hutch.cluster import catalogue as cat
from hutch.mirror import gm
from hutch.mirror.placement import ALWAYS, AUTOMATIC, SYNC_BATCH_SIZE, WHEN_SYNCED, MirrorParams
from hutch.mirror.replica import Backlog, Replica, decode_ops, encode_ops, enqueue_op
from hutch.queues.message import Message
from hutch.queues.state import Entry

if TYPE_CHECKING:
    from hutch.queues.classic import ClassicQueue

log = logging.getLogger("hutch.mirroring")


class MirrorCluster(Protocol):
    """What the mirroring glue uses of the node's cluster side (`hutch.broker.cluster.ClusterBroker`):
    the peers, the catalogue's leader of a queue, ha-* settings, and re-attaching consumers."""

    broker: Any
    node: str
    incarnation: int

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Any: ...
    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None: ...
    def send(self, peer: str, payload: Any) -> bool: ...
    def is_up(self, node: str) -> bool: ...
    def submit(self, cmd: cat.Command, callback: Callable[[cat.Result], None]) -> None: ...
    def catalogue_leader_of(self, vhost: str, name: str) -> str | None: ...
    def mirror_params(self, vhost: str, name: str) -> MirrorParams | None: ...
    def leader_here(self, cur: Any, q: Any) -> None: ...

FLOW_HIGH = 20000  # messages broadcast and not yet stable: publishers wait above this
FLOW_LOW = 5000
SYNC_INFLIGHT = 64  # sync batches in the ring at once
SYNC_PROGRESS_S = 1.0
JOIN_RETRY_S = 0.3
PROMOTE_RETRY_S = 1.0


def node_of(member: str) -> str:
    return member.split("|", 1)[0]


def _qname(q) -> str:
    return f"Mirrored queue '{q.name}' in vhost '{q.vhost}'"


class MirrorInfo:
    __slots__ = ("member", "node", "since", "order")

    def __init__(self, member: str, node: str, since: int, order: int):
        self.member = member
        self.node = node
        self.since = since  # the mirror holds every message from this sequence number on
        self.order = order  # join order: lower is longer-running


class Leader:
    """The leader side of one mirrored queue, attached to its ClassicQueue as `q.mirror`."""

    def __init__(self, host: MirrorHost, q: ClassicQueue, member: gm.GMMember):
        self.host = host
        self.q = q
        self.gm = member
        self.ops: list = []
        self.op_msgs = 0
        self.backlog = Backlog()
        self.last_seq = 0  # last broadcast
        self.stable_seq = 0
        self.mirrors: dict[str, MirrorInfo] = {}
        self._order = 0
        self.sync: SyncJob | None = None
        self.sync_waiters: list[Callable[[Any], None]] = []
        self.stopping = False
        self._view_sent: list | None = None
        self.recent_tokens: dict[tuple[str, int], None] = {}

    # ---------------------------------------------------------------- what the queue did

    def enqueued(self, entry: Entry) -> None:
        origin, token = self.host.token
        self.ops.append(enqueue_op(entry.seq, entry.message, entry.expires_at_ms, origin, token))
        self.op_msgs += 1

    def _seqs(self, tag: str, seq: int) -> None:
        ops = self.ops
        if ops and ops[-1][0] == tag:
            ops[-1][1].append(seq)
        else:
            ops.append([tag, [seq]])

    def checked_out(self, seq: int) -> None:
        self._seqs("K", seq)

    def removed(self, seq: int) -> None:
        self._seqs("X", seq)
        if self.sync is not None:
            self.sync.removed.add(seq)

    # ---------------------------------------------------------------- broadcasting

    def flush(self) -> None:
        if not self.ops or self.gm.status != gm.MEMBER:
            return
        ops, self.ops = self.ops, []
        n = self.gm.broadcast(encode_ops(ops))
        self.last_seq = n
        self.backlog.sent(n, self.op_msgs)
        self.op_msgs = 0

    def after_stable(self, fn: Callable[[Any], None], arg: Any) -> None:
        """fn(arg) once every mirror has everything recorded so far."""
        target = self.last_seq + (1 if self.ops else 0)
        if target <= self.stable_seq:
            self.host.cluster.call_soon(fn, arg)
        else:
            self.backlog.waiters.append((target, fn, arg))

    def backlogged(self) -> bool:
        return self.backlog.unstable_msgs + self.op_msgs > FLOW_HIGH

    def drained(self) -> bool:
        return self.backlog.unstable_msgs + self.op_msgs <= FLOW_LOW

    @property
    def syncing(self) -> bool:
        return self.sync is not None

    def after_sync(self, fn: Callable[[Any], None]) -> None:
        if self.sync is None:
            self.host.cluster.call_soon(fn, None)
        else:
            self.sync_waiters.append(fn)

    # ---------------------------------------------------------------- events of the ring

    def on_event(self, ev) -> None:
        t = type(ev)
        if t is gm.Stable:
            self.stable_seq = ev.seq
            for _s, fn, arg in self.backlog.stable(ev.seq):
                fn(arg)
            if self.sync is not None:
                self.sync.on_stable(ev.seq)
            if self.q.flow_waiters is not None:
                self.host.broker.dirty_queues.add(self.q)
        elif t is gm.MembersChanged:
            self._members_changed(ev)

    def _members_changed(self, ev: gm.MembersChanged) -> None:
        q = self.q
        for m in ev.births:
            if m == self.gm.id or m in self.mirrors:
                continue
            self._order += 1
            self.mirrors[m] = MirrorInfo(m, node_of(m), q.state.next_seq, self._order)
            log.info("%s: Adding mirror on node %s: %s", _qname(q), node_of(m), m)
        dead = [m for m in ev.deaths if m in self.mirrors]
        if dead:
            for m in dead:
                del self.mirrors[m]
            log.info("%s: Master %s saw deaths of mirrors %s", _qname(q), self.gm.id, " ".join(dead))
        self.send_view()
        if ev.births and self.params().sync_mode == AUTOMATIC and self.unsynced():
            self.start_sync()
        if self.sync is not None:
            self.sync.members_changed()

    # ---------------------------------------------------------------- synchronisation state

    def floor(self) -> int:
        """The lowest sequence number still in the queue (next_seq when it is empty)."""
        st = self.q.state
        low = st.next_seq
        for e in st.ready_heads():
            low = min(low, e.seq)
        if st.unacked:
            low = min(low, min(st.unacked))
        return low

    def synchronised(self) -> list[MirrorInfo]:
        f = self.floor()
        return [m for m in self.mirrors.values() if m.since <= f]

    def unsynced(self) -> list[MirrorInfo]:
        f = self.floor()
        return [m for m in self.mirrors.values() if m.since > f]

    def params(self) -> MirrorParams:
        return self.host.cluster.mirror_params(self.q.vhost, self.q.name) or MirrorParams("all", None)

    def view(self) -> list:
        """[mirrors oldest first as [member, node, synchronised, since], stopping,
        ha-promote-on-failure, ha-promote-on-shutdown, the leader's member]"""
        f = self.floor()
        p = self.params()
        mirrors = sorted(self.mirrors.values(), key=lambda m: m.order)
        return [[[m.member, m.node, m.since <= f, m.since] for m in mirrors], self.stopping, p.promote_on_failure,
                p.promote_on_shutdown, self.gm.id]

    def send_view(self) -> None:
        v = self.view()
        if v != self._view_sent:
            self._view_sent = v
            self.ops.append(["V", v])

    def mirror_nodes(self) -> tuple[list[str], list[str]]:
        """(mirror nodes, synchronised mirror nodes), as listings show them."""
        f = self.floor()
        ms = sorted(self.mirrors.values(), key=lambda m: m.order)
        return [m.node for m in ms], [m.node for m in ms if m.since <= f]

    # ---------------------------------------------------------------- sync

    def start_sync(self) -> str:
        if self.sync is not None:
            return "already synchronising"
        if not self.unsynced():
            return "already synchronised"
        self.sync = SyncJob(self)
        self.sync.start()
        return "ok"

    def cancel_sync(self) -> bool:
        if self.sync is None:
            return False
        self.sync.finish(cancelled=True)
        return True

    def sync_done(self, cancelled: bool = False) -> None:
        self.sync = None
        self.q.dispatch_blocked = False
        self.host.broker.dirty_queues.add(self.q)
        self.host.broker.schedule()
        waiters, self.sync_waiters = self.sync_waiters, []
        for fn in waiters:
            fn(None)
        if not cancelled and self.params().sync_mode == AUTOMATIC and self.unsynced() and not self.stopping:
            self.start_sync()  # a mirror that joined while the last one ran

    def tick(self, now: float) -> None:
        self.send_view()
        if self.sync is not None:
            self.sync.pump(now)

    def detach(self, deleted: bool = False) -> None:
        """The queue stops being mirrored, stops being led here, or is deleted (then the mirrors
        are told, so that none of them takes the leader's leaving for a failure)."""
        if self.sync is not None:
            self.sync.finish(cancelled=True)
        if deleted:
            self.ops.append(["Z"])
        if self.gm.status == gm.MEMBER:
            self.flush()
            self.gm.leave()
        waiters = list(self.backlog.waiters)
        self.backlog.waiters.clear()
        for _s, fn, arg in waiters:  # nobody else holds these now: settle as the queue stands
            fn(arg)


class SyncJob:
    """One run of a sync: the queue's messages as they stood at the start, sent in batches."""

    def __init__(self, leader: Leader):
        self.leader = leader
        q = leader.q
        st = q.state
        self.entries = sorted(list(st.ready()) + list(st.unacked.values()), key=lambda e: e.seq)
        self.floor_at_start = st.next_seq
        self.targets = {m.member for m in leader.unsynced()}
        p = leader.params()
        self.batch = p.sync_batch_size or leader.host.broker.config.mirroring_sync_batch_size or SYNC_BATCH_SIZE
        self.max_bytes_s = leader.host.broker.config.mirroring_sync_max_throughput
        self.pos = 0
        self.sent_bytes = 0
        self.inflight: list[int] = []
        self.started = leader.host.now()
        self.last_progress = self.started
        self.done_seq = 0
        self.finished = False
        self.removed: set[int] = set()

    def start(self) -> None:
        q = self.leader.q
        self.leader.q.dispatch_blocked = True
        log.info("%s: Synchronising: %d messages to synchronise", _qname(q), len(self.entries))
        log.info("%s: Synchronising: batch size: %d", _qname(q), self.batch)
        self.pump(self.started)

    def members_changed(self) -> None:
        alive = set(self.leader.mirrors)
        self.targets &= alive
        if not self.targets and not self.finished:
            self.finish(cancelled=False, reason="all mirrors to synchronise are gone")

    def pump(self, now: float) -> None:
        if self.finished:
            return
        ld = self.leader
        q = ld.q
        if now - self.last_progress >= SYNC_PROGRESS_S:
            self.last_progress = now
            log.info("%s: Synchronising: %d messages", _qname(q), self.pos)
        while self.pos < len(self.entries) and len(self.inflight) < SYNC_INFLIGHT:
            if self.max_bytes_s and self.sent_bytes > (now - self.started) * self.max_bytes_s:
                return  # over mirroring_sync_max_throughput: the next tick (0.1 s) goes on
            chunk = self.entries[self.pos:self.pos + self.batch]
            self.pos += len(chunk)
            items = []
            for e in chunk:
                if e.seq in self.removed:  # acknowledged meanwhile: its removal went out already
                    continue
                items.append(enqueue_op(e.seq, e.message, e.expires_at_ms, "", 0) + [e.delivery_count])
                self.sent_bytes += len(e.message.body)
            ld.flush()  # operations recorded before this batch go first
            n = ld.gm.broadcast(encode_ops([["Y", items]]))
            ld.last_seq = n
            self.inflight.append(n)
        if self.pos >= len(self.entries) and not self.done_seq:
            ld.flush()
            self.done_seq = ld.gm.broadcast(encode_ops([["YD", self.floor_at_start]]))
            ld.last_seq = self.done_seq

    def on_stable(self, seq: int) -> None:
        self.inflight = [s for s in self.inflight if s > seq]
        if self.done_seq and seq >= self.done_seq:
            for m in self.leader.mirrors.values():
                if m.member in self.targets:
                    m.since = 0  # it has what existed at the start, and everything since it joined
            self.finish(cancelled=False)
            return
        self.pump(self.leader.host.now())

    def finish(self, cancelled: bool, reason: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        q = self.leader.q
        if cancelled:
            log.info("%s: Synchronising: cancelled after %d messages", _qname(q), self.pos)
        elif reason:
            log.info("%s: Synchronising: stopped, %s", _qname(q), reason)
        else:
            log.info("%s: Synchronising: %d messages", _qname(q), len(self.entries))
            log.info("%s: Synchronising: complete", _qname(q))
        self.leader.send_view()
        self.leader.sync_done(cancelled)


class Mirror:
    """A mirror of a queue led by another node: its GM member and its replica."""

    def __init__(self, host: MirrorHost, vhost: str, name: str, leader_node: str):
        self.host = host
        self.vhost = vhost
        self.name = name
        self.leader_node = leader_node
        self.replica = Replica()
        self.member: gm.GMMember | None = None
        self.leader_member: str | None = None
        self.leader_dead = False
        self.retry_at = 0.0
        self.asking = False
        self.promoting = False
        self.wants_lead = False  # the catalogue names this node leader; waiting for the old one to go
        self.dead_leader_node = ""
        self.warned = False

    def __repr__(self) -> str:
        return f"Mirror({self.vhost!r}, {self.name!r}, leader {self.leader_node})"

    def start(self, now: float) -> None:
        """Ask the leader node for its member, then join the ring after it."""
        if self.asking or self.member is not None or now < self.retry_at:
            return
        if not self.host.cluster.is_up(self.leader_node):
            return
        self.asking = True
        self.host.cluster.call(self.leader_node, "gmid", [self.vhost, self.name], self._got_leader)

    def _got_leader(self, result) -> None:
        self.asking = False
        if self.host.mirrors.get((self.vhost, self.name)) is not self or self.member is not None:
            return
        if not result or result[0] != 200:
            self.retry_at = self.host.now() + JOIN_RETRY_S
            return
        self.leader_member = result[1]
        self.leader_dead = False
        self.replica = Replica()  # a (re)starting mirror starts empty
        self.member = gm.GMMember.joiner(self.host.new_member_id(), via=result[1])
        self.host.members[self.member.id] = self
        self.host.touched()

    def on_event(self, ev) -> None:
        t = type(ev)
        if t is gm.Deliver:
            if ev.sender != self.member.id:
                self.replica.apply(decode_ops(ev.payload))
                view = self.replica.view
                if view and len(view) > 4 and view[4] != self.leader_member and ev.sender == view[4]:
                    self.leader_member = view[4]
        elif t is gm.MembersChanged:
            if self.leader_member in ev.deaths and not self.leader_dead:
                self.leader_dead = True
                self.warned = False
                self.dead_leader_node = self.leader_node
                self.consider_promotion()
            elif self.leader_dead and ev.deaths:  # the successor may be among them: choose again
                self.consider_promotion()
        elif t in (gm.JoinFailed, gm.Removed):
            self.host.members.pop(self.member.id, None)
            self.member = None
            self.retry_at = self.host.now() + JOIN_RETRY_S

    def successor(self) -> str | None:
        """The member every survivor picks from the leader's last view (None: nobody may lead)."""
        view = self.replica.view
        if not view:
            return None
        mirrors, stopping, on_failure, on_shutdown, _leader = view
        alive = set(self.member.members) if self.member is not None else set()
        need_sync = on_failure == WHEN_SYNCED or (stopping and on_shutdown != ALWAYS)
        for member, _node, synced, _since in mirrors:
            if member in alive and (synced or not need_sync):
                return member
        return None

    def consider_promotion(self) -> None:
        if self.member is None or self.member.status != gm.MEMBER or not self.leader_dead or self.replica.deleted:
            return
        if self.wants_lead:  # a planned move: the catalogue named this node, the old leader has left
            self.host.promote(self)
            return
        if self.host.cluster.catalogue_leader_of(self.vhost, self.name) != self.dead_leader_node:
            return  # the catalogue has moved on (a promotion committed elsewhere)
        chosen = self.successor()
        key = (self.vhost, self.name)
        if chosen is None:
            if not self.warned:
                self.warned = True
                log.warning("Mirrored queue '%s' in vhost '%s': no synchronised mirror to promote; the queue is "
                            "unavailable until its leader node %s returns", self.name, self.vhost, self.leader_node)
            return
        if chosen != self.member.id or self.promoting:
            return
        self.promoting = True
        view = self.replica.view
        others = [n for m, n, *_ in view[0] if m != self.member.id and m in set(self.member.members)]
        cmd = cat.SetQueueNodes(self.vhost, self.name, self.host.node, tuple(dict.fromkeys(others)),
                                expect_leader=self.dead_leader_node, promotion=True)

        def done(res: cat.Result) -> None:
            if self.host.mirrors.get(key) is not self:
                return
            if res.code != cat.OK:
                self.promoting = False
                self.retry_at = self.host.now() + PROMOTE_RETRY_S
        self.host.cluster.submit(cmd, done)


class MirrorHost:
    """Every mirrored queue this node leads or mirrors, and their GM traffic (on ClusterBroker)."""

    def __init__(self, cluster: MirrorCluster):
        self.cluster = cluster
        self.broker = cluster.broker
        self.node = cluster.node
        self.members: dict[str, Leader | Mirror] = {}  # GM member id -> its owner here
        self.mirrors: dict[tuple[str, str], Mirror] = {}
        self.leaders: dict[tuple[str, str], Leader] = {}
        self.token: tuple[str, int] = ("", 0)  # the publish being enqueued (set by the cluster)
        self._ids = 0
        self._touched = False
        self.now: Callable[[], float] = lambda: self.broker.now_ms() / 1000

    def new_member_id(self) -> str:
        self._ids += 1
        return f"{self.node}|{self.cluster.incarnation:x}.{self._ids}"

    def touched(self) -> None:
        self._touched = True
        self.broker.schedule()

    # ---------------------------------------------------------------- the catalogue, applied

    def record_changed(self, rec: cat.QueueRecord, q) -> None:
        """Bring this node's part of a classic queue's mirroring in line with its record; `q` is
        this node's object for the queue (a ClassicQueue here, or a RemoteQueue)."""
        key = (rec.vhost, rec.name)
        mirrored_here = self.node in rec.member_nodes and rec.leader_node != self.node
        m = self.mirrors.get(key)
        if mirrored_here:
            if m is None:
                m = self.mirrors[key] = Mirror(self, rec.vhost, rec.name, rec.leader_node)
                m.start(self.now())
            elif m.leader_node != rec.leader_node:
                m.leader_node = rec.leader_node  # promotion elsewhere: same ring, new leader
                m.promoting = False
                m.leader_dead = False
        elif m is not None and not (rec.leader_node == self.node and m.wants_lead):
            self.drop_mirror(m)
        if rec.leader_node == self.node and not q.remote:
            self.ensure_leader(q, bool(rec.member_nodes))

    def ensure_leader(self, q: ClassicQueue, mirrored: bool) -> None:
        key = (q.vhost, q.name)
        ld = self.leaders.get(key)
        if mirrored and ld is None and q.exclusive_owner is None:
            mid = self.new_member_id()
            self._attach(q, gm.GMMember.create(mid, [mid]))
        elif not mirrored and ld is not None:
            self.drop_leader(ld)

    def _attach(self, q: ClassicQueue, member: gm.GMMember) -> Leader:
        ld = Leader(self, q, member)
        q.mirror = ld
        self.leaders[(q.vhost, q.name)] = ld
        self.members[member.id] = ld
        self.touched()
        return ld

    def drop_leader(self, ld: Leader, deleted: bool = False) -> None:
        ld.detach(deleted)
        self._pump_member(ld.gm)
        self.members.pop(ld.gm.id, None)
        if self.leaders.get((ld.q.vhost, ld.q.name)) is ld:
            del self.leaders[(ld.q.vhost, ld.q.name)]
        if ld.q.mirror is ld:
            ld.q.mirror = None

    def drop_mirror(self, m: Mirror) -> None:
        if self.mirrors.get((m.vhost, m.name)) is m:
            del self.mirrors[(m.vhost, m.name)]
        member = m.member
        if member is not None:
            member.leave()
            self._pump_member(member)
            self.members.pop(member.id, None)

    def queue_gone(self, vhost: str, name: str) -> None:
        ld = self.leaders.get((vhost, name))
        if ld is not None:
            self.drop_leader(ld, deleted=True)
        m = self.mirrors.get((vhost, name))
        if m is not None:
            self.drop_mirror(m)

    # ---------------------------------------------------------------- becoming leader

    def become_leader(self, rec: cat.QueueRecord, cur: Any) -> bool:
        """The catalogue names this node leader of a queue it mirrors. Promote the replica now if
        the old leader is gone from the ring; otherwise wait for it to leave (False)."""
        m = self.mirrors.get((rec.vhost, rec.name))
        if m is None or m.member is None or m.member.status != gm.MEMBER:
            return True  # nothing to promote: the caller makes a fresh queue
        m.wants_lead = True
        if m.leader_member is not None and m.leader_member in set(m.member.members):
            return False
        return self.promote(m)

    def promote(self, m: Mirror) -> bool:
        cl = self.cluster
        b = self.broker
        key = (m.vhost, m.name)
        rec = cl.catalogue.queue(m.vhost, m.name)
        v = b.vhosts.get(m.vhost)
        if rec is None or v is None or rec.leader_node != self.node:
            return False
        cur = v.queues.get(m.name)
        log.info("Mirrored queue '%s' in vhost '%s': Promoting slave %s to master", m.name, m.vhost, m.member.id)
        q = b.declare_queue(v, rec.name, durable=rec.durable, exclusive=False, auto_delete=rec.auto_delete,
                            arguments=dict(rec.arguments), owner=None)
        q.journal_id = rec.journal_id if rec.durable else 0
        q.ever_consumed = bool(cur is not None and getattr(cur, "local_consumers", None))
        st = q.state
        routes: dict[tuple[str, str], bytes] = {}
        for e in m.replica.in_order():
            rk = (e.exchange, e.routing_key)
            route = routes.get(rk)
            if route is None:
                route = routes[rk] = codec.route_encoding(e.exchange, e.routing_key)
            msg = Message(e.exchange, e.routing_key, route, e.props, e.body, e.persistent, e.priority,
                          e.expiration_ms)
            entry = Entry(e.seq, msg, e.expires_at_ms)
            entry.delivery_count = e.delivery_count
            if e.persistent and q.journal_id and b.journal is not None:
                entry.log_seq = b.journal.enqueue(q.journal_id, e.exchange, e.routing_key, e.props, e.body)
            st.restore(entry)
            if e.expires_at_ms is not None:
                b.ttl_queues.add(q)
        st.next_seq = max(st.next_seq, m.replica.max_seq + 1)
        view = m.replica.view
        del self.mirrors[key]
        ld = self._attach(q, m.member)
        ld.recent_tokens = m.replica.tokens
        my_since = 0
        for member, _node, _synced, since in (view[0] if view else []):
            if member == m.member.id:
                my_since = since
        alive = set(m.member.members)
        for member, node, _synced, since in (view[0] if view else []):
            if member != m.member.id and member in alive:
                ld._order += 1
                ld.mirrors[member] = MirrorInfo(member, node, 0 if since <= my_since else since, ld._order)
        ld.ops.append(["H", my_since, [s for s in m.replica.entries if s < my_since]])
        ld.send_view()
        if cur is not None and cur is not q:
            self.cluster.leader_here(cur, q)
        b.dirty_queues.add(q)
        b.schedule()
        return True

    # ---------------------------------------------------------------- GM traffic

    def on_gm(self, peer: str, to: str, frm: str, data: bytes) -> None:
        msg = gm.decode(data)
        owner = self.members.get(to)
        if owner is None:
            reply = gm.answer_for_absent(to, msg)
            if reply is not None:
                self.cluster.send(peer, ["G", frm, to, gm.encode(reply)])
            return
        member = owner.gm if isinstance(owner, Leader) else owner.member
        member.receive(frm, msg)
        self._pump_member(member)
        self.touched()

    def _pump_member(self, member: gm.GMMember) -> None:
        owner = self.members.get(member.id)
        for to, msg in member.take_messages():
            self.cluster.send(node_of(to), ["G", to, member.id, gm.encode(msg)])
        for ev in member.take_events():
            if owner is not None:
                owner.on_event(ev)

    def flush(self) -> None:
        """Once per loop iteration: broadcast what each leader recorded, move GM traffic."""
        for ld in list(self.leaders.values()):
            ld.flush()
        for _ in range(4):
            self._touched = False
            for owner in list(self.members.values()):
                member = owner.gm if isinstance(owner, Leader) else owner.member
                if member is not None:
                    self._pump_member(member)
            for ld in list(self.leaders.values()):
                ld.flush()
            if not self._touched:
                break

    def tick(self, now: float) -> None:
        for ld in list(self.leaders.values()):
            ld.tick(now)
        for m in list(self.mirrors.values()):
            if m.member is None:
                m.start(now)
            elif m.leader_dead and not m.promoting and now >= m.retry_at:
                m.consider_promotion()
        self.touched()

    def peer_down(self, peer: str) -> None:
        for owner in list(self.members.values()):
            member = owner.gm if isinstance(owner, Leader) else owner.member
            if member is None:
                continue
            for mid in member.peers():
                if node_of(mid) == peer:
                    member.member_down(mid)
            self._pump_member(member)
        self.touched()

    def peer_up(self, peer: str) -> None:
        now = self.now()
        for m in self.mirrors.values():
            if m.leader_node == peer and (m.member is None or m.leader_dead):
                if m.member is not None:
                    self.members.pop(m.member.id, None)
                    m.member = None
                m.retry_at = 0.0
                m.start(now)

    # ---------------------------------------------------------------- calls from other nodes

    def leader_member(self, vhost: str, name: str) -> list:
        ld = self.leaders.get((vhost, name))
        if ld is None or ld.gm.status != gm.MEMBER:
            return [spec.NOT_FOUND, f"queue '{name}' in vhost '{vhost}' is not led by a mirrored queue here"]
        return [200, ld.gm.id]

    def sync_action(self, vhost: str, name: str, action: str) -> list:
        ld = self.leaders.get((vhost, name))
        if ld is None:
            return [spec.NOT_FOUND, f"queue '{name}' in vhost '{vhost}' is not mirrored"]
        if action == "sync":
            return [200, ld.start_sync()]
        return [200, "ok" if ld.cancel_sync() else "not synchronising"]

    def shutdown(self) -> None:
        """Controlled shutdown: tell the mirrors (ha-promote-on-shutdown applies), then leave."""
        for ld in list(self.leaders.values()):
            ld.stopping = True
            ld.send_view()
            self.drop_leader(ld)
        for m in list(self.mirrors.values()):
            self.drop_mirror(m)

    def after_all_stable(self, fn: Callable[[Any], None], arg: Any) -> None:
        """fn(arg) once every queue led here has passed everything so far to its mirrors."""
        pending = [ld for ld in self.leaders.values() if ld.ops or ld.last_seq > ld.stable_seq]
        if not pending:
            fn(arg)
            return
        countdown = [len(pending)]

        def one(_a) -> None:
            countdown[0] -= 1
            if countdown[0] == 0:
                fn(arg)
        for ld in pending:
            ld.after_stable(one, None)

    def info(self, q) -> tuple[list[str], list[str]]:
        ld = self.leaders.get((q.vhost, q.name))
        return ld.mirror_nodes() if ld is not None else ([], [])


__all__ = ["MirrorHost", "Leader", "Mirror"]
