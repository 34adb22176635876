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
from collections.abc import Collection

from hutch.raft.group import LEADER, RaftConfig, RaftGroup, Ready
from hutch.raft.messages import GroupId, Message, NodeId
from hutch.raft.storage import LogStorage


class MultiReady:
    """One loop iteration's work for every group that has some: `groups` is [(group, Ready)].

    The plain order of work: persist `entries`/`hard_state`/`snapshot` of all groups; fsync
    once when `needs_fsync()` or `leader_writes`; send `messages()`; apply each group's
    committed entries; then `MultiRaft.advance(this)`.

    What must be durable before anything else is done with the Ready (`needs_fsync()`): a
    received snapshot or a new term or vote (`hard`: its vote or the term it saw must not be
    forgotten once it has said so), and the entries of a leader alone in its group (nobody
    else's fsync can overlap its own, so it may as well come first). Not a hard state that
    only moves the commit index (the commit is known again from the leader after a restart, as
    etcd-raft's `MustSync` also has it), nor committed entries, which a majority holds.

    Two kinds of writes may be made durable after the Ready, elsewhere, one fsync for many
    Readies, if the runtime keeps to their rule; a runtime that does not fsyncs them first
    like the rest (`must_sync_plainly()`):

    - `leader_writes`, `(group, term, last index)`: groups whose only writes are entries they
      appended as leader of several voters. Raft thesis §10.2.1: a leader may send
      AppendEntries before its own write is durable, and counts itself towards a commit only
      once it is. The Ready is sent, applied and advanced with `durable=False` at once; once
      an fsync covered it, the runtime calls the group's `persisted_to`.
    - `follower_writes`: groups whose only writes are entries appended as a follower (or
      learner). Its answers say what it holds, so its messages are held until an fsync that
      started after the write returned (and sent in the order they were made, behind any
      earlier held message of the group); its committed entries, which a majority holds
      already, are applied at once, and it is advanced with `durable=False`.

    A group added with `entries_wait_for_fsync=False` counts its entries as its own, and
    answers for them, once they are written: none of its writes of entries is in the sets above
    (a term, a vote or a snapshot still is). `written_only` says that some were written, for a
    runtime that makes them durable soon after all the same. Such a group's confirms mean that a
    majority wrote an entry, not that it is on their disks: a process that is killed loses
    nothing the OS was given, a machine that loses its power may lose the last writes (RabbitMQ's
    streams, which never fsync, make the same promise)."""

    __slots__ = ("groups", "leader_writes", "follower_writes", "hard", "_must_sync", "written_only")

    def __init__(self, groups: list[tuple[GroupId, Ready]], leader_writes: list[tuple[GroupId, int, int]],
                 follower_writes: set[GroupId], hard: set[GroupId], must_sync: bool,
                 written_only: bool = False) -> None:
        self.groups = groups
        self.leader_writes = leader_writes
        self.follower_writes = follower_writes
        self.hard = hard
        self._must_sync = must_sync
        self.written_only = written_only

    def messages(self) -> list[tuple[NodeId, GroupId, Message]]:
        return [(m.to, gid, m) for gid, rd in self.groups for m in rd.messages]

    def needs_fsync(self) -> bool:
        """Whether some group's writes must be durable before anything else is done with this
        Ready, whatever the runtime does with `leader_writes` and `follower_writes`."""
        return self._must_sync

    def must_sync_plainly(self) -> bool:
        """Whether a runtime that fsyncs before it sends (the plain order) must fsync now."""
        return self._must_sync or bool(self.follower_writes) or bool(self.leader_writes)


class MultiRaft:
    """The groups hosted by one node. Inputs are routed by group id; outputs come out batched."""

    __slots__ = ("node_id", "cfg", "groups", "_dirty", "groups_per_ready_max", "_written_only", "_alone_later")

    def __init__(self, node_id: NodeId, config: RaftConfig, groups_per_ready_max: int = 4096) -> None:
        self.node_id = node_id
        self.cfg = config
        self.groups: dict[GroupId, RaftGroup] = {}
        self._dirty: set[GroupId] = set()
        self.groups_per_ready_max = groups_per_ready_max
        self._written_only: set[GroupId] = set()  # groups whose entries count once written (MultiReady)
        self._alone_later: set[GroupId] = set()  # groups whose leader alone has its entries in leader_writes

    def add_group(self, gid: GroupId, storage: LogStorage, entries_wait_for_fsync: bool = True,
                  alone_fsyncs_first: bool = True) -> RaftGroup:
        """`alone_fsyncs_first=False`: the entries of a leader alone in the group go to
        `MultiReady.leader_writes` like those of a leader of several voters (for a group whose
        application gains from the loop going on during the fsync: a stream's next batch is
        read meanwhile) instead of making the Ready fsync first."""
        if gid in self.groups:
            raise ValueError(f"group {gid!r} already exists")
        g = RaftGroup(self.node_id, storage, self.cfg, seed=group_seed(gid))
        self.groups[gid] = g
        self._dirty.add(gid)
        if not entries_wait_for_fsync:
            self._written_only.add(gid)
        if not alone_fsyncs_first:
            self._alone_later.add(gid)
        return g

    def remove_group(self, gid: GroupId) -> None:
        del self.groups[gid]
        self._dirty.discard(gid)
        self._written_only.discard(gid)
        self._alone_later.discard(gid)

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
        leader_writes: list[tuple[GroupId, int, int]] = []
        follower_writes: set[GroupId] = set()
        hard: set[GroupId] = set()
        must_sync = False
        written_only = False
        lazy = self._written_only
        still: set[GroupId] = set()
        for gid in self._dirty:
            g = self.groups.get(gid)
            if g is None:
                continue
            if g.ready_out is not None or len(out) >= self.groups_per_ready_max:
                still.add(gid)  # its previous Ready is not advanced yet, or this batch is full
            elif g.has_ready():
                saved = g.hs_saved
                rd = g.ready()
                out.append((gid, rd))
                hs = rd.hard_state
                if rd.snapshot is not None or hs is not None and (hs.term != saved.term or hs.vote != saved.vote):
                    hard.add(gid)
                    must_sync = True
                elif rd.entries:
                    if gid in lazy:
                        written_only = True
                    elif g.role != LEADER:
                        follower_writes.add(gid)
                    elif len(g.voters) > 1 or gid in self._alone_later:
                        leader_writes.append((gid, g.term, rd.entries[-1].index))
                    else:
                        must_sync = True
        self._dirty = still
        return MultiReady(out, leader_writes, follower_writes, hard, must_sync, written_only) if out else None

    def advance(self, mr: MultiReady) -> None:
        """Advance every group of `mr`, all its writes durable."""
        self.advance_groups(mr.groups, ())

    def advance_groups(self, groups: list[tuple[GroupId, Ready]], not_durable: Collection[GroupId]) -> None:
        """Advance these groups' Readies; those in `not_durable` wrote entries that are not
        durable yet (`MultiReady.leader_writes` and `follower_writes`)."""
        for gid, rd in groups:
            g = self.groups.get(gid)
            if g is not None:
                g.advance(rd, durable=gid not in not_durable)
                self._dirty.add(gid)


def group_seed(gid: GroupId) -> int:
    """A stable per-group seed (Python's str hash is salted per process, so not that)."""
    if isinstance(gid, int):
        return gid
    return zlib.crc32(gid.encode())
