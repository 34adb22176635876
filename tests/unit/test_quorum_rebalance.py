"""`hutch-queues rebalance quorum`'s plan (hutch.quorum.placement.rebalance_plan): leadership
moves so that no running node leads more than ceil(queues / nodes), each queue moving only to
one of its own online members, the plan a pure function of what it is given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.quorum.placement import rebalance_plan

A, B, C = "a@h", "b@h", "c@h"
ALL = (A, B, C)


def test_three_queues_led_by_one_node_end_one_on_each():
    moves, counts = rebalance_plan([("/", f"q{i}", A, ALL) for i in range(3)], [A, B, C])
    assert moves == [("/", "q0", A, B), ("/", "q1", A, C)]
    assert counts == {A: 1, B: 1, C: 1}


def test_an_even_spread_moves_nothing():
    qs = [("/", "q0", A, ALL), ("/", "q1", B, ALL), ("/", "q2", C, ALL), ("/", "q3", A, ALL)]
    assert rebalance_plan(qs, [A, B, C]) == ([], {A: 2, B: 1, C: 1})


def test_a_queue_moves_only_to_its_own_running_members():
    qs = [("/", "q0", A, (A, B)), ("/", "q1", A, (A, B)), ("/", "q2", A, (A, B)), ("/", "q3", A, (A, C))]
    moves, counts = rebalance_plan(qs, [A, B, C])
    assert moves == [("/", "q0", A, B), ("/", "q1", A, B)]  # ceil(4 / 3) = 2 each at most
    assert counts == {A: 2, B: 2, C: 0}
    qs.append(("/", "q4", A, (A, C)))  # five: q4 can only go to C
    moves, counts = rebalance_plan(qs, [A, B, C])
    assert moves == [("/", "q0", A, B), ("/", "q1", A, B), ("/", "q3", A, C)] and counts == {A: 2, B: 2, C: 1}
    # C is not running: q3 cannot go there, and queues led by a stopped node stay
    moves, counts = rebalance_plan(qs + [("/", "q9", C, ALL)], [A, B])
    assert moves == [("/", "q0", A, B), ("/", "q1", A, B)] and counts == {A: 3, B: 2}  # ceil(5 / 2)


@given(st.lists(st.tuples(st.sampled_from(ALL), st.sets(st.sampled_from(ALL), max_size=2)), max_size=40))
def test_no_node_ends_over_the_ceiling_unless_its_queues_have_nowhere_to_go(spec):
    qs = [("/", f"q{i}", leader, tuple(sorted({leader, *others}))) for i, (leader, others) in enumerate(spec)]
    moves, counts = rebalance_plan(qs, list(ALL))
    assert sum(counts.values()) == len(qs) and rebalance_plan(qs, list(ALL)) == (moves, counts)
    members = {(v, n): m for v, n, _l, m in qs}
    assert all(to in members[(v, n)] and frm != to for v, n, frm, to in moves)
    assert len({(v, n) for v, n, _f, _t in moves}) == len(moves)  # each queue moves at most once
    ceiling = -(-len(qs) // 3)
    for node, n in counts.items():
        if n > ceiling:  # then every queue it still leads has no member under the ceiling
            moved = {(v, q) for v, q, _f, _t in moves}
            for v, q, leader, ms in qs:
                if leader == node and (v, q) not in moved:
                    assert all(counts[m] >= ceiling for m in ms if m != node)
