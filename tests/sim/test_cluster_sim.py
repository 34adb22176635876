"""The whole-cluster simulation (hutch.sim.cluster): real nodes in one process on simulated time,
network and clients; a seed names one run exactly, and each run ends with its checks
(docs/design/simulation.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hutch.sim.cluster import FAILURE_KINDS, run_seed, trace_digest

# One batch of consecutive seeds: each boots three nodes, publishes with confirms and consumes
# with acks through a quorum queue under partitions, link resets and node crashes, heals, and
# checks every kind in FAILURE_KINDS.
BATCH_FIRST_SEED = 100
BATCH_SEEDS = 40

# Failures the simulation has found and hutch has not fixed yet (docs/design/simulation.md,
# "Found so far"): confirmed messages of a quorum queue that a consumer does not get after
# partitions and crashes. While they stand, a batch that finds only these is an expected
# failure that names its seeds; any other kind fails the test.
KNOWN_DEFECTS = frozenset({"lost", "starved"})


@pytest.fixture(scope="module")
def seed_3():
    return run_seed(3, trace=True)


def test_a_seed_replays_exactly(seed_3):
    again = run_seed(3, trace=True)
    assert seed_3.trace and trace_digest(seed_3) == trace_digest(again)
    assert seed_3.stats == again.stats


def test_a_seed_replays_exactly_in_another_process_whatever_its_hash_seed(seed_3):
    here = trace_digest(seed_3)
    code = "from hutch.sim.cluster import run_seed, trace_digest; print(trace_digest(run_seed(3, trace=True)))"
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONHASHSEED=hash_seed),
                             capture_output=True, text=True, timeout=120, check=True)
        assert out.stdout.strip() == here


def test_other_seeds_run_differently():
    assert trace_digest(run_seed(4, trace=True)) != trace_digest(run_seed(5, trace=True))


def test_known_defects_are_failure_kinds_the_simulation_checks():
    assert KNOWN_DEFECTS <= FAILURE_KINDS


def test_a_batch_of_seeds_keeps_every_promise():
    started = time.perf_counter()
    known, unexpected = [], []
    for seed in range(BATCH_FIRST_SEED, BATCH_FIRST_SEED + BATCH_SEEDS):
        res = run_seed(seed)
        if res.ok:
            continue
        line = f"seed {seed} {res.stats['failed']}: {res.violation} (replay: hutch sim cluster --seed {seed} -v)"
        (known if set(res.stats["failed"]) <= KNOWN_DEFECTS else unexpected).append(line)
    elapsed = time.perf_counter() - started
    print(f"{BATCH_SEEDS} seeds in {elapsed:.1f}s ({BATCH_SEEDS / elapsed:.1f} seeds/s)")
    assert not unexpected, "\n".join(unexpected + known)
    if known:
        pytest.xfail(f"{len(known)} of {BATCH_SEEDS} seeds found known defects:\n" + "\n".join(known))
