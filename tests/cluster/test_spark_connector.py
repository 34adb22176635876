"""The Spark connector (docs/spark.md) through a hutch node's death: a streaming query from a
stream to a stream, on a 3-node cluster, goes on (restarted from its checkpoint when the kill
failed a micro-batch) and its output holds every input message exactly once."""

from __future__ import annotations

import asyncio
import uuid

import pika
import pytest

from hutch.streamclient import StreamClient, StreamEndpoint
from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

QUERY_RESTARTS_MAX = 5
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def spark():
    import hutch.spark
    from hutch.pipeline.spark import session

    s = session(master="local[2]", app_name="hutch-connector-cluster-tests", shuffle_partitions=2,
                driver_memory="1g", quick_jvm=True)
    hutch.spark.register(s)
    yield s
    s.stop()


def publish(node, name: str, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", name, b)
    finally:
        conn.close()


def bodies(node, stream: str) -> list[bytes]:
    async def read():
        c = await StreamClient.connect(StreamEndpoint("127.0.0.1", node.stream_port), "test-reader")
        try:
            _first, end, _ts = await c.end_of(stream)
            out = []
            async for h, chunk in c.read_range(stream, 0, end):
                recs = chunks.records(bytes(chunk), h)
                out.extend(amqp10.Message.decode(r).body for i, r in enumerate(recs) if h.first_offset + i < end)
            return out
        finally:
            await c.close()
    return asyncio.run(read())


def leader_index(cluster: HutchCluster, stream: str) -> int:
    async def ask():
        ep = StreamEndpoint("127.0.0.1", cluster.nodes[0].stream_port)
        c = await StreamClient.connect(ep, "test-metadata")
        try:
            return await c.leader_of(ep, stream)
        finally:
            await c.close()
    leader = asyncio.run(ask())
    return next(i for i, n in enumerate(cluster.nodes) if n.stream_port == leader.port)


def test_a_stream_to_stream_query_is_exactly_once_through_a_node_kill(spark, tmp_path):
    with HutchCluster(n=3) as cluster:
        src, dst = f"in.{uuid.uuid4().hex[:8]}", f"out.{uuid.uuid4().hex[:8]}"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[0].amqp_port))
        for name in (src, dst):
            conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        conn.close()
        first = [f"m{i}".encode() for i in range(30)]
        publish(cluster.nodes[0], src, first)
        uris = ",".join(f"hutch-stream://guest:guest@127.0.0.1:{n.stream_port}" for n in cluster.nodes)
        cp = tmp_path / "cp"

        def start():
            df = (spark.readStream.format("hutch").option("uri", uris).option("stream", src)
                  .option("startingOffsets", "earliest").load())
            return (df.select("body").writeStream.format("hutch").option("uri", uris).option("stream", dst)
                    .option("checkpointLocation", str(cp)).trigger(processingTime="300 milliseconds").start())

        query = {"q": start(), "restarts": 0}

        def copied(n: int, via: int):
            def check() -> bool:
                q = query["q"]
                if not q.isActive:  # a micro-batch failed with the node: run the query again
                    query["restarts"] += 1
                    assert query["restarts"] <= QUERY_RESTARTS_MAX, f"the query keeps failing: {q.exception()}"
                    query["q"] = start()
                return len(bodies(cluster.nodes[via], dst)) >= n
            return check

        try:
            wait_until(copied(30, 0), TIMEOUT_S, "the first messages copied", interval_s=0.3)
            victim = leader_index(cluster, dst)  # the sink's leader: publishing and reading both lose a node
            cluster.kill(victim)
            alive = (victim + 1) % cluster.n
            second = [f"n{i}".encode() for i in range(30)]
            publish(cluster.nodes[alive], src, second)
            wait_until(copied(60, alive), TIMEOUT_S, "the second messages copied", interval_s=0.3)
        finally:
            query["q"].stop()
        got = bodies(cluster.nodes[alive], dst)
        assert sorted(got) == sorted(first + second), f"{len(got)} messages, {len(set(got))} distinct"
