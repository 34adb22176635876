"""The sans-I/O pieces of classic queue mirroring: where replicas go (seed 000's placement
rules) and a mirror's copy built from the leader's operations."""

from __future__ import annotations

from hutch.mirror.placement import (
    ALWAYS,
    AUTOMATIC,
    MANUAL,
    WHEN_SYNCED,
    declare_node,
    leader_move,
    mirrors_for,
    params_of,
)
from hutch.mirror.replica import (
    TOKENS_KEPT,
    CheckedOut,
    Deleted,
    Enqueued,
    NewLeaderHead,
    Removed,
    Replica,
    SyncBatch,
    SyncDone,
    SyncItem,
    View,
    decode_ops,
    encode_ops,
)

A, B, C, D = "a@h", "b@h", "c@h", "d@h"
ALL4 = [A, B, C, D]


def test_params_defaults_are_rabbitmqs():
    assert params_of({"max-length": 3}) is None and params_of(None) is None
    p = params_of({"ha-mode": "all"})
    assert (p.sync_mode, p.sync_batch_size, p.promote_on_shutdown, p.promote_on_failure) == (
        MANUAL, None, WHEN_SYNCED, ALWAYS)
    p = params_of({"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic", "ha-sync-batch-size": 2,
                   "ha-promote-on-failure": "when-synced"})
    assert (p.params, p.sync_mode, p.sync_batch_size, p.promote_on_failure) == (2, AUTOMATIC, 2, WHEN_SYNCED)


def test_all_mirrors_on_every_running_node_but_the_leader():
    p = params_of({"ha-mode": "all"})
    assert mirrors_for(p, A, (), ALL4, ALL4) == (B, C, D)
    assert mirrors_for(p, A, (C, B), ALL4, [A, B, C]) == (C, B)  # existing order kept, D is down


def test_exactly_counts_the_leader_keeps_mirrors_and_replaces_a_down_one():
    assert mirrors_for(params_of({"ha-mode": "exactly", "ha-params": 1}), A, (), ALL4, ALL4) == ()
    two = params_of({"ha-mode": "exactly", "ha-params": 2})
    assert mirrors_for(two, A, (), ALL4, ALL4) == (B,)
    assert mirrors_for(two, A, (C,), ALL4, ALL4) == (C,)
    assert mirrors_for(two, A, (C,), ALL4, [A, B, D]) == (B,)  # C went down: replaced
    assert mirrors_for(params_of({"ha-mode": "exactly", "ha-params": 9}), A, (), ALL4, [A, B]) == (B,)


def test_nodes_ignores_unknown_names_and_moves_the_leader_only_to_a_synchronised_listed_mirror():
    p = params_of({"ha-mode": "nodes", "ha-params": [C, D, "nobody@h"]})
    assert mirrors_for(p, A, (B,), ALL4, ALL4) == (C, D)  # [A B] -> [A C D]: A stays until C or D syncs
    assert leader_move(p, A, []) is None
    assert leader_move(p, A, [D]) == D
    assert leader_move(p, C, [D]) is None  # a listed leader stays
    assert declare_node(p, A, ALL4) == C
    assert declare_node(p, A, [A, B]) == A  # no listed node running: the declaring node
    assert declare_node(params_of({"ha-mode": "nodes", "ha-params": [A, C]}), A, ALL4) == A


def _op(seq: int, body: bytes = b"x", origin: str = "", token: int = 0) -> Enqueued:
    return Enqueued(seq, "", "q", b"", body, True, 0, None, None, origin, token)


def _item(seq: int, delivery_count: int) -> SyncItem:
    return SyncItem(seq, "", "q", b"", b"x", True, 0, None, None, delivery_count)


def test_a_replica_follows_the_leaders_operations():
    r = Replica()
    r.apply(decode_ops(encode_ops([_op(1), _op(2, origin=B, token=7), _op(3), CheckedOut([1, 3]),
                                   Removed([2]), CheckedOut([1]), Removed([99])])))
    assert sorted(r.entries) == [1, 3] and r.max_seq == 3
    assert (r.entries[1].delivery_count, r.entries[3].delivery_count) == (2, 1)
    assert (B, 7) in r.tokens  # a promoted copy recognises that publish when it is sent again


def test_a_late_mirror_is_filled_by_sync_and_a_new_leader_trims_what_it_lacks():
    r = Replica()
    r.apply([_op(5), Removed([2])])  # joined late: seqs below 5 unknown, their operations ignored
    r.apply([SyncBatch((_item(2, 1), _item(3, 0), _item(5, 0))), SyncDone(6)])
    assert sorted(r.entries) == [2, 3, 5] and r.entries[2].delivery_count == 1 and r.entries[5].delivery_count == 0
    r.apply([NewLeaderHead(4, (3,))])  # the new leader holds 3 and everything from 4 on
    assert sorted(r.entries) == [3, 5]
    assert [e.seq for e in r.in_order()] == [3, 5]
    r.apply([View((), False, ALWAYS, WHEN_SYNCED, "m"), Deleted()])
    assert r.view.leader == "m" and r.deleted


def test_a_replica_remembers_a_bounded_number_of_publish_ids():
    r = Replica()
    r.apply([_op(i, origin=A, token=i) for i in range(1, TOKENS_KEPT + 3)])
    assert len(r.tokens) == TOKENS_KEPT and (A, 1) not in r.tokens and (A, TOKENS_KEPT + 2) in r.tokens
