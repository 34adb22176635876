"""`hutch.cluster.peers`: node-scoped ids from a counter, the one table of requests waiting for
an answer (answered once; failed when their peer goes down or their deadline passes), and
sending to this node itself on the next loop turn."""

from __future__ import annotations

import pytest

from hutch.cluster.peers import Peers, Requests, incarnation_in, node_of


class _Loop:
    """The runtime's call_soon, run by hand."""

    def __init__(self) -> None:
        self.due: list = []

    def call_soon(self, fn, *args) -> None:
        self.due.append((fn, args))

    def run(self) -> None:
        due, self.due = self.due, []
        for fn, args in due:
            fn(*args)


def _peers(up=("b",), sent=None, loop=None):
    sent = [] if sent is None else sent
    loop = loop or _Loop()

    def send(peer, payload):
        if peer not in up:
            return False
        sent.append((peer, payload))
        return True
    return Peers("a", send, lambda n: n in up, loop.call_soon, incarnation=7), sent, loop


def test_ids_come_from_a_counter_and_are_never_handed_out_twice():
    p, _sent, _loop = _peers()
    ids = [p.new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    owner = p.owner_id()
    assert node_of(owner) == "a" and incarnation_in(owner) == 7
    assert p.owner_id() != owner


def test_two_runs_of_a_node_draw_different_ids():
    a, _s, _l = _peers()
    b, _s, _l = _peers()
    assert a.new_id() != b.new_id()  # the high bits are random per run


def test_a_call_is_answered_once():
    p, sent, _loop = _peers()
    got = []
    rid = p.call("b", lambda r: ["R", r, "stat", []], got.append)
    assert sent == [("b", ["R", rid, "stat", []])]
    assert p.requests.answer(rid, [200, 1, 0])
    assert not p.requests.answer(rid, [200, 2, 0])
    assert got == [[200, 1, 0]]
    assert len(p.requests) == 0


def test_a_call_to_an_unreachable_peer_fails_on_the_next_loop_turn():
    p, _sent, loop = _peers(up=())
    got = []
    p.call("b", lambda r: ["R", r, "stat", []], got.append)
    assert got == [] and len(p.requests) == 0
    loop.run()
    assert got == [None]


def test_a_peer_going_down_fails_only_its_own_requests():
    p, _sent, _loop = _peers(up=("b", "c"))
    got = []
    p.call("b", lambda r: ["R", r], lambda a: got.append(("b", a)))
    p.call("c", lambda r: ["R", r], lambda a: got.append(("c", a)))
    p.requests.open(p.new_id(), lambda a: got.append(("any", a)), None, tag="q")
    p.peer_down("b")
    assert got == [("b", None)]
    assert len(p.requests) == 2


def test_requests_past_their_deadline_fail():
    r = Requests()
    got = []
    r.open(1, lambda a: got.append((1, a)), None, deadline_s=10.0)
    r.open(2, lambda a: got.append((2, a)), None)
    r.expire(9.9)
    assert got == []
    r.expire(10.0)
    assert got == [(1, None)]
    assert 2 in r and 1 not in r


def test_a_request_id_waits_once_unless_asked_again():
    r = Requests()
    r.open(1, lambda a: None)
    with pytest.raises(AssertionError):
        r.open(1, lambda a: None)
    got = []
    r.open(1, got.append, replace=True)
    r.answer(1, "x")
    assert got == ["x"]


def test_sending_to_this_node_arrives_on_the_next_loop_turn():
    p, sent, loop = _peers()
    got = []
    p.deliver_local = lambda peer, payload: got.append((peer, payload))
    assert p.send("a", ["ST", []])
    assert got == [] and sent == []
    loop.run()
    assert got == [("a", ["ST", []])]
