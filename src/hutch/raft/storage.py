"""The log storage a RaftGroup reads and writes, and an in-memory implementation of it.

A `LogStorage` is the group's view of its log: entries by index, the term of an index, the
first and last index, the hard state and the latest snapshot. The group writes to it as it
goes (appends, truncations of an unreplicated suffix, snapshot installs) and hands the same
changes to the runtime in `Ready`, whose job is to make them durable; the storage itself is a
memory table, like Ra's mem tables in front of its shared WAL. A disk-backed runtime rebuilds a
storage from its WAL and segments at start-up and passes it in. `MemoryStorage` is that table
for tests and the simulator. Nothing here touches files or clocks.

Index conventions (Raft paper §5.3): entries are numbered from 1; index 0 has term 0. After
compaction the log keeps entries (first_index - 1, last_index]; the snapshot covers everything
up to its own index, which may be above first_index - 1 when trailing entries are kept.
"""

from __future__ import annotations

from typing import Protocol

from hutch.raft.messages import (
    CONF_BOOTSTRAP,
    ENTRY_CONF,
    ConfChange,
    Entry,
    HardState,
    Snapshot,
    SnapshotMeta,
    encode_conf_change,
    entry_size_bytes,
)


class LogStorage(Protocol):
    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term(self, index: int) -> int | None:
        """The term of entry `index`, or None when it is compacted away or beyond the log."""

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi); at least one if lo < hi, then no more than `max_bytes` worth."""

    def append(self, entries: list[Entry]) -> None:
        """Write entries, first discarding any existing entries from entries[0].index on."""

    def hard_state(self) -> HardState: ...
    def set_hard_state(self, hs: HardState) -> None: ...
    def snapshot(self) -> Snapshot: ...
    def install_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log by `snap` (a follower receiving a leader's snapshot)."""

    def create_snapshot(self, snap: Snapshot, keep_from: int) -> None:
        """Record a locally taken snapshot and drop entries below `keep_from`."""


class EntryWindow:
    """The read side of a LogStorage kept in memory: a window of entries after the snapshot,
    the hard state and the snapshot. MemoryStorage and the disk-backed log share it; they
    differ only in how they write."""

    __slots__ = ()
    _entries: list[Entry]
    _offset: int
    _hs: HardState
    _snap: Snapshot

    def first_index(self) -> int:
        return self._offset

    def last_index(self) -> int:
        return self._offset + len(self._entries) - 1

    def term(self, index: int) -> int | None:
        i = index - self._offset
        if 0 <= i < len(self._entries):
            return self._entries[i].term
        if index == self._snap.meta.index:
            return self._snap.meta.term
        return None

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo >= hi:
            return []
        if lo < self._offset or hi > self.last_index() + 1:
            raise IndexError(f"entries [{lo}, {hi}) outside log [{self._offset}, {self.last_index()}]")
        out = self._entries[lo - self._offset : hi - self._offset]
        size = 0
        for n, e in enumerate(out):
            size += entry_size_bytes(e)
            if size > max_bytes and n > 0:
                return out[:n]
        return out

    def hard_state(self) -> HardState:
        return self._hs

    def snapshot(self) -> Snapshot:
        return self._snap


class MemoryStorage(EntryWindow):
    """A LogStorage in a Python list. `truncations` counts overwrites of existing entries."""

    __slots__ = ("_entries", "_offset", "_hs", "_snap", "truncations")

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._offset = 1  # index of _entries[0]
        self._hs = _EMPTY_HS
        self._snap = _EMPTY_SNAP
        self.truncations = 0

    @classmethod
    def restore(cls, hs: HardState, snap: Snapshot, entries: list[Entry]) -> MemoryStorage:
        s = cls()
        s._hs = hs
        s._snap = snap
        s._offset = entries[0].index if entries else snap.meta.index + 1
        s._entries = list(entries)
        return s

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first > self.last_index() + 1:
            raise IndexError(f"append at {first} leaves a gap after {self.last_index()}")
        if first < self._offset:
            raise IndexError(f"append at {first} below the first index {self._offset}")
        cut = first - self._offset
        if cut < len(self._entries):
            self.truncations += 1
            del self._entries[cut:]
        self._entries.extend(entries)

    def set_hard_state(self, hs: HardState) -> None:
        self._hs = hs

    def install_snapshot(self, snap: Snapshot) -> None:
        self._snap = snap
        self._entries = []
        self._offset = snap.meta.index + 1

    def create_snapshot(self, snap: Snapshot, keep_from: int) -> None:
        if snap.meta.index > self.last_index() or snap.meta.index < self._snap.meta.index:
            raise IndexError(f"snapshot at {snap.meta.index} outside log [{self._offset}, {self.last_index()}]")
        self._snap = snap
        keep_from = max(self._offset, min(keep_from, snap.meta.index + 1))
        del self._entries[: keep_from - self._offset]
        self._offset = keep_from


_EMPTY_HS = HardState()
_EMPTY_SNAP = Snapshot(SnapshotMeta())


BOOTSTRAP_TERM = 1  # the term of a new group's first entry; its first election makes term 2


def bootstrap_log(voters: tuple[int, ...]) -> tuple[HardState, list[Entry]]:
    """The durable state every initial member of a new group starts from (write it, then start).

    Entry 1 is a committed CONF_BOOTSTRAP naming the initial voters, so that a member added
    later learns the initial membership by replaying the log like any other change.
    """
    cc = encode_conf_change(ConfChange(CONF_BOOTSTRAP, tuple(sorted(voters))))
    return (HardState(term=BOOTSTRAP_TERM, vote=None, commit=1),
            [Entry(term=BOOTSTRAP_TERM, index=1, kind=ENTRY_CONF, data=cc)])


def bootstrap_memory_storage(voters: tuple[int, ...]) -> MemoryStorage:
    hs, entries = bootstrap_log(voters)
    return MemoryStorage.restore(hs, _EMPTY_SNAP, entries)
