"""The simulation kernel: one seeded clock, event queue, network and result for every simulator.

hutch proves its sans-I/O cores (Raft groups, the GM ring, and, as they join, whole nodes) by
deterministic simulation, in the manner of FoundationDB's simulator and TigerBeetle's VOPR:
everything runs in one thread, time is a number the kernel advances from event to event, and
every choice — latencies, losses, which node crashes and when — comes from one
`random.Random(seed)`. A seed therefore names one run exactly and replays it; a failing seed is
a bug report.

What a simulator gets here:

- `Kernel`: the clock (`now`, in microseconds), the event queue (`at` schedules, `next_event`
  takes the earliest; ties keep scheduling order), the seeded `rng`, and a trace (`log`) kept
  only when asked for;
- `Network` of directed `Link`s: FIFO per link (a message never overtakes an earlier one on
  the same link, as on one TCP connection), links cut and restored one direction at a time,
  and an epoch per link that changes when it is cut or restored, so a simulator can drop or
  reorder leftovers of the old connection; `draw_partition` draws the partition shapes that
  find bugs (two sides, one node cut off one way or both, any directed subset);
- `Violation`, the exception a simulator raises when a checked property fails, and
  `SimResult`, what a run returns;
- `run_seeds`, the loop behind each simulator's command line.

The kernel must never import a simulated component, read a real clock into a run's decisions,
or draw randomness from anywhere but `rng`: either would break replay.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


class Violation(Exception):
    """A checked property does not hold. The message says which, where and when."""


@dataclass(slots=True)
class SimResult:
    seed: int
    ok: bool
    violation: str | None
    stats: dict = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)


class Kernel:
    """A seeded clock and event queue. Simulators subclass it and dispatch on event kinds."""

    def __init__(self, seed: int, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0  # microseconds of simulated time
        self.queue: list[tuple] = []
        self.qseq = 0
        self.tracing = trace
        self.trace: list[str] = []

    def at(self, t_us: int, kind: int, *args) -> int:
        """Schedule an event of `kind` at `t_us`; returns its id (unique, increasing)."""
        assert t_us >= self.now, (t_us, self.now)  # the past cannot be scheduled
        self.qseq += 1
        heapq.heappush(self.queue, (t_us, self.qseq, kind, args))
        return self.qseq

    def peek_us(self) -> int | None:
        return self.queue[0][0] if self.queue else None

    def next_event(self) -> tuple[int, int, tuple]:
        """Take the earliest event and advance the clock to it: (event id, kind, args)."""
        t, eid, kind, args = heapq.heappop(self.queue)
        self.now = t
        return eid, kind, args

    def log(self, text: str) -> None:
        if self.tracing:
            self.trace.append(f"{self.now / 1000:9.3f}ms {text}")

    def result(self, violation: str | None, stats: dict) -> SimResult:
        return SimResult(self.seed, violation is None, violation, stats, self.trace)


class Link:
    """One direction between two nodes."""

    __slots__ = ("epoch", "blocked", "last_us")

    def __init__(self) -> None:
        self.epoch = 0
        self.blocked = False
        self.last_us = 0  # arrival time of the latest message sent on it

    def arrival_us(self, now_us: int, delay_us: int) -> int:
        """When a message sent now with this delay arrives, behind everything sent before it."""
        t = max(now_us + delay_us, self.last_us)
        self.last_us = t
        return t


class Network:
    """Directed links between node ids, FIFO each, cut and restored one direction at a time."""

    def __init__(self, ids: Iterable = ()) -> None:
        self.links: dict[tuple, Link] = {}
        ids = list(ids)
        for a in ids:
            for b in ids:
                if a != b:
                    self.links[(a, b)] = Link()

    def get(self, a, b) -> Link | None:
        return self.links.get((a, b))

    def link(self, a, b) -> Link:
        """The link from a to b, made on first use (for nodes that join later)."""
        ln = self.links.get((a, b))
        if ln is None:
            ln = self.links[(a, b)] = Link()
        return ln

    def set_blocked(self, blocked: set) -> None:
        """Cut exactly the directed links in `blocked`; every link that changes starts a new epoch
        (a new connection: leftovers of the old one are not FIFO with it)."""
        for key, ln in self.links.items():
            now_blocked = key in blocked
            if ln.blocked != now_blocked:
                ln.blocked = now_blocked
                ln.epoch += 1


def draw_partition(rng: random.Random, ids: list) -> set[tuple]:
    """A set of directed links to cut: none (heal), two sides, one node cut off (perhaps only one
    way), or each directed link independently."""
    shape = rng.random()
    if shape < 0.3:
        return set()
    if shape < 0.6:
        side = {i for i in ids if rng.random() < 0.5}
        return {(a, b) for a in ids for b in ids if a != b and ((a in side) != (b in side))}
    if shape < 0.8:
        x = rng.choice(ids)
        way = rng.random()
        return {(a, b) for a in ids for b in ids if a != b and ((a == x and way < 0.7) or (b == x and way > 0.3))}
    p = rng.random() * 0.6
    return {(a, b) for a in ids for b in ids if a != b and rng.random() < p}


def run_seeds(run: Callable[[int], SimResult], first: int, count: int, reproduce: Callable[[int], str],
              echo: Callable[..., None], verbose: bool = False, progress_every: int = 1000) -> int:
    """Run `count` consecutive seeds from `first`, print each failure with the command that
    replays it, and return how many failed."""
    failures = 0
    started = time.perf_counter()
    for s in range(first, first + count):
        res = run(s)
        if verbose:
            for line in res.trace:
                echo(line)
        if not res.ok:
            failures += 1
            echo(f"seed {s}: FAILED: {res.violation}")
            echo(f"  reproduce: {reproduce(s)} -v")
        elif verbose or count == 1:
            echo(f"seed {s}: ok {res.stats}")
        if count > 1 and (s - first + 1) % progress_every == 0:
            echo(f"{s - first + 1} seeds, {failures} failed, {time.perf_counter() - started:.1f}s", err=True)
    echo(f"{count} seed(s) from {first}: {failures} failed in {time.perf_counter() - started:.1f}s")
    return failures
