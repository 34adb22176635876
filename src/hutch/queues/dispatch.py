"""Which consumer a queue's next message goes to: RabbitMQ's rule for competing consumers.
Consumers are grouped by `x-priority`, highest first; a message goes to the first consumer of
the highest-priority group that can take it (its prefetch, its channel's credit), and within
a group the consumers take turns (round robin). Single active consumer is decided by the
queue itself: it keeps the registration order and serves only the first.

`PriorityRings` is that rule as data, shared by the classic queue (`hutch.queues.classic`,
holding consumer objects) and the quorum queue's state machine (`hutch.quorum.fifo`, holding
consumer ids, which every member must choose alike): the same operations in the same order
give the same choices, and the rings are plain lists and deques that a snapshot can copy.

Must never: read a clock, draw random numbers, iterate a set, do I/O, or import anything
outside `hutch.queues`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any


class PriorityRings:
    """Consumers (or their ids) in one ring per priority, the rings highest priority first."""

    __slots__ = ("groups",)

    def __init__(self, groups: list[tuple[int, deque]] | None = None):
        self.groups: list[tuple[int, deque]] = groups if groups is not None else []

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __iter__(self) -> Iterator[Any]:
        for _prio, ring in self.groups:
            yield from ring

    def add(self, priority: int, member: Any) -> None:
        """At the end of its priority's ring (it takes its turn after those already there)."""
        for prio, ring in self.groups:
            if prio == priority:
                ring.append(member)
                return
        self.groups.append((priority, deque([member])))
        self.groups.sort(key=lambda g: -g[0])

    def remove(self, member: Any) -> bool:
        """Take a member out; False when it was in no ring. An emptied ring goes."""
        for i, (_prio, ring) in enumerate(self.groups):
            try:
                ring.remove(member)
            except ValueError:
                continue
            if not ring:
                del self.groups[i]
            return True
        return False

    def clear(self) -> None:
        self.groups.clear()

    def next(self, can_take: Callable[[Any], bool]) -> Any | None:
        """The member that gets the next message, its ring turned past it; None when no member
        can take one. (ClassicQueue.next_consumer inlines this loop: it runs per delivery.)"""
        for _prio, ring in self.groups:
            for _ in range(len(ring)):
                m = ring[0]
                ring.rotate(-1)
                if can_take(m):
                    return m
        return None

    def snapshot(self) -> list[tuple[int, list]]:
        return [(p, list(ring)) for p, ring in self.groups]

    @classmethod
    def restore(cls, groups: list[tuple[int, list]]) -> PriorityRings:
        rings = cls([(p, deque(ring)) for p, ring in groups])
        assert all(a[0] > b[0] for a, b in zip(rings.groups, rings.groups[1:], strict=False)), "rings out of order"
        return rings
