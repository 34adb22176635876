"""hutch.simkernel.SeedPool: seeds on worker processes, and sweeps that take only idle cores."""

from __future__ import annotations

import os

from hutch.simkernel import SeedPool, SimResult, run_seeds_on_pool


def _scheduling_policy(seed: int) -> tuple[int, int]:
    return seed, os.sched_getscheduler(0)


def test_a_pool_gives_back_every_seed_in_order_from_its_workers():
    with SeedPool(jobs=2) as pool:
        batch = pool.submit(_scheduling_policy, range(1, 26), chunk=3)
        assert [seed for seed, _ in batch.results(timeout_s=60)] == list(range(1, 26))


def test_an_idle_pool_runs_its_workers_only_on_idle_cores_and_a_plain_one_does_not():
    with SeedPool(jobs=1, idle=True) as idle, SeedPool(jobs=1) as plain:
        assert {policy for _, policy in idle.submit(_scheduling_policy, [1, 2]).results(timeout_s=60)} == {os.SCHED_IDLE}
        assert {policy for _, policy in plain.submit(_scheduling_policy, [1]).results(timeout_s=60)} == {os.SCHED_OTHER}


def _every_seventh_fails(seed: int) -> SimResult:
    bad = seed % 7 == 0
    return SimResult(seed, not bad, f"seed {seed} broke" if bad else None)


def test_seeds_run_on_the_pool_report_each_failure_with_its_replay_in_seed_order():
    lines: list[str] = []
    failed = run_seeds_on_pool(_every_seventh_fails, 1, 30, lambda s: f"replay {s}",
                               lambda line, err=False: lines.append(line), jobs=2, window=8)
    assert failed == 4
    assert [line for line in lines if "FAILED" in line] == [f"seed {s}: FAILED: seed {s} broke" for s in (7, 14, 21, 28)]
    assert [line for line in lines if "reproduce" in line] == [f"  reproduce: replay {s} -v" for s in (7, 14, 21, 28)]
    assert lines[-1].startswith("30 seed(s) from 1: 4 failed in ") and lines[-1].endswith("on 2 worker(s)")
