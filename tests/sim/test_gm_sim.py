"""Seeded simulations of GM groups (seed 004 §4.2.3–4.2.4): under random kills of up to all but
one member, joins racing deaths, leaves, random latencies and FIFO links that lose what was
in flight when a member dies, survivors agree on every sender's messages, lose nothing any
survivor delivered, deliver nothing twice, deliver everything a survivor broadcast, report
each death after the same last message, and empty their caches. Broken variants of the
protocol are caught."""

from __future__ import annotations

import pytest

from hutch.mirror.gm import GMMember
from hutch.mirror.gmsim import GMSimOptions, GMSimulation, run_seed


def _run_range(first: int, count: int, **kw) -> dict:
    failed, totals = [], {}
    for seed in range(first, first + count):
        res = run_seed(seed, **kw)
        if not res.ok:
            failed.append(f"seed {seed}: {res.violation}")
        for k, v in res.stats.items():
            totals[k] = totals.get(k, 0) + v
    assert not failed, "\n".join(failed[:20]) + "\n(replay: python -m hutch.mirror.gmsim --seed N -v)"
    return totals


@pytest.mark.parametrize("chunk", range(2))
def test_survivors_agree_and_lose_nothing_under_random_kills_joins_and_leaves(chunk):
    totals = _run_range(chunk * 800, 800)
    # the runs do exercise what they claim to
    for k in ("kills", "joins", "joins_failed", "leaves", "probes"):
        assert totals[k] > 10, (k, totals)
    assert totals["deliveries"] > 100_000


def test_joins_racing_deaths_all_the_time_keep_the_same_properties():
    totals = _run_range(100_000, 600, profile="churn")
    assert totals["joins_failed"] > 50 and totals["kills"] > 2000


def test_six_member_groups_with_long_runs():
    _run_range(200_000, 60, members=6, broadcasts_max=2000, profile="churn")


def test_a_seed_replays_exactly():
    a = GMSimulation(GMSimOptions(seed=4242, trace=True, profile="churn")).run()
    b = GMSimulation(GMSimOptions(seed=4242, trace=True, profile="churn")).run()
    assert a.trace and a.trace == b.trace and a.stats == b.stats


class _NoResendToNewNeighbour(GMMember):
    """Forgets that a new right neighbour may lack what this member holds."""

    def _set_right(self, new):
        super()._set_right(new)
        self._catchup_due = False


class _StableAtOnce(GMMember):
    """Calls a message stable as soon as it is sent (what a confirm must never do)."""

    def _settle(self, s):
        self._left_has[s] = self._streams[s].received
        super()._settle(s)

    def broadcast(self, payload):
        seq = super().broadcast(payload)
        self._settle(self.id)
        return seq


class _EveryoneEndsDeadStreams(GMMember):
    """No single heir: each member ends a dead member's stream at what it holds itself."""

    def _recompute(self):
        super()._recompute()
        if self.status == "member":
            for x in sorted(self._dead - self._aliases):
                if x in self._pos:
                    self._aliases.add(x)
                    self._inherit(x)


@pytest.mark.parametrize("broken,expect", [
    (_NoResendToNewNeighbour, ""),
    (_StableAtOnce, "Stable"),
    (_EveryoneEndsDeadStreams, ""),
])
def test_simulator_catches_a_deliberately_broken_gm(broken, expect):
    for seed in range(300):
        res = run_seed(seed, member_class=broken)
        if not res.ok:
            assert expect in res.violation, res.violation
            return
    pytest.fail(f"{broken.__name__} went unnoticed for 300 seeds")
