"""The catalogue leader's decisions (hutch.broker.chores), held against RabbitMQ's rules: mirror
placement for each ha-mode (seed 000, "Queue Arguments that Control Mirroring"), deletion of
non-durable and exclusive queues whose home node is gone, refusal of a promotion whose old
leader is still running, forget_cluster_node's promote-or-delete rule, and the first start of a
cluster."""

from __future__ import annotations

import pytest

from hutch.broker import chores
from hutch.broker.cluster import INIT_PARAM, NODE_PARAM
from hutch.cluster import catalogue as cat
from hutch.mirror.placement import params_of

ABC = ["a", "b", "c"]


def q(name: str, leader: str = "a", mirrors: tuple[str, ...] = (), durable: bool = True, exclusive: str | None = None,
      kind: str = cat.CLASSIC) -> cat.QueueRecord:
    return cat.QueueRecord("/", name, type=kind, durable=durable, exclusive_owner=exclusive, leader_node=leader,
                           member_nodes=mirrors)


def place(records, policy: dict | None, running=ABC, members=ABC, synced=(), placing=None, now=100.0):
    params = params_of(policy)
    return chores.mirror_placements(records, list(members), list(running), lambda v, n: params,
                                    lambda v, n: list(synced), placing or {}, now)


# ------------------------------------------------------------ placement, one ha-mode at a time


def test_ha_mode_all_puts_a_mirror_on_every_running_node():
    [p] = place([q("q1")], {"ha-mode": "all"})
    assert p.command == cat.SetQueueNodes("/", "q1", "a", ("b", "c"), expect_leader="a")
    assert p.moved_to is None


def test_ha_mode_all_leaves_out_a_node_that_is_down():
    [p] = place([q("q1")], {"ha-mode": "all"}, running=["a", "c"])
    assert p.command.member_nodes == ("c",)


def test_ha_mode_exactly_counts_the_leader_among_the_replicas():
    [p] = place([q("q1")], {"ha-mode": "exactly", "ha-params": 2})
    assert p.command.member_nodes == ("b",)


def test_ha_mode_exactly_replaces_a_mirror_whose_node_went_down():
    [p] = place([q("q1", mirrors=("b",))], {"ha-mode": "exactly", "ha-params": 2}, running=["a", "c"])
    assert p.command.member_nodes == ("c",)


def test_ha_mode_nodes_mirrors_only_on_the_listed_nodes():
    [p] = place([q("q1")], {"ha-mode": "nodes", "ha-params": ["a", "c"]})
    assert p.command.member_nodes == ("c",)


def test_ha_mode_nodes_moves_an_unlisted_leader_to_a_synchronised_listed_mirror():
    [p] = place([q("q1", mirrors=("b",))], {"ha-mode": "nodes", "ha-params": ["b"]}, synced=["b"])
    assert p.moved_to == "b"
    assert p.command == cat.SetQueueNodes("/", "q1", "b", (), expect_leader="a")


def test_ha_mode_nodes_keeps_an_unlisted_leader_until_a_listed_mirror_is_synchronised():
    assert place([q("q1", mirrors=("b",))], {"ha-mode": "nodes", "ha-params": ["b"]}, synced=[]) == []


def test_a_queue_already_placed_as_its_policy_asks_is_left_alone():
    assert place([q("q1", mirrors=("b", "c"))], {"ha-mode": "all"}) == []


def test_a_queue_whose_policy_went_away_loses_its_mirrors():
    [p] = place([q("q1", mirrors=("b",))], None)
    assert p.command.member_nodes == ()


def test_placement_skips_exclusive_quorum_and_leaderless_queues():
    records = [q("ex", exclusive="conn@a"), q("qq", kind=cat.QUORUM), q("orphan", leader="b")]
    assert place(records, {"ha-mode": "all"}, running=["a", "c"]) == []


def test_placement_is_not_proposed_again_within_its_retry_window():
    placing = {("/", "q1"): 99.0}
    assert place([q("q1")], {"ha-mode": "all"}, placing=placing, now=99.0 + chores.PLACEMENT_RETRY_S - 0.1) == []
    assert len(place([q("q1")], {"ha-mode": "all"}, placing=placing, now=99.0 + chores.PLACEMENT_RETRY_S)) == 1


# ------------------------------------------------------------ transient queues of a node that is gone


def test_a_non_durable_queue_dies_with_its_home_node():
    records = [q("durable"), q("transient", durable=False), q("elsewhere", leader="b", durable=False)]
    got = chores.transient_deletions("a", records, {"b", "c"}, {}, 10.0)
    assert [r.name for r in got] == ["transient"]


def test_an_exclusive_queue_dies_with_its_home_node_even_when_durable_or_mirrored():
    records = [q("ex", exclusive="conn@a", mirrors=("b",))]
    assert [r.name for r in chores.transient_deletions("a", records, {"b"}, {}, 10.0)] == ["ex"]


def test_a_non_durable_mirrored_queue_waits_for_a_running_mirror_to_be_promoted():
    records = [q("m", durable=False, mirrors=("b",))]
    assert chores.transient_deletions("a", records, {"b"}, {}, 10.0) == []
    assert [r.name for r in chores.transient_deletions("a", records, set(), {}, 10.0)] == ["m"]


def test_a_deletion_is_not_proposed_again_within_its_retry_window():
    records = [q("t", durable=False)]
    deleting = {("/", "t"): 10.0}
    assert chores.transient_deletions("a", records, set(), deleting, 10.0 + chores.DELETE_RETRY_S - 0.1) == []
    assert len(chores.transient_deletions("a", records, set(), deleting, 10.0 + chores.DELETE_RETRY_S)) == 1


def test_a_member_is_gone_once_down_or_after_the_grace_since_start():
    kw = dict(me="a", members=ABC, up={"a"}, started_s=0.0, grace_s=60.0)
    assert chores.members_gone(down_since_s={"b": 5.0}, now_s=10.0, **kw) == ["b"]  # seen going down
    assert chores.members_gone(down_since_s={}, now_s=59.0, **kw) == []  # never seen: wait net_ticktime
    assert chores.members_gone(down_since_s={}, now_s=60.0, **kw) == ["b", "c"]


# ------------------------------------------------------------ promotions


def promotion(expect_leader: str) -> cat.SetQueueNodes:
    return cat.SetQueueNodes("/", "q1", "b", ("c",), expect_leader=expect_leader, promotion=True)


def test_a_promotion_is_refused_while_the_old_leader_is_running():
    assert chores.refuse_promotion(promotion("c"), "a", {"c"}.__contains__) is True


def test_a_promotion_is_refused_when_the_old_leader_is_the_catalogue_leader():
    assert chores.refuse_promotion(promotion("a"), "a", set().__contains__) is True


def test_a_promotion_goes_ahead_once_the_old_leader_is_down():
    assert chores.refuse_promotion(promotion("c"), "a", set().__contains__) is False


def test_only_promotions_are_ever_refused():
    move = cat.SetQueueNodes("/", "q1", "b", (), expect_leader="c")
    assert chores.refuse_promotion(move, "a", {"c"}.__contains__) is False
    assert chores.refuse_promotion(cat.DeleteQueue("/", "q1"), "a", {"c"}.__contains__) is False


# ------------------------------------------------------------ forget_cluster_node


@pytest.mark.parametrize("name, up, why", [
    ("a", set(), "node a cannot forget itself; run forget_cluster_node on another node"),
    ("z", set(), "node z is not a member of the cluster"),
    ("b", {"b"}, "node b is running; stop it (hutchctl -n b stop_app) before forgetting it"),
])
def test_forget_is_refused_for_this_node_a_stranger_or_a_running_node(name, up, why):
    assert chores.forget_refusal(name, "a", ABC, up.__contains__) == why


def test_forget_is_allowed_for_a_stopped_member():
    assert chores.forget_refusal("b", "a", ABC, set().__contains__) is None


def test_forget_promotes_a_mirror_deletes_a_plain_classic_queue_and_leaves_quorum_queues_and_streams():
    records = [q("mirrored", leader="b", mirrors=("c", "a")), q("plain", leader="b"),
               q("qq", leader="b", mirrors=("a", "c"), kind=cat.QUORUM),
               q("s", leader="b", mirrors=("a", "c"), kind=cat.STREAM), q("other", leader="a")]
    steps = chores.forget_commands("b", records)
    assert [(s.record.name, s.command, s.promoted) for s in steps] == [
        ("mirrored", cat.SetQueueNodes("/", "mirrored", "c", ("a",), expect_leader="b"), "c"),
        ("plain", cat.DeleteQueue("/", "plain"), None),
    ]  # the quorum queue and the stream lose b as a member instead (control.quorum.drop_forgotten_member)
    assert chores.forget_parameter("b") == cat.ClearGlobalParameter(NODE_PARAM + "b")


# ------------------------------------------------------------ first start and joins


def first(**kw):
    base = dict(default_vhost="/", default_user="guest", password_hash="h", load_definitions=False, legacy=None,
                cluster_name="c1", addresses={"b@h": ("h", 2), "a@h": ("h", 1)})
    return chores.first_start_commands(**(base | kw))


def test_a_new_cluster_starts_with_the_default_vhost_user_name_and_addresses():
    assert first() == [
        cat.AddVhost("/"),
        cat.PutUser("guest", "h", ("administrator",)),
        cat.SetPermissions("guest", "/", ".*", ".*", ".*"),
        cat.SetGlobalParameter("cluster_name", "c1"),
        cat.SetGlobalParameter(NODE_PARAM + "a@h", "h:1"),
        cat.SetGlobalParameter(NODE_PARAM + "b@h", "h:2"),
        cat.SetGlobalParameter(INIT_PARAM, True),
    ]


def test_definitions_imported_at_boot_replace_the_default_vhost_and_user():
    assert [type(c) for c in first(load_definitions=True)] == [cat.SetGlobalParameter] * 4


def test_legacy_definitions_replace_the_defaults():
    legacy = [cat.AddVhost("old")]
    assert first(legacy=legacy)[:2] == [cat.AddVhost("old"), cat.SetGlobalParameter("cluster_name", "c1")]


def test_the_first_start_is_proposed_again_only_after_its_retry_window():
    assert chores.initialisation_due(False, 10.0, -1e9) is True
    assert chores.initialisation_due(False, 10.0 + chores.INIT_RETRY_S, 10.0) is False
    assert chores.initialisation_due(False, 10.0 + chores.INIT_RETRY_S + 0.01, 10.0) is True
    assert chores.initialisation_due(True, 100.0, -1e9) is False


def test_a_joining_node_is_recorded_then_added_as_a_learner_then_joined():
    joins = {"d": "h:4"}
    [s] = chores.join_steps(joins, set(), set())
    assert (s.action, s.command) == (chores.RECORD, cat.SetGlobalParameter(NODE_PARAM + "d", "h:4"))
    assert chores.join_steps(joins, {NODE_PARAM + "d"}, set())[0].action == chores.ADD_LEARNER
    assert chores.join_steps(joins, {NODE_PARAM + "d"}, {"d"})[0].action == chores.JOINED


def test_retry_stamps_older_than_their_window_are_dropped():
    assert chores.recent({("/", "x"): 1.0, ("/", "y"): 9.0}, 10.0, 5.0) == {("/", "y"): 9.0}
