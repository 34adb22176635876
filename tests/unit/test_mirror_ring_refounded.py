"""A leader the ring declared dead while it still leads (docs/mirroring.md, "A leader the ring
declared dead").

A ring's record of deaths is a union. When two members each declare the other dead, both are
out: a paused leader that resumes just as its mirror is promoted, and the promoted mirror,
take each other out of the ring. Seen under load in the cluster test of a SIGSTOPped leader:
the new leader's member was removed, so it could broadcast nothing and no mirror could join,
and the one surviving mirror kept proposing its own promotion, which the catalogue refused
because the new leader was running. The leader now founds a ring of its own, and a mirror
whose leader's node is up and still named by the catalogue joins that leader's new ring."""

from __future__ import annotations

from types import SimpleNamespace

from hutch.broker.broker import Config
from hutch.mirror import gm
from hutch.mirror.host import MirrorHost
from hutch.mirror.leader import MISSING_MIRROR_S, Leader
from hutch.mirror.mirror import LOOK_FOR_RING_S, Mirror

N1, N2 = "hutch@n1", "hutch@n2"
N1_MEMBER, N2_MEMBER = "hutch@n1|1.1", "hutch@n2|1.1"


class _Records:
    """The catalogue's queue records, as the glue reads them."""

    def __init__(self) -> None:
        self.records: dict = {}

    def queue(self, vhost: str, name: str):
        return self.records.get((vhost, name))


class _LeaderNode:
    """The leader's node: its catalogue answers CheckQueueLeader when the test says so."""

    def __init__(self) -> None:
        self.node = N1
        self.submitted: list = []
        self.ids = 1
        self.catalogue = _Records()  # what the queue's record names: nothing unless a test says
        self.up = {N1, N2}
        self.calls: list = []

    def catalogue_leader_of(self, vhost: str, name: str) -> str:
        return N1

    def is_up(self, node: str) -> bool:
        return node in self.up

    def call(self, peer: str, kind: str, args: list, callback) -> None:
        self.calls.append((peer, kind, args))

    def cut_off(self) -> bool:
        return False

    def promotion_held(self, dead_leader: str) -> bool:
        return False

    def fenced_nodes(self, vhost: str, name: str) -> tuple[str, ...]:
        return ()

    def mirror_params(self, vhost: str, name: str):
        return None

    def submit(self, cmd, callback) -> None:
        self.submitted.append((cmd, callback))

    def call_soon(self, fn, *args) -> None:
        fn(*args)


def _leader() -> tuple[Leader, SimpleNamespace, _LeaderNode, list]:
    cluster = _LeaderNode()
    replaced: list = []

    def new_member_id() -> str:
        cluster.ids += 1
        return f"{N1}|1.{cluster.ids}"

    host = SimpleNamespace(cluster=cluster, node=N1, token=("", 0), new_member_id=new_member_id,
                           member_replaced=lambda old, ld: replaced.append((old.id, ld.gm.id)))
    state = SimpleNamespace(next_seq=1, unacked={}, ready_heads=lambda: ())  # an empty queue
    q = SimpleNamespace(vhost="/", name="orders", state=state, tail=None, flow_waiters=None)
    ld = Leader(host, q, gm.GMMember.create(N1_MEMBER, [N1_MEMBER, N2_MEMBER]))
    ld.on_event(gm.MembersChanged(1, (N1_MEMBER, N2_MEMBER), (N2_MEMBER,), ()))
    assert [m.node for m in ld.synchronised()] == [N2]
    return ld, host, cluster, replaced


def _pump(ld: Leader, member: gm.GMMember) -> None:
    for ev in member.take_events():
        ld.on_event(ev)


def test_a_leader_declared_dead_by_its_ring_founds_a_new_one_and_confirms_once_its_mirror_is_fenced():
    ld, _host, cluster, replaced = _leader()
    old = ld.gm
    ld.removed(1)  # recorded, broadcast, not yet round the ring
    ld.flush()
    outcome: list = []
    ld.after_stable(lambda tag: outcome.append(("confirmed", tag)), 7, lambda tag: outcome.append(("refused", tag)))

    old.receive(N2_MEMBER, gm.Notice((N1_MEMBER,), ()))  # n2 declared n1's member dead
    _pump(ld, old)

    assert old.status == gm.REMOVED
    assert ld.gm is not old and ld.gm.status == gm.MEMBER and ld.gm.members == (ld.gm.id,)
    assert replaced == [(N1_MEMBER, ld.gm.id)]
    assert not ld.mirrors and ld.to_fence == {N2}
    assert outcome == []  # n2 still takes itself for synchronised: nothing confirmed yet
    ld.tick(0.0)
    (cmd, answer), = cluster.submitted
    assert (cmd.leader_node, cmd.fence) == (N1, (N2,))
    answer(SimpleNamespace(ok=True, code=200, text="", status=""))
    assert outcome == [("confirmed", 7)] and not ld.stable_held

    # the new ring numbers its broadcasts on from the old one's, and is alone: stable at once
    ld.removed(2)
    ld.flush()
    _pump(ld, ld.gm)
    assert ld.last_seq == 2 and ld.stable_seq == 2


def test_what_waits_is_refused_if_the_catalogue_says_another_node_leads():
    ld, _host, cluster, _replaced = _leader()
    old = ld.gm
    ld.removed(1)
    ld.flush()
    outcome: list = []
    ld.after_stable(lambda tag: outcome.append(("confirmed", tag)), 7, lambda tag: outcome.append(("refused", tag)))
    old.receive(N2_MEMBER, gm.Notice((N1_MEMBER,), ()))
    _pump(ld, old)
    ld.tick(0.0)
    (_cmd, answer), = cluster.submitted
    answer(SimpleNamespace(ok=False, code=406, text=f"led by {N2}, not {N1}", status=""))
    assert outcome == []
    cluster.catalogue_leader_of = lambda vhost, name: N2
    ld.detach()
    assert outcome == [("refused", 7)]


class _MirrorNode:
    """A mirror's node: which peers are up, what the catalogue names, and its calls to peers."""

    def __init__(self) -> None:
        self.node = "hutch@n3"
        self.incarnation = 1
        self.broker = SimpleNamespace(config=Config(), journal=None, schedule=lambda: None,
                                      now_ms=lambda: 0)
        self.up = {N1}
        self.leader = N1
        self.calls: list = []

    def is_up(self, node: str) -> bool:
        return node in self.up

    def send(self, peer: str, payload) -> bool:
        return peer in self.up

    def catalogue_leader_of(self, vhost: str, name: str) -> str:
        return self.leader

    def call(self, peer: str, kind: str, args: list, callback) -> None:
        self.calls.append((peer, kind, args, callback))


def _mirror_whose_leader_was_declared_dead() -> tuple[MirrorHost, Mirror, _MirrorNode]:
    cl = _MirrorNode()
    host = MirrorHost(cl)
    m = host.mirrors[("/", "orders")] = Mirror(host, "/", "orders", N1)
    m.claimed = True
    me = "hutch@n3|1.1"
    m.member = gm.GMMember.create(me, [N1_MEMBER, me])
    m.leader_member = N1_MEMBER
    host.members[me] = m
    m.member.receive(N2_MEMBER, gm.Notice((N1_MEMBER,), ()))  # told by a stale leader
    host._pump_member(m.member)
    assert m.leader_dead
    return host, m, cl


def test_a_mirror_joins_its_leaders_new_ring():
    host, m, cl = _mirror_whose_leader_was_declared_dead()
    old = m.member
    m.promoting = True  # its own promotion proposed: refused while the leader's node runs
    host.tick(10.0)
    (peer, kind, args, answer), = cl.calls
    assert (peer, kind, args) == (N1, "gmid", ["/", "orders"])
    answer([200, "hutch@n1|1.2", [], False])  # n1 leads a new ring
    assert m.member is None and not m.leader_dead and old.status == gm.REMOVED
    assert old.id not in host.members
    host.tick(10.1)
    (peer, kind, args, answer) = cl.calls[-1]
    assert (peer, kind) == (N1, "gmid")
    answer([200, "hutch@n1|1.2", [], False])
    assert m.member is not None and m.member.status == gm.JOINING and m.leader_member == "hutch@n1|1.2"


def test_a_mirror_stays_in_its_ring_while_the_leaders_node_answers_with_the_member_it_lost():
    host, m, cl = _mirror_whose_leader_was_declared_dead()
    old = m.member
    host.tick(10.0)
    cl.calls[-1][3]([200, N1_MEMBER, [], False])
    assert m.member is old and m.leader_dead
    host.tick(10.0 + LOOK_FOR_RING_S / 2)  # asks again only after a while
    assert len(cl.calls) == 1
    host.tick(10.0 + LOOK_FOR_RING_S)
    assert len(cl.calls) == 2


def test_a_mirror_does_not_ask_a_leader_node_that_is_down_or_no_longer_named():
    host, m, cl = _mirror_whose_leader_was_declared_dead()
    cl.up.clear()
    host.tick(10.0)
    cl.up.add(N1)
    cl.leader = N2  # a promotion committed: the catalogue has moved on
    host.tick(20.0)
    assert cl.calls == [] and m.member is not None


def test_a_leader_that_leaves_its_ring_on_purpose_founds_no_other():
    ld, _host, _cluster, replaced = _leader()
    member = ld.gm
    ld.detach()
    _pump(ld, member)
    assert member.status == gm.REMOVED and ld.gm is member and replaced == []


def test_no_mirror_joins_a_recovered_leaders_ring_until_the_mirrors_nodes_are_fenced():
    """A leader that recovered its queue from disk at boot founds a ring afresh. A mirror that
    joins it gives up its copy unless the leader takes it, and a promotion of that mirror,
    proposed while the leader's node was down, may still commit: the queue would then be led
    from an empty copy (found by hutch sim cluster, mirrored seed 330). So the mirrors' nodes
    are fenced first, and only then may mirrors join."""
    ld, _host, cluster, _replaced = _leader()
    ld.mirrors.clear()
    ld.admit_after_fencing([N2])
    host = MirrorHost(_MirrorNode())
    host.leaders[("/", "orders")] = ld
    refused = host.leader_member("/", "orders")
    assert refused[0] == 404 and "not yet confirmed" in refused[1]
    ld.tick(0.0)
    (cmd, answer), = cluster.submitted
    assert (cmd.leader_node, cmd.fence) == (N1, (N2,))
    answer(SimpleNamespace(ok=True, code=200, text="", status=""))
    assert ld.admitting and host.leader_member("/", "orders")[:2] == [200, ld.gm.id]


def test_a_recovered_leader_that_no_longer_leads_lets_no_mirror_in():
    ld, _host, cluster, _replaced = _leader()
    ld.admit_after_fencing([N2])
    ld.tick(0.0)
    (_cmd, answer), = cluster.submitted
    answer(SimpleNamespace(ok=False, code=406, text=f"led by {N2}, not {N1}", status=""))
    assert not ld.admitting


# -- a mirror left in an earlier leader's ring (found by the simulation's copies check, mirrored seed 557)

N3 = "hutch@n3"


def test_a_leader_tells_a_member_node_whose_mirror_is_not_in_its_ring_to_join_it():
    """n3's mirror was cut off when the old leader's ring declared it dead, and took the
    promotion that followed for its own ring's: the new leader, whose record names n3, tells
    n3 to join its ring once n3 has been up without a mirror in it for MISSING_MIRROR_S."""
    ld, _host, cluster, _replaced = _leader()
    cluster.catalogue.records[("/", "orders")] = SimpleNamespace(leader_node=N1, member_nodes=(N1, N2, N3))
    cluster.up.add(N3)
    ld.tick(100.0)
    ld.tick(100.0 + MISSING_MIRROR_S / 2)
    assert cluster.calls == []  # a mirror may still be joining
    ld.tick(100.0 + MISSING_MIRROR_S)
    assert cluster.calls == [(N3, "gmrejoin", ["/", "orders", ld.gm.id])]  # n2's mirror is in the ring
    ld.tick(100.0 + MISSING_MIRROR_S + 1)
    assert len(cluster.calls) == 1  # and again only after as long
    ld.tick(100.0 + 2 * MISSING_MIRROR_S)
    assert len(cluster.calls) == 2


def test_a_leader_does_not_call_a_node_that_is_down_or_not_named_or_whose_mirror_came():
    ld, _host, cluster, _replaced = _leader()
    cluster.catalogue.records[("/", "orders")] = SimpleNamespace(leader_node=N1, member_nodes=(N1, N2, N3))
    ld.tick(0.0)
    ld.tick(2 * MISSING_MIRROR_S)  # n3 down
    cluster.up.add(N3)
    ld.tick(2 * MISSING_MIRROR_S + 1)
    ld.on_event(gm.MembersChanged(2, (N1_MEMBER, N2_MEMBER, "hutch@n3|2.1"), ("hutch@n3|2.1",), ()))
    ld.tick(4 * MISSING_MIRROR_S)  # its mirror joined meanwhile
    cluster.catalogue.records[("/", "orders")] = SimpleNamespace(leader_node=N2, member_nodes=(N2, N1, N3))
    ld.tick(8 * MISSING_MIRROR_S)  # no longer the leader the record names
    assert cluster.calls == []


def test_a_mirror_that_is_a_member_of_another_ring_leaves_it_when_its_leader_says_so():
    host, m, _cl = _mirror_whose_leader_was_declared_dead()
    old = m.member
    assert host.rejoin("/", "orders", "hutch@n1|1.7") == [200, True]
    assert m.member is None and not m.leader_dead and old.status == gm.REMOVED
    assert host.rejoin("/", "orders", "hutch@n1|1.7") == [200, False]  # between rings: it joins anyway
    assert host.rejoin("/", "other", "hutch@n1|1.7") == [200, False]
