"""The partition-handling decisions (hutch.server.partitions) against RabbitMQ 3.13's rules:
pause_minority counts reachable members; pause_if_all_down looks only at the listed nodes that
are members; ignore and autoheal never pause; a partition is an unreachable member that did not
announce a stop."""

from __future__ import annotations

import pytest

from hutch.server.partitions import partitioned_from, pause_reason, should_pause

ABC = ["a", "b", "c"]


@pytest.mark.parametrize("up, pause", [({"a", "b", "c"}, False), ({"a", "b"}, False), ({"a"}, True)])
def test_pause_minority_pauses_at_half_or_less(up, pause):
    assert should_pause("pause_minority", "a", ABC, up) is pause


def test_pause_minority_never_pauses_a_single_node():
    assert should_pause("pause_minority", "a", ["a"], {"a"}) is False


def test_pause_if_all_down_pauses_a_majority_that_lost_every_listed_node():
    assert should_pause("pause_if_all_down", "b", ABC, {"b", "c"}, ["a"]) is True


def test_pause_if_all_down_keeps_a_minority_that_reaches_one_listed_node():
    assert should_pause("pause_if_all_down", "c", ABC, {"c", "a"}, ["a", "b"]) is False


def test_a_listed_node_never_pauses_itself():
    assert should_pause("pause_if_all_down", "a", ABC, {"a"}, ["a"]) is False


def test_listed_nodes_that_are_not_members_do_not_count():
    assert should_pause("pause_if_all_down", "b", ABC, {"b"}, ["x@elsewhere"]) is False
    assert should_pause("pause_if_all_down", "b", ABC, {"b"}, ["x@elsewhere", "a"]) is True


@pytest.mark.parametrize("mode", ["ignore", "autoheal"])
def test_ignore_and_autoheal_never_pause(mode):
    assert should_pause(mode, "a", ABC, {"a"}, ["b"]) is False


def test_partitions_leave_out_reachable_and_stopping_members():
    assert partitioned_from("a", ABC, {"a", "b"}, set()) == ["c"]
    assert partitioned_from("a", ABC, {"a"}, {"c"}) == ["b"]
    assert partitioned_from("a", ABC, {"a", "b", "c"}, set()) == []


def test_pause_minority_pauses_a_majority_side_after_a_partial_partition():
    """a lost b while c still reaches b: a sees a majority (a, c) and pauses all the same, as
    RabbitMQ does, until the entire cluster is back (the runtime then stops passing `partial`)."""
    assert should_pause("pause_minority", "a", ABC, {"a", "c"}) is False
    assert should_pause("pause_minority", "a", ABC, {"a", "c"}, partial=True) is True
    assert pause_reason("pause_minority", "a", ABC, {"a", "c"}, partial=True) == \
        "a partial partition, 2 of 3 nodes reachable"


@pytest.mark.parametrize("mode", ["ignore", "autoheal", "pause_if_all_down"])
def test_a_partial_partition_pauses_only_under_pause_minority(mode):
    assert should_pause(mode, "a", ABC, {"a", "c"}, ["a"], partial=True) is False


# -- ClusterRuntime.promotion_hold: no mirror promoted while a partial-partition check runs


def _runtime_checking(now: list[float]):
    from hutch.server.clustering import PP_CHECK_S, ClusterRuntime

    rt = ClusterRuntime.__new__(ClusterRuntime)  # only the partial-partition bookkeeping is used
    rt.now_s = lambda: now[0]
    rt.partial_partition = None
    rt._pp_checking = {"a": ({"b", "c"}, now[0] + PP_CHECK_S)}  # lost a, asked b and c
    return rt, PP_CHECK_S


def test_a_promotion_over_a_lost_node_waits_until_every_member_asked_has_answered():
    now = [100.0]
    rt, _ = _runtime_checking(now)
    assert rt.promotion_hold("a") and not rt.promotion_hold("d")
    rt._pp_answered("a", "b")  # b does not reach a
    assert rt.promotion_hold("a")
    rt._pp_answered("a", "c")  # nor does c: a is gone, not cut off
    assert not rt.promotion_hold("a")


def test_an_unanswered_check_ends_and_a_partial_partition_holds_every_promotion():
    now = [100.0]
    rt, check_s = _runtime_checking(now)
    now[0] += check_s - 0.01
    assert rt.promotion_hold("a")
    now[0] += 0.02
    assert not rt.promotion_hold("a") and "a" not in rt._pp_checking
    rt.partial_partition = ("a", "b")  # paused: b still reaches a
    assert rt.promotion_hold("a") and rt.promotion_hold("d")
