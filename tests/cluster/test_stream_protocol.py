"""The stream protocol (port 5552) on a 3-node cluster: metadata names a stream's leader and its
replicas at each node's advertised stream port; a consumer subscribed on a replica's node keeps
receiving while the leader's node is killed (kill -9); publishing resumes on the new leader once
the client asks for metadata again, the publisher's reference carrying its sequence over (no
message twice), and every confirmed message is read afterwards exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hutch.streamproto import frames as f
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster
from tests.support.stream_client import Raw, amqp_body, chunk_bodies, create, run, unique

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def connect(cluster: HutchCluster, i: int) -> Raw:
    c = Raw(cluster.nodes[i].stream_port)
    try:
        c.handshake()
    except BaseException:
        c.close()
        raise
    return c


@contextlib.contextmanager
def connected(cluster: HutchCluster, i: int):
    c = connect(cluster, i)
    try:
        yield c
    finally:
        c.close()


def metadata(c: Raw, name: str) -> tuple[int, tuple[str, int] | None, list[tuple[str, int]]]:
    """(code, leader (host, port), replicas [(host, port)]) of a stream as the node answers."""
    md = c.call(f.Metadata(c.cid(), [name]))
    brokers = {ref: (host, port) for ref, host, port in md.brokers}
    [(stream, code, leader, replicas)] = md.streams
    assert stream == name
    if code != f.OK:
        return code, None, []
    return code, brokers[leader], [brokers[r] for r in replicas]


def back(cluster: HutchCluster, i: int) -> None:
    """Node i running again (after a test killed it), the cluster healthy."""
    if not cluster.running(i):
        cluster.start_node(i)


def new_leader(cluster: HutchCluster, via: int, name: str, old: int) -> tuple[str, int] | None:
    """The stream's leader as node `via` answers metadata, once it is not node `old`."""
    with connected(cluster, via) as c:
        code, leader, _r = metadata(c, name)
    return leader if code == f.OK and leader is not None and leader[1] != cluster.nodes[old].stream_port else None


def node_at(cluster: HutchCluster, port: int) -> int:
    return next(i for i, n in enumerate(cluster.nodes) if n.stream_port == port)


def publish(c: Raw, publisher_id: int, first: int, count: int, batch: int = 10) -> None:
    """Messages first..first+count-1 (publishing id = number), each batch confirmed."""
    for start in range(first, first + count, batch):
        ids = range(start, min(start + batch, first + count))
        c.send(f.Publish(publisher_id, [(i, amqp_body(f"m{i}")) for i in ids]))
        confirmed: set[int] = set()
        while len(confirmed) < len(ids):
            got = c.recv(f.PublishConfirm, f.PublishError)
            assert type(got) is f.PublishConfirm, got
            confirmed.update(got.publishing_ids)


def consume(c: Raw, sub: int, until: int, got: list[bytes]) -> None:
    """Read deliveries of `sub` until `got` holds `until` messages, granting a credit per chunk."""
    while len(got) < until:
        d = c.recv(f.Deliver, f.DeliverV2)
        assert d.subscription_id == sub
        got.extend(chunk_bodies(d.chunk))
        c.send(f.Credit(sub, 1))


def test_metadata_names_the_leader_and_the_replicas_with_each_nodes_stream_port(cluster):
    name = unique()
    ports = {n.stream_port for n in cluster.nodes}
    with connected(cluster, 1) as c:
        create(c, name)
    leader_name = cluster.api(0, f"/api/queues/%2F/{name}")["leader"]
    leader_port = cluster.nodes[cluster.names.index(leader_name)].stream_port
    for i in range(cluster.n):
        with connected(cluster, i) as c:
            assert c.open_properties == {"advertised_host": "localhost",
                                         "advertised_port": str(cluster.nodes[i].stream_port)}
            code, leader, replicas = metadata(c, name)
            assert code == f.OK
            assert leader == ("localhost", leader_port)
            assert sorted(replicas) == sorted(("localhost", p) for p in ports - {leader_port})
    with connected(cluster, 2) as c:
        assert c.call(f.Delete(c.cid(), name)).code == f.OK
        assert metadata(c, name)[0] == f.STREAM_DOES_NOT_EXIST


def test_a_node_without_a_replica_publishes_consumes_tracks_offsets_and_answers_stats(cluster):
    """A stream on two of the three nodes; the third has no replica and serves its clients from a
    member's (as RabbitMQ's stream plugin does through the leader's and replicas' processes)."""
    name = unique()
    with connected(cluster, 0) as c:
        create(c, name, **{"initial-cluster-size": "2"})
        _code, leader, replicas = metadata(c, name)
    assert len(replicas) == 1
    members = {node_at(cluster, leader[1]), node_at(cluster, replicas[0][1])}
    [outsider] = set(range(cluster.n)) - members
    with connected(cluster, outsider) as c:
        assert c.call(f.DeclarePublisher(c.cid(), 0, "outside-writer", name)).code == f.OK
        publish(c, 0, 1, 25)
        assert c.call(f.QueryPublisherSequence(c.cid(), "outside-writer", name)).sequence == 25
        assert c.call(f.Subscribe(c.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 3)).code == f.OK
        got: list[bytes] = []
        consume(c, 1, 25, got)
        assert got == [f"m{i}".encode() for i in range(1, 26)]
        publish(c, 0, 26, 5)  # a subscription at the end gets what comes later
        consume(c, 1, 30, got)
        assert got[25:] == [f"m{i}".encode() for i in range(26, 31)]
        c.send(f.StoreOffset("outside-reader", name, 29))
        wait_until(lambda: c.call(f.QueryOffset(c.cid(), "outside-reader", name)).offset == 29, 20,
                   "the stored offset")
        stats = c.call(f.StreamStats(c.cid(), name))
        assert stats.code == f.OK and stats.stats["first_chunk_id"] == 0
        assert 0 < stats.stats["committed_chunk_id"] <= 29
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_a_consumer_on_a_replica_keeps_receiving_through_the_leaders_kill_and_publishing_resumes_on_the_new_leader(
        cluster):
    name = unique()
    ref = "failover-writer"
    n_before, n_after = 60, 40
    with connected(cluster, 0) as c:
        create(c, name)
        _code, leader, replicas = metadata(c, name)
    old = node_at(cluster, leader[1])
    replica = node_at(cluster, replicas[0][1])
    consumer = connect(cluster, replica)
    try:
        assert consumer.call(f.Subscribe(consumer.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 5)).code == f.OK
        with connected(cluster, old) as pub:
            assert pub.call(f.DeclarePublisher(pub.cid(), 0, ref, name)).code == f.OK
            publish(pub, 0, 1, n_before)
        got: list[bytes] = []
        consume(consumer, 1, n_before, got)

        cluster.kill(old)
        wait_until(lambda: new_leader(cluster, replica, name, old) is not None, 60, "a new leader in the metadata")
        new = node_at(cluster, new_leader(cluster, replica, name, old)[1])
        with connected(cluster, replica) as c:  # the dead node is no replica in the metadata either
            _code, _leader, replicas_now = metadata(c, name)
        assert ("localhost", cluster.nodes[old].stream_port) not in replicas_now
        with connected(cluster, new) as pub:
            seq = pub.call(f.QueryPublisherSequence(pub.cid(), ref, name))
            assert (seq.code, seq.sequence) == (f.OK, n_before)
            assert pub.call(f.DeclarePublisher(pub.cid(), 0, ref, name)).code == f.OK
            # the last batch again (the client cannot know it was kept) and the new messages
            publish(pub, 0, n_before - 9, 10 + n_after)
        consume(consumer, 1, n_before + n_after, got)
        assert got == [f"m{i}".encode() for i in range(1, n_before + n_after + 1)]
        assert consumer.sync() == []  # the same connection, nothing more, nothing twice
    finally:
        consumer.close()
        back(cluster, old)

    # afterwards, on every node: each confirmed message exactly once
    for i in range(cluster.n):
        with connected(cluster, i) as c:
            assert c.call(f.Subscribe(c.cid(), 2, name, f.OFFSET_TYPE_FIRST, None, 10)).code == f.OK
            again: list[bytes] = []
            consume(c, 2, n_before + n_after, again)
            assert again == got
            assert c.sync() == []
    with connected(cluster, 0) as c:
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


@pytest.mark.parametrize("reference", ["", "replica-writer"])
def test_a_publisher_on_a_replicas_node_is_confirmed_through_the_leaders_kill_and_nothing_is_stored_twice(
        cluster, reference):
    """Its connection is not to the leader: batches in flight when the leader dies are written
    through the new leader and confirmed, with or without a reference, each once."""
    name = unique()
    with connected(cluster, 0) as c:
        create(c, name)
        _code, leader, replicas = metadata(c, name)
    old = node_at(cluster, leader[1])
    replica = node_at(cluster, replicas[0][1])
    total = 400
    try:
        with connected(cluster, replica) as pub:
            assert pub.call(f.DeclarePublisher(pub.cid(), 0, reference, name)).code == f.OK
            publish(pub, 0, 1, 100)
            for start in range(101, total + 1, 20):  # 15 batches in flight
                pub.send(f.Publish(0, [(i, amqp_body(f"m{i}")) for i in range(start, start + 20)]))
            cluster.kill(old)
            confirmed: set[int] = set()
            while len(confirmed) < total - 100:
                got = pub.recv(f.PublishConfirm, f.PublishError)
                assert type(got) is f.PublishConfirm, got
                confirmed.update(got.publishing_ids)
            assert confirmed == set(range(101, total + 1))
            assert pub.call(f.Subscribe(pub.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 10)).code == f.OK
            got_bodies: list[bytes] = []
            consume(pub, 1, total, got_bodies)
            assert pub.sync() == []
            assert got_bodies == [f"m{i}".encode() for i in range(1, total + 1)]
            assert pub.call(f.Delete(pub.cid(), name)).code == f.OK
    finally:
        back(cluster, old)


def test_rstream_producer_through_the_leaders_kill(cluster):
    """rstream 1.1.1's producer and consumer (connected first to a node that is not the leader):
    when the leader's node dies the producer reconnects by itself to the new leader the metadata
    names, its named publisher's sequence carries over, each message is in the stream once and
    the consumer gets each once."""
    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        OffsetType,
        Producer,
        ServerError,
        amqp_decoder,
    )

    name = unique()
    ref = "rstream-failover"
    with connected(cluster, 0) as c:
        create(c, name)
        _code, leader, _replicas = metadata(c, name)
    old = node_at(cluster, leader[1])
    locator = next(i for i in range(cluster.n) if i != old)
    sent: list[int] = []

    consumed: list[tuple[int, bytes]] = []

    async def go():
        all_in = asyncio.Event()

        def on_message(msg, ctx):
            consumed.append((ctx.offset, b"".join(msg.body) if isinstance(msg.body, list) else msg.body))
            if len(consumed) >= 40:
                all_in.set()
        async with Producer("127.0.0.1", cluster.nodes[locator].stream_port, username="guest",
                            password="guest") as p, \
                Consumer("127.0.0.1", cluster.nodes[locator].stream_port, username="guest", password="guest") as c:
            await c.subscribe(name, on_message, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            for i in range(20):
                sent.append(await p.send_wait(name, AMQPMessage(body=f"r{i}".encode()), publisher_name=ref))
            cluster.kill(old)
            # the send in flight when the leader's connection dies fails (ServerError "Connection
            # Closed"); rstream reconnects by itself, asking for the metadata again, and the
            # application sends that message again
            i, failures = 20, 0
            while i < 40:
                try:
                    sent.append(await p.send_wait(name, AMQPMessage(body=f"r{i}".encode()), publisher_name=ref))
                    i += 1
                except ServerError:  # StreamNotAvailable too, while no leader is elected
                    failures += 1
                    assert failures <= 3, "rstream does not publish again"
                    await asyncio.to_thread(wait_until, lambda: new_leader(cluster, locator, name, old) is not None,
                                            60, "a new leader in the metadata")
            await asyncio.wait_for(all_in.wait(), 60)
    try:
        run(go())
    finally:
        back(cluster, old)
    with connected(cluster, old) as c:
        seq = c.call(f.QueryPublisherSequence(c.cid(), ref, name))
        assert (seq.code, seq.sequence) == (f.OK, max(sent))
        assert c.call(f.Subscribe(c.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 10)).code == f.OK
        got: list[bytes] = []
        consume(c, 1, 40, got)
        assert c.sync() == []
        assert sorted(set(got)) == sorted(got)  # nothing twice
        assert got == [f"r{i}".encode() for i in range(40)]
        assert c.call(f.Delete(c.cid(), name)).code == f.OK
    # rstream's consumer (on a replica's node, or resubscribed from its offset when its node
    # was the one killed) saw each message once
    assert consumed == list(enumerate(got))
