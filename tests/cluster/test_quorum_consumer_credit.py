"""Quorum queue consumers with a small prefetch on a real 3-node cluster (docs/quorum.md,
"Performance"): the consumer's node holds a few deliveries beyond the prefetch, so an ack is
followed by the next message without waiting for the Raft log, yet the client never has more
than its prefetch unacknowledged, gets every message once and in order, and what was held for
a consumer that cancels goes back to the queue."""

from __future__ import annotations

import time

import pika
import pytest

from tests.cluster.test_quorum import QUORUM, connect, consume_all, queue_info
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def publish(conn: pika.BlockingConnection, queue: str, count: int) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, f"m{i}".encode(), PERSISTENT)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


@pytest.mark.parametrize("consumer_node", [0, 2], ids=["on-the-leader", "on-a-follower"])
def test_a_prefetch_1_consumer_gets_every_message_once_in_order_never_two_unacked(cluster, consumer_node):
    name = f"qq.credit.order.{consumer_node}"
    leader, consumer = connect(cluster, 0), connect(cluster, consumer_node)
    try:
        leader.channel().queue_declare(name, durable=True, arguments=QUORUM)
        publish(connect(cluster, 1), name, 400)
        ch = consumer.channel()
        ch.basic_qos(prefetch_count=1)
        got: list[bytes] = []
        unacked = [0]
        most_unacked = [0]

        def on_message(c, method, _props, body):
            unacked[0] += 1
            most_unacked[0] = max(most_unacked[0], unacked[0])
            got.append(body)
            unacked[0] -= 1
            c.basic_ack(method.delivery_tag)
        ch.basic_consume(name, on_message)
        deadline = time.monotonic() + 60
        while len(got) < 400 and time.monotonic() < deadline:
            consumer.process_data_events(0.05)
        assert got == [f"m{i}".encode() for i in range(400)]
        assert most_unacked[0] == 1
        wait_until(lambda: queue_info(cluster, name)["messages"] == 0, 20, "every ack applied")
    finally:
        for c in (leader, consumer):
            if c.is_open:
                c.close()


def test_what_is_held_for_a_consumer_that_cancels_goes_back_to_the_queue(cluster):
    name = "qq.credit.cancel"
    leader, first, second = connect(cluster, 0), connect(cluster, 2), connect(cluster, 1)
    try:
        leader.channel().queue_declare(name, durable=True, arguments=QUORUM)
        publish(leader, name, 50)
        ch = first.channel()
        ch.basic_qos(prefetch_count=1)
        kept: list = []
        tag = ch.basic_consume(name, lambda c, method, props, body: kept.append((method, body)))
        wait_until(lambda: first.process_data_events(0.05) or len(kept) >= 1, 20, "a first delivery")
        # the node of the consumer holds more than the one the client has (its credit ahead)
        wait_until(lambda: queue_info(cluster, name).get("messages_unacknowledged", 0) > 1, 20, "held deliveries")
        first.process_data_events(0.2)
        assert len(kept) == 1 and kept[0][1] == b"m0"  # never more than the prefetch to the client
        ch.basic_cancel(tag)
        # the held ones are ready again; the one the client has stays its own until it acks
        wait_until(lambda: queue_info(cluster, name).get("messages_unacknowledged") == 1, 20, "held ones returned")
        got = consume_all(second, name, 49)
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(1, 50))
        ch.basic_ack(kept[0][0].delivery_tag)
        wait_until(lambda: queue_info(cluster, name)["messages"] == 0, 20, "every message settled")
    finally:
        for c in (leader, first, second):
            if c.is_open:
                c.close()
