"""Synthetic histories with injected defects whose verdict is known in advance.

A checker is only trusted once it has been shown histories where the right answer is
known. This module fabricates what a load run against a perfect broker would have
recorded — publishers numbering their messages, confirms, consumers receiving each
message once in queue order and acking it, fault windows during which deliveries and
confirms stall — and then breaks it in exactly the ways the checker must see: confirmed
messages that are never delivered (lost), repeats with and without the redelivered flag,
adjacent swaps in a consumer's stream (reorders), deliveries of ids nobody published
(unexpected), nacks, publishes never confirmed, and mandatory returns. It also writes what a
correct broker may do and a checker must not blame it for: a message whose confirm was lost,
published again by its publisher and so delivered twice without the flag, the second time
behind later messages. `generate` writes
the history through the format of `hutch.pipeline.history` and returns `Truth`: what a
correct checker must report for each queue.

It is vectorised with numpy so the same code makes the 100-million-event histories of the
scale benchmark. Every choice comes from one seeded generator: the same spec writes the
same history.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hutch.pipeline.history import (
    PUBLISHER_MAX,
    ROWS_PER_FILE_DEFAULT,
    SCHEMA,
    drain_detail,
    fault_end,
    fault_start,
)

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
START_NS_DEFAULT = 1_767_225_600 * NS_PER_S  # 2026-01-01T00:00:00Z
CONSUMER_SPACING_NS = 2_000  # two deliveries to one consumer are at least 2 µs apart
ACK_AFTER_DELIVER_NS = 1_000  # a consumer acks 1 µs after the delivery
REDELIVERY_AFTER_NS = 100 * NS_PER_MS  # a flagged repeat arrives 100 ms after the original


@dataclass(frozen=True)
class Fault:
    """A window [start_s, start_s + duration_s) of the run during which the queues stall.

    `recorded` writes its `fault` rows (start/end); an unrecorded fault is an outage
    nobody announced (the checker must find the gap and name no cause). `stall` holds back
    every delivery and confirm due inside the window until it ends.
    """

    name: str
    start_s: float
    duration_s: float
    recorded: bool = True
    stall: bool = True


@dataclass(frozen=True)
class Defects:
    """How many messages of each queue get each defect (chosen disjointly at random)."""

    lost: int = 0
    dup_flagged: int = 0
    dup_unflagged: int = 0
    reordered: int = 0
    unexpected: int = 0
    nacked: int = 0  # the first half of them is also never delivered
    unconfirmed: int = 0  # the first half of them is also never delivered
    returned: int = 0  # returned (and then confirmed, as a broker does), never delivered
    republished: int = 0  # confirm lost, published again at the end: delivered twice, unflagged (no defect)
    lost_in_faults: bool = True  # lost messages are picked among those published in a fault window

    def total(self) -> int:
        return (
            self.lost
            + self.dup_flagged
            + self.dup_unflagged
            + 2 * self.reordered
            + self.nacked
            + self.unconfirmed
            + self.returned
            + self.republished
        )


@dataclass(frozen=True)
class SynthSpec:
    run_id: str = "synth"
    queues: int = 1
    publishers_per_queue: int = 2
    consumers_per_queue: int = 2
    messages_per_publisher: int = 1_000
    rate_per_publisher: float = 1_000.0  # messages per second
    confirm_latency_ms: float = 2.0  # median; lognormal
    delivery_latency_ms: float = 4.0  # median; lognormal
    faults: tuple[Fault, ...] = ()
    defects: Defects = field(default_factory=Defects)
    acks: bool = True
    drained: bool = True  # the run ends with a completed drain of every queue (a `drain` row each)
    seed: int = 0
    start_ns: int = START_NS_DEFAULT

    def queue_name(self, q: int) -> str:
        return f"q{q}"

    def events(self) -> int:
        """About how many rows the history will have."""
        per_msg = 3 + (1 if self.acks else 0)
        return self.queues * self.publishers_per_queue * self.messages_per_publisher * per_msg


@dataclass
class QueueTruth:
    published: int = 0
    confirmed: int = 0
    delivered: int = 0
    deliveries: int = 0
    lost: int = 0
    unread: int = 0  # never delivered, on a queue whose run did not drain
    drained: int = 1
    duplicates: int = 0
    duplicates_without_redelivered: int = 0
    duplicates_unexplained: int = 0
    unexpected: int = 0
    reordered: int = 0
    reordered_unexplained: int = 0
    nacked: int = 0
    nacked_delivered: int = 0
    unconfirmed: int = 0
    unconfirmed_delivered: int = 0
    returned: int = 0
    lost_ids: set[int] = field(default_factory=set)
    lost_by_window: dict[str, int] = field(default_factory=dict)


@dataclass
class Truth:
    run_id: str
    queues: dict[str, QueueTruth]
    faults: tuple[Fault, ...]
    rows: int = 0
    files: int = 0


class _Rows:
    """Column arrays of one client's rows, concatenated then sorted by time."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []

    def add(self, op: str, queue: str, msg_id, ts_ns, redelivered=None, detail=None) -> None:
        n = len(ts_ns)
        if n == 0:
            return
        self.parts.append(
            {
                "op": np.full(n, op, dtype=object),
                "queue": np.full(n, queue, dtype=object),
                "msg_id": np.asarray(msg_id, dtype=np.int64) if msg_id is not None else None,
                "ts_ns": np.asarray(ts_ns, dtype=np.int64),
                "redelivered": np.asarray(redelivered, dtype=bool) if redelivered is not None else None,
                "detail": np.asarray(detail, dtype=object) if detail is not None else None,
                "n": n,
            }
        )


def _write_client(directory: Path, spec: SynthSpec, client_id: str, node: str, rows: _Rows,
                  rows_per_file: int, token: str) -> tuple[int, int]:
    parts = rows.parts
    if not parts:
        return 0, 0
    ts = np.concatenate([p["ts_ns"] for p in parts])
    # rank of each part (earlier parts first on equal times): deliveries before their acks
    rank = np.concatenate([np.full(p["n"], i, dtype=np.int16) for i, p in enumerate(parts)])
    order = np.lexsort((rank, ts))
    n = len(ts)

    def col(name, dtype):
        arrs = []
        mask = []
        for p in parts:
            if p[name] is None:
                arrs.append(np.zeros(p["n"], dtype=dtype) if dtype is not object else np.full(p["n"], "", dtype=object))
                mask.append(np.ones(p["n"], dtype=bool))
            else:
                arrs.append(p[name])
                mask.append(np.zeros(p["n"], dtype=bool))
        return np.concatenate(arrs)[order], np.concatenate(mask)[order]

    ops, _ = col("op", object)
    queues, _ = col("queue", object)
    msg_ids, msg_null = col("msg_id", np.int64)
    redelivered, red_null = col("redelivered", bool)
    details, det_null = col("detail", object)
    ts = ts[order]
    files = 0
    for lo in range(0, n, rows_per_file):
        hi = min(n, lo + rows_per_file)
        m = hi - lo
        table = pa.Table.from_arrays(
            [
                pa.array(np.full(m, spec.run_id, dtype=object), pa.string()),
                pa.array(np.full(m, client_id, dtype=object), pa.string()),
                pa.array(np.full(m, node, dtype=object), pa.string()),
                pa.array(queues[lo:hi], pa.string()),
                pa.array(ops[lo:hi], pa.string()),
                pa.array(msg_ids[lo:hi], pa.int64(), mask=msg_null[lo:hi]),
                pa.array(redelivered[lo:hi], pa.bool_(), mask=red_null[lo:hi]),
                pa.array(ts[lo:hi], pa.int64()),
                pa.array(np.where(det_null[lo:hi], "", details[lo:hi]), pa.string()),
                pa.array(np.arange(lo, hi, dtype=np.int64), pa.int64()),
            ],
            schema=SCHEMA,
        )
        name = f"{client_id}.{os.getpid()}.{token}.{files:05d}.parquet"
        pq.write_table(table, directory / f".{name}.tmp", compression="zstd")
        os.replace(directory / f".{name}.tmp", directory / name)
        files += 1
    return n, files


def _stall(ts: np.ndarray, faults: tuple[Fault, ...], start_ns: int, rng: np.random.Generator,
           latency_ms: float) -> np.ndarray:
    """Times due inside a stalling fault window move to just after the window ends."""
    out = ts.copy()
    for f in faults:
        if not f.stall:
            continue
        fs = start_ns + int(f.start_s * NS_PER_S)
        fe = fs + int(f.duration_s * NS_PER_S)
        inside = (out >= fs) & (out < fe)
        k = int(inside.sum())
        if k:
            out[inside] = fe + _lognormal(rng, latency_ms, k)
    return out


def _lognormal(rng: np.random.Generator, median_ms: float, n: int) -> np.ndarray:
    return (rng.lognormal(mean=np.log(median_ms), sigma=0.5, size=n) * NS_PER_MS).astype(np.int64) + 1


def _pick(rng: np.random.Generator, taken: np.ndarray, k: int, among: np.ndarray | None = None) -> np.ndarray:
    """k message indexes not yet taken (and within `among`), marked taken, in ascending order."""
    if k == 0:
        return np.empty(0, dtype=np.int64)
    pool = np.flatnonzero(~taken if among is None else (~taken & among))
    if len(pool) < k:
        raise ValueError("not enough messages to place the defects")
    chosen = rng.choice(pool, size=k, replace=False)
    taken[chosen] = True
    return np.sort(chosen)


def _descents_of_second_copies(republished, re_consumer, seq, pub_no, consumer, delivered, deliver_ts,
                               dup_u) -> int:
    """How many second copies of republished messages arrive right behind a later message of their
    publisher in their consumer's stream (the copies come last, in the order given)."""
    last_seq: dict[tuple[int, int], tuple[int, int]] = {}  # (consumer, publisher) -> (ts, seq) of the newest
    for ts_, c, p, s_ in zip(np.concatenate([deliver_ts[delivered], deliver_ts[dup_u] + 1]),
                             np.concatenate([consumer[delivered], consumer[dup_u]]),
                             np.concatenate([pub_no[delivered], pub_no[dup_u]]),
                             np.concatenate([seq[delivered], seq[dup_u]]), strict=True):
        key = (int(c), int(p))
        if key not in last_seq or ts_ > last_seq[key][0]:
            last_seq[key] = (int(ts_), int(s_))
    descents = 0
    for i, c in zip(republished, re_consumer, strict=True):
        key = (int(c), int(pub_no[i]))
        if key in last_seq and last_seq[key][1] > seq[i]:
            descents += 1
        last_seq[key] = (0, int(seq[i]))
    return descents


def _window_of(ts: int, spec: SynthSpec) -> str:
    best = None
    for f in spec.faults:
        if not f.recorded:
            continue
        fs = spec.start_ns + int(f.start_s * NS_PER_S)
        fe = fs + int(f.duration_s * NS_PER_S)
        if fs <= ts < fe and (best is None or fs >= best[0]):
            best = (fs, f.name)
    return best[1] if best else "healthy"


def generate(spec: SynthSpec, directory: str | os.PathLike, rows_per_file: int = ROWS_PER_FILE_DEFAULT) -> Truth:
    """Write the history `spec` describes into `directory` and return what a checker must find."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    token = secrets.token_hex(4)
    truth = Truth(spec.run_id, {}, spec.faults)
    P, C, M = spec.publishers_per_queue, spec.consumers_per_queue, spec.messages_per_publisher
    d = spec.defects
    if d.total() > P * M // 2:
        raise ValueError("too many defects for the number of messages")
    spacing_ns = int(NS_PER_S / spec.rate_per_publisher)

    last_ts = [spec.start_ns]

    def emit(client_id: str, node: str, rows: _Rows) -> None:
        for part in rows.parts:
            last_ts[0] = max(last_ts[0], int(part["ts_ns"].max()))
        n, f = _write_client(directory, spec, client_id, node, rows, rows_per_file, token)
        truth.rows += n
        truth.files += f

    for q in range(spec.queues):
        qname = spec.queue_name(q)
        qt = QueueTruth()
        truth.queues[qname] = qt
        n = P * M
        pub_no = np.repeat(np.arange(P, dtype=np.int64) + q * P, M)
        seq = np.tile(np.arange(M, dtype=np.int64), P)
        msg_id = pub_no << 32 | seq
        pub_ts = (
            spec.start_ns
            + seq * spacing_ns
            + (pub_no % P) * (spacing_ns // max(P, 1))
            + rng.integers(0, max(spacing_ns // (4 * P), 1), size=n)
        )
        # queue order = publish order
        qorder = np.argsort(pub_ts, kind="stable")
        confirm_ts = _stall(pub_ts + _lognormal(rng, spec.confirm_latency_ms, n), spec.faults, spec.start_ns,
                            rng, spec.confirm_latency_ms)
        consumer = rng.integers(0, C, size=n)
        due = _stall(pub_ts + _lognormal(rng, spec.delivery_latency_ms, n), spec.faults, spec.start_ns,
                     rng, spec.delivery_latency_ms)
        deliver_ts = np.empty(n, dtype=np.int64)
        for c in range(C):
            idx = qorder[consumer[qorder] == c]  # this consumer's messages in queue order
            k = np.arange(len(idx), dtype=np.int64) * CONSUMER_SPACING_NS
            deliver_ts[idx] = np.maximum.accumulate(due[idx] - k) + k  # strictly increasing

        # choose the defective messages, disjointly
        taken = np.zeros(n, dtype=bool)

        def pick(k: int, among: np.ndarray | None = None, taken=taken) -> np.ndarray:
            return _pick(rng, taken, k, among)

        in_fault = np.zeros(n, dtype=bool)
        for f in spec.faults:
            if f.recorded:
                fs = spec.start_ns + int(f.start_s * NS_PER_S)
                in_fault |= (pub_ts >= fs) & (pub_ts < fs + int(f.duration_s * NS_PER_S))
        if d.lost and d.lost_in_faults and in_fault.sum() >= d.lost:
            lost = pick(d.lost, in_fault)
        else:
            lost = pick(d.lost)

        # reorder pairs: a message and the next one of the same publisher in the same consumer's stream
        first_of_pair: list[int] = []
        second_of_pair: list[int] = []
        if d.reordered:
            key = np.lexsort((deliver_ts, pub_no, consumer))  # streams per (consumer, publisher)
            same_next = np.zeros(n, dtype=bool)
            same_next[:-1] = (consumer[key][:-1] == consumer[key][1:]) & (pub_no[key][:-1] == pub_no[key][1:])
            nxt = np.full(n, -1, dtype=np.int64)
            nxt[key[:-1][same_next[:-1]]] = key[1:][same_next[:-1]]
            candidates = rng.permutation(np.flatnonzero(nxt >= 0))
            for a in candidates:
                b = nxt[a]
                if taken[a] or taken[b]:
                    continue
                taken[a] = taken[b] = True
                first_of_pair.append(int(a))
                second_of_pair.append(int(b))
                if len(first_of_pair) == d.reordered:
                    break
            if len(first_of_pair) < d.reordered:
                raise ValueError("not enough messages to place the reorders")
            fa, sb = np.array(first_of_pair), np.array(second_of_pair)
            deliver_ts[fa], deliver_ts[sb] = deliver_ts[sb].copy(), deliver_ts[fa].copy()
        dup_f = pick(d.dup_flagged)
        dup_u = pick(d.dup_unflagged)
        nacked = pick(d.nacked)
        unconfirmed = pick(d.unconfirmed)
        returned = pick(d.returned)
        republished = pick(d.republished)

        delivered = np.ones(n, dtype=bool)
        delivered[lost] = False
        delivered[returned] = False
        delivered[nacked[: len(nacked) // 2]] = False
        delivered[unconfirmed[: len(unconfirmed) // 2]] = False
        confirmed = np.ones(n, dtype=bool)
        confirmed[nacked] = False
        confirmed[unconfirmed] = False
        confirmed[republished] = False  # the first publish's confirm was lost; the second one's comes
        # the second publishes and their deliveries come after everything else, one after another
        re_deliver_ts = int(deliver_ts.max()) + NS_PER_MS + np.arange(len(republished), dtype=np.int64) * CONSUMER_SPACING_NS
        re_pub_ts = re_deliver_ts - NS_PER_MS // 2
        re_consumer = rng.integers(0, C, size=len(republished))

        # publishers
        nodes = [f"hutch@node{k}" for k in range(3)]
        for p in range(P):
            mine = pub_no == q * P + p
            rows = _Rows()
            rows.add("publish", qname, msg_id[mine], pub_ts[mine])
            sel = mine & confirmed
            rows.add("confirm", qname, msg_id[sel], confirm_ts[sel])
            sel = np.zeros(n, dtype=bool)
            sel[nacked] = True
            sel &= mine
            rows.add("nack", qname, msg_id[sel], confirm_ts[sel])
            sel = np.zeros(n, dtype=bool)
            sel[returned] = True
            sel &= mine
            rows.add("return", qname, msg_id[sel], confirm_ts[sel] - 1)
            r = pub_no[republished] == q * P + p
            rows.add("publish", qname, msg_id[republished[r]], re_pub_ts[r])
            rows.add("confirm", qname, msg_id[republished[r]], re_pub_ts[r] + 1)
            emit(f"pub-{q}-{p}", nodes[p % len(nodes)], rows)

        # unexpected ids: a publisher number nobody uses, ascending seq in time
        unexpected_ids = (np.int64(PUBLISHER_MAX - q) << 32) | np.arange(d.unexpected, dtype=np.int64)
        run_end = int(deliver_ts.max())
        unexpected_ts = np.sort(_stall(rng.integers(spec.start_ns, run_end, size=d.unexpected), spec.faults,
                                       spec.start_ns, rng, spec.delivery_latency_ms))
        unexpected_consumer = rng.integers(0, C, size=d.unexpected)
        flagged_consumer = rng.integers(0, C, size=len(dup_f))

        for c in range(C):
            mine = (consumer == c) & delivered
            rows = _Rows()
            rows.add("deliver", qname, msg_id[mine], deliver_ts[mine], redelivered=np.zeros(int(mine.sum()), bool))
            u = dup_u[consumer[dup_u] == c]
            rows.add("deliver", qname, msg_id[u], deliver_ts[u] + 1, redelivered=np.zeros(len(u), bool))
            f = dup_f[flagged_consumer == c]
            again_ts = _stall(deliver_ts[f] + REDELIVERY_AFTER_NS, spec.faults, spec.start_ns, rng,
                              spec.delivery_latency_ms)
            rows.add("deliver", qname, msg_id[f], again_ts, redelivered=np.ones(len(f), bool))
            e = unexpected_consumer == c
            rows.add("deliver", qname, unexpected_ids[e], unexpected_ts[e], redelivered=np.zeros(int(e.sum()), bool))
            r = re_consumer == c
            rows.add("deliver", qname, msg_id[republished[r]], re_deliver_ts[r], redelivered=np.zeros(int(r.sum()), bool))
            if spec.acks:
                rows.add("ack", qname, msg_id[mine], deliver_ts[mine] + ACK_AFTER_DELIVER_NS)
            emit(f"con-{q}-{c}", nodes[c % len(nodes)], rows)

        qt.published = n
        qt.confirmed = int(confirmed.sum()) + len(republished)
        qt.delivered = int(delivered.sum()) + d.unexpected
        qt.deliveries = qt.delivered + len(dup_f) + len(dup_u) + len(republished)
        if spec.drained:
            qt.lost = len(lost)
            qt.lost_ids = {int(x) for x in msg_id[lost]}
            for i in lost:
                w = _window_of(int(pub_ts[i]), spec)
                qt.lost_by_window[w] = qt.lost_by_window.get(w, 0) + 1
        else:
            qt.unread, qt.drained = len(lost), 0
        qt.duplicates = len(dup_f) + len(dup_u) + len(republished)
        qt.duplicates_without_redelivered = len(dup_u) + len(republished)
        qt.duplicates_unexplained = len(dup_u)
        qt.unexpected = d.unexpected
        qt.reordered_unexplained = len(first_of_pair)
        qt.reordered = len(first_of_pair) + _descents_of_second_copies(
            republished, re_consumer, seq, pub_no, consumer, delivered, deliver_ts, dup_u)
        qt.nacked = len(nacked)
        qt.nacked_delivered = len(nacked) - len(nacked) // 2
        qt.unconfirmed = len(unconfirmed)
        qt.unconfirmed_delivered = len(unconfirmed) - len(unconfirmed) // 2
        qt.returned = len(returned)

    lab = _Rows()
    for f in spec.faults:
        if f.recorded:
            fs = spec.start_ns + int(f.start_s * NS_PER_S)
            fe = fs + int(f.duration_s * NS_PER_S)
            lab.add("fault", "", None, [fs, fe], detail=[fault_start(f.name), fault_end(f.name)])
    for q in range(spec.queues):  # at the run's last event, so the drain does not lengthen the run
        lab.add("drain", spec.queue_name(q), None, [last_ts[0]],
                detail=[drain_detail(spec.drained, "stopped before the queue was empty")])
    emit("lab", "", lab)
    return truth
