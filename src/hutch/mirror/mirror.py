"""A mirror of a mirrored queue on this node (`Mirror`): a GM member that joined the leader's
ring, a `Replica` built from the leader's operations, and the promotion decision when the
leader dies (seed 000, "Promotion"). Must never: import anything from `hutch.broker` or above.

Mirrors that remember (hutch's own, `mirroring_recover_from_disk`, on by default): a mirror of
a durable queue writes the persistent messages of its copy to its node's message journal, under
a copy id of its own with a header naming the queue (its journal id, new on every declare) and
the leader's epoch (a random id of the leader's sequence numbers, new when a leader starts a
queue afresh or from its own journal, and on every promotion, which keeps the numbers). After
its node restarts the mirror takes its copy back and, when it asks the leader's node which
member to join, reports the copy: its epoch and its seqs as ranges. A leader that knows the
epoch (its own, or one of the few before it) accepts; once the mirror has joined it tells it
which of those seqs to drop (`Recovered`) and synchronises only what the copy lacks. A copy of
another queue or of an unknown epoch is discarded and the mirror starts empty, as RabbitMQ's
always does. Transient messages and non-durable queues are never written.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from hutch.cluster import catalogue as cat
from hutch.mirror import gm
from hutch.mirror.placement import ALWAYS, WHEN_SYNCED
from hutch.mirror.replica import OnDisk, Replica, Unreconciled, decode_ops

log = logging.getLogger("hutch.mirroring")

if TYPE_CHECKING:
    pass


JOIN_RETRY_S = 0.3
PROMOTE_RETRY_S = 1.0
LOOK_FOR_RING_S = 1.0  # how often a mirror whose leader's node is up asks it for its ring


class Mirror:
    """A mirror of a queue led by another node: its GM member and its replica."""

    def __init__(self, host: Any, vhost: str, name: str, leader_node: str, durable: bool = False,
                 queue_journal_id: int = 0):
        self.host = host
        self.vhost = vhost
        self.name = name
        self.leader_node = leader_node
        config = host.broker.config
        self.persists = durable and bool(queue_journal_id) and config.mirroring_recover_from_disk
        self.queue_journal_id = queue_journal_id
        self.copy_id = 0  # the copy's id in the journal (0: nothing on disk)
        self.header_seq = 0
        self.adopted_seq = 0  # its MA record: a promotion began to write it into the queue's journal
        self.epoch = 0  # the leader epoch the copy on disk belongs to
        self.claimed = False  # looked for a copy recovered from disk
        self.joining_as = ""
        self.replica = Replica(self.persists)
        self.member: gm.GMMember | None = None
        self.leader_member: str | None = None
        self.leader_dead = False
        self.retry_at = 0.0
        self.asking = False
        self.ring_asked_at = 0.0  # when `look_for_ring` last asked the leader's node
        self.promoting = False
        self.wants_lead = False  # the catalogue names this node leader; waiting for the old one to go
        self.dead_leader_node = ""
        self.warned = False
        # its copy is the one it held in a ring of this run, offered to the leader's node on its
        # return (Mirror.start) and not judged yet: exact as of its view all the same
        self.copy_from_ring = False

    def __repr__(self) -> str:
        return f"Mirror({self.vhost!r}, {self.name!r}, leader {self.leader_node})"

    def start(self, now: float) -> None:
        """Ask the leader node for its member, then join the ring after it."""
        if self.asking or self.member is not None or now < self.retry_at:
            return
        if not self.claimed and not self._claim():
            return
        if not self.host.cluster.is_up(self.leader_node):
            return
        self.asking = True
        self.joining_as = self.host.new_member_id()
        args = [self.vhost, self.name]
        if self.copy_id and len(self.replica):
            if not self.replica.recovered_epoch:
                # the first offer of this copy (a join that failed is asked again, and must not
                # take the entries it marked unreconciled then for a copy read from disk)
                self.copy_from_ring = self.replica.view is not None and not self.replica.unreconciled
            self.replica.recovered_epoch = self.epoch
            ranges = self.replica.held_ranges()
            self.replica.unreconciled = Unreconciled(ranges)
            self.persist()
            args += [self.joining_as, self.epoch, ranges]
        self.host.cluster.call(self.leader_node, "gmid", args, self._got_leader)

    def _got_leader(self, result) -> None:
        self.asking = False
        if self.host.mirrors.get((self.vhost, self.name)) is not self or self.member is not None:
            return
        if not result or result[0] != 200:
            self.retry_at = self.host.now() + JOIN_RETRY_S
            return
        self.leader_member = result[1]
        self.leader_dead = False
        epochs = list(result[2]) if len(result) > 2 else []
        if not (len(result) > 3 and result[3]):
            self._start_copy(epochs)  # a (re)starting mirror starts empty, unless its copy was accepted
        self.replica.epochs = epochs
        self.replica.member = self.joining_as
        self.member = gm.GMMember.joiner(self.joining_as, via=result[1])
        self.host.members[self.member.id] = self
        self.host.touched()

    # ---------------------------------------------------------------- the copy on disk

    def _claim(self) -> bool:
        """Take this queue's copy recovered from disk, if any (False: storage is not open yet)."""
        journal = self.host.broker.journal
        if journal is None:
            # the catalogue comes back before storage opens: wait for it (a mirror joins once its
            # node has recovered its queues, whether or not it persists its own copy)
            return False
        self.claimed = True
        copy = journal.take_mirror_copy(self.vhost, self.name)
        if copy is None:
            return True
        if not self.persists or copy.queue_journal_id != self.queue_journal_id:
            if copy.items:
                log.info("Mirrored queue '%s' in vhost '%s': discarding the mirror's copy of %d messages on disk (%s)",
                         self.name, self.vhost, len(copy.items),
                         "mirroring_recover_from_disk is off" if not self.persists else "the queue was declared anew")
            journal.drop_mirror_copy(copy)
            return True
        r = self.replica
        for log_seq, seq in copy.items.items():  # by reference: bodies stay on disk until a promotion
            r.restore(seq, log_seq)
        self.copy_id, self.header_seq, self.epoch = copy.copy_id, copy.header_seq, copy.epoch
        self.adopted_seq = copy.adopted_seq
        log.info("Mirrored queue '%s' in vhost '%s': recovered %d messages of the mirror's copy from disk",
                 self.name, self.vhost, len(r))
        return True

    def _start_copy(self, epochs: list) -> None:
        """Start empty: forget any copy on disk and, if this mirror persists, begin a new one."""
        dropped = len(self.replica)
        self.forget_copy()
        if dropped and self.persists:
            log.info("Mirrored queue '%s' in vhost '%s': the leader does not know the epoch of the mirror's copy; "
                     "discarding its %d messages", self.name, self.vhost, dropped)
        self.replica = Replica(self.persists)
        journal = self.host.broker.journal
        if self.persists and journal is not None and epochs:
            self.copy_id = int.from_bytes(os.urandom(8), "big") >> 1 or 1
            self.epoch = epochs[-1][0]
            self.header_seq = journal.mirror_header(self.copy_id, self.vhost, self.name, self.queue_journal_id,
                                                    self.epoch)
        else:
            self.replica.durable = False

    def forget_copy(self) -> None:
        """Drop the copy on disk (the queue is gone from here, or a promotion made it the queue's)."""
        journal = self.host.broker.journal
        if self.copy_id and journal is not None:
            r = self.replica
            # the header first: once its removal is on disk the copy is gone (journal.py, MA)
            seqs = [self.header_seq, *([self.adopted_seq] if self.adopted_seq else []),
                    *(log_seq for log_seq, _seq in r.log_refs()), *r.to_release]
            journal.mirror_removed(self.copy_id, seqs)
            for e in r.entries.values():
                e.log_seq = 0
            r.on_disk = OnDisk()  # (their records are gone)
        self.replica.to_release = []
        self.replica.to_write = []
        self.replica.durable = False
        self.copy_id = self.header_seq = self.adopted_seq = 0

    def adopt(self, queue_journal_id: int) -> None:
        """A promotion is about to write this copy into the queue's journal (MA record first), so
        that a crash before it drops the copy leaves a copy the node's boot knows to take whole."""
        journal = self.host.broker.journal
        if not self.copy_id or journal is None or not queue_journal_id:
            return
        if self.adopted_seq:
            self.replica.to_release.append(self.adopted_seq)
        self.adopted_seq = journal.mirror_adopted(self.copy_id, queue_journal_id)

    def shelve_copy(self) -> None:
        """This node stops mirroring the queue: hand the copy back to the journal as one recovered,
        for a mirror made here again to take (the node's tick drops it if none does)."""
        journal = self.host.broker.journal
        if not self.copy_id or journal is None:
            return
        self.persist()
        items = sorted(self.replica.log_refs())
        journal.shelve_mirror_copy(self.copy_id, self.header_seq, self.vhost, self.name, self.queue_journal_id,
                                   self.epoch, items, self.adopted_seq)
        self.copy_id = self.header_seq = self.adopted_seq = 0

    def persist(self) -> None:
        """Write what joined the copy and what left it since the last call (one batch a broadcast;
        the node's group commit syncs it)."""
        r = self.replica
        if not self.copy_id:
            return
        journal = self.host.broker.journal
        if r.to_write:
            entries = r.entries
            written = []
            for e in r.to_write:
                if entries.get(e.seq) is e:
                    e.log_seq = journal.mirror_enqueue(self.copy_id, e.exchange, e.routing_key, e.props, e.body,
                                                       e.seq, e.priority, e.expiration_ms, e.expires_at_ms)
                    written.append(e)
            r.to_write = []
            # past the node's memory window the newest are kept on disk only (read back on promotion)
            config = self.host.broker.config
            window, window_bytes = config.classic_queue_memory_window_messages, config.classic_queue_memory_window_bytes
            held, held_bytes, n = r.bodies_held, r.body_bytes_held, len(written)
            while n and (held > window or held_bytes > window_bytes):  # the newest go, released oldest first
                n -= 1
                held -= 1
                held_bytes -= len(written[n].body)
            for e in written[n:]:
                r.release_body(e)
        if r.to_release:
            journal.mirror_removed(self.copy_id, r.to_release)
            r.to_release = []
        if r.epochs and self.epoch != r.epochs[-1][0] and not r.recovered_epoch:
            # a copy of an older epoch the leader has reconciled: it belongs to the current one now
            old, self.epoch = self.header_seq, r.epochs[-1][0]
            self.header_seq = journal.mirror_header(self.copy_id, self.vhost, self.name, self.queue_journal_id,
                                                    self.epoch)
            journal.mirror_removed(self.copy_id, [old])

    def on_event(self, ev) -> None:
        t = type(ev)
        if t is gm.Deliver:
            if ev.sender != self.member.id:
                self.replica.apply(decode_ops(ev.payload))
                if self.copy_id:
                    self.persist()
                view = self.replica.view
                if view is not None and view.leader != self.leader_member and ev.sender == view.leader:
                    self.leader_member = view.leader
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

    def look_for_ring(self, now: float) -> None:
        """The ring says the leader died, but the catalogue still names its node, which is up:
        that leader may have been declared dead in a race (a paused leader coming back as its
        mirror is promoted) and founded a ring of its own (`Leader._refound`). Ask its node; a
        leader member other than the one this ring lost means the ring is over for this mirror,
        and it joins the leader's ring again (offering its copy, as any mirror coming back does).
        It asks while it proposes its own promotion too: the catalogue refuses that while the
        leader's node runs, and a promotion that commits after all is made from between rings
        (`MirrorHost.become_leader`)."""
        cl = self.host.cluster
        if (self.asking or now - self.ring_asked_at < LOOK_FOR_RING_S
                or not cl.is_up(self.leader_node)
                or cl.catalogue_leader_of(self.vhost, self.name) != self.leader_node):
            return
        self.ring_asked_at = now
        self.asking = True
        cl.call(self.leader_node, "gmid", [self.vhost, self.name], self._ring_answer)

    def _ring_answer(self, result) -> None:
        self.asking = False
        if (self.host.mirrors.get((self.vhost, self.name)) is not self or self.member is None
                or not self.leader_dead or not result or result[0] != 200):
            return
        leader = result[1]
        if leader == self.leader_member or leader in self.member.members:
            return
        log.info("Mirrored queue '%s' in vhost '%s': its leader on %s leads a new ring (%s); the mirror "
                 "leaves its old ring and joins it", self.name, self.vhost, self.leader_node, leader)
        self.leader_dead = False
        self.host.leave_ring(self)

    def successor(self) -> str | None:
        """The member every survivor picks from the leader's last view (None: nobody may lead)."""
        view = self.replica.view
        if view is None:
            return None
        alive = set(self.member.members) if self.member is not None else set()
        need_sync = _needs_sync(view)
        for mv in view.mirrors:
            if mv.member in alive and (mv.synchronised or not need_sync):
                return mv.member
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
        if self.host.cluster.promotion_held(self.dead_leader_node):
            return  # a partial partition: paused, or not yet known (the next tick asks again)
        self.promoting = True
        view = self.replica.view
        alive = set(self.member.members)
        others = [mv.node for mv in view.mirrors if mv.member != self.member.id and mv.member in alive]
        cmd = cat.SetQueueNodes(self.vhost, self.name, self.host.node, tuple(dict.fromkeys(others)),
                                expect_leader=self.dead_leader_node, promotion=True,
                                synchronised_only=_needs_sync(view))

        def done(res: cat.Result) -> None:
            if self.host.mirrors.get(key) is not self:
                return
            if res.code != cat.OK:
                self.promoting = False
                self.retry_at = self.host.now() + PROMOTE_RETRY_S
                if not self.warned and res.code == cat.PRECONDITION_FAILED:
                    self.warned = True
                    log.warning("Mirrored queue '%s' in vhost '%s': not promoting the mirror on %s: %s; the queue "
                                "is unavailable until its leader node %s returns", self.name, self.vhost,
                                self.host.node, res.text, self.dead_leader_node)
        self.host.cluster.submit(cmd, done)


def _needs_sync(view) -> bool:
    """Whether only a synchronised mirror may take over from the leader of this view."""
    return view.promote_on_failure == WHEN_SYNCED or (view.stopping and view.promote_on_shutdown != ALWAYS)
