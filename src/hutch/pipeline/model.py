"""The checker's definitions that do not need the whole history: small pure functions.

Both checkers — the Spark job (`hutch.pipeline.check`) and the pure-Python reference
(`hutch.pipeline.reference`) — compute the per-message facts from the history themselves,
each in its own way. What is left is decided here, once, on small inputs: the fault
windows a run's `fault` rows describe, which gaps count and which fault caused each, the
nearest-rank percentile, the names of the summary fields and the `--expect` language.

Definitions (docs/lab-and-checker.md explains them at length):

- A fault window opens at ``start NAME`` and closes at the next ``end NAME``; one never
  closed lasts to the end of the run (the latest event of any kind in it). A message is
  *published in* the window that contains its first publish time; when windows overlap,
  the one that opened last; when none does, ``healthy``.
- A confirmed message (not returned) that was never delivered is *lost* when its queue's
  run recorded a completed drain (`drain` rows), and *unread* otherwise: the run ended
  before the queue was read empty, so its absence proves nothing. `drained` is 1 for a
  queue whose drain completed, 0 otherwise.
- A *gap* of a queue is an interval with no deliveries (or, separately, no confirms) on it
  longer than the threshold, between two consecutive such events — or from the queue's
  first publish to its first such event, or from its last such event to the run's end —
  during which at least one publish to the queue was attempted (a publish time in
  ``[start, end)``). Its *cause* is the fault event (a window's start or a point event)
  nearest to the gap's start among those in ``[start - threshold, end]``; its *recovery*
  is the time from that fault to the gap's end.
"""

from __future__ import annotations

import math
import operator
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from hutch.pipeline.history import drain_complete, parse_fault

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
HEALTHY = "healthy"
UNKNOWN_WINDOW = "unknown"
PERCENTILES = (0.5, 0.95, 0.99)
GAP_KINDS = ("deliver", "confirm")

# Integer fields of one queue's summary, in the order a person reads them.
SUMMARY_INT_FIELDS = (
    "published",
    "confirmed",
    "nacked",
    "returned",
    "unconfirmed",
    "delivered",
    "deliveries",
    "lost",
    "unread",
    "drained",
    "duplicates",
    "duplicates_without_redelivered",
    "duplicates_unexplained",
    "unexpected",
    "reordered",
    "reordered_unexplained",
    "nacked_delivered",
    "returned_delivered",
    "unconfirmed_delivered",
    "gaps",
    "max_gap_ms",
    "max_delivery_gap_ms",
    "max_confirm_gap_ms",
)
MAX_FIELDS = frozenset({"max_gap_ms", "max_delivery_gap_ms", "max_confirm_gap_ms"})
MIN_FIELDS = frozenset({"drained"})  # across runs: drained only if every run drained


@dataclass(frozen=True)
class FaultEvent:
    run_id: str
    ts_ns: int
    kind: str  # start | end | point
    name: str
    detail: str


@dataclass(frozen=True)
class FaultWindow:
    run_id: str
    name: str
    start_ns: int
    end_ns: int
    closed: bool


@dataclass(frozen=True)
class Gap:
    run_id: str
    queue: str
    kind: str  # deliver | confirm
    start_ns: int
    end_ns: int
    recovered: bool  # False: the gap lasted to the end of the run
    cause: str | None
    fault_ts_ns: int | None

    @property
    def gap_ms(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_MS

    @property
    def recovery_ms(self) -> float | None:
        if self.fault_ts_ns is None:
            return None
        return (self.end_ns - self.fault_ts_ns) / NS_PER_MS

    def as_row(self) -> dict:
        return {
            "run_id": self.run_id,
            "queue": self.queue,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "gap_ms": self.gap_ms,
            "recovered": self.recovered,
            "cause": self.cause,
            "fault_ts_ns": self.fault_ts_ns,
            "recovery_ms": self.recovery_ms,
        }


def drained_queues(rows: Iterable[tuple[str, str, str | None]]) -> set[tuple[str, str]]:
    """The (run, queue) pairs of (run_id, queue, detail) `drain` rows whose drain completed."""
    return {(run, queue) for run, queue, detail in rows if queue and drain_complete(detail)}


def fault_events(rows: Iterable[tuple[str, int, str | None]]) -> list[FaultEvent]:
    """FaultEvents of (run_id, ts_ns, detail) fault rows, in time order."""
    out = []
    for run_id, ts_ns, detail in rows:
        kind, name = parse_fault(detail)
        out.append(FaultEvent(run_id, int(ts_ns), kind, name, detail or ""))
    out.sort(key=lambda e: (e.run_id, e.ts_ns, e.kind != "end"))
    return out


def fault_windows(events: list[FaultEvent], run_end_ns: dict[str, int]) -> list[FaultWindow]:
    """The windows opened and closed by `events`; an `end` closes the latest open window of its name."""
    open_: dict[tuple[str, str], list[int]] = {}
    windows: list[FaultWindow] = []
    for e in events:
        key = (e.run_id, e.name)
        if e.kind == "start":
            open_.setdefault(key, []).append(e.ts_ns)
        elif e.kind == "end" and open_.get(key):
            windows.append(FaultWindow(e.run_id, e.name, open_[key].pop(), e.ts_ns, True))
    for (run_id, name), starts in open_.items():
        for s in starts:
            windows.append(FaultWindow(run_id, name, s, max(s, run_end_ns.get(run_id, s)), False))
    windows.sort(key=lambda w: (w.run_id, w.start_ns, w.name))
    return windows


def window_of(windows: list[FaultWindow], run_id: str, ts_ns: int | None) -> str:
    """The window a message published at `ts_ns` was published in (the latest-opened that contains it)."""
    if ts_ns is None:
        return UNKNOWN_WINDOW
    best: FaultWindow | None = None
    for w in windows:
        if w.run_id == run_id and w.start_ns <= ts_ns < w.end_ns:
            if best is None or w.start_ns >= best.start_ns:
                best = w
    return best.name if best else HEALTHY


def gap_cause(events: list[FaultEvent], run_id: str, start_ns: int, end_ns: int, gap_ns: int) -> FaultEvent | None:
    """The fault event nearest the gap's start among starts and points in [start - gap, end]."""
    best: FaultEvent | None = None
    for e in events:
        if e.run_id != run_id or e.kind == "end":
            continue
        if start_ns - gap_ns <= e.ts_ns <= end_ns:
            if best is None or abs(e.ts_ns - start_ns) < abs(best.ts_ns - start_ns):
                best = e
    return best


def make_gap(events: list[FaultEvent], run_id: str, queue: str, kind: str, start_ns: int, end_ns: int,
             recovered: bool, gap_ns: int) -> Gap:
    cause = gap_cause(events, run_id, start_ns, end_ns, gap_ns)
    return Gap(run_id, queue, kind, start_ns, end_ns, recovered,
               cause.name if cause else None, cause.ts_ns if cause else None)


@dataclass(frozen=True)
class Bin:
    """Events of one kind on one queue within one time bin: how many, the first and last time."""

    bin: int
    count: int
    min_ns: int
    max_ns: int


def gaps_from_bins(
    run_id: str,
    queue: str,
    kind: str,
    event_bins: list[Bin],
    publish_bins: list[Bin],
    run_end_ns: int,
    gap_ns: int,
    events: list[FaultEvent],
) -> list[Gap]:
    """The gaps of one queue and kind, from its events binned by `gap_ns` wide bins.

    A gap longer than a bin cannot lie inside one bin, so it lies between the last event
    of one non-empty bin and the first of the next: the binned series finds every gap the
    definition names, exactly, without sorting the events themselves.
    """
    if not event_bins:
        return []
    eb = sorted(event_bins, key=lambda b: b.bin)
    pb = sorted(publish_bins, key=lambda b: b.bin)
    intervals: list[tuple[int, int, bool]] = []
    if pb and pb[0].min_ns < eb[0].min_ns:
        intervals.append((pb[0].min_ns, eb[0].min_ns, True))
    for prev, cur in zip(eb, eb[1:], strict=False):
        intervals.append((prev.max_ns, cur.min_ns, True))
    if run_end_ns > eb[-1].max_ns:
        intervals.append((eb[-1].max_ns, run_end_ns, False))
    gaps = []
    for a, b, recovered in intervals:
        if b - a > gap_ns and _publish_attempted(pb, a, b, gap_ns):
            gaps.append(make_gap(events, run_id, queue, kind, a, b, recovered, gap_ns))
    return gaps


def _publish_attempted(publish_bins: list[Bin], a: int, b: int, width_ns: int) -> bool:
    """Whether a publish time lies in [a, b), from bins `width_ns` wide, when b - a > width_ns."""
    a_bin, b_bin = a // width_ns, b // width_ns
    for p in publish_bins:
        if a_bin < p.bin < b_bin:  # the whole bin lies inside [a, b)
            return True
        if p.bin == a_bin and p.max_ns >= a:  # the bin ends before b
            return True
        if p.bin == b_bin and p.min_ns < b:  # the bin starts after a
            return True
    return False


def gap_fields(gaps: list[Gap]) -> dict[str, int]:
    """The summary's gap fields of one queue's gaps (whole milliseconds, rounded down)."""

    def longest(kind: str | None) -> int:
        ns = [g.end_ns - g.start_ns for g in gaps if kind is None or g.kind == kind]
        return max(ns) // NS_PER_MS if ns else 0

    return {
        "gaps": len(gaps),
        "max_gap_ms": longest(None),
        "max_delivery_gap_ms": longest("deliver"),
        "max_confirm_gap_ms": longest("confirm"),
    }


def nearest_rank(sorted_values: list[int], p: float) -> int | None:
    """The smallest value with at least a fraction `p` of the values at or below it."""
    if not sorted_values:
        return None
    k = max(1, math.ceil(p * len(sorted_values)))
    return sorted_values[k - 1]


def latency_fields(values_ns: list[int]) -> dict[str, float | None]:
    """p50/p95/p99/max of latencies given in nanoseconds, in milliseconds."""
    v = sorted(values_ns)
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        r = nearest_rank(v, p)
        out[f"p{round(p * 100)}"] = None if r is None else r / NS_PER_MS
    out["max"] = v[-1] / NS_PER_MS if v else None
    out["count"] = len(v)
    return out


def merge_queue_summaries(per_run: list[dict]) -> dict:
    """One queue's summary across runs: counts add up, maxima take the largest."""
    if len(per_run) == 1:
        return dict(per_run[0])
    out: dict = {}
    for f in SUMMARY_INT_FIELDS:
        vals = [s.get(f, 0) for s in per_run]
        out[f] = max(vals) if f in MAX_FIELDS else min(vals) if f in MIN_FIELDS else sum(vals)
    for lat in ("confirm_latency_ms", "e2e_latency_ms"):
        maxima = [s[lat]["max"] for s in per_run if s.get(lat) and s[lat].get("max") is not None]
        out[lat] = {"max": max(maxima) if maxima else None, "count": sum(s[lat]["count"] for s in per_run if s.get(lat))}
    lbw: dict[str, int] = {}
    for s in per_run:
        for k, v in s.get("lost_by_window", {}).items():
            lbw[k] = lbw.get(k, 0) + v
    out["lost_by_window"] = lbw
    out["runs"] = len(per_run)
    return out


_EXPECT = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|==|!=|=|<|>)\s*(-?\d+)\s*$")
_OPS = {"=": operator.eq, "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class Expectation:
    field: str
    op: str
    value: int

    @classmethod
    def parse(cls, text: str) -> Expectation:
        m = _EXPECT.match(text)
        if not m or m.group(1) not in SUMMARY_INT_FIELDS:
            raise ValueError(
                f"cannot read expectation {text!r}: write FIELD OP INTEGER, e.g. lost=0 or max_gap_ms<=5000, "
                f"with FIELD one of {', '.join(SUMMARY_INT_FIELDS)}"
            )
        return cls(m.group(1), m.group(2), int(m.group(3)))

    def __str__(self) -> str:
        return f"{self.field}{self.op}{self.value}"

    def broken_by(self, summary: dict) -> list[str]:
        """What breaks this expectation: one line per run and queue whose value does not satisfy it."""
        broken = []
        for run_id, run in sorted(summary.get("runs", {}).items()):
            for queue, s in sorted(run.get("queues", {}).items()):
                v = s.get(self.field, 0)
                if not _OPS[self.op](v, self.value):
                    broken.append(f"run {run_id} queue {queue}: {self.field} is {v}, expected {self}")
        return broken


def empty_summary() -> dict:
    s: dict = dict.fromkeys(SUMMARY_INT_FIELDS, 0)
    s["lost_by_window"] = {}
    return s


def by_queue_name(summary: dict) -> dict:
    """summary.json's top-level `queues`: each queue name's summaries merged across runs."""
    per_name: dict[str, list[dict]] = defaultdict(list)
    for run in sorted(summary["runs"]):
        for queue, s in summary["runs"][run]["queues"].items():
            per_name[queue].append(s)
    return {q: merge_queue_summaries(v) for q, v in sorted(per_name.items())}


@dataclass
class Findings:
    """What a checker found: the summary (the shape of summary.json) and its tables as rows."""

    summary: dict
    lost: list[dict] = field(default_factory=list)
    duplicates: list[dict] = field(default_factory=list)
    unexpected: list[dict] = field(default_factory=list)
    reorders: list[dict] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    throughput: list[dict] = field(default_factory=list)  # run_id, queue, second, op, count
    latency: list[dict] = field(default_factory=list)  # run_id, queue, second, kind, count, p50, p95, p99, max
    faults: list[FaultEvent] = field(default_factory=list)
    windows: list[FaultWindow] = field(default_factory=list)
