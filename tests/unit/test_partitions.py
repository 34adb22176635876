"""The partition-handling decisions (hutch.server.partitions) against RabbitMQ 3.13's rules:
pause_minority counts reachable members; pause_if_all_down looks only at the listed nodes that
are members; ignore and autoheal never pause; a partition is an unreachable member that did not
announce a stop."""

from __future__ import annotations

import pytest

from hutch.server.partitions import partitioned_from, should_pause

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
