"""A mirror's promotion committed after its mirror was taken off the queue (docs/mirroring.md,
"The leader fails"): the catalogue refuses it. Found by hutch sim cluster (mirrored seed 170):
n1's synchronised mirror proposed its promotion; before it committed, a placement took n1 off
the queue's mirrors (its mirror went, its copy shelved); the promotion then named n1 leader,
and n1, holding no mirror to promote, made the queue afresh: three confirmed messages lost."""

from __future__ import annotations

from hutch.cluster.catalogue import AddVhost, Catalogue, DeclareQueue, SetQueueNodes


def _catalogue() -> Catalogue:
    k = Catalogue()
    assert k.apply(AddVhost("/")).ok
    assert k.apply(DeclareQueue("/", "q", leader_node="n2", member_nodes=("n1", "n3"))).ok
    return k


def test_a_promotion_of_a_node_no_longer_among_the_mirrors_is_refused():
    k = _catalogue()
    assert k.apply(SetQueueNodes("/", "q", "n2", ("n3",), expect_leader="n2")).ok  # n1 taken off
    refused = k.apply(SetQueueNodes("/", "q", "n1", ("n3",), expect_leader="n2", promotion=True))
    assert refused.code == 406 and "has no mirror on n1 to promote" in refused.text
    assert (k.queue("/", "q").leader_node, k.queue("/", "q").member_nodes) == ("n2", ("n3",))


def test_a_mirror_still_among_the_mirrors_is_promoted():
    k = _catalogue()
    assert k.apply(SetQueueNodes("/", "q", "n1", ("n3",), expect_leader="n2", promotion=True)).ok
    assert k.queue("/", "q").leader_node == "n1"
