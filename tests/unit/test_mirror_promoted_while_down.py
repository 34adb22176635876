"""A mirror promoted while its node was down (docs/mirroring.md, "Nodes that come back").

A mirror saw its leader die and proposed its promotion; its node went down before the
proposal committed, and it committed while the node was down. When the node starts again the
catalogue names it leader of a queue its own journal holds nothing of, while the copy its
mirror kept on disk holds the queue. It leads with that copy, each message redelivered. Found
by hutch sim cluster (mirrored seed 1030, every fault kind, with nodes that resume from a pause
only once the catalogue has caught up): the node made the queue afresh, and three confirmed
messages were lost."""

from __future__ import annotations

from hutch.broker.broker import Broker, Config
from hutch.broker.cluster import ClusterBroker
from hutch.cluster import catalogue as cat
from hutch.mirror.placement import WHEN_SYNCED
from hutch.mirror.replica import Enqueued, MirrorView, View

A, B = "a@h", "b@h"
A_MEMBER = "a@h|1.1"


def _enqueued(seq: int) -> Enqueued:
    return Enqueued(seq, "", "orders", b"", b"m%d" % seq, True, 0, None, None, "", 0)


def _node(tmp_path, leader: str) -> ClusterBroker:
    cl = ClusterBroker(Broker(Config()), B, lambda peer, payload: True, lambda _n: False,
                       lambda _cmd, _cb: None, lambda fn, *args: None)
    cl.broker.cluster = cl  # (as the node's runtime does: recovery ends with ClusterBroker.recovered)
    cl.recovering = True
    cl.apply_command(cat.AddVhost("/"))
    cl.apply_command(cat.DeclareQueue("/", "orders", leader_node=A, member_nodes=(B,), journal_id=7))
    if leader != A:  # the promotion, committed while this node was down
        cl.apply_command(cat.SetQueueNodes("/", "orders", B, (A,), expect_leader=A, promotion=True,
                                           synchronised_only=True))
    cl.broker.open_storage(str(tmp_path))
    return cl


def test_a_node_whose_mirror_was_promoted_while_it_was_down_leads_with_the_copy_it_kept(tmp_path):
    cl = _node(tmp_path, leader=A)  # the first run: a mirror of the queue led by a@h
    m = cl.mirroring.mirrors[("/", "orders")]
    m._got_leader([200, A_MEMBER, [(1, 1)]])  # joined the leader's ring: a new copy on disk
    m.replica.apply([_enqueued(1), _enqueued(2), _enqueued(3),
                     View((MirrorView(m.member.id, B, True, 1),), False, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    m.persist()
    cl.broker.close_storage()

    again = _node(tmp_path, leader=B)  # the second run: the catalogue names this node leader
    q = again.broker.vhosts["/"].queues["orders"]
    assert q.local and ("/", "orders") in again.mirroring.leaders
    assert [(e.message.body, e.redelivered) for e in q.state.ready()] == [(b"m1", True), (b"m2", True),
                                                                           (b"m3", True)]
    assert again.broker.journal.mirror_copies == {}  # the queue's own journal holds them now
