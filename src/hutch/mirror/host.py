"""Mirrored classic queues: a leader and its mirrors joined by a GM ring (seed 000, seed 004 §4.2).

A classic queue that a policy with `ha-mode` matches has, in the catalogue, a leader node
(`leader_node`) and mirror nodes (`member_nodes`); the catalogue leader keeps the mirror nodes
in line with the policy (`hutch.mirror.placement`). On the leader node the queue is an
ordinary `ClassicQueue` with a `Leader` attached as `q.mirror`: every change the queue makes
is recorded as an operation (`hutch.mirror.replica`) and once per loop iteration they go out
in one broadcast on the queue's GM group. Each mirror node runs a `Mirror`: a GM member that
joined the leader's ring and a `Replica` built from the operations. Consumers and publishers
anywhere talk to the leader (the queue is a `RemoteQueue` on every other node).

This module is the node's host of the mirroring strategy (`MirrorHost`: which queues it
leads or mirrors, their GM traffic, promotion); the leader side is `hutch.mirror.leader`,
synchronisation `hutch.mirror.sync`, a mirror `hutch.mirror.mirror`, and what consumers on
other nodes do on failover `hutch.mirror.failover`. It sees the broker only through `MirrorCluster` (peers,
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

import msgspec

from hutch.amqp import codec, spec
from hutch.cluster import catalogue as cat
from hutch.mirror import gm
from hutch.mirror.leader import Leader, MirrorInfo, new_epochs
from hutch.mirror.mirror import Mirror
from hutch.mirror.names import node_of
from hutch.mirror.placement import MirrorParams
from hutch.mirror.replica import NewLeaderHead
from hutch.queues.message import Message
from hutch.queues.paging import SCRATCH
from hutch.queues.state import Entry

if TYPE_CHECKING:
    from hutch.queues.classic import ClassicQueue

log = logging.getLogger("hutch.mirroring")

FORGET, SHELVE, KEEP = "forget", "shelve", "keep"  # what drop_mirror does with the mirror's copy on disk
UNCLAIMED_COPY_S = 60.0  # a mirror's copy recovered from disk that no mirror here claims by then is dropped
PUMP_ROUNDS_MAX = 4  # a member's sends, then the deaths of members its dropped messages were for


class MirrorCluster(Protocol):
    """What the mirroring glue uses of the node's cluster side (`hutch.broker.cluster.ClusterBroker`):
    the peers, the catalogue's leader of a queue, ha-* settings, and re-attaching consumers."""

    broker: Any
    node: str
    incarnation: int
    recovering: bool  # the node's queues are not recovered from its disk yet
    catalogue: cat.Catalogue

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Any: ...
    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None: ...
    def send(self, peer: str, payload: Any) -> bool: ...
    def is_up(self, node: str) -> bool: ...
    def cut_off(self) -> bool: ...
    def promotion_held(self, dead_leader: str) -> bool: ...
    def submit(self, cmd: cat.Command, callback: Callable[[cat.Result], None]) -> None: ...
    def catalogue_leader_of(self, vhost: str, name: str) -> str | None: ...
    def fenced_nodes(self, vhost: str, name: str) -> tuple[str, ...]: ...
    def mirror_params(self, vhost: str, name: str) -> MirrorParams | None: ...
    def leader_here(self, cur: Any, q: Any) -> None: ...

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
        self._unclaimed: dict[tuple[str, str], float] = {}  # copies on disk nobody took, since when
        self.now: Callable[[], float] = lambda: self.broker.now_ms() / 1000

    def new_member_id(self) -> str:
        self._ids += 1
        return f"{self.node}|{self.cluster.incarnation:x}.{self._ids}"

    def touched(self) -> None:
        self._touched = True
        self.broker.schedule()

    # ---------------------------------------------------------------- the catalogue, applied

    def record_changed(self, rec: cat.QueueRecord, q, recovered: bool = False) -> None:
        """Bring this node's part of a classic queue's mirroring in line with its record; `q` is
        this node's object for the queue (a ClassicQueue here, or a RemoteQueue; `recovered`: a
        queue this node recovered from disk at boot, whose mirrors were another run's)."""
        key = (rec.vhost, rec.name)
        mirrored_here = self.node in rec.member_nodes and rec.leader_node != self.node
        m = self.mirrors.get(key)
        if mirrored_here:
            if m is None:
                m = self.mirrors[key] = Mirror(self, rec.vhost, rec.name, rec.leader_node, rec.durable,
                                               rec.journal_id if rec.durable else 0)
                m.start(self.now())
            elif m.leader_node != rec.leader_node:
                m.leader_node = rec.leader_node  # promotion elsewhere: same ring, new leader
                m.promoting = False
                m.leader_dead = False
        elif m is not None and not (rec.leader_node == self.node and m.wants_lead):
            self.drop_mirror(m, copy=SHELVE)  # it may come back here: a mirror made then takes the copy
        if rec.leader_node == self.node and q.local and not self.cluster.recovering:
            # (a booting node leads once its queues are recovered: ClusterBroker.recovered)
            if recovered:
                self._take_own_copy(rec, q)
            self.ensure_leader(q, rec.member_nodes, recovered)

    def _take_own_copy(self, rec: cat.QueueRecord, q: ClassicQueue) -> None:
        """At boot, a queue this node leads while the copy of a mirror this node had of it
        survives. Either the queue's journal holds nothing of it: the mirror here was promoted
        while the node was down (the promotion was proposed before it went, and committed
        after). Or it holds what a promotion here had written of the copy when the node stopped
        (the copy's MA record says so). Either way the copy is the queue: its messages come back,
        each redelivered, as a promotion's would."""
        journal = self.broker.journal
        copy = journal.mirror_copies.get((rec.vhost, rec.name)) if journal is not None else None
        if copy is None or q.mirror is not None or q.unacked_count:
            return
        partial = 0
        if q.message_count:  # (message_count: a lazy queue's are all paged)
            if not (copy.adopted_seq and copy.queue_journal_id == rec.journal_id and rec.durable):
                return
            # a promotion here wrote part of this copy into the queue and stopped before it dropped
            # the copy: the queue's records after its MA record are that part (journal.py, MA)
            q.page_in_all()
            st = q.state
            ready = list(st.ready())
            if any(e.log_seq and e.log_seq < copy.adopted_seq for e in ready):
                return  # the queue holds messages from before: not a promotion's remains
            st.purge()
            journal.purged(q.journal_id, [e.log_seq for e in ready if e.log_seq])
            partial = len(ready)
        m = Mirror(self, rec.vhost, rec.name, self.node, rec.durable, rec.journal_id if rec.durable else 0)
        m._claim()  # takes the copy (one of another declaration of the queue, or not kept, is dropped)
        if not len(m.replica):
            return
        if partial:
            log.warning("Mirrored queue '%s' in vhost '%s': this node's promotion of its mirror stopped before it "
                        "had written the copy into the queue; it leads with the %d messages of the copy (the %d "
                        "written before it stopped are a part of them)", rec.name, rec.vhost,
                        len(m.replica), partial)
        else:
            log.info("Mirrored queue '%s' in vhost '%s': this node was made its leader while it was down; it "
                     "leads with the %d messages of its mirror's copy", rec.name, rec.vhost, len(m.replica))
        self._restore_copy(m, q, failed=True)
        self.broker.dirty_queues.add(q)

    def ensure_leader(self, q: ClassicQueue, member_nodes: tuple[str, ...], recovered: bool = False) -> None:
        key = (q.vhost, q.name)
        ld = self.leaders.get(key)
        if member_nodes and ld is None and q.exclusive_owner is None:
            mid = self.new_member_id()
            ld = self._attach(q, gm.GMMember.create(mid, [mid]))
            if recovered:
                ld.admit_after_fencing(n for n in member_nodes if n != self.node)
        elif not member_nodes and ld is not None:
            self.drop_leader(ld)

    def _attach(self, q: ClassicQueue, member: gm.GMMember, epochs: list | None = None) -> Leader:
        ld = Leader(self, q, member, epochs)
        q.mirror = ld
        self.leaders[(q.vhost, q.name)] = ld
        self.members[member.id] = ld
        self.touched()
        return ld

    def member_replaced(self, old: gm.GMMember, ld: Leader) -> None:
        """A leader founded a new ring (`Leader._refound`): its new member takes the old one's place."""
        if self.members.get(old.id) is ld:
            del self.members[old.id]
        self.members[ld.gm.id] = ld
        self.touched()

    def leave_ring(self, m: Mirror) -> None:
        """A mirror leaves its ring to join its leader's again (`Mirror.look_for_ring`)."""
        member = m.member
        if member is None:
            return
        self.members.pop(member.id, None)  # its leaving is no event for the mirror, which goes on
        m.member = None
        member.leave()
        self._pump_member(member)
        m.retry_at = 0.0
        self.touched()

    def drop_leader(self, ld: Leader, deleted: bool = False) -> None:
        ld.detach(deleted)
        self._pump_member(ld.gm)
        self.members.pop(ld.gm.id, None)
        if self.leaders.get((ld.q.vhost, ld.q.name)) is ld:
            del self.leaders[(ld.q.vhost, ld.q.name)]
        if ld.q.mirror is ld:
            ld.q.mirror = None

    def drop_mirror(self, m: Mirror, copy: str) -> None:
        """Leave the ring. Its copy on disk: FORGET (the queue is gone), SHELVE (this node no
        longer mirrors it: the copy waits for a mirror made here again, UNCLAIMED_COPY_S at
        most), KEEP (a controlled shutdown: the node recovers it at boot)."""
        if self.mirrors.get((m.vhost, m.name)) is m:
            del self.mirrors[(m.vhost, m.name)]
        if copy == FORGET:
            m.forget_copy()
        elif copy == SHELVE:
            m.shelve_copy()
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
            self.drop_mirror(m, copy=FORGET)

    # ---------------------------------------------------------------- becoming leader

    def become_leader(self, rec: cat.QueueRecord, cur: Any) -> bool:
        """The catalogue names this node leader of a queue it mirrors. Promote the replica now if
        the old leader is gone from the ring; otherwise wait for it to leave (False)."""
        m = self.mirrors.get((rec.vhost, rec.name))
        if m is None:
            return True  # nothing to promote: the caller makes a fresh queue
        if not m.claimed:
            # made while the node booted, before its storage opened: the copy it kept on disk is
            # taken now (a promotion of it may have been proposed before the node went down)
            m._claim()
        if m.member is not None and m.member.status != gm.MEMBER:
            # on its way into a ring (a new mirror, or one that left the ring of a leader it saw
            # die and offered its copy to that leader's node, back with a ring of its own): it
            # gives that ring up, and is promoted as a mirror between rings is
            self.members.pop(m.member.id, None)
            m.member = None
        if m.member is None:
            # between rings (it left the ring of a leader it saw die, to join that leader's node
            # again once it is back, or the ring took it off): a promotion decided while it was in
            # the ring commits now. What it held there is the queue; it leads a ring of its own.
            if m.replica.view is None and not len(m.replica):
                return True
            if m.replica.view is None:
                # the copy this node's mirror kept on disk before a restart, its promotion proposed
                # before the node went and committed after: what it holds is the queue
                m.replica.keep_unreconciled()
            return self.promote(m)
        m.wants_lead = True
        if m.leader_member is not None and m.leader_member in set(m.member.members):
            return False
        return self.promote(m)

    def _restore_copy(self, m: Mirror, q: ClassicQueue, failed: bool) -> None:
        """Put the messages of mirror `m`'s copy into the queue `q` this node now leads, and into
        its journal, then drop the copy; `failed`: the leader went without a controlled stop
        (each message comes back redelivered)."""
        b = self.broker
        st = q.state
        routes: dict[tuple[str, str], bytes] = {}
        journal = b.journal
        m.adopt(q.journal_id)
        for e in m.replica.in_order():
            if e.body is None:  # recovered from disk by reference: read it back from its ME record
                got = journal.read_mirror_enqueue(e.log_seq) if journal is not None else None
                if got is None:
                    log.error("Mirrored queue '%s' in vhost '%s': message %d of the mirror's copy (journal record %d) "
                              "cannot be read back; it is dropped", m.name, m.vhost, e.seq, e.log_seq)
                    continue
                e.exchange, e.routing_key, e.props, e.body, e.priority, e.expiration_ms, e.expires_at_ms = got
            rk = (e.exchange, e.routing_key)
            route = routes.get(rk)
            if route is None:
                route = routes[rk] = codec.route_encoding(e.exchange, e.routing_key)
            msg = Message(e.exchange, e.routing_key, route, e.props, e.body, e.persistent, e.priority,
                          e.expiration_ms)
            count = max(e.delivery_count, 1) if failed else e.delivery_count
            if e.expires_at_ms is not None:
                b.ttl_queues.add(q)
            if b.pages(q, msg):  # past the window, as a publish would be
                loc = b.store_paged(q, msg)
                if loc is not None:
                    if count and loc < SCRATCH:  # and a restart keeps it redelivered (a V record)
                        journal.delivered(q.journal_id, loc)
                    q.restore_paged(e.seq, loc, len(e.body), e.expires_at_ms, count, e.priority)
                    continue
                q.page_in_all()  # the scratch log failed: the rest stays in memory, after what was paged
            entry = Entry(e.seq, msg, e.expires_at_ms)
            entry.delivery_count = count
            if e.persistent and q.journal_id and b.journal is not None:
                entry.log_seq = b.journal.enqueue(q.journal_id, e.exchange, e.routing_key, e.props, e.body)
                if count:
                    b.journal.delivered(q.journal_id, entry.log_seq)
            st.restore(entry)
        st.next_seq = max(st.next_seq, m.replica.max_seq + 1)
        m.forget_copy()  # the queue's own journal has the messages now

    def promote(self, m: Mirror) -> bool:
        cl = self.cluster
        b = self.broker
        key = (m.vhost, m.name)
        rec = cl.catalogue.queue(m.vhost, m.name)
        v = b.vhosts.get(m.vhost)
        if rec is None or v is None or rec.leader_node != self.node or self.mirrors.get(key) is not m:
            return False  # (not a mirror of this node's any more: promoted already, or dropped)
        cur = v.queues.get(m.name)
        me = m.replica.member if m.member is None else m.member.id  # its id in the ring its view is of
        log.info("Mirrored queue '%s' in vhost '%s': Promoting slave %s to master", m.name, m.vhost,
                 me or f"on {self.node} (a copy from disk)")
        q = b.declare_queue(v, rec.name, durable=rec.durable, exclusive=False, auto_delete=rec.auto_delete,
                            arguments=dict(rec.arguments), owner=None)
        q.journal_id = rec.journal_id if rec.durable else 0
        q.ever_consumed = bool(cur is not None and getattr(cur, "local_consumers", None))
        if m.copy_from_ring:
            # offered for judging on its way back to a ring, not read from disk: what it holds came
            # through the old ring, confirmed messages among it, and is the queue
            m.replica.keep_unreconciled()
        elif m.replica.recovered_epoch:  # its copy from disk was never reconciled: only what came since counts
            m.replica.forget_unreconciled()
        # A leader that failed may have delivered any message just before it died (it delivers
        # before its mirrors hear of it; cut off, it went on for a moment): every message comes
        # back `redelivered`, so a consumer that got one already can tell. After a controlled
        # stop the copy is exact.
        self._restore_copy(m, q, failed=not (m.replica.view is not None and m.replica.view.stopping))
        st = q.state
        view = m.replica.view
        del self.mirrors[key]
        member = m.member
        if member is None:
            mid = self.new_member_id()
            member = gm.GMMember.create(mid, [mid])
        ld = self._attach(q, member, new_epochs(m.replica.epochs, st.next_seq))
        ld.recent_tokens = m.replica.tokens
        my_since = 0
        viewed = view.mirrors if view is not None else ()
        for mv in viewed:
            if mv.member == me:
                my_since = mv.since
        alive = set(member.members)
        for mv in viewed:
            if mv.member != me and mv.member in alive:
                ld._order += 1
                since = 0 if mv.since <= my_since else mv.since
                ld.mirrors[mv.member] = MirrorInfo(mv.member, mv.node, since, ld._order)
        ld.ops.append(NewLeaderHead(my_since, tuple(sorted(s for s in m.replica.seqs() if s < my_since))))
        ld.send_view()
        if cur is not None and cur is not q:
            self.cluster.leader_here(cur, q)
        b.dirty_queues.add(q)
        b.schedule()
        return True

    # ---------------------------------------------------------------- GM traffic

    def on_gm(self, peer: str, to: str, frm: str, data: bytes) -> None:
        try:
            msg = gm.decode(data)
        except (msgspec.DecodeError, ValueError, TypeError) as e:
            log.error("undecodable GM message from %s (to %s from %s): %s; ignored", peer, to, frm, e)
            return
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
        """Send what `member` has to send and hand its events to its owner. The ring needs FIFO
        links without gaps: a message to its right neighbour that the transport drops (that
        node is not up, or too far behind) makes the neighbour dead to this member, as a closed
        link would, and the ring closes past it. `peer_down` does that for the members known
        when a node went down; this covers members learnt of while it was (a mirror that joins
        while its right neighbour's node is unreachable from here would otherwise send into
        nothing, and the ring stalls for good). Other messages (joins, notices) are not ring
        traffic: losing one costs a retry, not a gap.

        The owner is looked up for every event: one event can change it (a mirror promoted by
        the first of two events hands its member to the leader it became, and the second goes
        to that leader; given to the mirror still, it promoted the mirror a second time)."""
        members = self.members
        for _ in range(PUMP_ROUNDS_MAX):
            lost: list[str] = []
            right = member.right
            for to, msg in member.take_messages():
                if not self.cluster.send(node_of(to), ["G", to, member.id, gm.encode(msg)]) and to == right:
                    lost.append(to)
            for ev in member.take_events():
                owner = members.get(member.id)
                if owner is not None:
                    owner.on_event(ev)
            if not lost:
                return
            for to in dict.fromkeys(lost):
                member.member_down(to)

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
        journal = self.broker.journal
        if journal is not None and (journal.mirror_copies or self._unclaimed):
            unclaimed = self._unclaimed
            for key in list(unclaimed):
                if key not in journal.mirror_copies:
                    del unclaimed[key]
            for key in journal.mirror_copies:
                if key not in unclaimed:
                    unclaimed[key] = now
                elif now - unclaimed[key] >= UNCLAIMED_COPY_S and key not in self.mirrors:
                    del unclaimed[key]
                    copy = journal.take_mirror_copy(*key)
                    log.info("Mirrored queue '%s' in vhost '%s': this node no longer mirrors it; discarding the "
                             "mirror's copy of %d messages on disk", key[1], key[0], len(copy.items))
                    journal.drop_mirror_copy(copy)
                    break  # the dict changed; the next tick goes on
        for m in list(self.mirrors.values()):
            if m.member is None:
                m.start(now)
            elif m.leader_dead:
                m.look_for_ring(now)
                if not m.promoting and now >= m.retry_at:
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

    def leader_member(self, vhost: str, name: str, member: str = "", epoch: int = 0, ranges: Any = ()) -> list:
        """The leader's GM member for a mirror to join, the leader's epochs, and whether it takes
        the copy the mirror recovered from disk (`member` it will join as, its `epoch`, `ranges`)."""
        ld = self.leaders.get((vhost, name))
        if ld is None or ld.gm.status != gm.MEMBER:
            return [spec.NOT_FOUND, f"queue '{name}' in vhost '{vhost}' is not led by a mirrored queue here"]
        if not ld.admitting:  # (the mirror asks again shortly)
            return [spec.NOT_FOUND, f"queue '{name}' in vhost '{vhost}': its leader is not yet confirmed"]
        accepted = bool(member) and ld.recovery_report(str(member), int(epoch), list(ranges))
        return [200, ld.gm.id, ld.epochs, accepted]

    def rejoin(self, vhost: str, name: str, leader_member: str) -> list:
        """The queue's leader (GM member `leader_member`) has had no mirror of this node in its
        ring for a while (`Leader.call_missing_mirrors`). A mirror that is a member of another
        ring (an earlier leader's, which declared it dead while it was cut off: it took the
        promotion that followed for a new leader of its own ring, and waits for broadcasts that
        never come) leaves it and joins the leader's afresh, offering its copy as any mirror
        coming back does. A mirror still joining, or none, is left alone."""
        m = self.mirrors.get((vhost, name))
        if m is None or m.member is None or m.member.status != gm.MEMBER or m.member.id == leader_member:
            return [200, False]
        log.info("Mirrored queue '%s' in vhost '%s': its leader's ring (%s) has no mirror of this node; the "
                 "mirror leaves the ring it is in and joins the leader's", name, vhost, leader_member)
        m.leader_dead = False
        m.promoting = False
        self.leave_ring(m)
        return [200, True]

    def sync_action(self, vhost: str, name: str, action: str) -> list:
        ld = self.leaders.get((vhost, name))
        if ld is None:
            return [spec.NOT_FOUND, f"queue '{name}' in vhost '{vhost}' is not mirrored"]
        if action == "sync":
            return [200, ld.start_sync()]
        return [200, "ok" if ld.cancel_sync() else "not synchronising"]

    def announce_shutdown(self) -> None:
        """The first step of a controlled shutdown: every queue led here tells its mirrors that
        its leader is stopping on purpose (so ha-promote-on-shutdown, not -on-failure, decides
        whether one of them is promoted). The caller waits (`after_all_stable`) until the
        mirrors have it before `shutdown` leaves the rings, or a mirror may see the leader go
        before it sees why."""
        for ld in self.leaders.values():
            ld.stopping = True
            ld.send_view()

    def shutdown(self) -> None:
        """Controlled shutdown: tell the mirrors (ha-promote-on-shutdown applies), then leave."""
        self.announce_shutdown()
        for ld in list(self.leaders.values()):
            self.drop_leader(ld)
        for m in list(self.mirrors.values()):
            self.drop_mirror(m, copy=KEEP)

    def after_all_stable(self, fn: Callable[[Any], None], arg: Any, keys: set[tuple[str, str]] | None = None) -> None:
        """fn(arg) once every queue led here (or those of `keys`, (vhost, name)) has passed
        everything so far to its mirrors."""
        leaders = self.leaders.values() if keys is None else [ld for k in keys if (ld := self.leaders.get(k))]
        pending = [ld for ld in leaders if ld.ops or ld.last_seq > ld.stable_seq]
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
