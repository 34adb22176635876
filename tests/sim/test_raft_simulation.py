"""Seeded whole-cluster simulations: the properties of Raft hold under every fault mix, runs
replay exactly from their seed, and deliberately broken implementations are caught."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from hutch.raft.sim import SimOptions, Simulation, run_seed

SEEDS_PER_CHUNK = 625  # `make soak` runs a million
PARALLEL_FROM = 1000  # seed ranges this long run on every core (each seed is independent)


def _violations(seeds: range, kw: dict) -> list[str]:
    out = []
    for seed in seeds:
        res = run_seed(seed, **kw)
        if not res.ok:
            out.append(f"seed {seed}: {res.violation}")
    return out


def _run_range(first: int, count: int, **kw) -> None:
    workers = min(os.cpu_count() or 1, 4)
    if count < PARALLEL_FROM or workers < 2:
        failed = _violations(range(first, first + count), kw)
    else:
        with ProcessPoolExecutor(workers) as pool:
            parts = [range(first + i, first + count, workers) for i in range(workers)]
            failed = sorted(sum(pool.map(functools.partial(_violations, kw=kw), parts), []))
    assert not failed, "\n".join(failed[:20]) + "\n(replay: hutch sim raft --seed N -v)"


# 2 x 625 = 1,250 seeds of the light scenario (3 nodes, 2 s of faults, then healing).
@pytest.mark.parametrize("chunk", range(2))
def test_safety_linearizability_and_liveness_hold_for_1250_seeds(chunk):
    _run_range(chunk * SEEDS_PER_CHUNK, SEEDS_PER_CHUNK)


def test_five_node_clusters_hold_the_same_properties():
    _run_range(100_000, 150, nodes=5)


def test_constant_leader_churn_holds_the_same_properties():
    _run_range(200_000, 150, profile="churn")
    _run_range(300_000, 100, profile="churn", nodes=5)


@pytest.mark.parametrize("seed", [7, 1234, 99_999])
def test_long_runs_hold_the_same_properties(seed):
    res = run_seed(seed, fault_ms=30_000, ops_per_client_max=400)
    assert res.ok, res.violation
    assert res.stats["applied"] > 100


def test_a_seed_replays_exactly():
    a = Simulation(SimOptions(seed=4242, trace=True)).run()
    b = Simulation(SimOptions(seed=4242, trace=True)).run()
    assert a.trace == b.trace and a.stats == b.stats and a.trace


def test_runs_exercise_the_faults_they_claim_to():
    totals: dict[str, int] = {}
    for seed in range(500, 700):
        for k, v in run_seed(seed).stats.items():
            totals[k] = totals.get(k, 0) + v
    for k in ("crashes", "partitions", "conf_changes", "transfers", "snapshots_sent", "elections", "ops"):
        assert totals[k] > 20, (k, totals)


# Each deliberate bug must be caught by some checker within the given seeds.
@pytest.mark.parametrize(
    "bug,kw,seeds,expect",
    [
        ("vote_twice", {}, range(0, 200), "election safety"),
        ("vote_ignores_log", {}, range(0, 200), ""),
        ("skip_prev_term_check", {}, range(0, 400), ""),
        ("read_without_quorum", {}, range(0, 300), "linearizability"),
        # Figure 8 needs a leader to commit an old entry and crash at once: rare, so it takes
        # the churn profile on five nodes and several hundred seeds (the first catch is 767).
        pytest.param("commit_previous_term", {"nodes": 5, "profile": "churn"}, range(1, 1000), "",
                     marks=pytest.mark.slow),
    ],
)
def test_simulator_catches_a_deliberately_broken_raft(bug, kw, seeds, expect):
    for seed in seeds:
        res = run_seed(seed, bugs=frozenset({bug}), **kw)
        if not res.ok:
            assert expect in res.violation, res.violation
            return
    pytest.fail(f"{bug} went unnoticed for {len(seeds)} seeds")
