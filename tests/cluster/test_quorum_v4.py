"""RabbitMQ 4's quorum queue features on a real 3-node cluster, through pika: the default
delivery limit of 20, message priorities (two levels, two high to one normal), the consumer
(delivery acknowledgement) timeout, and leader placement and rebalancing
(docs/quorum.md, "RabbitMQ 4 features")."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
QUORUM = {"x-queue-type": "quorum"}


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def publish(ch, queue: str, bodies_priorities: list[tuple[str, int | None]]) -> None:
    """Persistent messages with these priorities (None: no priority property), confirmed."""
    for body, prio in bodies_priorities:
        ch.basic_publish("", queue, body.encode(), pika.BasicProperties(delivery_mode=2, priority=prio))


def test_the_default_delivery_limit_is_20_and_minus_one_lifts_it(cluster):
    conn = connect(cluster, 1)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("v4.dlq", durable=True, arguments=QUORUM)
        ch.queue_declare("v4.poison", durable=True, arguments={**QUORUM, "x-dead-letter-exchange": "",
                                                                "x-dead-letter-routing-key": "v4.dlq"})
        ch.queue_declare("v4.unlimited", durable=True, arguments={**QUORUM, "x-delivery-limit": -1})
        publish(ch, "v4.poison", [("poison", None)])
        publish(ch, "v4.unlimited", [("again", None)])
        counts = []
        while True:
            method, props, _body = ch.basic_get("v4.poison")
            if method is None:
                break
            counts.append(props.headers["x-delivery-count"])
            ch.basic_nack(method.delivery_tag, requeue=True)
        assert counts == list(range(21))  # delivered 21 times: the 21st return dead-letters it
        method, props, body = ch.basic_get("v4.dlq", auto_ack=True)
        assert body == b"poison" and props.headers["x-death"][0]["reason"] == "delivery_limit"
        for n in range(30):
            method, props, _body = ch.basic_get("v4.unlimited")
            assert props.headers["x-delivery-count"] == n
            ch.basic_nack(method.delivery_tag, requeue=True)
        method, props, body = ch.basic_get("v4.unlimited", auto_ack=True)
        assert body == b"again" and props.headers["x-delivery-count"] == 30
    finally:
        conn.close()


def test_high_priority_messages_are_delivered_two_to_one_without_x_max_priority(cluster):
    conn = connect(cluster, 2)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("v4.prio", durable=True, arguments=QUORUM)
        publish(ch, "v4.prio", [(f"n{i}", p) for i, p in enumerate([None, 0, 4, 2])]
                + [(f"h{i}", 5 + i) for i in range(6)])
        got = []
        while True:
            method, _props, body = ch.basic_get("v4.prio", auto_ack=True)
            if method is None:
                break
            got.append(body.decode())
        assert got == ["h0", "h1", "n0", "h2", "h3", "n1", "h4", "h5", "n2", "n3"]
    finally:
        conn.close()
