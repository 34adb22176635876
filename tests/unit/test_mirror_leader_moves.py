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
        self.catalogue = SimpleNamespace(queue=lambda vhost, name: None)  # no record: nothing to place

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


class _FencingCluster(_Cluster):
    """A leader's node whose catalogue answers CheckQueueLeader when the test says so."""

    def __init__(self) -> None:
        super().__init__("hutch@n1")
        self.submitted: list = []
        self.fenced: tuple[str, ...] = ()

    def cut_off(self) -> bool:
        return False

    def promotion_held(self, dead_leader: str) -> bool:
        return False

    def fenced_nodes(self, vhost: str, name: str) -> tuple[str, ...]:
        return self.fenced

    def mirror_params(self, vhost: str, name: str):
        return None

    def submit(self, cmd, callback) -> None:
        self.submitted.append((cmd, callback))


def _leader_with_a_synchronised_mirror() -> tuple[Leader, gm.GMMember, _FencingCluster, list]:
    cluster = _FencingCluster()
    host = SimpleNamespace(cluster=cluster, node=cluster.node, token=("", 0))
    state = SimpleNamespace(next_seq=1, unacked={}, ready_heads=lambda: ())  # an empty queue
    q = SimpleNamespace(vhost="/", name="orders", state=state, tail=None, flow_waiters=None)
    member = gm.GMMember.create(N1, [N1, N2])
    ld = Leader(host, q, member)
    ld.on_event(gm.MembersChanged(1, (N1, N2), (N2,), ()))
    assert [m.node for m in ld.synchronised()] == ["hutch@n2"]
    ld.removed(1)
    ld.flush()
    outcome: list = []
    ld.after_stable(lambda seq: outcome.append(("confirmed", seq)), 7, lambda seq: outcome.append(("refused", seq)))
    return ld, member, cluster, outcome


def test_what_became_stable_because_a_synchronised_mirror_died_waits_until_its_node_is_fenced():
    """The ring declares n2 dead and reports the leader's broadcast stable (n1 alone holds it).
    n2 still takes itself for synchronised: where it is reachable and n1 is not, it may be
    promoted. So nothing is confirmed until the catalogue, through its log, says n1 still leads
    and has fenced n2 (seen in a campaign: a leader cut off alone confirmed as its mirror's node
    was declared down, a moment before it found itself in the minority)."""
    ld, member, cluster, outcome = _leader_with_a_synchronised_mirror()
    member.member_down(N2)
    for ev in member.take_events():
        ld.on_event(ev)
    assert outcome == [] and ld.stable_held
    ld.tick(0.0)
    (cmd, answer), = cluster.submitted
    assert (cmd.leader_node, cmd.fence, cmd.unfence) == ("hutch@n1", ("hutch@n2",), ())
    answer(SimpleNamespace(ok=True, code=200, text="", status=""))
    assert outcome == [("confirmed", 7)] and not ld.to_fence and not ld.stable_held


def test_a_leader_the_catalogue_no_longer_names_confirms_nothing_after_a_mirror_died():
    ld, member, cluster, outcome = _leader_with_a_synchronised_mirror()
    member.member_down(N2)
    for ev in member.take_events():
        ld.on_event(ev)
    ld.tick(0.0)
    (_cmd, answer), = cluster.submitted
    answer(SimpleNamespace(ok=False, code=406, text="led by hutch@n2, not hutch@n1", status=""))
    assert outcome == [] and ld.to_fence == {"hutch@n2"}
    cluster.leader_in_catalogue = "hutch@n2"
    ld.detach()
    assert outcome == [("refused", 7)]


def test_a_stable_reported_before_the_death_is_held_too():
    """The ring may settle a broadcast past a member it declared dead before it reports the
    death: the leader looks at the members the ring declared dead, not only at reported deaths."""
    ld, member, cluster, outcome = _leader_with_a_synchronised_mirror()
    member.member_down(N2)
    events = member.take_events()
    stable = [ev for ev in events if type(ev) is gm.Stable]
    assert stable
    ld.on_event(stable[0])  # before MembersChanged
    assert outcome == [] and ld.to_fence == {"hutch@n2"}

