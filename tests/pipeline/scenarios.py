"""Synthetic histories the checkers are tried on, each with its defects known in advance.

Each publisher sends 3000 messages at 1000 per second, so a run lasts about three seconds
(longer where faults stall it); faults lie inside the publishing period.
"""

from __future__ import annotations

from hutch.pipeline.synth import Defects, Fault, QueueTruth, SynthSpec, Truth

BASE = dict(messages_per_publisher=3000, rate_per_publisher=1000.0)

SCENARIOS: dict[str, SynthSpec] = {
    "clean": SynthSpec(run_id="clean", **BASE),
    "losses_in_a_failover": SynthSpec(
        run_id="failover", faults=(Fault("kill-node1", 1.0, 1.2),), defects=Defects(lost=7), seed=1, **BASE
    ),
    "duplicates_with_and_without_flag": SynthSpec(
        run_id="dups", defects=Defects(dup_flagged=5, dup_unflagged=4), consumers_per_queue=3, seed=2, **BASE
    ),
    "republished_messages_explain_their_repeats_and_reorders": SynthSpec(
        run_id="again", defects=Defects(republished=12, dup_unflagged=2, reordered=3), consumers_per_queue=2, seed=8,
        **BASE
    ),
    "reorders_and_unexpected": SynthSpec(
        run_id="order", defects=Defects(reordered=8, unexpected=3), publishers_per_queue=3, seed=3, **BASE
    ),
    "nacks_returns_and_unconfirmed": SynthSpec(
        run_id="outcomes", defects=Defects(nacked=6, unconfirmed=8, returned=3), seed=4, **BASE
    ),
    "an_outage_nobody_announced": SynthSpec(
        run_id="silent",
        faults=(Fault("partition", 0.5, 1.1), Fault("unannounced", 2.0, 1.4, recorded=False)),
        seed=5,
        **BASE,
    ),
    "a_run_that_did_not_drain": SynthSpec(
        run_id="undrained", faults=(Fault("kill-node1", 1.0, 1.2),), defects=Defects(lost=6), drained=False, seed=7,
        **BASE,
    ),
    "everything_at_once": SynthSpec(
        run_id="all",
        queues=3,
        faults=(Fault("kill-node1", 0.8, 1.5), Fault("partition", 2.6, 1.0)),
        defects=Defects(lost=4, dup_flagged=3, dup_unflagged=2, reordered=5, unexpected=2, nacked=2, unconfirmed=4,
                        returned=1, republished=3),
        seed=6,
        **BASE,
    ),
}

COUNT_FIELDS = [f for f in QueueTruth.__dataclass_fields__ if f not in ("lost_ids", "lost_by_window")]
GAP_SLACK_S = 0.2  # a stall's gap is its window plus a delivery latency or two


def assert_matches_truth(summary: dict, lost_ids: dict[str, set[int]], gaps: list, truth: Truth) -> None:
    """A checker's findings against the defects that were injected."""
    run = summary["runs"][truth.run_id]
    assert set(run["queues"]) == set(truth.queues)
    for queue, qt in truth.queues.items():
        s = run["queues"][queue]
        for name in COUNT_FIELDS:
            assert s[name] == getattr(qt, name), f"{queue}.{name}: found {s[name]}, injected {getattr(qt, name)}"
        assert lost_ids.get(queue, set()) == qt.lost_ids
        assert s["lost_by_window"] == qt.lost_by_window
        mine = [g for g in gaps if g.queue == queue]
        stalls = [f for f in truth.faults if f.stall]
        assert len(mine) == 2 * len(stalls), mine  # one delivery gap and one confirm gap per stall
        for f in stalls:
            for kind in ("deliver", "confirm"):
                (g,) = [g for g in mine if g.kind == kind and abs(g.gap_ms / 1000 - f.duration_s) < GAP_SLACK_S]
                assert g.cause == (f.name if f.recorded else None)
                assert g.recovered
        if stalls:
            assert s["max_gap_ms"] >= max(f.duration_s for f in stalls) * 1000
        else:
            assert s["max_gap_ms"] == 0

