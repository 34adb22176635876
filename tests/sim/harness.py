"""A hand-driven cluster of RaftGroups for scripted scenarios (in the spirit of etcd-raft's
test `network`): messages are delivered only when the test says so, links can be cut, and
every Ready is persisted to an in-memory log, applied, and advanced."""

from __future__ import annotations

from hutch.raft.group import RaftConfig, RaftGroup
from hutch.raft.messages import Entry, HardState, Message, Snapshot, SnapshotMeta
from hutch.raft.storage import MemoryStorage, bootstrap_memory_storage

QUIET = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1)


class Cluster:
    def __init__(self, ids=(1, 2, 3), cfg: RaftConfig = QUIET, storages: dict | None = None, members=None):
        members = tuple(members or ids)
        self.cfg = cfg
        self.groups: dict[int, RaftGroup] = {}
        self.applied: dict[int, list[Entry]] = {}
        self.snapshots: dict[int, list[Snapshot]] = {}
        self.read_states: dict[int, list] = {}
        self.inbox: list[Message] = []
        self.cut: set[tuple[int, int]] = set()
        self.delivered: list[Message] = []
        for i in ids:
            if storages and i in storages:
                st = storages[i]
            elif i in members:
                st = bootstrap_memory_storage(members)
            else:
                st = MemoryStorage()
            self.add(i, st)
        self.process()

    def add(self, i: int, storage, cfg: RaftConfig | None = None) -> RaftGroup:
        self.groups[i] = RaftGroup(i, storage, cfg or self.cfg, seed=i)
        self.applied[i] = []
        self.snapshots[i] = []
        self.read_states[i] = []
        return self.groups[i]

    def __getitem__(self, i: int) -> RaftGroup:
        return self.groups[i]

    def process(self) -> None:
        """Take every Ready: collect its messages in the inbox, apply, advance."""
        moved = True
        while moved:
            moved = False
            for i, g in self.groups.items():
                if g.has_ready():
                    rd = g.ready()
                    moved = True
                    self.inbox.extend(rd.messages)
                    if rd.snapshot is not None:
                        self.snapshots[i].append(rd.snapshot)
                    self.applied[i].extend(rd.committed_entries)
                    self.read_states[i].extend(rd.read_states)
                    g.advance(rd)

    def deliver(self, pred=None, rounds: int = 1000) -> int:
        """Deliver inbox messages (those matching pred, if given) until none is left."""
        n = 0
        for _ in range(rounds):
            self.process()
            batch = [m for m in self.inbox if pred is None or pred(m)]
            if not batch:
                return n
            self.inbox = [m for m in self.inbox if not (pred is None or pred(m))]
            for m in batch:
                if (m.frm, m.to) in self.cut or m.to not in self.groups:
                    continue
                n += 1
                self.delivered.append(m)
                self.groups[m.to].step(m)
        raise AssertionError("messages kept flowing")

    def drop_inbox(self) -> None:
        self.process()
        self.inbox.clear()

    def tick(self, ids=None, n: int = 1) -> None:
        for _ in range(n):
            for i in ids or list(self.groups):
                self.groups[i].tick()
            self.process()

    def stabilize(self, ticks: int = 1) -> None:
        """Tick everyone `ticks` times, delivering all messages after each tick."""
        for _ in range(ticks):
            self.tick()
            self.deliver()

    def elect(self, i: int) -> None:
        """Make node i campaign now and deliver until the election is over."""
        g = self.groups[i]
        g.elapsed = g.timeout - 1
        g.tick()
        self.deliver()
        assert g.is_leader, g.status()

    def isolate(self, i: int) -> None:
        for j in self.groups:
            if j != i:
                self.cut |= {(i, j), (j, i)}

    def heal(self) -> None:
        self.cut.clear()

    def leaders(self) -> list[int]:
        return [i for i, g in self.groups.items() if g.is_leader]

    def data(self, i: int) -> list[bytes]:
        return [e.data for e in self.applied[i] if e.kind == 0 and e.data]


def storage_with_log(terms: list[int], hs_term: int, voters=(1, 2, 3), commit: int = 1) -> MemoryStorage:
    """A storage whose log is the bootstrap entry then one entry per term in `terms`."""
    st = bootstrap_memory_storage(voters)
    st.append([Entry(t, i + 2, 0, f"t{t}i{i + 2}".encode()) for i, t in enumerate(terms)])
    st.set_hard_state(HardState(term=hs_term, vote=None, commit=commit))
    return st


EMPTY_SNAPSHOT = Snapshot(SnapshotMeta())
