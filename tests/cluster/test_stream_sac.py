"""Single active consumer for streams on a 3-node cluster (RabbitMQ 3.11+'s rules; RabbitMQ 3.10.8
has no single active consumer for streams): one member of a group is active cluster-wide,
whichever nodes its members are connected to.

The group's consumers sit on different nodes; when the active one's connection closes, or its
node is killed (the node that coordinates the groups, in the hardest case), the next one in
line, and only it, is activated and goes on from the group's stored offset. On a super stream, consumers
on three nodes split the partitions between them, partition i going to consumer (i mod 3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from hutch.streamproto import frames as f
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster
from tests.support.stream_client import Raw, chunk_bodies, create, publish_chunks, unique

pytestmark = pytest.mark.timeout(300)
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[HutchCluster]:
    with HutchCluster(n=3) as c:
        yield c


class Member:
    """A raw stream-protocol connection to node `i`, collecting what the server sends."""

    def __init__(self, cluster: HutchCluster, i: int):
        self.i = i
        self.c = Raw(cluster.nodes[i].stream_port)
        self.c.handshake()
        self.updates: list[f.ConsumerUpdate] = []
        self.bodies: dict[int, list[bytes]] = {}

    def subscribe(self, sub: int, stream: str, name: str, super_stream: str | None = None) -> None:
        props = {"single-active-consumer": "true", "name": name}
        if super_stream is not None:
            props["super-stream"] = super_stream
        assert self.c.call(f.Subscribe(self.c.cid(), sub, stream, f.OFFSET_TYPE_FIRST, None, 10, props)).code == f.OK

    def poll(self) -> None:
        """What the server sent so far (a round trip): updates kept, chunks read (credit given)."""
        for cmd in self.c.sync():
            if type(cmd) is f.ConsumerUpdate:
                self.updates.append(cmd)
            elif type(cmd) in (f.Deliver, f.DeliverV2):
                self.bodies.setdefault(cmd.subscription_id, []).extend(chunk_bodies(cmd.chunk))
                self.c.send(f.Credit(cmd.subscription_id, 1))

    def answer_all(self, offset_type: int = f.OFFSET_TYPE_NEXT, offset: int | None = None) -> list[f.ConsumerUpdate]:
        got, self.updates = self.updates, []
        for u in got:
            self.c.send(f.ConsumerUpdateResponse(u.correlation_id, f.OK, offset_type, offset))
        return got

    def close(self) -> None:
        self.c.close()


@contextlib.contextmanager
def members(cluster: HutchCluster, nodes: list[int]) -> Iterator[list[Member]]:
    ms: list[Member] = []
    try:
        for i in nodes:
            ms.append(Member(cluster, i))
        yield ms
    finally:
        for m in ms:
            m.close()


def group(cluster: HutchCluster, via: int, stream: str, name: str) -> list[tuple[int, str]]:
    """(node index of the member's connection, state) in group order, as node `via` lists it."""
    try:
        rows = cluster.api(via, f"/api/hutch/streams/%2F/{stream}/groups/{name}")
    except OSError:
        return []
    ports = {n.stream_port: i for i, n in enumerate(cluster.nodes)}
    # a connection's name ends with the node's stream port: "client:port -> server:port"
    return [(ports.get(int(r["connection_name"].rsplit(":", 1)[1]), -1), r["state"]) for r in rows]


def activated(ms: list[Member]) -> list[Member]:
    for m in ms:
        m.poll()
    return [m for m in ms if any(u.active for u in m.updates)]


def leader_index(cluster: HutchCluster) -> int:
    return cluster.names.index(cluster.cluster_status(0)["leader"])


def test_the_active_consumers_connection_closing_activates_one_on_another_node_from_the_stored_offset(cluster):
    stream, name = unique(), unique("app")
    with members(cluster, [0, 1, 2]) as (a, b, c), contextlib.closing(Raw(cluster.nodes[0].stream_port)) as p:
        p.handshake()
        create(p, stream)
        publish_chunks(p, stream, [["m0", "m1"], ["m2"]])
        a.subscribe(1, stream, name)
        wait_until(lambda: activated([a]), WAIT_S, "the first consumer's activation")
        a.answer_all(f.OFFSET_TYPE_FIRST)
        for k, m in enumerate((b, c)):
            m.subscribe(1, stream, name)
            # registered in this order cluster-wide before the next one subscribes (their nodes'
            # links to the coordinator are not ordered with each other)
            wait_until(lambda k=k: len(group(cluster, 0, stream, name)) == k + 2, WAIT_S, "the registration")
        wait_until(lambda: a.bodies.get(1) == [b"m0", b"m1", b"m2"] or a.poll(), WAIT_S, "the first consumer reading")
        a.c.send(f.StoreOffset(name, stream, 1))
        wait_until(lambda: group(cluster, 2, stream, name) == [(0, "active"), (1, "inactive"), (2, "inactive")],
                   WAIT_S, "the group listed from any node, in order")
        wait_until(lambda: p.call(f.QueryOffset(p.cid(), name, stream)).offset == 1, WAIT_S, "the stored offset")
        assert not activated([b, c]) and not b.bodies and not c.bodies

        a.close()
        wait_until(lambda: activated([b, c]), WAIT_S, "another consumer's activation")
        assert activated([b, c]) == [b]  # the next registered, and only it
        stored = b.c.call(f.QueryOffset(b.c.cid(), name, stream)).offset
        b.answer_all(f.OFFSET_TYPE_OFFSET, stored + 1)
        wait_until(lambda: b.poll() or b.bodies.get(1) == [b"m2"], WAIT_S, "the next consumer reading on")
        c.poll()
        assert not c.bodies and not c.updates


def test_killing_the_node_of_the_active_consumer_and_of_the_coordinator_activates_the_next_in_line(cluster):
    stream, name = unique(), unique("app")
    lead = leader_index(cluster)
    others = [i for i in range(3) if i != lead]
    with members(cluster, [lead, *others]) as (a, b, c), \
            contextlib.closing(Raw(cluster.nodes[others[0]].stream_port)) as p:
        p.handshake()
        create(p, stream)
        publish_chunks(p, stream, [["k0"], ["k1"]])
        a.subscribe(1, stream, name)
        wait_until(lambda: activated([a]), WAIT_S, "the first consumer's activation")
        a.answer_all(f.OFFSET_TYPE_FIRST)
        for k, m in enumerate((b, c)):
            m.subscribe(1, stream, name)
            wait_until(lambda k=k: len(group(cluster, others[0], stream, name)) == k + 2, WAIT_S, "the registration")
        wait_until(lambda: a.poll() or a.bodies.get(1) == [b"k0", b"k1"], WAIT_S, "the first consumer reading")
        a.c.send(f.StoreOffset(name, stream, 0))
        wait_until(lambda: p.call(f.QueryOffset(p.cid(), name, stream)).offset == 0, WAIT_S, "the stored offset")
        assert not activated([b, c])

        cluster.kill(lead)
        try:
            wait_until(lambda: activated([b, c]), WAIT_S, "a consumer activated on a surviving node")
            # the next in line: the new coordinator has the members' order from their nodes
            assert activated([b, c]) == [b]
            winner, loser = b, c
            stored = winner.c.call(f.QueryOffset(winner.c.cid(), name, stream)).offset
            winner.answer_all(f.OFFSET_TYPE_OFFSET, stored + 1)
            wait_until(lambda: winner.poll() or winner.bodies.get(1) == [b"k1"], WAIT_S, "it reads from the stored offset")
            publish_chunks(p, stream, [["k2"]])
            wait_until(lambda: winner.poll() or winner.bodies.get(1) == [b"k1", b"k2"], WAIT_S, "and on")
            loser.poll()
            assert not loser.bodies and not any(u.active for u in loser.updates)
            assert group(cluster, others[0], stream, name) == [(others[0], "active"), (others[1], "inactive")]
        finally:
            cluster.start_node(lead)


def test_super_stream_partitions_spread_over_consumers_on_three_nodes(cluster):
    name, group_name = unique("ss"), unique("app")
    parts = [f"{name}-{i}" for i in range(3)]
    with members(cluster, [0, 1, 2]) as ms, contextlib.closing(Raw(cluster.nodes[0].stream_port)) as p:
        p.handshake()
        assert p.call(f.CreateSuperStream(p.cid(), name, parts, ["0", "1", "2"], {})).code == f.OK
        for k, m in enumerate(ms):
            for i, s in enumerate(parts):
                m.subscribe(i, s, group_name, name)
            # registered in this order cluster-wide before the next consumer comes
            wait_until(lambda k=k: all(len(group(cluster, 0, s, group_name)) == k + 1 for s in parts), WAIT_S,
                       "the consumer in every partition's group")

        def spread() -> bool:
            for m in ms:
                m.poll()
                m.answer_all()
            return all(group(cluster, 0, s, group_name) == [(j, "active" if j == i else "inactive") for j in range(3)]
                       for i, s in enumerate(parts))
        wait_until(spread, WAIT_S, "partition i active on consumer i")
        for i, s in enumerate(parts):
            publish_chunks(p, s, [[f"p{i}"]])
        wait_until(lambda: all(m.poll() or m.bodies == {k: [f"p{k}".encode()]} for k, m in enumerate(ms)), WAIT_S,
                   "each consumer reading its own partition only")
