"""The reference checker and the shared definitions, on hand-made and synthetic histories (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hutch.pipeline.history import SCHEMA, drain_detail, fault_end, fault_start, message_id
from hutch.pipeline.model import (
    NS_PER_MS,
    Bin,
    Expectation,
    fault_events,
    fault_windows,
    gaps_from_bins,
    window_of,
)
from hutch.pipeline.reference import _gaps, check_table
from hutch.pipeline.synth import generate

from .scenarios import SCENARIOS, assert_matches_truth

MS = NS_PER_MS


class History:
    """A hand-written history: rows in the order each client recorded them."""

    def __init__(self, run_id="r"):
        self.run_id = run_id
        self.rows = []
        self.seq = {}

    def add(self, client, op, queue="q", msg_id=None, ts_ms=0.0, redelivered=None, detail=""):
        cseq = self.seq.get(client, 0)
        self.seq[client] = cseq + 1
        self.rows.append({"run_id": self.run_id, "client_id": client, "node": "n1", "queue": queue, "op": op,
                          "msg_id": msg_id, "redelivered": redelivered, "ts_ns": int(ts_ms * MS), "detail": detail,
                          "client_seq": cseq})
        return self

    def table(self):
        return pa.Table.from_pylist(self.rows, schema=SCHEMA)

    def check(self, gap_ms=1000.0):
        return check_table(self.table(), gap_ms)


def summary_of(f, queue="q", run="r"):
    return f.summary["runs"][run]["queues"][queue]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_reference_finds_exactly_the_injected_defects(name, tmp_path):
    truth = generate(SCENARIOS[name], tmp_path, rows_per_file=4000)
    from hutch.pipeline.reference import check_history

    f = check_history(tmp_path)
    lost = {}
    for r in f.lost:
        lost.setdefault(r["queue"], set()).add(r["msg_id"])
    assert_matches_truth(f.summary, lost, f.gaps, truth)


def _outcomes_history(drain: str | None) -> History:
    h = History()
    for i, (confirm, ret, deliver) in enumerate([(1, 0, 1), (1, 0, 0), (1, 1, 0), (0, 0, 0)]):
        m = message_id(0, i)
        h.add("p", "publish", msg_id=m, ts_ms=i)
        if ret:
            h.add("p", "return", msg_id=m, ts_ms=i + 0.5)
        if confirm:
            h.add("p", "confirm", msg_id=m, ts_ms=i + 1)
        if deliver:
            h.add("c", "deliver", msg_id=m, ts_ms=i + 2, redelivered=False)
    if drain is not None:
        h.add("c", "drain", ts_ms=10, detail=drain)
    return h


def test_confirmed_and_never_delivered_is_lost_on_a_drained_queue_but_a_returned_message_is_not():
    s = summary_of(_outcomes_history(drain_detail(True)).check())
    assert (s["published"], s["confirmed"], s["delivered"], s["lost"], s["unread"], s["drained"]) == (4, 3, 1, 1, 0, 1)
    assert (s["returned"], s["unconfirmed"], s["unconfirmed_delivered"]) == (1, 1, 0)


@pytest.mark.parametrize("drain", [None, drain_detail(False, "messages left: q=1")])
def test_confirmed_and_never_delivered_is_unread_when_the_run_did_not_drain(drain):
    f = _outcomes_history(drain).check()
    s = summary_of(f)
    assert (s["confirmed"], s["delivered"], s["lost"], s["unread"], s["drained"]) == (3, 1, 0, 1, 0)
    assert f.lost == []


def test_a_repeat_counts_as_duplicate_and_without_redelivered_only_when_the_flag_is_missing():
    h = History()
    a, b = message_id(0, 0), message_id(0, 1)
    h.add("p", "publish", msg_id=a, ts_ms=0).add("p", "publish", msg_id=b, ts_ms=1)
    h.add("c1", "deliver", msg_id=a, ts_ms=2, redelivered=False)
    h.add("c1", "deliver", msg_id=a, ts_ms=3, redelivered=True)  # flagged repeat
    h.add("c2", "deliver", msg_id=a, ts_ms=4, redelivered=False)  # unflagged repeat
    h.add("c1", "deliver", msg_id=b, ts_ms=5, redelivered=True)  # first delivery flagged: not a duplicate
    s = summary_of(h.check())
    assert (s["delivered"], s["deliveries"], s["duplicates"], s["duplicates_without_redelivered"]) == (2, 4, 2, 1)


def test_a_second_publish_explains_one_unflagged_repeat_and_the_reorder_it_causes():
    h = History()
    a, b, c = (message_id(0, i) for i in range(3))
    for m, t in ((a, 0), (b, 1), (c, 2), (b, 3)):  # b's confirm was lost: its publisher sent it again
        h.add("p", "publish", msg_id=m, ts_ms=t)
    for m, t in ((a, 4), (b, 5), (c, 6), (b, 7), (b, 8), (a, 9)):
        h.add("c", "deliver", msg_id=m, ts_ms=t, redelivered=False)
    f = h.check()
    s = summary_of(f)
    # b: three unflagged deliveries for two publishes, one unexplained; a: two for one publish
    assert (s["duplicates"], s["duplicates_without_redelivered"], s["duplicates_unexplained"]) == (3, 3, 2)
    # c -> b is explained by b's second publish; b -> a is not
    assert (s["reordered"], s["reordered_unexplained"]) == (2, 1)
    assert {(r["prev_seq"], r["seq"], r["republished"]) for r in f.reorders} == {(2, 1, True), (1, 0, False)}
    assert {r["msg_id"]: r["unexplained"] for r in f.duplicates} == {a: 1, b: 1}


def test_reorders_are_descents_of_one_publishers_seq_in_one_consumers_stream():
    h = History()
    for seq in range(6):
        h.add("p0", "publish", msg_id=message_id(0, seq), ts_ms=seq)
        h.add("p1", "publish", msg_id=message_id(1, seq), ts_ms=seq)
    # consumer c1 sees p0: 0 2 1 3 (one descent); p1 interleaved in order
    for seq in (0, 2, 1, 3):
        h.add("c1", "deliver", msg_id=message_id(0, seq), ts_ms=10, redelivered=False)
        if seq in (0, 1):
            h.add("c1", "deliver", msg_id=message_id(1, seq), ts_ms=10, redelivered=False)
    # consumer c2 gets p0: 5 then 4 redelivered (not counted), p1: 5 4 (one descent)
    h.add("c2", "deliver", msg_id=message_id(0, 5), ts_ms=11, redelivered=False)
    h.add("c2", "deliver", msg_id=message_id(0, 4), ts_ms=12, redelivered=True)
    h.add("c2", "deliver", msg_id=message_id(1, 5), ts_ms=13, redelivered=False)
    h.add("c2", "deliver", msg_id=message_id(1, 4), ts_ms=14, redelivered=False)
    f = h.check()
    assert summary_of(f)["reordered"] == 2
    assert {(r["client_id"], r["publisher"], r["prev_seq"], r["seq"]) for r in f.reorders} == {("c1", 0, 2, 1), ("c2", 1, 5, 4)}


def test_delivery_of_an_id_nobody_published_is_unexpected():
    h = History().add("p", "publish", msg_id=1, ts_ms=0)
    h.add("c", "deliver", msg_id=1, ts_ms=1, redelivered=False).add("c", "deliver", msg_id=99, ts_ms=2, redelivered=False)
    assert summary_of(h.check())["unexpected"] == 1


def test_a_stall_counts_only_while_clients_publish_and_names_the_nearest_fault():
    h = History()
    h.add("lab", "fault", queue="", ts_ms=995, detail=fault_start("kill-b"))
    h.add("lab", "fault", queue="", ts_ms=3000, detail=fault_end("kill-b"))
    for i, t in enumerate([0, 500, 1000, 4000, 4500]):  # 3 s without deliveries from 1000 to 4000
        h.add("p", "publish", msg_id=i, ts_ms=t - 1)
        h.add("c", "deliver", msg_id=i, ts_ms=t, redelivered=False)
    h.add("p", "publish", msg_id=10, ts_ms=2000)  # someone tried during the stall
    h.add("c", "deliver", msg_id=10, ts_ms=4001, redelivered=False)
    h.add("c", "deliver", msg_id=11, ts_ms=9000, redelivered=False)  # idle 4.5 s, nobody publishing: no gap
    f = h.check(gap_ms=1000)
    (g,) = f.gaps
    assert (g.kind, g.start_ns, g.end_ns, g.cause, g.recovered) == ("deliver", 1000 * MS, 4000 * MS, "kill-b", True)
    assert g.recovery_ms == pytest.approx(3005)
    s = summary_of(f)
    assert (s["gaps"], s["max_gap_ms"], s["max_delivery_gap_ms"], s["max_confirm_gap_ms"]) == (1, 3000, 3000, 0)


def test_a_queue_that_never_recovers_has_an_open_gap_to_the_end_of_the_run():
    h = History()
    h.add("p", "publish", msg_id=1, ts_ms=0).add("c", "deliver", msg_id=1, ts_ms=1, redelivered=False)
    for i in range(2, 7):
        h.add("p", "publish", msg_id=i, ts_ms=i * 1000)
    (g,) = h.check(gap_ms=1000).gaps
    assert (g.start_ns, g.end_ns, g.recovered, g.cause) == (1 * MS, 6000 * MS, False, None)


def test_fault_windows_pair_start_with_end_and_an_unclosed_one_lasts_to_the_run_end():
    ev = fault_events([("r", 10, fault_start("p")), ("r", 20, fault_end("p")), ("r", 15, fault_start("k")),
                       ("r", 30, "kill x"), ("r", 40, fault_end("nothing-open"))])
    ws = fault_windows(ev, {"r": 100})
    assert [(w.name, w.start_ns, w.end_ns, w.closed) for w in ws] == [("p", 10, 20, True), ("k", 15, 100, False)]
    assert [window_of(ws, "r", t) for t in (5, 12, 16, 25, None)] == ["healthy", "p", "k", "k", "unknown"]


def test_gaps_from_bins_equal_the_gaps_of_the_sorted_times():
    import random

    rnd = random.Random(7)
    gap_ns = 50 * MS
    for _ in range(200):
        deliveries, publishes, t = [], [], 0
        for _ in range(rnd.randint(1, 30)):
            t += rnd.choice([rnd.randint(1, 40), rnd.randint(40, 60), rnd.randint(60, 300)]) * MS + rnd.randint(0, 999)
            (deliveries if rnd.random() < 0.6 else publishes).append(t)
        if not deliveries:
            continue
        end = t + rnd.randint(0, 200) * MS

        def binned(ts):
            out = {}
            for x in ts:
                b = out.setdefault(x // gap_ns, [0, x, x])
                b[0] += 1
                b[1], b[2] = min(b[1], x), max(b[2], x)
            return [Bin(k, *v) for k, v in out.items()]

        direct = _gaps([], "r", "q", "deliver", deliveries, publishes, end, gap_ns)
        via_bins = gaps_from_bins("r", "q", "deliver", binned(deliveries), binned(publishes), end, gap_ns, [])
        assert via_bins == direct


def test_expectations_read_like_the_summary_fields():
    summary = {"runs": {"r": {"queues": {"a": {"lost": 0, "max_gap_ms": 7000}, "b": {"lost": 2, "max_gap_ms": 10}}}}}
    assert Expectation.parse("lost=0").broken_by(summary) == ["run r queue b: lost is 2, expected lost=0"]
    assert Expectation.parse("max_gap_ms <= 5000").broken_by(summary) == [
        "run r queue a: max_gap_ms is 7000, expected max_gap_ms<=5000"]
    assert Expectation.parse("published>=0").broken_by(summary) == []
    with pytest.raises(ValueError, match="lost=0"):
        Expectation.parse("lots=0")
