"""The reference: what a real 3-node RabbitMQ 3.10 cluster does, as hutch's cluster tests expect it.

RabbitMQ's clustering guide: nodes joined with `stop_app`, `join_cluster`, `start_app` form
one cluster that `cluster_status` reports from every node; a queue lives on one node (here
the node the declaring client was connected to, the client-local master locator), and a
client connected to any node of the cluster publishes to it and consumes from it.
"""

from __future__ import annotations

import uuid

import pika
import pytest

from tests.support.rabbitmq_cluster import RabbitMQCluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster():
    with RabbitMQCluster(n=3) as c:
        yield c


def test_nodes_joined_with_join_cluster_all_run_in_one_cluster(cluster):
    for i in range(3):
        status = cluster.cluster_status(i)
        assert sorted(status["running_nodes"]) == sorted(cluster.names)
        assert sorted(status["disk_nodes"]) == sorted(cluster.names)
        assert status["partitions"] == {}


def test_message_published_on_node_2_to_queue_on_node_1_is_consumed_on_node_3(cluster):
    queue = f"ref-cluster-{uuid.uuid4().hex[:8]}"
    cluster.declare_queue(queue, node=0, durable=True)
    assert cluster.queue_home(queue) == cluster.names[0]  # client-local: the declaring client's node

    body = b"through three nodes " + uuid.uuid4().hex.encode()
    pub = pika.BlockingConnection(pika.URLParameters(cluster.nodes[1].url))
    try:
        ch = pub.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        pub.close()

    sub = pika.BlockingConnection(pika.URLParameters(cluster.nodes[2].url))
    try:
        ch = sub.channel()
        got = None
        for method, _props, received in ch.consume(queue, inactivity_timeout=10):
            assert method is not None, "no delivery within 10 s"
            ch.basic_ack(method.delivery_tag)
            got = received
            break
        ch.cancel()
        assert got == body
        assert ch.queue_declare(queue, passive=True).method.message_count == 0
        ch.queue_delete(queue)
    finally:
        sub.close()
