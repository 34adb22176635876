"""Many Raft groups on one node, still sans-I/O: one ticker and one batch to persist per loop.

Quorum queues are one Raft group each, and a node hosts thousands of them (Ra's design, see
the research notes §2.1). `MultiRaft` owns the node's groups and gives the runtime one
`MultiReady` per loop iteration: the entries and hard states of every group that has any,
to be written to the node's single shared log and made durable with one fsync, then the
messages of every group (already addressed `(node, group, message)`), then each group's
committed entries to apply. Only groups that were touched since the last batch are visited
when the batch is built, so an idle group costs a tick call and its memory: `RaftGroup` and
`MemoryStorage` use `__slots__`, and the leader-only structures (progress, votes, outgoing
messages, pending reads) exist only while needed. This module must not do I/O either.
"""

from __future__ import annotations

import zlib

from hutch.raft.group import RaftConfig, RaftGroup, Ready
from hutch.raft.messages import GroupId, Message, NodeId
from hutch.raft.storage import LogStorage


class MultiReady:
    """One loop iteration's work for every group that has some: `groups` is [(group, Ready)].

    Order of work: persist `entries`/`hard_state`/`snapshot` of all groups, fsync once, send
    `messages()`, apply each group's committed entries, then `MultiRaft.advance(this)`."""

    __slots__ = ("groups",)

    def __init__(self, groups: list[tuple[GroupId, Ready]]) -> None:
        self.groups = groups

    def messages(self) -> list[tuple[NodeId, GroupId, Message]]:
        return [(m.to, gid, m) for gid, rd in self.groups for m in rd.messages]

    def needs_fsync(self) -> bool:
        return any(rd.entries or rd.hard_state is not None or rd.snapshot is not None for _, rd in self.groups)


class MultiRaft:
    """The groups hosted by one node. Inputs are routed by group id; outputs come out batched."""

    __slots__ = ("node_id", "cfg", "groups", "_dirty", "groups_per_ready_max")

    def __init__(self, node_id: NodeId, config: RaftConfig, groups_per_ready_max: int = 4096) -> None:
        self.node_id = node_id
        self.cfg = config
        self.groups: dict[GroupId, RaftGroup] = {}
        self._dirty: set[GroupId] = set()
        self.groups_per_ready_max = groups_per_ready_max

    def add_group(self, gid: GroupId, storage: LogStorage) -> RaftGroup:
        if gid in self.groups:
            raise ValueError(f"group {gid!r} already exists")
        g = RaftGroup(self.node_id, storage, self.cfg, seed=group_seed(gid))
        self.groups[gid] = g
        self._dirty.add(gid)
        return g

    def remove_group(self, gid: GroupId) -> None:
        del self.groups[gid]
        self._dirty.discard(gid)

    def step(self, gid: GroupId, msg: Message) -> None:
        g = self.groups.get(gid)
        if g is None:
            return  # a message for a group this node does not (or no longer) host
        g.step(msg)
        self._dirty.add(gid)

    def tick(self) -> None:
        dirty = self._dirty
        for gid, g in self.groups.items():
            g.tick()
            if g.msgs is not None or g.unstable_from is not None:
                dirty.add(gid)

    def propose(self, gid: GroupId, data: bytes) -> int:
        idx = self.groups[gid].propose(data)
        self._dirty.add(gid)
        return idx

    def read_index(self, gid: GroupId, ctx: bytes) -> None:
        self.groups[gid].read_index(ctx)
        self._dirty.add(gid)

    def touched(self, gid: GroupId) -> None:
        """Call after using a group directly (membership change, transfer, compaction)."""
        self._dirty.add(gid)

    def ready(self) -> MultiReady | None:
        """Everything all groups need done now, or None. Advance it before asking again."""
        out: list[tuple[GroupId, Ready]] = []
        still: set[GroupId] = set()
        for gid in self._dirty:
            g = self.groups.get(gid)
            if g is None:
                continue
            if g.ready_out is not None or len(out) >= self.groups_per_ready_max:
                still.add(gid)  # its previous Ready is not advanced yet, or this batch is full
            elif g.has_ready():
                out.append((gid, g.ready()))
        self._dirty = still
        return MultiReady(out) if out else None

    def advance(self, mr: MultiReady) -> None:
        for gid, rd in mr.groups:
            g = self.groups.get(gid)
            if g is not None:
                g.advance(rd)
                self._dirty.add(gid)


def group_seed(gid: GroupId) -> int:
    """A stable per-group seed (Python's str hash is salted per process, so not that)."""
    if isinstance(gid, int):
        return gid
    return zlib.crc32(gid.encode())
