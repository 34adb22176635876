"""A mirror of a mirrored queue on this node (`Mirror`): a GM member that joined the leader's
ring, a `Replica` built from the leader's operations, and the promotion decision when the
leader dies (seed 000, "Promotion"). Must never: import anything from `hutch.broker` or above.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hutch.cluster import catalogue as cat
from hutch.mirror import gm
from hutch.mirror.placement import ALWAYS, WHEN_SYNCED
from hutch.mirror.replica import Replica, decode_ops

log = logging.getLogger("hutch.mirroring")

if TYPE_CHECKING:
    pass


JOIN_RETRY_S = 0.3
PROMOTE_RETRY_S = 1.0


class Mirror:
    """A mirror of a queue led by another node: its GM member and its replica."""

    def __init__(self, host: Any, vhost: str, name: str, leader_node: str):
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

    def successor(self) -> str | None:
        """The member every survivor picks from the leader's last view (None: nobody may lead)."""
        view = self.replica.view
        if view is None:
            return None
        alive = set(self.member.members) if self.member is not None else set()
        need_sync = (view.promote_on_failure == WHEN_SYNCED
                     or (view.stopping and view.promote_on_shutdown != ALWAYS))
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
        self.promoting = True
        view = self.replica.view
        alive = set(self.member.members)
        others = [mv.node for mv in view.mirrors if mv.member != self.member.id and mv.member in alive]
        cmd = cat.SetQueueNodes(self.vhost, self.name, self.host.node, tuple(dict.fromkeys(others)),
                                expect_leader=self.dead_leader_node, promotion=True)

        def done(res: cat.Result) -> None:
            if self.host.mirrors.get(key) is not self:
                return
            if res.code != cat.OK:
                self.promoting = False
                self.retry_at = self.host.now() + PROMOTE_RETRY_S
        self.host.cluster.submit(cmd, done)
