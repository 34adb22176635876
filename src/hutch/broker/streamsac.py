"""Single active consumer for streams over the stream protocol (RabbitMQ 3.11+): a node's side.

A subscription with the properties `single-active-consumer=true` and `name=<group>` (and
`super-stream=<super stream>` on a partition of one) joins the group (vhost, stream, name).
Exactly one member of a group is active cluster-wide; the rules are `hutch.streams.sac`'s.

Where the groups live: with the stream coordinator, which is the node leading the cluster's
metadata Raft group (every node knows it, as every RabbitMQ node knows its stream coordinator's
Ra leader). Its state is kept in memory, not in a log: a group's members are subscriptions,
which live and die with their connections and nodes, and the nodes holding them are the truth
about them. So every node sends the coordinator what it holds (`sync`) whenever the
coordinator (the leader, and its term) changes, each member with its state as the node knows
it, and a new coordinator activates nobody until every running node has synced (or `HOLD_S`
passed): an active consumer stays active across a coordinator's failure. When a node goes down, the coordinator drops its
members and activates the next ones.

Peer messages (`["SAC", [op, ...]]`), to the coordinator:

    ["reg", vhost, stream, name, partition index, connection, subscription id, connection name]
    ["unreg", vhost, stream, name, connection, subscription id]
    ["resp", vhost, stream, name, connection, subscription id]   it stepped down (its client answered)
    ["sync", vhost, stream, name, partition index, [[connection, subscription id, name, active, seq], ...]]
    ["synced"]                                                  this node sent all it holds

and to a member's node: `["act", vhost, stream, name, connection, subscription id, active]`, and
`["seq", vhost, stream, name, connection, subscription id, term, n]`: the member's place in its
group, which its node keeps and syncs, so that a new coordinator keeps the members' order (a
plain stream's next in line, a super stream's partitions staying where they are). The
member's node sends its client a ConsumerUpdate; the client's ConsumerUpdateResponse carries
the offset specification to start from (activation), and only then are chunks delivered. An
inactive subscription gets no chunks. A ConsumerUpdate not answered within `RESEND_S` is sent
again (a client may miss one that arrives right behind its subscribe response).

Must never: deliver anything itself (`hutch.broker.streamsession` does), or decide the group
rules (`hutch.streams.sac` does).
"""

from __future__ import annotations

import logging
from typing import Any

from hutch.broker import superstreams
from hutch.streamproto import frames as f
from hutch.streams.sac import GroupKey, MemberId, Notice, SacGroups

log = logging.getLogger("hutch.stream")

SAC_PROPERTY = "single-active-consumer"
NAME_PROPERTY = "name"
SUPER_STREAM_PROPERTY = "super-stream"
RESEND_S = 2.0  # a ConsumerUpdate not answered for this long is sent again
PENDING_MAX = 8  # ConsumerUpdates of one subscription whose answer is awaited (older ones are forgotten)
HOLD_S = 3.0  # a new coordinator activates nobody until every running node synced, or this long


def offset_start(offset_type: int, offset: Any) -> Any:
    """A stream-protocol offset specification as the session reads from it: "first", "last",
    "next", an offset, or ("ts", milliseconds); None for none."""
    if offset_type == f.OFFSET_TYPE_OFFSET:
        return int(offset)
    if offset_type == f.OFFSET_TYPE_TIMESTAMP:
        return ("ts", int(offset))
    return {f.OFFSET_TYPE_FIRST: "first", f.OFFSET_TYPE_LAST: "last", f.OFFSET_TYPE_NEXT: "next"}.get(offset_type)


class LocalMember:
    """A subscription of this node in a group; the session's `_Subscription.sac`."""

    __slots__ = ("key", "id", "session", "sub", "partition_index", "connection_name", "active", "delivering",
                 "pending", "pending_since_s", "start", "seq")

    def __init__(self, key: GroupKey, mid: MemberId, session: Any, sub: Any, partition_index: int):
        self.key = key
        self.id = mid
        self.session = session
        self.sub = sub
        self.partition_index = partition_index
        self.connection_name = session.name
        self.active = False  # what the coordinator last said
        self.delivering = False  # active, and its client answered where to start
        self.pending: dict[int, bool] = {}  # ConsumerUpdates sent, not answered: correlation id -> active
        self.pending_since_s = 0.0
        self.start = sub.offset  # the subscription's own offset specification
        self.seq: list[int] | None = None  # its place in the group, as the coordinator gave it


class StreamSac:
    """This node's single-active-consumer members, and the groups when it coordinates them."""

    def __init__(self, broker: Any):
        self.broker = broker
        self.local: dict[GroupKey, dict[MemberId, LocalMember]] = {}
        self.synced_to: str | None = None  # the coordinator that has what this node holds
        self.synced: tuple[str, int] | None = None  # and its term of office
        self.now_s = 0.0
        # as the coordinator
        self.groups: SacGroups | None = None
        self.groups_term = 0  # the metadata term this node coordinates in
        self.hold_until_s = 0.0
        self.waiting_for: set[str] = set()  # running nodes that have not synced with this coordinator yet

    @property
    def cluster(self) -> Any:
        return self.broker.cluster

    def coordinator(self) -> tuple[str, int] | None:
        """The stream coordinator: the metadata group's leader, with its term (a leader that
        lost office and won it again has forgotten the groups); None when none is known or
        reachable."""
        cl = self.cluster
        st = cl.status()
        leader = st.get("leader")
        if leader is None or not (leader == cl.node or cl.is_up(leader)):
            return None
        return leader, int((st.get("raft") or {}).get("term") or 0)

    # ------------------------------------------------------------ the session's hooks

    def subscribe(self, session: Any, s: Any, q: Any) -> int:
        """A new subscription: a member of its group when its properties ask for one (it then
        waits for its activation); the response code of the Subscribe."""
        props = s.properties
        if str(props.get(SAC_PROPERTY, "")).lower() != "true":
            return f.OK
        name = props.get(NAME_PROPERTY)
        if not name:
            return f.PRECONDITION_FAILED  # RabbitMQ: a single active consumer needs a name
        index = -1
        super_stream = props.get(SUPER_STREAM_PROPERTY)
        if super_stream:
            parts = superstreams.partitions(session.vhost, super_stream) or []
            index = parts.index(q.name) if q.name in parts else -1
        key = (q.vhost, q.name, name)
        mid = MemberId(self.cluster.node, session.id, s.id)
        m = LocalMember(key, mid, session, s, index)
        self.local.setdefault(key, {})[mid] = m
        s.sac = m
        self._record(m)
        if self.synced_to is not None:
            self._send(self.synced_to, ["reg", *key, index, mid.connection, mid.subscription_id, m.connection_name])
        return f.OK

    def gone(self, s: Any) -> None:
        """A member's subscription ended (unsubscribe, its connection closed, its stream deleted)."""
        m = s.sac
        if m is None:
            return
        s.sac = None
        members = self.local.get(m.key)
        if members is not None and members.pop(m.id, None) is not None and not members:
            del self.local[m.key]
        if self.synced_to is not None:
            self._send(self.synced_to, ["unreg", *m.key, m.id.connection, m.id.subscription_id])

    def answered(self, session: Any, cmd: f.ConsumerUpdateResponse) -> None:
        """A client's ConsumerUpdateResponse: where the activated consumer starts, or that the
        one told to step down did."""
        for s in list(session.subscriptions.values()):
            m = s.sac
            if m is None or cmd.correlation_id not in m.pending:
                continue
            active = m.pending.pop(cmd.correlation_id)
            if active != m.active:
                return  # an answer to an update the coordinator has since taken back
            m.pending.clear()
            if active:
                start = offset_start(cmd.offset_type, cmd.offset)
                s.offset = start if start is not None else m.start
                s.ahead.clear()
                m.delivering = True
                log.debug("stream '%s' in vhost '%s': consumer %d of group '%s' on connection %s is active",
                          m.key[1], m.key[0], s.id, m.key[2], m.connection_name)
                session.pump()
            elif self.synced_to is not None:
                self._send(self.synced_to, ["resp", *m.key, m.id.connection, m.id.subscription_id])
            return

    # ------------------------------------------------------------ the runtime's

    def _coordinating(self) -> tuple[str, int] | None:
        """The coordinator now; this node takes the part up or lays it down as it changes."""
        c = self.coordinator()
        if c is None:
            return None
        me = self.cluster.node
        if c[0] == me and (self.groups is None or self.groups_term != c[1]):
            self.groups = SacGroups(c[1])
            self.groups_term = c[1]
            self.groups.holding = True
            self.hold_until_s = self.now_s + HOLD_S
            self.waiting_for = set(self.cluster.running_nodes())
            log.info("stream coordinator: single active consumer groups are coordinated on this node")
        elif c[0] != me and self.groups is not None:
            self.groups = None  # another node coordinates now; it learns the groups from every node
        return c

    def tick(self, now_s: float) -> None:
        self.now_s = now_s
        c = self._coordinating()
        if self.groups is not None:
            if self.groups.holding and (not self.waiting_for or now_s >= self.hold_until_s):
                self._notify(self.groups.release(now_s))
            self._notify(self.groups.tick(now_s))
        if c is not None and c != self.synced:
            self._sync(c)
        for members in self.local.values():
            for m in members.values():
                if m.pending and now_s - m.pending_since_s >= RESEND_S:
                    self._tell_client(m, m.active)

    def peer_down(self, peer: str) -> None:
        if self.synced_to == peer:
            self.synced_to = self.synced = None  # synced again with whoever coordinates next
        if self.groups is not None:
            self.waiting_for.discard(peer)
            self._notify(self.groups.node_gone(peer, self.now_s))

    def on_peer(self, peer: str, msg: list) -> None:
        try:
            self._on_peer(peer, msg)
        except (ValueError, TypeError, IndexError) as e:
            log.error("malformed single active consumer message from %s: %.200r (%s); ignored", peer, msg, e)

    def _on_peer(self, peer: str, msg: list) -> None:
        op = msg[0]
        if op == "act":
            self._activation((msg[1], msg[2], msg[3]), MemberId(self.cluster.node, msg[4], int(msg[5])), bool(msg[6]))
            return
        if op == "seq":
            m = self.local.get((msg[1], msg[2], msg[3]), {}).get(MemberId(self.cluster.node, msg[4], int(msg[5])))
            if m is not None:
                m.seq = [int(msg[6]), int(msg[7])]
            return
        self._coordinating()  # the sender may have heard of this node's leadership first
        g = self.groups
        if g is None:
            return  # not the coordinator (any more): the sender syncs with the next one
        now = self.now_s
        if op == "synced":
            self.waiting_for.discard(peer)
            return
        key = (str(msg[1]), str(msg[2]), str(msg[3]))
        if op == "reg":
            mid = MemberId(peer, msg[5], int(msg[6]))
            notices = g.register(key, int(msg[4]), mid, str(msg[7]), now)
            seq = g.seq_of(key, mid)
            if seq is not None:
                self._send(peer, ["seq", *key, mid.connection, mid.subscription_id, *seq])
            self._notify(notices)
        elif op == "unreg":
            self._notify(g.unregister(key, MemberId(peer, msg[4], int(msg[5])), now))
        elif op == "resp":
            self._notify(g.responded(key, MemberId(peer, msg[4], int(msg[5])), now))
        elif op == "sync":
            members = [(MemberId(peer, c, int(sid)), str(n), bool(a), (int(seq[0]), int(seq[1])) if seq else None)
                       for c, sid, n, a, seq in msg[5]]
            self._notify(g.sync(key, int(msg[4]), peer, members, now))
        else:
            raise ValueError(f"unknown operation {op!r}")

    # ------------------------------------------------------------ listing

    def group_rows(self, vhost: str, stream: str, name: str) -> list[dict[str, Any]] | None:
        """The group as its coordinator holds it, in order (None when this node does not
        coordinate it)."""
        if self.groups is None:
            return None
        members = self.groups.members_of((vhost, stream, name))
        if not members:
            return None
        return [{"subscription_id": m.id.subscription_id, "connection_name": m.connection_name,
                 "state": "active" if m.state == "active" else "inactive"} for m in members]

    def group_list(self, vhost: str) -> list[dict[str, Any]] | None:
        """The groups of a vhost (stream, reference, partition_index, consumers), when this
        node is the coordinator (None otherwise)."""
        if self.groups is None:
            return None
        return [{"stream": stream, "reference": name, "partition_index": g.partition_index,
                 "consumers": len(g.members)}
                for (vh, stream, name), g in sorted(self.groups.groups.items()) if vh == vhost]

    # ------------------------------------------------------------ inside

    def _send(self, node: str, op: list) -> None:
        self.cluster.peers.send(node, ["SAC", op])

    def _notify(self, notices: list[Notice]) -> None:
        for key, mid, active in notices:
            self._send(mid.node, ["act", *key, mid.connection, mid.subscription_id, active])

    def _sync(self, c: tuple[str, int]) -> None:
        """Send coordinator `c` everything this node holds."""
        self.synced = c
        self.synced_to = node = c[0]
        for key, members in self.local.items():
            first = next(iter(members.values()))
            rows = [[m.id.connection, m.id.subscription_id, m.connection_name, m.active, m.seq]
                    for m in members.values()]
            self._send(node, ["sync", *key, first.partition_index, rows])
        self._send(node, ["synced"])

    def _activation(self, key: GroupKey, mid: MemberId, active: bool) -> None:
        m = self.local.get(key, {}).get(mid)
        if m is None:  # gone here meanwhile; the coordinator hears of it (or has)
            if self.synced_to is not None:
                self._send(self.synced_to, ["unreg" if active else "resp", *key, mid.connection, mid.subscription_id])
            return
        if active == m.active:  # told already (a repeat after a coordinator change)
            if not active and not m.pending and self.synced_to is not None:
                self._send(self.synced_to, ["resp", *key, mid.connection, mid.subscription_id])
            return
        m.active = active
        if not active:
            m.delivering = False
            m.sub.ahead.clear()
        self._record(m)
        self._tell_client(m, active)
        log.debug("stream '%s' in vhost '%s': consumer %d of group '%s' on connection %s is %s", key[1], key[0],
                  mid.subscription_id, key[2], m.connection_name, "activated" if active else "told to step down")

    def _tell_client(self, m: LocalMember, active: bool) -> None:
        session = m.session
        if session.closed:
            return
        cid = session.conn.consumer_update(m.sub.id, active)
        if len(m.pending) >= PENDING_MAX:
            del m.pending[next(iter(m.pending))]
        m.pending[cid] = active
        m.pending_since_s = self.now_s
        session._flush()

    def _record(self, m: LocalMember) -> None:
        rec = m.sub.record
        rec["active"] = m.active
        rec["activity_status"] = "single_active" if m.active else "waiting"


def sac_of(broker: Any) -> StreamSac:
    """The broker's single-active-consumer side (`broker.stream_sac`), made on first use."""
    sac = getattr(broker, "stream_sac", None)
    if sac is None:
        sac = broker.stream_sac = StreamSac(broker)
    return sac


__all__ = ["StreamSac", "LocalMember", "sac_of", "offset_start", "SAC_PROPERTY", "NAME_PROPERTY",
           "SUPER_STREAM_PROPERTY"]
