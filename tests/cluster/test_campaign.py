"""The Jepsen-style campaign on quorum queues (`hutch.lab.campaign`): its nemesis plan is a pure
function of the seed, its total-queue check counts what RabbitMQ's Jepsen checker counts
(lost: confirmed and never consumed; unexpected: consumed and never published; duplicates
reported), and a short campaign on a real 3-node lab — a kill, a partition and a suspend at
least — loses no confirmed message and delivers nothing unexpected."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from hutch.lab.campaign import (
    FAULT_KINDS,
    CampaignConfig,
    CampaignError,
    Tally,
    plan_fault,
    run_campaign,
)
from tests.support.lab import free_base_port

NAMES3 = [f"hutch-{i}@localhost" for i in (1, 2, 3)]
NAMES5 = [f"hutch-{i}@localhost" for i in (1, 2, 3, 4, 5)]
HOLD = (4.0, 10.0)
MODES = ("blackhole", "reset")


def plans(seed: int, count: int, names=NAMES3, leaders=None, kinds=FAULT_KINDS):
    rng = random.Random(seed)
    leaders = leaders if leaders is not None else {"q": names[1]}
    return [plan_fault(rng, kinds, names, leaders, HOLD, MODES) for _ in range(count)]


def test_the_nemesis_replays_the_same_faults_from_the_same_seed():
    assert plans(7, 50) == plans(7, 50)
    assert plans(7, 50) != plans(8, 50)


def test_the_sequence_of_fault_kinds_does_not_depend_on_where_the_leader_is():
    a = plans(3, 40, leaders={"q": NAMES3[0]})
    b = plans(3, 40, leaders={"q": None})
    assert [p.kind for p in a] == [p.kind for p in b]
    assert [p.hold_s for p in a] == [p.hold_s for p in b]


def test_every_fault_kind_is_drawn_and_holds_stay_in_range():
    drawn = plans(1, 300)
    assert {p.kind for p in drawn} == set(FAULT_KINDS)
    assert all(HOLD[0] <= p.hold_s <= HOLD[1] for p in drawn)


def test_partition_leader_isolates_the_queue_leader():
    for p in plans(2, 100, leaders={"q": NAMES3[2]}, kinds=("partition-leader",)):
        assert p.nodes == (NAMES3[2],) and p.mode in MODES


def test_partition_halves_leaves_a_majority_on_one_side_of_five_nodes():
    for p in plans(4, 100, names=NAMES5, kinds=("partition-halves",)):
        assert 1 <= len(p.nodes) <= 2


def test_kill_and_suspend_aim_at_the_leader_about_half_the_time():
    drawn = plans(5, 200, leaders={"q": NAMES3[0]}, kinds=("kill", "suspend"))
    at_leader = sum(p.nodes == (NAMES3[0],) for p in drawn)
    assert all(len(p.nodes) == 1 for p in drawn)
    assert 0.5 * 200 <= at_leader <= 0.8 * 200  # half aimed at it, plus random picks that hit it


def test_a_delay_slows_one_pair_of_nodes():
    for p in plans(6, 50, kinds=("delay",)):
        assert len(set(p.nodes)) == 2 and p.delay_ms > 0


def test_the_total_queue_check_counts_lost_unexpected_and_duplicates():
    t = Tally()
    t.published = {1: 10, 2: 10, 3: 10, 4: 10}
    t.confirmed = {1: 20, 2: 25, 3: 30}  # 4 is unconfirmed: it may come out or not
    t.deliveries = {1: 1, 2: 3, 4: 1, 99: 1}  # 3 never came out; 99 was never published
    t.deliveries_total = 6
    c = t.check()
    assert (c["lost"], c["unexpected"], c["duplicates"]) == (1, 1, 2)
    assert (c["unconfirmed"], c["unconfirmed_delivered"]) == (1, 1)
    assert c["confirm_latency_ms"]["count"] == 3


def test_a_campaign_refuses_what_it_cannot_run():
    with pytest.raises(CampaignError):
        CampaignConfig(nodes=4)
    with pytest.raises(CampaignError):
        CampaignConfig(faults=("partition-bridge",))
    with pytest.raises(CampaignError):
        CampaignConfig(queues=2, consumers=1)


def _seed_covering(cfg: CampaignConfig, first: int) -> int:
    """The first seed whose nemesis, configured as `cfg`, draws every one of its kinds in its
    first `first` faults (it draws the healthy pause before each fault from the same RNG)."""
    for seed in range(1, 1000):
        rng = random.Random(seed)
        drawn = set()
        for _ in range(first):
            rng.uniform(*cfg.healthy_s)
            drawn.add(plan_fault(rng, cfg.faults, NAMES3, {"q": None}, cfg.fault_hold_s, cfg.partition_modes).kind)
        if set(cfg.faults) <= drawn:
            return seed
    raise AssertionError("no seed covers every kind")


def _short_campaign(tmp_path, queue_type: str):
    """30 s of kills, leader partitions and suspends on 3 nodes, a seed that draws all three."""
    cfg = CampaignConfig(duration_s=30.0, publishers=2, consumers=2, rate_per_publisher=25.0, queue_type=queue_type,
                         faults=("kill", "partition-leader", "suspend"), healthy_s=(1.0, 2.0),
                         fault_hold_s=(5.0, 6.0), drain_quiet_s=3.0, late_confirms_s=15.0, drain_timeout_s=60.0)
    cfg = dataclasses.replace(cfg, seed=_seed_covering(cfg, 3))
    result = run_campaign(cfg, tmp_path / "out", base_port=free_base_port(3), tied_to_caller=True)
    applied = {f["kind"] for f in result.faults if f["applied"]}
    assert {"kill", "partition-leader", "suspend"} <= applied, result.faults
    return cfg, result


@pytest.mark.timeout(240)
def test_a_short_campaign_loses_no_confirmed_message(tmp_path):
    cfg, result = _short_campaign(tmp_path, "quorum")
    seed = cfg.seed
    check = result.check
    detail = json.dumps({k: check[k] for k in ("lost", "lost_examples", "unexpected", "unexpected_examples")})
    assert check["confirmed"] > 500, check
    assert check["lost"] == 0, f"confirmed messages lost (seed {seed}, history {result.history_dir}): {detail}"
    assert check["unexpected"] == 0, detail
    assert result.drained, result.verdict
    assert result.reference is not None and result.reference["lost"] == 0 and result.reference["unexpected"] == 0
    # every unflagged repeat and every reorder is one a publisher's second publish explains
    assert result.reference["duplicates_unexplained"] == 0, result.verdict
    assert result.reference["reordered_unexplained"] == 0, result.verdict
    assert result.ok, result.verdict
    # read from each queue's leader, after the drain
    assert list(result.queue_depths_after.values()) == [0] * cfg.queues, result.queue_views_after
    _assert_copies_compared(result, copies=3)


def _assert_copies_compared(result, copies: int) -> None:
    """Every copy of every queue gave its digest after the drain, at one point, and they agree."""
    for q, rep in result.replicas.items():
        assert rep["copies"] == copies and len(rep["points"]) == 1, (q, rep)
        assert rep["problems"] == [], (q, rep["problems"])


@pytest.mark.timeout(240)
def test_a_short_campaign_on_mirrored_queues_loses_no_confirmed_message(tmp_path):
    """Mirroring that promises what a quorum queue does (every node, automatic sync, promotion
    only when synchronised, pause_minority). It lost confirmed messages when the leader was cut
    off: the leader confirmed what became stable only because it had declared the mirrors
    beyond the cut dead, and the majority promoted one of them."""
    cfg, result = _short_campaign(tmp_path, "mirrored")
    assert result.check["confirmed"] > 500, result.check
    assert result.check["lost"] == 0, f"seed {cfg.seed}: {result.verdict}; history {result.history_dir}"
    assert result.check["unexpected"] == 0 and result.drained, result.verdict
    assert result.reference["lost"] == 0 and result.reference["duplicates_unexplained"] == 0, result.verdict
    _assert_copies_compared(result, copies=3)
    # not asserted: order. A publish that reaches a promoted mirror before its promotion completes
    # is answered "retry" and sent again, and a later one of the same channel can get in first
    # (docs/mirroring.md); the campaign reports it (reordered_unexplained)


@pytest.mark.timeout(240)
def test_a_short_campaign_on_durable_classic_queues_loses_no_confirmed_message(tmp_path):
    """One copy on its home node: kills and suspends of that node make the queue unavailable
    until it is back, and what it confirmed was on its disk."""
    cfg, result = _short_campaign(tmp_path, "classic")
    assert result.check["confirmed"] > 500, result.check
    assert result.check["lost"] == 0, f"seed {cfg.seed}: {result.verdict}; history {result.history_dir}"
    assert result.check["unexpected"] == 0 and result.drained, result.verdict
    assert result.reference["lost"] == 0 and result.reference["duplicates_unexplained"] == 0, result.verdict
    assert result.ok, result.verdict
    assert all(rep["copies"] == 0 for rep in result.replicas.values()), result.replicas  # nothing to compare


@pytest.mark.timeout(240)
def test_a_short_campaign_on_a_stream_with_disk_faults(tmp_path):
    """A stream written over AMQP 0-9-1 with confirms and read from its first offset, while a
    node's fsync fails (it must stop, and is started again) and a node's disk fills up (its
    publishers are blocked): no confirmed message lost, no copy stored twice unless its
    publisher sent it twice, every offset read the same from every replica, and the replicas'
    chunks the same up to their common end."""
    cfg = CampaignConfig(duration_s=15.0, publishers=2, consumers=2, rate_per_publisher=25.0, queue_type="stream",
                         faults=("fsync-error", "disk-full", "kill"), healthy_s=(1.0, 1.5), fault_hold_s=(3.0, 4.0),
                         drain_quiet_s=2.0, late_confirms_s=15.0, drain_timeout_s=60.0)
    cfg = dataclasses.replace(cfg, seed=_seed_covering(cfg, 3))
    result = run_campaign(cfg, tmp_path / "out", base_port=free_base_port(3), tied_to_caller=True)
    applied = {f["kind"] for f in result.faults if f["applied"]}
    assert {"fsync-error", "disk-full", "kill"} <= applied, result.faults
    fsync = [f for f in result.faults if f["kind"] == "fsync-error"]
    assert all(f["stopped_node"] for f in fsync), fsync  # the node stopped at its next fsync
    assert result.fault_counts["kill"] >= 1 + len(fsync)  # and counts as killed
    check = result.check
    assert check["confirmed"] > 200, check
    assert check["lost"] == 0 and check["unexpected"] == 0, result.verdict
    assert check["offset_conflicts"] == 0 and result.drained, result.verdict
    assert result.reference["lost"] == 0 and result.reference["duplicates_unexplained"] == 0, result.verdict
    _assert_copies_compared(result, copies=3)
    assert result.ok, result.verdict
