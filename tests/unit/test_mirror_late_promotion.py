"""A mirror's promotion that commits late (docs/mirroring.md, "The leader fails" and "Nodes
that come back").

A mirror that saw its leader die proposes its promotion; the catalogue may commit it only much
later, and the mirror's copy must be the queue all the same:

- Its node was cut off from the majority, and meanwhile the old leader's node came back: the
  mirror left its ring to join it again, offering its copy to be judged. It is promoted with
  what it held, leading a ring of its own. Found by hutch sim cluster (mirrored seeds 749 and
  987): the mirror's node made the queue afresh instead, and the messages confirmed with the
  mirror synchronised were lost.
- Its node went down before the promotion committed. When it starts again, the catalogue names
  it leader of a queue its own journal holds nothing of, while the copy its mirror kept on disk
  holds the queue: it leads with that copy, each message redelivered. Found by hutch sim
  cluster (mirrored seed 1030, every fault kind, with nodes that resume from a pause only once
  the catalogue has caught up): the node made the queue afresh, and three confirmed messages
  were lost."""

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


def _mirror_with_a_copy(tmp_path):
    """A node mirroring queue 'orders' led by a@h, its copy on disk holding m1 and m2, in sync."""
    cl = ClusterBroker(Broker(Config()), B, lambda peer, payload: True, lambda _n: True,
                       lambda _cmd, _cb: None, lambda fn, *args: None)
    cl.recovering = True
    cl.apply_command(cat.AddVhost("/"))
    cl.broker.open_storage(str(tmp_path))
    cl.apply_command(cat.DeclareQueue("/", "orders", leader_node=A, member_nodes=(B,), journal_id=7))
    m = cl.mirroring.mirrors[("/", "orders")]
    m._got_leader([200, A_MEMBER, [(1, 1)]])  # joined the leader's ring: a new copy on disk
    m.replica.apply([_enqueued(1), _enqueued(2),
                     View((MirrorView(m.member.id, B, True, 1),), False, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    m.persist()
    return cl, m


def test_a_promotion_that_commits_while_the_mirror_rejoins_keeps_what_it_held(tmp_path) -> None:
    cl, m = _mirror_with_a_copy(tmp_path)
    cl.peer_down(A)  # the leader's node goes; the promotion proposed now commits much later
    cl.peer_up(A)  # it is back: the mirror leaves the ring to join it again, offering its copy
    assert m.member is None and set(m.replica.unreconciled) == {1, 2}

    cl.apply_command(cat.SetQueueNodes("/", "orders", B, (), expect_leader=A, promotion=True,
                                       synchronised_only=True))

    q = cl.broker.vhosts["/"].queues["orders"]
    assert q.local and ("/", "orders") in cl.mirroring.leaders
    assert ("/", "orders") not in cl.mirroring.mirrors
    assert [(e.seq, e.message.body, e.redelivered) for e in q.state.ready()] == [(1, b"m1", True), (2, b"m2", True)]


def test_a_join_asked_again_does_not_turn_the_copy_from_the_ring_into_one_read_from_disk(tmp_path) -> None:
    """The same, but the mirror's first offer of its copy got no answer and it asked again before
    the promotion committed. Found by hutch sim cluster (mirrored seed 222, every fault kind):
    the second offer took the entries the first had marked unjudged for a copy read from disk,
    and the promotion dropped them, six confirmed messages among them."""
    cl, m = _mirror_with_a_copy(tmp_path)
    cl.peer_down(A)
    cl.peer_up(A)  # the first offer of its copy
    assert m.asking and m.copy_from_ring
    m._got_leader(None)  # no answer: it asks again later
    m.start(m.retry_at + 1)  # the second offer
    assert m.asking and m.copy_from_ring and set(m.replica.unreconciled) == {1, 2}

    cl.apply_command(cat.SetQueueNodes("/", "orders", B, (), expect_leader=A, promotion=True,
                                       synchronised_only=True))

    q = cl.broker.vhosts["/"].queues["orders"]
    assert ("/", "orders") in cl.mirroring.leaders
    assert [(e.seq, e.message.body) for e in q.state.ready()] == [(1, b"m1"), (2, b"m2")]


def test_a_promotion_that_commits_while_the_mirror_is_joining_the_old_leaders_new_ring_keeps_what_it_held(
        tmp_path) -> None:
    """The same, but the old leader's node answered the mirror's offer and the mirror is on its
    way into that node's new ring when the promotion commits. Found by `make campaign-long` (run
    37, mirrored, ha-mode all: an fsync error stopped the leader's node, which came back on the
    network for a moment while it stopped): the node took a mirror still joining for one with
    nothing to promote, made the queue afresh, and three confirmed messages were lost."""
    cl, m = _mirror_with_a_copy(tmp_path)
    cl.peer_down(A)
    cl.peer_up(A)  # it offers its copy to the old leader's node, which answers with its new ring
    m._got_leader([200, "a@h|1.2", [(1, 1)], True])
    assert m.member is not None and m.member.status != "member" and m.replica.entries
    joining = m.member.id

    cl.apply_command(cat.SetQueueNodes("/", "orders", B, (), expect_leader=A, promotion=True,
                                       synchronised_only=True))

    q = cl.broker.vhosts["/"].queues["orders"]
    assert ("/", "orders") in cl.mirroring.leaders and ("/", "orders") not in cl.mirroring.mirrors
    assert [(e.seq, e.message.body) for e in q.state.ready()] == [(1, b"m1"), (2, b"m2")]
    assert joining not in cl.mirroring.members  # the joining member was let go


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


def _bodies(cl: ClusterBroker) -> list[tuple[bytes, bool]]:
    q = cl.broker.vhosts["/"].queues["orders"]
    q.page_in_all()
    return [(e.message.body, e.redelivered) for e in q.state.ready()]


def test_a_promotion_cut_short_by_the_node_stopping_is_completed_at_its_next_boot(tmp_path):
    """Found by hutch sim cluster (mirrored-nodes 221, window 4): the node's fsyncs failed while
    it wrote the promoted copy into the queue's journal, and it stopped. Its journal kept the
    copy whole and the queue's records of all but the last message; the node came back leading
    the queue with those, and the last confirmed message was lost."""
    cl = _node(tmp_path, leader=A)
    m = cl.mirroring.mirrors[("/", "orders")]
    m._got_leader([200, A_MEMBER, [(1, 1)]])
    m.replica.apply([*(_enqueued(s) for s in range(1, 6)),
                     View((MirrorView(m.member.id, B, True, 1),), False, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    m.persist()
    # what MirrorHost._restore_copy writes, cut short: MA, then three of the five E records; the
    # records that drop the copy never reach the disk
    j = cl.broker.journal
    m.adopt(7)
    for s in range(1, 4):
        j.enqueue(7, "", "orders", b"", b"m%d" % s)
    cl.broker.close_storage()

    again = _node(tmp_path, leader=B)
    assert ("/", "orders") in again.mirroring.leaders
    assert _bodies(again) == [(b"m%d" % s, True) for s in range(1, 6)], "the whole copy, once each"
    assert again.broker.journal.mirror_copies == {}
    again.broker.close_storage()

    third = _node(tmp_path, leader=B)  # what the second boot wrote is the queue now; the copy is gone
    assert _bodies(third) == [(b"m%d" % s, True) for s in range(1, 6)]
    assert third.broker.journal.mirror_copies == {}


def test_a_queue_holding_messages_from_before_a_copys_adoption_is_not_replaced(tmp_path):
    cl = _node(tmp_path, leader=A)
    m = cl.mirroring.mirrors[("/", "orders")]
    m._got_leader([200, A_MEMBER, [(1, 1)]])
    m.replica.apply([_enqueued(1), _enqueued(2),
                     View((MirrorView(m.member.id, B, True, 1),), False, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    m.persist()
    j = cl.broker.journal
    j.enqueue(7, "", "orders", b"", b"older")  # written before the MA: not a part of the copy
    m.adopt(7)
    j.enqueue(7, "", "orders", b"", b"m1")
    cl.broker.close_storage()

    again = _node(tmp_path, leader=B)
    assert _bodies(again) == [(b"older", False), (b"m1", False)]  # (a clean stop: nothing was delivered)
