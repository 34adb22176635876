"""A mirrored queue's leader side (`Leader`, attached to the leader's `ClassicQueue` as
`q.mirror`): every operation the queue makes becomes a GM broadcast, publishes are accepted
once their broadcast is stable, mirrors joining and dying are tracked (`MirrorInfo`), and
publishers wait while too much is unstable (`FLOW_HIGH`/`FLOW_LOW`). Synchronisation is
`hutch.mirror.sync`.

Seed 000 ("Master/mirror synchronisation", "Publisher confirms and transactions"). The
leader's host (`hutch.mirror.host.MirrorHost`) owns it. Must never: import anything from
`hutch.broker` or above, or write to a client's connection.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.cluster import catalogue as cat
from hutch.mirror import gm
from hutch.mirror.names import node_of, qname
from hutch.mirror.placement import AUTOMATIC, MirrorParams
from hutch.mirror.replica import (
    Backlog,
    CheckedOut,
    Deleted,
    Enqueued,
    MirrorView,
    Recovered,
    Removed,
    View,
    encode_ops,
    in_ranges,
    remember_token,
    to_ranges,
)
from hutch.mirror.sync import SyncJob
from hutch.queues.state import Entry

if TYPE_CHECKING:
    from hutch.queues.classic import ClassicQueue
    from hutch.queues.message import Message

log = logging.getLogger("hutch.mirroring")

FLOW_HIGH = 20000  # messages broadcast and not yet stable: publishers wait above this
FLOW_LOW = 5000
SYNC_INFLIGHT = 64  # sync batches in the ring at once
SYNC_PROGRESS_S = 1.0


EPOCHS_KEPT = 8  # a leader's epochs a mirror's copy from disk may belong to
RECOVERY_REPORTS_MAX = 64  # mirrors' reports of their copies kept until they join
MISSING_MIRROR_S = 5.0  # a member node up with no mirror in the ring this long is told to join it


def new_epochs(epochs: list | None = None, first_seq: int = 0) -> list:
    """The epochs of a leader that starts numbering afresh (None), or that was promoted and goes
    on from `first_seq`: a mirror's copy of an earlier epoch is good below its successor's first
    seq only (beyond it the lost leader may have given seqs to messages nobody else saw)."""
    epoch = [int.from_bytes(os.urandom(8), "big") >> 1 or 1, first_seq]
    return [*(epochs or [])[-(EPOCHS_KEPT - 1):], epoch]


class MirrorInfo:
    __slots__ = ("member", "node", "since", "order", "has", "recovered")

    def __init__(self, member: str, node: str, since: int, order: int):
        self.member = member
        self.node = node
        self.since = since  # the mirror holds every message from this sequence number on
        self.order = order  # join order: lower is longer-running
        self.has: set[int] | None = None  # and, below `since`, these (a copy it recovered from disk)
        self.recovered = 0  # how many messages its copy from disk gave it


class Leader:
    """The leader side of one mirrored queue, attached to its ClassicQueue as `q.mirror`."""

    def __init__(self, host: Any, q: ClassicQueue, member: gm.GMMember, epochs: list | None = None):
        self.host = host
        self.epochs = [list(e) for e in epochs] if epochs else new_epochs()  # [epoch, first seq], oldest first
        self.recovery_reports: dict[str, tuple[list[int], int | None]] = {}  # member -> (ranges, good below)
        self.q = q
        self.gm = member
        self.ops: list = []  # hutch.mirror.replica operations not yet broadcast
        self.op_msgs = 0
        self.backlog = Backlog()
        self.last_seq = 0  # last broadcast
        # this leader's broadcasts are numbered on across the rings it leads (`_refound`): a
        # ring's own seq plus what the rings before it had broadcast
        self._seq_base = 0
        self.stable_seq = 0
        self.stable_held = 0  # stable while this node was cut off from the majority: not confirmed yet
        self.confirmed = 0  # publishes (and tx.commits) confirmed by this leader, for the simulation's checks
        self.missing: dict[str, float] = {}  # member nodes up with no mirror in this ring -> since when
        # nodes to fence in the catalogue (those of synchronised mirrors declared dead, and of
        # every mirror a ring founded afresh lost: `admit_after_fencing`): nothing is confirmed
        # meanwhile (`_fence_due`)
        self.to_fence: set[str] = set()
        self.checking_leader = False  # asking the catalogue whether this node still leads
        # mirrors may join (`MirrorHost.leader_member`): False from a ring founded afresh until the
        # catalogue says this node leads and has fenced the nodes whose mirrors are not in it
        self.admitting = True
        self.check_failed = 0  # the code of the last refused check (logged once)
        self.mirrors: dict[str, MirrorInfo] = {}
        self._order = 0
        self.sync: SyncJob | None = None
        self.sync_waiters: list[Callable[[Any], None]] = []
        self.stopping = False
        self.detached = False
        self._view_sent: View | None = None
        self.recent_tokens: dict[tuple[str, int], None] = {}

    # ---------------------------------------------------------------- what the queue did

    def enqueued(self, seq: int, m: Message, expires_at_ms: int | None) -> None:
        """The queue took message `m` as `seq` (in memory or paged)."""
        origin, token = self.host.token
        self.ops.append(Enqueued(seq, m.exchange, m.routing_key, m.props, m.body, m.persistent,
                                 m.priority, m.expiration_ms, expires_at_ms, origin, token))
        self.op_msgs += 1
        if origin:  # a publish another node forwarded: it may send it again (retry_orphans)
            remember_token(self.recent_tokens, origin, token)

    def _seqs(self, kind: type[CheckedOut] | type[Removed], seq: int) -> None:
        ops = self.ops
        if ops and type(ops[-1]) is kind:
            ops[-1].seqs.append(seq)
        else:
            ops.append(kind([seq]))

    def checked_out(self, seq: int) -> None:
        self._seqs(CheckedOut, seq)

    def removed(self, seq: int) -> None:
        self._seqs(Removed, seq)
        if self.sync is not None:
            self.sync.removed.add(seq)

    def paged_in(self, entries: list[Entry]) -> None:
        """Paged messages were read back into memory (nothing for the mirrors: where the leader
        keeps a body is its own affair); a running sync sends them from memory now."""
        if self.sync is not None:
            self.sync.paged_in(entries)

    # ---------------------------------------------------------------- broadcasting

    def flush(self) -> None:
        if not self.ops or self.gm.status != gm.MEMBER:
            return
        ops, self.ops = self.ops, []
        n = self.broadcast(encode_ops(ops))
        self.backlog.sent(n, self.op_msgs)
        self.op_msgs = 0

    def broadcast(self, payload: bytes) -> int:
        """Send `payload` round the ring; its seq (what `Stable` events count in)."""
        self.last_seq = n = self._seq_base + self.gm.broadcast(payload)
        return n

    def after_stable(self, fn: Callable[[Any], None], arg: Any,
                     refused: Callable[[Any], None] | None = None) -> None:
        """fn(arg) once every mirror has everything recorded so far; refused(arg) instead if the
        queue is led elsewhere before then (`detach`): the new leader may not have it."""
        target = self.last_seq + (1 if self.ops else 0)
        if target <= self.stable_seq:
            self.host.cluster.call_soon(fn, arg)
        else:
            self.backlog.waiters.append((target, fn, arg, refused))

    def backlogged(self) -> bool:
        return self.backlog.unstable_msgs + self.op_msgs > FLOW_HIGH

    def drained(self) -> bool:
        return self.backlog.unstable_msgs + self.op_msgs <= FLOW_LOW

    @property
    def syncing(self) -> bool:
        return self.sync is not None

    @property
    def sync_holds_clients(self) -> bool:
        """A sync runs that deliveries and basic.get wait for (not one in the background)."""
        return self.sync is not None and self.sync.blocking

    def after_sync(self, fn: Callable[[Any], None]) -> None:
        if self.sync is None:
            self.host.cluster.call_soon(fn, None)
        else:
            self.sync_waiters.append(fn)

    # ---------------------------------------------------------------- events of the ring

    def on_event(self, ev) -> None:
        t = type(ev)
        if t is gm.Stable:
            if self.stable_held or self._fence_due() or self.host.cluster.cut_off():
                # what became stable because a synchronised mirror was declared dead may exist
                # nowhere that leads the queue next: that mirror still takes itself for
                # synchronised, and the nodes it reaches may promote it (this node may be the one
                # cut off, and may not know it yet: the failure detector declares one peer down
                # at a time). Nothing is confirmed until the catalogue says, through its log,
                # that this node still leads, and has fenced the dead mirrors' nodes (`tick`);
                # a paused node's clients are gone before that.
                self.stable_held = max(self.stable_held, self._seq_base + ev.seq)
                return
            self._stable(self._seq_base + ev.seq)
        elif t is gm.MembersChanged:
            self._members_changed(ev)
        elif t is gm.Removed and not self.detached:  # (not its own leaving: `detach`)
            self._refound(ev.reason)

    def _refound(self, reason: str) -> None:
        """The ring declared this leader dead, and it may lead still. Two nodes that each lost
        sight of the other declare each other's members dead, and a ring's record of deaths is
        a union, so both go: a paused leader that resumes just as its mirror is promoted takes
        the new leader out of the ring with it. Nothing could then be broadcast, and no mirror
        could join. The leader founds a ring of its own instead: every mirror counts as lost
        (their nodes are fenced before anything more is confirmed or any mirror joins, and what
        the old ring had not made stable waits for the catalogue to say this node still leads),
        and the mirrors join the new ring (`Mirror.look_for_ring`). A leader that no longer
        leads is dropped when the catalogue's record arrives here, refusing what waits."""
        q = self.q
        lost = sorted(self.mirrors.values(), key=lambda m: m.order)
        self.mirrors.clear()
        if self.sync is not None:
            self.sync.finish(cancelled=True)
        old = self.gm
        self._seq_base = self.last_seq
        self.stable_held = max(self.stable_held, self.last_seq)
        mid = self.host.new_member_id()
        self.gm = gm.GMMember.create(mid, [mid])
        self._view_sent = None
        self.admit_after_fencing(m.node for m in lost)
        log.warning("%s: Master %s was %s; it leads a new ring as %s, and its mirrors on %s join it again",
                    qname(q), old.id, reason, mid, ", ".join(m.node for m in lost) or "no node")
        self.host.member_replaced(old, self)
        self.send_view()

    def admit_after_fencing(self, nodes) -> None:
        """A ring founded afresh (a leader that recovered its queue from disk, or whose ring
        declared it dead): the mirrors on `nodes`, whatever they hold, are not in it, and a
        mirror that joins it gives up its copy unless this leader takes it. A promotion of one
        of them proposed earlier may still commit, so no mirror joins until the catalogue says
        this node leads and has fenced those nodes (a promotion that commits after that is
        refused where only a synchronised mirror may take over; one that committed before it
        leaves this node's check refused, and the queue goes to the promoted mirror, which
        still holds its copy). Each node is unfenced once its mirror is synchronised here."""
        self.to_fence.update(nodes)
        self.admitting = False

    def _fence_due(self) -> bool:
        """Whether a synchronised mirror was declared dead and its node is not fenced yet. The
        ring may report a Stable that leaves a dead member out before it reports the death, so
        the members the ring has declared dead are looked at too."""
        dead = self.gm.known_dead()
        if dead and any(m.member in dead for m in self.mirrors.values()):
            f = self.floor()
            self.to_fence.update(m.node for m in self.mirrors.values() if m.member in dead and m.since <= f)
        return bool(self.to_fence)

    def _stable(self, seq: int) -> None:
        """Everything broadcast up to `seq` is with every mirror: confirm it."""
        self.stable_seq = seq
        done = self.backlog.stable(seq)
        self.confirmed += len(done)
        for _s, fn, arg, _refused in done:
            fn(arg)
        if self.sync is not None:
            self.sync.on_stable(seq)
        if self.q.flow_waiters is not None:
            self.host.broker.dirty_queues.add(self.q)

    def _members_changed(self, ev: gm.MembersChanged) -> None:
        q = self.q
        for m in ev.births:
            if m == self.gm.id or m in self.mirrors:
                continue
            self._order += 1
            info = self.mirrors[m] = MirrorInfo(m, node_of(m), q.state.next_seq, self._order)
            log.info("%s: Adding mirror on node %s: %s", qname(q), node_of(m), m)
            report = self.recovery_reports.pop(m, None)
            if report is not None:
                self._reconcile(info, *report)
        dead = [m for m in ev.deaths if m in self.mirrors]
        if dead:
            f = self.floor()
            for m in dead:
                info = self.mirrors.pop(m)
                if info.since <= f:
                    self.to_fence.add(info.node)
            log.info("%s: Master %s saw deaths of mirrors %s", qname(q), self.gm.id, " ".join(dead))
        self.send_view()
        if ev.births and self.params().sync_mode == AUTOMATIC and self.unsynced():
            self.start_sync()
        if self.sync is not None:
            self.sync.members_changed()

    # ---------------------------------------------------------------- mirrors that remember

    def recovery_report(self, member: str, epoch: int, ranges: list[int]) -> bool:
        """A mirror about to join as `member` recovered a copy of `epoch` holding `ranges`: take
        it (True) if the epoch is one of ours; the copy is reconciled when the mirror joins."""
        for i, (e, _first) in enumerate(self.epochs):
            if e == epoch:
                good_below = self.epochs[i + 1][1] if i + 1 < len(self.epochs) else None
                reports = self.recovery_reports
                reports[member] = (ranges, good_below)
                while len(reports) > RECOVERY_REPORTS_MAX:
                    del reports[next(iter(reports))]
                return True
        return False

    def _reconcile(self, info: MirrorInfo, ranges: list[int], good_below: int | None) -> None:
        """The mirror `info` joined with a copy from disk: what it holds that the queue still has
        counts; the rest it drops (a Recovered operation, in order with everything else)."""
        live = self.q.live_seqs()
        held = set(in_ranges(ranges))
        keep = held & live
        if good_below is not None:
            keep = {seq for seq in keep if seq < good_below}
        drop = sorted(held - keep)
        self.ops.append(Recovered(info.member, tuple(to_ranges(drop))))
        info.has = keep
        info.recovered = len(keep)
        if not self.lacking([info], live):
            info.since = 0  # it lacks nothing: synchronised as soon as it has the Recovered operation
            info.has = None
        log.info("%s: Mirror on node %s recovered %d messages from disk (%d of them gone from the queue)",
                 qname(self.q), info.node, len(keep), len(drop))

    @staticmethod
    def lacking(mirrors: list[MirrorInfo], live: set[int]) -> set[int]:
        """Of the queue's messages `live`, those one of `mirrors` lacks: below where it holds
        everything from (`since`), what it did not bring back from disk (`has`). Set algebra, not
        a test a message: a queue may hold millions."""
        out: set[int] = set()
        top = max(live, default=0)
        for m in mirrors:
            below = live if top < m.since else {seq for seq in live if seq < m.since}
            out |= below if m.has is None else below - m.has
        return out

    # ---------------------------------------------------------------- synchronisation state

    def floor(self) -> int:
        """The lowest sequence number still in the queue (next_seq when it is empty)."""
        q = self.q
        st = q.state
        low = st.next_seq
        for e in st.ready_heads():
            low = min(low, e.seq)
        if st.unacked:
            low = min(low, min(st.unacked))
        tail = q.tail
        if tail is not None and tail.count:
            low = min(low, tail.head_seq)
        return low

    def synchronised(self) -> list[MirrorInfo]:
        f = self.floor()
        return [m for m in self.mirrors.values() if m.since <= f]

    def unsynced(self) -> list[MirrorInfo]:
        f = self.floor()
        return [m for m in self.mirrors.values() if m.since > f]

    def params(self) -> MirrorParams:
        return self.host.cluster.mirror_params(self.q.vhost, self.q.name) or MirrorParams("all", None)

    def view(self) -> View:
        """The mirrors oldest first, whether the leader is stopping, ha-promote-on-failure and
        -on-shutdown, and the leader's member (see hutch.mirror.replica.View)."""
        f = self.floor()
        p = self.params()
        mirrors = sorted(self.mirrors.values(), key=lambda m: m.order)
        return View(tuple(MirrorView(m.member, m.node, m.since <= f, m.since) for m in mirrors),
                    self.stopping, p.promote_on_failure, p.promote_on_shutdown, self.gm.id)

    def send_view(self) -> None:
        v = self.view()
        if v != self._view_sent:
            self._view_sent = v
            self.ops.append(v)

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
        if not self.checking_leader and not self.host.cluster.cut_off():
            self._check_leader()
        self.call_missing_mirrors(now)
        self.send_view()
        if self.sync is not None:
            self.sync.pump(now)

    def call_missing_mirrors(self, now: float) -> None:
        """Nodes the queue's record names for mirrors that are up and have had no mirror in this
        ring for MISSING_MIRROR_S: each is told to join it afresh (`MirrorHost.rejoin`). Without
        this, a mirror cut off when an earlier leader's ring declared it dead stays in that ring
        for good once another mirror is promoted, with a copy nobody updates, and the queue has
        a copy fewer than its policy asks for."""
        cl = self.host.cluster
        q = self.q
        rec = cl.catalogue.queue(q.vhost, q.name)
        if rec is None or rec.leader_node != self.host.node or self.stopping or self.detached:
            self.missing.clear()
            return
        in_ring = {m.node for m in self.mirrors.values()}
        missing = {}
        for node in rec.member_nodes:
            if node == self.host.node or node in in_ring or not cl.is_up(node):
                continue
            since = self.missing.get(node, now)
            if now - since >= MISSING_MIRROR_S:
                since = now  # and again after as long, if it is still missing
                cl.call(node, "gmrejoin", [q.vhost, q.name, self.gm.id], _ignore)
            missing[node] = since
        self.missing = missing

    def _check_leader(self) -> None:
        """Ask the catalogue, through its log, whether this node still leads, fencing the nodes
        of synchronised mirrors declared dead and unfencing those with a synchronised mirror
        again; needed before confirming what waits (`on_event`), and to unfence."""
        q = self.q
        self._fence_due()
        fence = tuple(sorted(self.to_fence))
        fenced = self.host.cluster.fenced_nodes(q.vhost, q.name)
        unfence = ()
        if fenced:
            dead = self.gm.known_dead()
            synced = {m.node for m in self.synchronised() if m.member not in dead}
            unfence = tuple(sorted(n for n in fenced if n in synced and n not in self.to_fence))
        if not (self.stable_held or fence or unfence):
            return
        self.checking_leader = True
        self.host.cluster.submit(cat.CheckQueueLeader(q.vhost, q.name, self.host.node, fence, unfence),
                                 lambda result: self._checked_leader(result, fence))

    def _checked_leader(self, result: cat.Result, fenced: tuple[str, ...] = ()) -> None:
        """The catalogue's answer: confirm what waited, or (another node leads, or no answer yet)
        keep it waiting; a leader that lost the queue is detached with everything that waits."""
        self.checking_leader = False
        if not result.ok:
            if result.code != self.check_failed:
                self.check_failed = result.code
                log.warning("%s: not confirming what became stable after mirrors were lost or while this node "
                            "was cut off from the cluster's majority: %s", qname(self.q),
                            result.text or result.status)
            return
        self.check_failed = 0
        if fenced:
            self.to_fence.difference_update(fenced)
            log.info("%s: mirrors on %s no longer count as synchronised for promotion", qname(self.q),
                     ", ".join(fenced))
        if not self.to_fence:
            self.admitting = True
        if self.stable_held and not self._fence_due():
            seq, self.stable_held = self.stable_held, 0
            self._stable(seq)

    def detach(self, deleted: bool = False) -> None:
        """The queue stops being mirrored, stops being led here, or is deleted (then the mirrors
        are told, so that none of them takes the leader's leaving for a failure)."""
        self.detached = True
        if self.sync is not None:
            self.sync.finish(cancelled=True)
        if deleted:
            self.ops.append(Deleted())
        if self.gm.status == gm.MEMBER:
            self.flush()
            self.gm.leave()
        waiters = list(self.backlog.waiters)
        self.backlog.waiters.clear()
        q = self.q
        leader = self.host.cluster.catalogue_leader_of(q.vhost, q.name)
        if leader is not None and leader != self.host.node:
            # led elsewhere now: the new leader has what it got through the ring, which may not be
            # all of this (it may have counted this node out of the ring before the move): what
            # waits is refused, for its publisher to send again; never confirmed from here
            if waiters:
                log.warning("%s: leader moved to %s; %d publish(es) not yet seen by every mirror are "
                            "refused", qname(q), leader, len(waiters))
            for _s, fn, arg, refused in waiters:
                if refused is not None:
                    refused(arg)
                else:
                    fn(arg)  # a wait that confirms nothing (a controlled shutdown's): it is over
            return
        for _s, fn, arg, _refused in waiters:  # nobody else holds these now: settle as the queue stands
            fn(arg)


def _ignore(_result: Any) -> None:
    pass
