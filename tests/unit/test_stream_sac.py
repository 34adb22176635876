"""The single-active-consumer groups of streams as the coordinator keeps them
(hutch.streams.sac), against RabbitMQ 3.11+'s rules: on a plain stream the first registered is
active until it goes; on a super stream partition i's active member is member (i mod n), the
old one stepping down (and answering, or timing out) before the new one is activated; a new
coordinator keeps what the nodes say is active."""

from __future__ import annotations

from hutch.streams.sac import DEACTIVATE_TIMEOUT_S, MemberId, SacGroups

KEY = ("/", "s", "app")


def m(node: str, sub: int = 1) -> MemberId:
    return MemberId(node, f"{node}/conn", sub)


def test_plain_stream_first_registered_is_active_and_the_next_takes_over_when_it_goes():
    g = SacGroups()
    assert g.register(KEY, -1, m("a"), "a", 0) == [(KEY, m("a"), True)]
    assert g.register(KEY, -1, m("b"), "b", 0) == []
    assert g.register(KEY, -1, m("c"), "c", 0) == []
    assert g.unregister(KEY, m("b"), 0) == []  # a waiting one going changes nothing
    assert g.unregister(KEY, m("a"), 0) == [(KEY, m("c"), True)]
    assert g.unregister(KEY, m("c"), 0) == []
    assert KEY not in g.groups  # an empty group goes


def test_a_node_going_down_takes_its_members_out_of_every_group():
    g = SacGroups()
    other = ("/", "t", "app")
    g.register(KEY, -1, m("a"), "a", 0)
    g.register(KEY, -1, m("b"), "b", 0)
    g.register(other, -1, m("a", 2), "a", 0)
    assert sorted(g.node_gone("a", 0)) == [(KEY, m("b"), True)]
    assert other not in g.groups


def test_super_stream_partition_goes_to_member_index_mod_n_after_the_old_one_steps_down():
    g = SacGroups()
    assert g.register(KEY, 1, m("a"), "a", 0) == [(KEY, m("a"), True)]
    assert g.register(KEY, 1, m("b"), "b", 0) == [(KEY, m("a"), False)]  # 1 mod 2: b; a steps down first
    assert g.register(KEY, 1, m("c"), "c", 0) == []  # 1 mod 3 is b too; a's answer still awaited
    assert g.responded(KEY, m("a"), 1) == [(KEY, m("b"), True)]
    assert g.unregister(KEY, m("a"), 2) == [(KEY, m("b"), False)]  # [b, c]: 1 mod 2 is c now
    assert g.tick(2 + DEACTIVATE_TIMEOUT_S - 0.1) == []
    assert g.tick(2 + DEACTIVATE_TIMEOUT_S) == [(KEY, m("c"), True)]  # b did not answer in time


def test_partition_zero_keeps_its_first_member_when_others_join():
    g = SacGroups()
    g.register(KEY, 0, m("a"), "a", 0)
    assert g.register(KEY, 0, m("b"), "b", 0) == []
    assert g.register(KEY, 0, m("c"), "c", 0) == []


def test_a_new_coordinator_keeps_the_active_member_its_node_reports_and_holds_until_released():
    g = SacGroups()
    g.holding = True
    assert g.sync(KEY, -1, "b", [(m("b"), "b", False, None)], 0) == []
    assert g.sync(KEY, -1, "a", [(m("a"), "a", True, None)], 0) == []  # active already on its node
    assert g.release(0) == []
    assert [(x.id, x.state) for x in g.members_of(KEY)] == [(m("b"), "waiting"), (m("a"), "active")]
    # a second claim is refused; a node that missed its activation is told again
    assert g.sync(KEY, -1, "c", [(m("c"), "c", True, None)], 0) == [(KEY, m("c"), False)]
    assert g.sync(KEY, -1, "a", [(m("a"), "a", False, None)], 0) == [(KEY, m("a"), True)]


def test_a_new_coordinator_keeps_the_members_order_from_the_places_the_old_one_gave():
    old = SacGroups(term=3)
    part = ("/", "ss-1", "app")
    for node in "abc":
        old.register(KEY, -1, m(node), node, 0)
        old.register(part, 1, m(node, 2), node, 0)
    assert [x.state for x in old.members_of(part)] == ["deactivating", "waiting", "waiting"]
    assert old.responded(part, m("a", 2), 0) == [(part, m("b", 2), True)]  # 1 mod 3
    new = SacGroups(term=4)
    new.holding = True
    for node in "cba":  # the nodes sync in another order
        for key, sub in ((KEY, 1), (part, 2)):
            x = next(x for x in old.members_of(key) if x.id == m(node, sub))
            new.sync(key, -1 if key is KEY else 1, node, [(x.id, node, x.state == "active", x.seq)], 0)
    assert new.release(0) == []  # the active ones stay; nobody is told anything
    assert [x.id.node for x in new.members_of(KEY)] == ["a", "b", "c"]
    assert [(x.id.node, x.state) for x in new.members_of(part)] == [("a", "waiting"), ("b", "active"), ("c", "waiting")]
    new.register(KEY, -1, m("d"), "d", 0)  # a newcomer goes after them
    assert new.unregister(KEY, m("a"), 0) == [(KEY, m("b"), True)]
    assert [x.id.node for x in new.members_of(KEY)] == ["b", "c", "d"]


def test_a_sync_drops_the_members_its_node_no_longer_has():
    g = SacGroups()
    g.register(KEY, -1, m("a"), "a", 0)
    g.register(KEY, -1, m("b"), "b", 0)
    assert g.sync(KEY, -1, "a", [], 0) == [(KEY, m("b"), True)]


def test_while_holding_nobody_is_activated_and_release_activates():
    g = SacGroups()
    g.holding = True
    assert g.register(KEY, -1, m("a"), "a", 0) == []
    assert g.release(0) == [(KEY, m("a"), True)]


def test_random_histories_keep_one_active_member_and_end_on_the_rule():
    """Seeded random registrations, departures, nodes going down, answers and timeouts: a
    group never has two members active or stepping down, a member is told only what changes
    its state, and once every step-down is answered the active member is the rule's."""
    import random

    for seed in range(100):
        rnd = random.Random(seed)
        g = SacGroups()
        index = rnd.choice([-1, 0, 1, 2])
        told: dict[MemberId, bool] = {}
        now = 0.0
        for _ in range(60):
            now += rnd.choice([0.0, 1.0, DEACTIVATE_TIMEOUT_S])
            members = g.members_of(KEY)
            op = rnd.random()
            if op < 0.4 or not members:
                notices = g.register(KEY, index, m(rnd.choice("abc"), rnd.randrange(4)), "x", now)
            elif op < 0.6:
                notices = g.unregister(KEY, rnd.choice(members).id, now)
            elif op < 0.7:
                notices = g.node_gone(rnd.choice("abc"), now)
            elif op < 0.9:
                stepping = [x.id for x in members if x.state == "deactivating"]
                notices = g.responded(KEY, stepping[0], now) if stepping else []
            else:
                notices = g.tick(now)
            for _k, mid, active in notices:
                assert told.get(mid, False) != active, (seed, mid, active)
                told[mid] = active
            members = g.members_of(KEY)
            for gone in set(told) - {x.id for x in members}:
                del told[gone]  # its subscription is over: an id used again is a new member
            assert sum(x.state != "waiting" for x in members) <= 1, seed
            for x in members:
                assert told.get(x.id, False) == (x.state == "active"), (seed, x.id, x.state)
        while any(x.state == "deactivating" for x in g.members_of(KEY)):
            stepping = next(x.id for x in g.members_of(KEY) if x.state == "deactivating")
            for _k, mid, active in g.responded(KEY, stepping, now):
                told[mid] = active
        members = g.members_of(KEY)
        if members:
            want = members[0] if index < 0 else members[index % len(members)]
            active = [x for x in members if x.state == "active"]
            assert len(active) == 1 and (index < 0 or active[0] is want), seed
