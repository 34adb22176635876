"""The reference checker: the checker's definitions, written as plainly as Python allows.

This is the yardstick the Spark job is measured against. It holds the whole history in
memory and follows each definition of docs/lab-and-checker.md literally — per message,
per consumer stream, over the sorted event times — with no binning, no approximate
percentiles and no cleverness, so it is slow (about a million events in seconds) and
obviously right. Tests run both checkers on the same synthetic histories and demand the
same answers, and both against the defects that were injected.

It must never import Spark: the unit tests run it without a JVM.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from hutch.pipeline.history import read_history, seq_of
from hutch.pipeline.model import (
    GAP_KINDS,
    NS_PER_S,
    Findings,
    Gap,
    by_queue_name,
    drained_queues,
    empty_summary,
    fault_events,
    fault_windows,
    gap_fields,
    latency_fields,
    make_gap,
    nearest_rank,
    window_of,
)

MSG_OPS = frozenset({"publish", "confirm", "nack", "return", "deliver"})
THROUGHPUT_OPS = ("publish", "confirm", "nack", "deliver", "ack")


@dataclass
class _Msg:
    pub_ts: int | None = None
    publishes: int = 0
    confirm_ts: int | None = None
    nacked: bool = False
    returned: bool = False
    deliveries: list[tuple[int, bool, str, int]] = field(default_factory=list)  # ts, redelivered, client, client_seq


def check_history(directory: str | os.PathLike, gap_ms: float = 1000.0) -> Findings:
    return check_table(read_history(directory), gap_ms)


def check_table(table: pa.Table, gap_ms: float = 1000.0) -> Findings:
    gap_ns = int(gap_ms * 1_000_000)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    n = table.num_rows
    msgs: dict[tuple[str, str, int], _Msg] = defaultdict(_Msg)
    streams: dict[tuple[str, str, str, int], list[tuple[int, int, int]]] = defaultdict(list)
    times: dict[tuple[str, str, str], list[int]] = defaultdict(list)  # (run, queue, op) -> ts
    run_end: dict[str, int] = {}
    fault_rows = []
    drain_rows = []
    for i in range(n):
        run, queue, op, ts = cols["run_id"][i], cols["queue"][i], cols["op"][i], cols["ts_ns"][i]
        run_end[run] = max(run_end.get(run, ts), ts)
        if op == "fault":
            fault_rows.append((run, ts, cols["detail"][i]))
            continue
        if not queue:
            continue
        if op == "drain":
            drain_rows.append((run, queue, cols["detail"][i]))
        times[(run, queue, op)].append(ts)
        msg_id = cols["msg_id"][i]
        if op not in MSG_OPS or msg_id is None:
            continue
        m = msgs[(run, queue, msg_id)]
        if op == "publish":
            m.pub_ts = ts if m.pub_ts is None else min(m.pub_ts, ts)
            m.publishes += 1
        elif op == "confirm":
            m.confirm_ts = ts if m.confirm_ts is None else min(m.confirm_ts, ts)
        elif op == "nack":
            m.nacked = True
        elif op == "return":
            m.returned = True
        else:
            red = bool(cols["redelivered"][i])
            client, cseq = cols["client_id"][i], cols["client_seq"][i]
            m.deliveries.append((ts, red, client, cseq))
            if not red:
                streams[(run, queue, client, msg_id >> 32)].append((cseq, seq_of(msg_id), msg_id))

    events = fault_events(fault_rows)
    windows = fault_windows(events, run_end)
    f = Findings(summary={"runs": {}}, faults=events, windows=windows)
    drained = drained_queues(drain_rows)
    per_queue: dict[tuple[str, str], dict] = {}
    for run, queue, _op in times:
        per_queue.setdefault((run, queue), empty_summary())["drained"] = int((run, queue) in drained)
    confirm_lat: dict[tuple[str, str], list[int]] = defaultdict(list)
    e2e_lat: dict[tuple[str, str], list[int]] = defaultdict(list)
    per_second_lat: dict[tuple[str, str, int, str], list[int]] = defaultdict(list)

    for (run, queue, msg_id), m in msgs.items():
        s = per_queue[(run, queue)]
        nd = len(m.deliveries)
        published = m.pub_ts is not None
        confirmed = m.confirm_ts is not None
        s["published"] += published
        s["confirmed"] += confirmed
        s["delivered"] += nd > 0
        s["deliveries"] += nd
        nacked = m.nacked and not confirmed
        unconfirmed = published and not confirmed and not m.nacked and not m.returned
        s["nacked"] += nacked
        s["returned"] += m.returned
        s["unconfirmed"] += unconfirmed
        s["nacked_delivered"] += nacked and nd > 0
        s["returned_delivered"] += m.returned and nd > 0
        s["unconfirmed_delivered"] += unconfirmed and nd > 0
        if confirmed and not m.returned and nd == 0 and (run, queue) not in drained:
            s["unread"] += 1
        elif confirmed and not m.returned and nd == 0:
            s["lost"] += 1
            window = window_of(windows, run, m.pub_ts)
            s["lost_by_window"][window] = s["lost_by_window"].get(window, 0) + 1
            f.lost.append(
                {"run_id": run, "queue": queue, "msg_id": msg_id, "publisher": msg_id >> 32, "seq": seq_of(msg_id),
                 "pub_ts_ns": m.pub_ts, "confirm_ts_ns": m.confirm_ts, "window": window}
            )
        if nd > 1:
            ordered = sorted(m.deliveries, key=lambda d: (d[0], d[1], d[2], d[3]))
            repeats = ordered[1:]
            without = sum(1 for d in repeats if not d[1])
            unexplained = max(0, sum(1 for d in m.deliveries if not d[1]) - max(m.publishes, 1))
            s["duplicates"] += len(repeats)
            s["duplicates_without_redelivered"] += without
            s["duplicates_unexplained"] += unexplained
            f.duplicates.append(
                {"run_id": run, "queue": queue, "msg_id": msg_id, "deliveries": nd,
                 "repeats_without_redelivered": without, "unexplained": unexplained, "first_ts_ns": ordered[0][0]}
            )
        if nd > 0 and not published:
            s["unexpected"] += 1
            f.unexpected.append({"run_id": run, "queue": queue, "msg_id": msg_id, "deliveries": nd,
                                 "first_ts_ns": min(d[0] for d in m.deliveries)})
        if published and confirmed:
            confirm_lat[(run, queue)].append(m.confirm_ts - m.pub_ts)
            per_second_lat[(run, queue, m.pub_ts // NS_PER_S, "confirm")].append(m.confirm_ts - m.pub_ts)
        if published and nd > 0:
            first = min(d[0] for d in m.deliveries)
            e2e_lat[(run, queue)].append(first - m.pub_ts)
            per_second_lat[(run, queue, m.pub_ts // NS_PER_S, "e2e")].append(first - m.pub_ts)

    for (run, queue, client, publisher), stream in streams.items():
        stream.sort()
        for (_, prev_seq, prev_id), (cseq, seq, msg_id) in zip(stream, stream[1:], strict=False):
            if seq < prev_seq:
                republished = msgs[(run, queue, msg_id)].publishes > 1
                per_queue[(run, queue)]["reordered"] += 1
                per_queue[(run, queue)]["reordered_unexplained"] += not republished
                f.reorders.append({"run_id": run, "queue": queue, "client_id": client, "publisher": publisher,
                                   "client_seq": cseq, "msg_id": msg_id, "seq": seq, "prev_msg_id": prev_id,
                                   "prev_seq": prev_seq, "republished": republished})

    for (run, queue), s in per_queue.items():
        publishes = sorted(times.get((run, queue, "publish"), []))
        queue_gaps: list[Gap] = []
        for kind in GAP_KINDS:
            ts = sorted(times.get((run, queue, kind), []))
            queue_gaps += _gaps(events, run, queue, kind, ts, publishes, run_end[run], gap_ns)
        f.gaps += queue_gaps
        s.update(gap_fields(queue_gaps))
        s["confirm_latency_ms"] = latency_fields(confirm_lat.get((run, queue), []))
        s["e2e_latency_ms"] = latency_fields(e2e_lat.get((run, queue), []))
        f.summary["runs"].setdefault(run, {"queues": {}})["queues"][queue] = s

    for (run, queue, op), ts in times.items():
        if op not in THROUGHPUT_OPS:
            continue
        counts: dict[int, int] = defaultdict(int)
        for t in ts:
            counts[t // NS_PER_S] += 1
        f.throughput += [{"run_id": run, "queue": queue, "second": sec, "op": op, "count": c}
                         for sec, c in sorted(counts.items())]
    for (run, queue, sec, kind), lat in sorted(per_second_lat.items()):
        v = sorted(lat)
        f.latency.append({"run_id": run, "queue": queue, "second": sec, "kind": kind, "count": len(v),
                          "p50_ns": nearest_rank(v, 0.5), "p95_ns": nearest_rank(v, 0.95),
                          "p99_ns": nearest_rank(v, 0.99), "max_ns": v[-1]})

    for run in f.summary["runs"]:
        f.summary["runs"][run]["faults"] = [w.__dict__ for w in windows if w.run_id == run]
    f.summary["queues"] = by_queue_name(f.summary)
    return f


def _gaps(events, run, queue, kind, ts: list[int], publishes: list[int], run_end_ns: int, gap_ns: int) -> list[Gap]:
    if not ts:
        return []
    intervals = []
    if publishes and publishes[0] < ts[0]:
        intervals.append((publishes[0], ts[0], True))
    intervals += [(a, b, True) for a, b in zip(ts, ts[1:], strict=False)]
    if run_end_ns > ts[-1]:
        intervals.append((ts[-1], run_end_ns, False))
    out = []
    for a, b, recovered in intervals:
        if b - a <= gap_ns:
            continue
        i = bisect.bisect_left(publishes, a)
        if i < len(publishes) and publishes[i] < b:
            out.append(make_gap(events, run, queue, kind, a, b, recovered, gap_ns))
    return out


