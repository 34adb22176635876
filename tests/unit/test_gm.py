"""GM, the guaranteed multicast ring of mirrored queues (seed 004 §4.2.3–4.2.4), driven step by
step over a hand-run network: every message is moved by the test, so each scenario puts a
failure exactly where it wants it (before or after a given member forwarded a message)."""

from __future__ import annotations

from collections import deque

import pytest

from hutch.mirror.gm import (
    FAILED,
    JOINING,
    MEMBER,
    REMOVED,
    Activity,
    Deliver,
    GMConfig,
    GMMember,
    GMNotMember,
    GMOverloaded,
    Item,
    JoinFailed,
    JoinRecord,
    JoinRefused,
    JoinRequest,
    MembersChanged,
    MembershipState,
    Notice,
    Probe,
    Removed,
    Resync,
    Stable,
    StreamState,
    Welcome,
    answer_for_absent,
    build_ring,
    decode,
    encode,
)


class Net:
    """Members joined by FIFO links that the test drains one message at a time (or all).
    Every message crosses the msgpack codec, as on the peer transport."""

    def __init__(self, ids: list[str], config: GMConfig | None = None) -> None:
        self.cfg = config
        self.m: dict[str, GMMember] = {i: GMMember.create(i, ids, config) for i in ids}
        self.links: dict[tuple[str, str], deque] = {}
        self.dead: set[str] = set()
        self.sent = 0
        self.events: dict[str, list] = {i: [] for i in ids}

    def collect(self) -> None:
        for i, g in self.m.items():
            if i in self.dead:
                continue
            for to, msg in g.take_messages():
                self.sent += 1
                self.links.setdefault((i, to), deque()).append(decode(encode(msg)))
            self.events[i].extend(g.take_events())

    def pending(self, frm: str, to: str) -> int:
        self.collect()
        return len(self.links.get((frm, to), ()))

    def step(self, frm: str, to: str) -> object:
        """Deliver the next message on the link frm → to; returns it."""
        self.collect()
        msg = self.links[(frm, to)].popleft()
        if to not in self.dead:
            self.m[to].receive(frm, msg)
        self.collect()
        return msg

    def run(self, hold: set[tuple[str, str]] = frozenset()) -> None:
        """Deliver everything (links in `hold` stay untouched) until the network is quiet."""
        while True:
            self.collect()
            busy = [k for k, q in sorted(self.links.items()) if q and k not in hold]
            if not busy:
                return
            for k in busy:
                self.step(*k)

    def kill(self, victim: str) -> None:
        """The member dies: what it had not sent is lost, messages to it are dropped."""
        self.dead.add(victim)
        for (a, b), q in self.links.items():
            if victim in (a, b):
                q.clear()

    def down(self, victim: str) -> None:
        """Every survivor's failure detector reports the death."""
        for i, g in self.m.items():
            if i not in self.dead:
                g.member_down(victim)

    def join(self, new: str, via: str) -> GMMember:
        g = self.m[new] = GMMember.joiner(new, via, self.cfg)
        self.events[new] = []
        return g

    def delivered(self, member: str, sender: str | None = None) -> list[tuple[str, int]]:
        self.collect()
        return [(e.sender, e.seq) for e in self.events[member]
                if isinstance(e, Deliver) and (sender is None or e.sender == sender)]

    def of(self, member: str, kind: type) -> list:
        self.collect()
        return [e for e in self.events[member] if isinstance(e, kind)]

    def survivors(self) -> list[str]:
        return [i for i in self.m if i not in self.dead and self.m[i].status == MEMBER]


def seqs(n: int, sender: str, first: int = 1) -> list[tuple[str, int]]:
    return [(sender, s) for s in range(first, n + 1)]


# -- §4.2.4: the message goes round the ring, returns to its sender, then its ack goes round --


def test_broadcast_travels_round_the_ring_and_each_member_delivers_in_sender_order():
    net = Net(["a", "b", "c", "d"])
    for i in range(3):
        net.m["a"].broadcast(b"a%d" % i)
    net.m["c"].broadcast(b"c0")
    net.m["c"].broadcast(b"c1")
    net.collect()
    # a's messages go only to its right neighbour
    assert [k for k, q in net.links.items() if q] == [("a", "b"), ("c", "d")]
    net.run()
    for member in "abcd":
        assert net.delivered(member, "a") == seqs(3, "a")
        assert net.delivered(member, "c") == seqs(2, "c")
    assert [e.payload for e in net.of("d", Deliver) if e.sender == "a"] == [b"a0", b"a1", b"a2"]


def test_the_sender_delivers_its_own_message_at_once():
    net = Net(["a", "b"])
    assert net.m["a"].broadcast(b"x") == 1
    assert net.delivered("a") == [("a", 1)]


def test_every_member_caches_the_message_until_the_ack_passes_it():
    net = Net(["a", "b", "c", "d"])
    net.m["a"].broadcast(b"m")
    net.step("a", "b")
    net.step("b", "c")
    net.step("c", "d")
    assert [net.m[i].cached_count() for i in "abcd"] == [1, 1, 1, 1]
    assert net.of("a", Stable) == []  # d has it, but a does not know yet
    net.step("d", "a")  # back at the sender: every member has it
    assert net.of("a", Stable) == [Stable(1)]
    assert net.m["a"].cached_count() == 0 and net.m["a"].inflight == 0
    net.step("a", "b")  # the ack
    assert [net.m[i].cached_count() for i in "abcd"] == [0, 0, 1, 1]
    net.step("b", "c")
    net.step("c", "d")
    assert [net.m[i].cached_count() for i in "abcd"] == [0, 0, 0, 0]
    net.collect()
    assert not any(net.links.values())  # d does not send the ack back to its sender: 7 messages in all
    assert net.sent == 7


def test_stable_means_every_member_in_the_ring_holds_the_message():
    net = Net(["a", "b", "c"])
    for i in range(5):
        net.m["a"].broadcast(b"%d" % i)
        net.run()
        stable = net.of("a", Stable)[-1].seq
        assert all(net.m[x].received_upto("a") >= stable for x in "abc")
    assert net.of("a", Stable)[-1] == Stable(5)


def test_a_member_alone_is_stable_at_once():
    g = GMMember.create("a", ["a"])
    assert g.broadcast(b"x") == 1
    assert g.take_events() == [Deliver("a", 1, b"x"), Stable(1)]
    assert g.take_messages() == [] and g.cached_count() == 0


# -- batching ---------------------------------------------------------------------------------


def test_broadcasts_of_one_loop_iteration_leave_as_one_message_per_neighbour():
    net = Net(["a", "b", "c"])
    for i in range(2000):
        net.m["a"].broadcast(b"op-%d" % i)
    assert net.pending("a", "b") == 1
    net.run()
    # 2000 messages round the ring and their acks round again: a handful of Activities, not 4000+
    assert net.sent <= 6
    assert all(net.delivered(x, "a") == seqs(2000, "a") for x in "abc")
    assert all(net.m[x].cached_count() == 0 for x in "abc")


def test_acks_ride_along_with_new_messages():
    net = Net(["a", "b", "c"])
    net.m["a"].broadcast(b"1")
    net.step("a", "b")
    net.step("b", "c")
    net.collect()
    back = net.links[("c", "a")].popleft()
    # one loop iteration at a: message 1 comes back, and the application broadcasts message 2
    net.m["a"].receive("c", back)
    net.m["a"].broadcast(b"2")
    out = net.m["a"].take_messages()
    assert len(out) == 1
    to, msg = out[0]
    assert to == "b"
    assert [(it.sender, it.acked, it.first_seq, it.payloads) for it in msg.items] == [("a", 1, 2, (b"2",))]


def test_a_batch_larger_than_the_byte_limit_is_split_in_order():
    net = Net(["a", "b"], GMConfig(batch_bytes_max=1000))
    for i in range(100):
        net.m["a"].broadcast(bytes(100) + b"%d" % i)
    assert 9 <= net.pending("a", "b") <= 12
    net.run()
    assert net.delivered("b", "a") == seqs(100, "a")


def test_broadcast_refuses_beyond_the_inflight_limit():
    net = Net(["a", "b"], GMConfig(inflight_max=3))
    for _ in range(3):
        net.m["a"].broadcast(b"x")
    with pytest.raises(GMOverloaded):
        net.m["a"].broadcast(b"x")
    net.run()
    net.m["a"].broadcast(b"x")  # stable again: room again


# -- member death (§4.2.3: a neighbour takes over so that survivors all get it or none do) ----


def _assert_survivors_agree(net: Net, senders: str) -> None:
    alive = net.survivors()
    for s in senders:
        # the same sequence everywhere, from each member's join point on (0 for founders)
        full = max((net.delivered(x, s) for x in alive), key=len)
        for x in alive:
            start = net.m[x].joined_after(s)
            assert net.delivered(x, s) == [e for e in full if e[1] > start], (s, x, full)
    for x in alive:
        assert net.m[x].cached_count() == 0, x
        assert net.m[x].inflight == 0, x
        assert set(net.m[x].members) == set(alive)
        assert net.m[x].members == net.m[alive[0]].members  # the same ring order everywhere


def test_death_of_a_member_that_had_not_forwarded_the_message():
    net = Net(["a", "b", "c", "d"])
    net.m["a"].broadcast(b"m")
    net.step("a", "b")
    net.step("b", "c")
    net.kill("c")  # c delivered m and died before passing it to d
    net.down("c")
    net.run()
    assert net.delivered("d", "a") == [("a", 1)]  # b resent it to d
    assert net.of("a", Stable) == [Stable(1)]
    _assert_survivors_agree(net, "ab")
    for x in "abd":
        assert net.of(x, MembersChanged)[-1].deaths == ("c",)


def test_death_of_the_broadcasters_right_neighbour_with_the_message_in_flight():
    net = Net(["a", "b", "c"])
    net.m["a"].broadcast(b"m1")
    net.m["a"].broadcast(b"m2")
    net.collect()
    net.kill("b")  # the message to b is lost with it
    net.down("b")
    net.run()
    for x in "ac":
        assert net.delivered(x, "a") == seqs(2, "a")
    assert net.of("a", Stable) == [Stable(2)]
    _assert_survivors_agree(net, "a")


def test_death_of_the_broadcaster_after_its_right_neighbour_got_the_message():
    net = Net(["a", "b", "c", "d"])
    net.m["a"].broadcast(b"m1")
    net.m["a"].broadcast(b"m2")
    net.step("a", "b")  # only b has them
    net.kill("a")
    net.down("a")
    net.run()
    # b is a's heir: everyone delivers what b had, then learns of a's death
    for x in "bcd":
        assert net.delivered(x, "a") == seqs(2, "a")
        deaths = [e for e in net.events[x] if isinstance(e, MembersChanged) and e.deaths]
        assert deaths[-1].deaths == ("a",)
        last_deliver = max(i for i, e in enumerate(net.events[x]) if isinstance(e, Deliver) and e.sender == "a")
        assert net.events[x].index(deaths[-1]) > last_deliver  # the death comes after a's last message
        assert net.m[x].ended_at("a") == 3
    _assert_survivors_agree(net, "a")


def test_death_of_the_broadcaster_before_anyone_got_the_message():
    net = Net(["a", "b", "c"])
    net.m["a"].broadcast(b"lost")
    net.collect()
    net.kill("a")
    net.down("a")
    net.run()
    for x in "bc":
        assert net.delivered(x, "a") == []
        assert net.of(x, MembersChanged)[-1] == MembersChanged(1, ("b", "c"), (), ("a",))


def test_death_of_the_broadcaster_half_way_round_with_a_second_death_after_it():
    net = Net(["a", "b", "c", "d", "e"])
    for i in range(3):
        net.m["a"].broadcast(b"%d" % i)
    net.step("a", "b")
    net.step("b", "c")  # b and c have all three, d and e nothing
    net.kill("a")
    net.kill("b")
    net.down("b")
    net.down("a")
    net.run()
    for x in "cde":
        assert net.delivered(x, "a") == seqs(3, "a")
    _assert_survivors_agree(net, "a")


@pytest.mark.parametrize("victim", ["a", "b", "c", "d"])
@pytest.mark.parametrize("hops", [0, 1, 2, 3, 4])
def test_death_in_every_position_at_every_point_of_the_round(victim, hops):
    """Whoever dies, wherever the messages are, survivors deliver the same sequence per sender."""
    net = Net(["a", "b", "c", "d"])
    for i in range(3):
        net.m["a"].broadcast(b"a%d" % i)
        net.m["c"].broadcast(b"c%d" % i)
    order = [("a", "b"), ("c", "d"), ("b", "c"), ("d", "a"), ("c", "d"), ("a", "b"), ("d", "a"), ("b", "c")]
    for link in order[:hops * 2]:
        if net.pending(*link):
            net.step(*link)
    net.kill(victim)
    net.down(victim)
    net.run()
    _assert_survivors_agree(net, "ac")
    for s in "ac":
        if s != victim:
            assert net.delivered(net.survivors()[0], s) == seqs(3, s)  # nothing of a survivor's is lost


def test_the_failure_detector_may_speak_at_different_times():
    net = Net(["a", "b", "c", "d"])
    net.m["b"].broadcast(b"x")
    net.step("b", "c")
    net.kill("c")
    net.m["d"].member_down("c")  # only d knows for now; it tells the others through the ring
    net.run()
    net.m["b"].member_down("c")  # b hears it too, as it would: nothing changes twice
    net.m["a"].member_down("c")
    net.run()
    assert net.delivered("d", "b") == [("b", 1)]
    _assert_survivors_agree(net, "b")


def test_all_but_one_die():
    net = Net(["a", "b", "c"])
    net.m["b"].broadcast(b"1")
    net.step("b", "c")
    for v in "bc":
        net.kill(v)
        net.down(v)
    net.run()
    assert net.delivered("a", "b") == []
    assert net.m["a"].members == ("a",)
    assert net.m["a"].broadcast(b"alone") == 1
    assert net.of("a", Stable) == [Stable(1)]


# -- joins ------------------------------------------------------------------------------------


def test_a_newcomer_receives_only_messages_sent_after_it_joined():
    net = Net(["a", "b", "c"])
    for i in range(3):
        net.m["a"].broadcast(b"old%d" % i)
    net.run()
    net.join("j", via="b")
    net.run()
    assert net.m["j"].status == MEMBER
    assert net.of("j", MembersChanged) == [MembersChanged(1, ("a", "b", "j", "c"), ("j",), ())]
    for x in "abc":
        assert net.of(x, MembersChanged)[-1].births == ("j",)
    net.m["a"].broadcast(b"new")
    net.m["j"].broadcast(b"from-j")
    net.run()
    assert net.delivered("j", "a") == [("a", 4)]
    for x in "abc":
        assert net.delivered(x, "j") == [("j", 1)]
    assert all(net.m[x].cached_count() == 0 for x in "abcj")


def test_the_join_goes_round_the_ring_before_the_newcomer_is_let_in():
    net = Net(["a", "b", "c"])
    net.join("j", via="b")
    net.step("j", "b")  # the request
    assert net.pending("b", "j") == 0  # not yet: c and a must know j first
    net.step("b", "c")
    net.step("c", "a")
    assert net.pending("b", "j") == 0
    net.step("a", "b")  # the membership is back at b: everyone knows j
    assert isinstance(net.step("b", "j"), Welcome)
    net.run()
    assert net.m["c"].left == "j" and net.m["b"].right == "j"


def test_messages_in_flight_during_a_join_reach_everyone():
    net = Net(["a", "b", "c"])
    net.join("j", via="b")
    net.step("j", "b")
    for i in range(5):
        net.m["a"].broadcast(b"%d" % i)
        net.m["c"].broadcast(b"%d" % i)
        net.run(hold={("a", "b")} if i % 2 else set())
    net.run()
    _assert_survivors_agree(net, "ac")
    joined = net.m["j"].joined_after("a")
    assert net.delivered("j", "a") == seqs(5, "a", joined + 1)


def test_a_join_fails_when_the_member_asked_dies_first():
    net = Net(["a", "b", "c"])
    j = net.join("j", via="b")
    net.step("j", "b")
    net.step("b", "c")
    net.kill("b")
    net.down("b")
    j.member_down("b")
    net.run()
    assert j.status == FAILED and net.of("j", JoinFailed)
    assert net.survivors() == ["a", "c"]
    assert all("j" not in net.m[x].members for x in "ac")
    net.m["a"].broadcast(b"x")
    net.run()
    _assert_survivors_agree(net, "a")


def test_a_newcomer_let_in_just_before_its_inserter_died_takes_over_as_heir():
    net = Net(["a", "b", "c"])
    net.join("j", via="b")
    net.run()
    net.m["b"].broadcast(b"b1")
    net.step("b", "j")  # only j has it
    net.kill("b")
    net.down("b")
    net.run()
    for x in "acj":
        assert net.delivered(x, "b") == [("b", 1)]
    _assert_survivors_agree(net, "b")


def test_a_join_via_a_member_that_left_is_refused():
    net = Net(["a", "b"])
    net.m["b"].leave()
    net.run()
    j = net.join("j", via="b")
    net.run()
    assert j.status == FAILED
    assert "refused" in net.of("j", JoinFailed)[0].reason


# -- leaving and being declared dead ------------------------------------------------------------


def test_a_member_that_leaves_is_reported_gone_after_its_last_message():
    net = Net(["a", "b", "c"])
    net.m["b"].broadcast(b"last words")
    net.m["b"].leave()
    net.run()
    assert net.of("b", Removed) == [Removed("left the group")]
    for x in "ac":
        assert net.delivered(x, "b") == [("b", 1)]
        assert net.of(x, MembersChanged)[-1].deaths == ("b",)
    with pytest.raises(GMNotMember):
        net.m["b"].broadcast(b"more")


def test_a_silent_member_the_group_declared_dead_is_told_so():
    """A mirror only passes on what reaches it: one declared dead on a false suspicion, that
    the ring now closes past, would wait for the leader's traffic for ever. Every member that
    learns of the death tells it (seen when a paused leader resumed as its mirror was promoted:
    the other mirror, declared dead by the old leader, never rejoined)."""
    net = Net(["a", "b", "c"])
    net.m["b"].member_down("a")  # a false suspicion: a is out for good
    net.run()
    assert net.m["a"].status == REMOVED
    assert net.of("a", Removed)[0].reason == "declared dead by the group"
    assert {m for (frm, _to), q in net.links.items() for m in q if frm == "a"} == set()


def test_a_member_the_group_declared_dead_is_told_so_when_it_speaks():
    net = Net(["a", "b", "c"])
    for x in "bc":
        net.m[x].member_down("a")  # a false suspicion: a is out for good
    net.collect()
    for x in "bc":  # their telling a so is lost (a's node was unreachable)
        net.links[(x, "a")].clear()
    net.run()
    assert net.m["a"].status == MEMBER
    net.m["a"].broadcast(b"zombie")
    net.run()
    assert net.m["a"].status == REMOVED
    assert net.of("a", Removed)[0].reason == "declared dead by the group"
    assert net.delivered("b", "a") == [] and net.delivered("c", "a") == []


def test_a_node_answers_for_a_member_it_does_not_run():
    assert answer_for_absent("gone", Probe()) == Notice(("gone",), ())
    assert answer_for_absent("gone", Resync()) == Notice(("gone",), ())
    assert answer_for_absent("gone", Activity(None, ())) == Notice(("gone",), ())
    assert answer_for_absent("gone", Notice((), ())) is None


def test_a_newcomer_that_asked_a_member_gone_since_fails_and_may_ask_again():
    # a mirror looked up its leader's member, which was replaced before the join arrived
    j = GMMember.joiner("j", via="gone")
    (to, req), = j.take_messages()
    assert to == "gone" and isinstance(req, JoinRequest)
    j.receive("gone", answer_for_absent("gone", req))
    assert j.status == FAILED
    assert [type(e) for e in j.take_events()] == [JoinFailed]


# -- the ring order and the wire ------------------------------------------------------------------


def test_ring_order_puts_each_newcomer_right_after_its_inserter():
    # b let in j1, then j2 (right after b, before j1); j1 let in k
    ring = build_ring(["a", "b", "c"], [("j1", "b", 1), ("j2", "b", 2), ("k", "j1", 1)])
    assert ring == ["a", "b", "j2", "j1", "k", "c"]


def test_every_message_round_trips_through_msgpack():
    ms = MembershipState(("a", "b"), (JoinRecord("j", "a", 1, True),), ("b",))
    msgs = [
        Activity(ms, (Item("a", 3, 4, (b"x", None)),), True),
        Activity(None, ()),
        JoinRequest(),
        Welcome(ms, (StreamState("a", 2, 0, (b"p",)),)),
        JoinRefused("no"),
        Probe(),
        Notice(("x",), ("j",)),
        Resync(),
    ]
    for m in msgs:
        assert decode(encode(m)) == m


def test_a_joining_member_cannot_broadcast():
    j = GMMember.joiner("j", "a")
    assert j.status == JOINING
    assert j.take_messages() == [("a", JoinRequest())]
    with pytest.raises(GMNotMember):
        j.broadcast(b"x")
