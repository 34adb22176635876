"""A node whose catalogue has not caught up when it starts (docs/durability.md, "A queue
declared late").

An entry this node applied before it stopped may not be known committed when it starts again:
if it cannot reach a majority within `metadata_timeout_ms`, it starts with the entries it knows
committed, and a durable queue declared by a later one is missing for a while. Its messages are
in the journal all the same. Found by hutch sim cluster (classic seed 293): the journal released
them as a deleted queue's, so that when the declaration was applied the queue came back without
them, and only the luck of a segment not yet deleted kept the run from losing them."""

from __future__ import annotations

from hutch.broker.broker import Broker, Config
from hutch.broker.cluster import ClusterBroker
from hutch.cluster import catalogue as cat

B = "b@h"
DECLARE = cat.DeclareQueue("/", "orders", leader_node=B, journal_id=9)


def _node(tmp_path, *, declared: bool, caught_up: bool) -> ClusterBroker:
    cl = ClusterBroker(Broker(Config()), B, lambda peer, payload: True, lambda _n: True,
                       lambda _cmd, _cb: None, lambda fn, *args: None)
    cl.broker.cluster = cl
    cl.recovering = True
    cl.apply_command(cat.AddVhost("/"))
    if declared:
        cl.apply_command(DECLARE)
    cl.broker.open_storage(str(tmp_path), keep_unknown=not caught_up)
    return cl


def _bodies(cl: ClusterBroker) -> list[bytes]:
    return [e.message.body for e in cl.broker.vhosts["/"].queues["orders"].state.ready()]


def _first_run(tmp_path) -> None:
    cl = _node(tmp_path, declared=True, caught_up=True)
    for i in range(3):
        cl.broker.journal.enqueue(9, "", "orders", b"\x00\x00", b"m%d" % i)
    cl.broker.close_storage()


def test_a_queue_declared_after_start_up_gets_the_messages_its_journal_kept(tmp_path):
    _first_run(tmp_path)
    cl = _node(tmp_path, declared=False, caught_up=False)
    assert "orders" not in cl.broker.vhosts["/"].queues
    cl.apply_command(DECLARE)  # the catalogue catches up
    assert _bodies(cl) == [b"m0", b"m1", b"m2"]
    assert cl.broker.journal.orphans == {}
    cl.broker.close_storage()
    again = _node(tmp_path, declared=True, caught_up=True)  # and they are the queue's from now on
    assert _bodies(again) == [b"m0", b"m1", b"m2"]
    again.broker.close_storage()


def test_a_caught_up_start_without_the_queue_lets_its_messages_go(tmp_path):
    _first_run(tmp_path)
    cl = _node(tmp_path, declared=False, caught_up=True)  # the queue was deleted
    assert cl.broker.journal.orphans == {}
    cl.apply_command(DECLARE)  # (a declaration of the same id cannot come back; if it did, empty)
    assert _bodies(cl) == []
    cl.broker.close_storage()
