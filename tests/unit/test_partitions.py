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
