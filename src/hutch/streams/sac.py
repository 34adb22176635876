"""Single active consumer for streams: the groups and which member of each is active, as
RabbitMQ's stream coordinator keeps them (rabbit_stream_sac_coordinator, RabbitMQ 3.11+).

A group is the subscriptions of one stream that share a `name` (vhost, stream, name). On a plain
stream the first member registered is active and the others wait; when the active one goes
(unsubscribe, its connection closes, its node goes down) the first waiting one takes over. On a
partition of a super stream the active member is member `partition index mod number of members`
(consumers of a super stream join every partition's group, so the partitions spread over them);
when a member comes or goes and another one should be active, the active one is first told to
step down, and the new one is activated when the old one has answered (its client's
ConsumerUpdateResponse) or after `DEACTIVATE_TIMEOUT_S`.

`SacGroups` is the coordinator's state, held by the node that coordinates the groups (the
leader of the cluster's metadata group, `hutch.broker.streamsac`): its methods take what
happened and return the notifications to send, `(group, member, active)`; a member's node sends
its client the ConsumerUpdate. A new coordinator learns the groups again from every node's
`sync`, which carries each member's state as its node knows it, and activates nobody until it
has heard from every node (`holding`, `release`): an active member stays active across the
change.

Must never: do I/O, read a clock (times come in as arguments), or import from the broker.
"""

from __future__ import annotations

from typing import NamedTuple

DEACTIVATE_TIMEOUT_S = 10.0  # how long a stepping-down consumer has to answer before the next is activated
GROUPS_MAX = 65536  # groups one coordinator holds
MEMBERS_MAX = 4096  # members of one group

WAITING = "waiting"
ACTIVE = "active"
DEACTIVATING = "deactivating"  # told to step down, its answer not yet in


class MemberId(NamedTuple):
    """A subscription cluster-wide: its node, its connection (unique in the cluster) and its id."""

    node: str
    connection: str
    subscription_id: int


GroupKey = tuple[str, str, str]  # (vhost, stream, name)
Seq = tuple[int, int]  # a member's place in its group: (coordinator's term, number in that term)
Notice = tuple[GroupKey, MemberId, bool]  # tell this member it is now active (True) or not (False)


class Member:
    __slots__ = ("id", "connection_name", "state", "deadline_s", "seq")

    def __init__(self, mid: MemberId, connection_name: str, seq: Seq | None = None):
        self.id = mid
        self.connection_name = connection_name
        self.state = WAITING
        self.deadline_s = 0.0  # while DEACTIVATING: when the next one is activated anyway
        self.seq = seq  # given when it registered, kept by its node, so that order survives a new coordinator


class Group:
    __slots__ = ("partition_index", "members")

    def __init__(self, partition_index: int):
        self.partition_index = partition_index  # -1: a plain stream
        self.members: list[Member] = []  # in the order they registered

    def current(self) -> Member | None:
        """The member that is active or stepping down (at most one)."""
        for m in self.members:
            if m.state != WAITING:
                return m
        return None

    def find(self, mid: MemberId) -> Member | None:
        for m in self.members:
            if m.id == mid:
                return m
        return None


class SacGroups:
    """The single-active-consumer groups one node coordinates (see the module docstring)."""

    def __init__(self, term: int = 0) -> None:
        self.groups: dict[GroupKey, Group] = {}
        self.term = term  # this coordinator's term of office: the first half of the seqs it gives
        self.registered = 0  # members registered in this term
        # a new coordinator activates nobody until it has heard from every node (`release`):
        # an active member it has not heard of yet may be active still
        self.holding = False

    # ------------------------------------------------------------ what happens

    def register(self, key: GroupKey, partition_index: int, mid: MemberId, connection_name: str,
                 now_s: float) -> list[Notice]:
        """A new member, placed after every member registered before (`seq_of` tells its node
        its place); it waits unless the group's rules make it active."""
        g = self.groups.get(key)
        if g is None:
            if len(self.groups) >= GROUPS_MAX:
                return [(key, mid, False)]
            g = self.groups[key] = Group(partition_index)
        if g.find(mid) is not None or len(g.members) >= MEMBERS_MAX:
            return []
        g.partition_index = partition_index
        self.registered += 1
        g.members.append(Member(mid, connection_name, (self.term, self.registered)))
        return self._rebalance(key, g, now_s)

    def seq_of(self, key: GroupKey, mid: MemberId) -> Seq | None:
        g = self.groups.get(key)
        m = g.find(mid) if g is not None else None
        return m.seq if m is not None else None

    def unregister(self, key: GroupKey, mid: MemberId, now_s: float) -> list[Notice]:
        g = self.groups.get(key)
        if g is None:
            return []
        g.members = [m for m in g.members if m.id != mid]
        return self._settle(key, g, now_s)

    def sync(self, key: GroupKey, partition_index: int, node: str,
             members: list[tuple[MemberId, str, bool, Seq | None]], now_s: float) -> list[Notice]:
        """What `node` holds of the group, whole: (member, connection name, active as its node
        knows it, its place). Its members not listed go; the others take their places (those
        without one after them, in the order they came); an active one stays active unless
        another is."""
        g = self.groups.get(key)
        if g is None:
            if not members or len(self.groups) >= GROUPS_MAX:
                return [(key, mid, False) for mid, _n, active, _s in members if active]
            g = self.groups[key] = Group(partition_index)
        g.partition_index = partition_index
        listed = {mid for mid, _n, _a, _s in members}
        g.members = [m for m in g.members if m.id.node != node or m.id in listed]
        out: list[Notice] = []
        for mid, name, active, seq in members:
            m = g.find(mid)
            if m is None:
                if len(g.members) >= MEMBERS_MAX:
                    continue
                m = Member(mid, name, seq)
                g.members.append(m)
            elif m.seq is None:
                m.seq = seq
            if active and m.state == WAITING:
                if g.current() is None:
                    m.state = ACTIVE  # it is active on its node already: nothing to tell
                else:
                    out.append((key, mid, False))  # two claim it: the one known here stays
            elif not active and m.state == ACTIVE:
                out.append((key, mid, True))  # its node did not hear it: tell it again
        g.members.sort(key=lambda m: (m.seq is None, m.seq or (0, 0)))  # stable: the placeless keep their order
        return out + self._settle(key, g, now_s)

    def responded(self, key: GroupKey, mid: MemberId, now_s: float) -> list[Notice]:
        """A member told to step down answered: the next one may be activated."""
        g = self.groups.get(key)
        m = g.find(mid) if g is not None else None
        if g is None or m is None or m.state != DEACTIVATING:
            return []
        m.state = WAITING
        return self._rebalance(key, g, now_s)

    def node_gone(self, node: str, now_s: float) -> list[Notice]:
        """A node went down: its members leave every group."""
        out: list[Notice] = []
        for key, g in list(self.groups.items()):
            if any(m.id.node == node for m in g.members):
                g.members = [m for m in g.members if m.id.node != node]
                out += self._settle(key, g, now_s)
        return out

    def tick(self, now_s: float) -> list[Notice]:
        """Members that did not answer their step-down in time are taken as stepped down."""
        out: list[Notice] = []
        for key, g in self.groups.items():
            m = g.current()
            if m is not None and m.state == DEACTIVATING and now_s >= m.deadline_s:
                m.state = WAITING
                out += self._rebalance(key, g, now_s)
        return out

    def release(self, now_s: float) -> list[Notice]:
        """Every node has told what it holds (or the wait is over): the groups without an
        active member get one."""
        self.holding = False
        out: list[Notice] = []
        for key, g in list(self.groups.items()):
            out += self._settle(key, g, now_s)
        return out

    # ------------------------------------------------------------ reading

    def members_of(self, key: GroupKey) -> list[Member]:
        g = self.groups.get(key)
        return list(g.members) if g is not None else []

    # ------------------------------------------------------------ the rules

    def _settle(self, key: GroupKey, g: Group, now_s: float) -> list[Notice]:
        if not g.members:
            del self.groups[key]
            return []
        return self._rebalance(key, g, now_s)

    def _rebalance(self, key: GroupKey, g: Group, now_s: float) -> list[Notice]:
        assert sum(m.state != WAITING for m in g.members) <= 1, f"group {key}: more than one member active"
        if self.holding:
            return []
        current = g.current()
        if g.partition_index < 0:  # a plain stream: the first one, kept until it goes
            if current is not None:
                return []
            target = g.members[0]
        else:
            target = g.members[g.partition_index % len(g.members)]
            if current is target:
                return []
            if current is not None:
                if current.state == ACTIVE:  # step down first; the target follows on its answer
                    current.state = DEACTIVATING
                    current.deadline_s = now_s + DEACTIVATE_TIMEOUT_S
                    return [(key, current.id, False)]
                return []  # already stepping down: wait for it
        target.state = ACTIVE
        return [(key, target.id, True)]


__all__ = ["SacGroups", "MemberId", "Member", "GroupKey", "Notice", "Seq", "DEACTIVATE_TIMEOUT_S", "WAITING", "ACTIVE",
           "DEACTIVATING"]
