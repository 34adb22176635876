"""A mirrored queue's leader that stops leading, and the GM traffic it sends (seed 000,
"Publisher confirms and transactions"; docs/mirroring.md, "Confirms wait for every mirror").

A publish to a mirrored queue is confirmed once every mirror has it. When the catalogue hands
the queue to another node before that, the old leader cannot know whether the new one has it:
the publish is refused (nacked, or sent again by its node), never confirmed. When the queue
stays here (its policy no longer mirrors it) or is deleted, what waits is settled as before.
And a GM message the transport drops makes its member dead to the sender, so that a ring
never waits for what will not arrive."""

from __future__ import annotations

from types import SimpleNamespace

from hutch.mirror import gm
from hutch.mirror.host import MirrorHost
from hutch.mirror.leader import Leader

N1, N2, N3 = "hutch@n1|1.1", "hutch@n2|1.1", "hutch@n3|1.1"


class _Cluster:
    """The leader's view of its node: where the catalogue says the queue is led."""

    def __init__(self, leader_in_catalogue: str | None) -> None:
        self.node = "hutch@n1"
        self.leader_in_catalogue = leader_in_catalogue

    def catalogue_leader_of(self, vhost: str, name: str) -> str | None:
        return self.leader_in_catalogue

    def call_soon(self, fn, *args) -> None:
        fn(*args)


def _leader_with_an_unstable_publish(leader_in_catalogue: str | None) -> tuple[Leader, list]:
    cluster = _Cluster(leader_in_catalogue)
    host = SimpleNamespace(cluster=cluster, node=cluster.node, token=("", 0))
    q = SimpleNamespace(vhost="/", name="orders")
    ld = Leader(host, q, gm.GMMember.create(N1, [N1, N2]))
    ld.removed(1)  # an operation recorded, broadcast, and not yet round the ring
    ld.flush()
    outcome: list = []
    ld.after_stable(lambda seq: outcome.append(("confirmed", seq)), 7, lambda seq: outcome.append(("refused", seq)))
    return ld, outcome


def test_a_leader_whose_queue_moved_refuses_what_its_mirrors_had_not_all_got():
    ld, outcome = _leader_with_an_unstable_publish("hutch@n2")
    ld.detach()
    assert outcome == [("refused", 7)]
    assert not ld.backlog.waiters


def test_a_queue_no_longer_mirrored_confirms_what_waited():
    ld, outcome = _leader_with_an_unstable_publish("hutch@n1")
    ld.detach()
    assert outcome == [("confirmed", 7)]


def test_a_deleted_queue_settles_what_waited():
    ld, outcome = _leader_with_an_unstable_publish(None)
    ld.detach(deleted=True)
    assert outcome == [("confirmed", 7)]


class _Peers:
    """The node's peer transport: a message to a node that is not up is dropped (False)."""

    def __init__(self, up: set[str]) -> None:
        self.broker = SimpleNamespace()
        self.node = "hutch@n1"
        self.incarnation = 1
        self.up = up
        self.sent: list[tuple[str, str]] = []

    def send(self, peer: str, payload) -> bool:
        if peer not in self.up:
            return False
        self.sent.append((peer, payload[1]))
        return True


def test_a_member_whose_message_was_dropped_is_dead_to_the_sender_and_the_ring_closes_past_it():
    peers = _Peers(up={"hutch@n3"})
    host = MirrorHost(peers)
    member = gm.GMMember.create(N1, [N1, N2, N3])
    assert member.right == N2
    member.broadcast(b"m1")
    host._pump_member(member)  # n2 is not up: what went to it is lost
    assert N2 in member.known_dead() and member.right == N3
    assert ("hutch@n3", N3) in peers.sent  # the ring goes on past it
