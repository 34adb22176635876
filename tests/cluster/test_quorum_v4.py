"""RabbitMQ 4's quorum queue features on a real 3-node cluster, through pika: the default
delivery limit of 20, message priorities (two levels, two high to one normal), the consumer
(delivery acknowledgement) timeout, and leader placement and rebalancing
(docs/quorum.md, "RabbitMQ 4 features")."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.http import Http
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


def hold_until_closed(conn: pika.BlockingConnection, queue: str, timeout_s: float = 15.0) -> tuple[list, object]:
    """Consume from `queue` without acknowledging; return (delivery counts seen, the channel's
    close reason) once the broker closes the channel."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    reasons: list = []
    ch._impl.add_on_close_callback(lambda _c, reason: reasons.append(reason))
    seen: list = []
    ch.basic_consume(queue, lambda _c, _m, props, _b: seen.append((props.headers or {}).get("x-delivery-count")))
    deadline = time.monotonic() + timeout_s
    while not reasons and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert reasons, f"the channel was not closed within {timeout_s} s"
    return seen, reasons[0]


def test_a_channel_holding_a_delivery_past_x_consumer_timeout_is_closed_and_its_messages_come_back(cluster):
    conn, other = connect(cluster, 0), connect(cluster, 2)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("v4.slow", durable=True, arguments={**QUORUM, "x-consumer-timeout": 1500})
        publish(ch, "v4.slow", [("a", None), ("b", None)])
        started = time.monotonic()
        seen, reason = hold_until_closed(other, "v4.slow")
        held_s = time.monotonic() - started
        assert seen == [0, 0]
        assert reason.reply_code == 406
        assert reason.reply_text == (
            "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 1500 ms. "
            "This timeout value can be configured, see consumers doc guide to learn more")
        assert 1.5 <= held_s < 6.0  # checked once a second
        assert other.is_open  # only the channel is closed
        wait_until(lambda: ch.queue_declare("v4.slow", passive=True).method.message_count == 2, 10,
                   "both messages back in the queue")
        again = []
        for _ in range(2):
            method, props, body = ch.basic_get("v4.slow", auto_ack=True)
            again.append((body, method.redelivered, props.headers["x-delivery-count"]))
        assert again == [(b"a", True, 1), (b"b", True, 1)]
    finally:
        conn.close()
        other.close()


def test_the_consumer_timeout_policy_applies_to_classic_queues_and_prompt_acks_are_never_timed_out(cluster):
    status, _ = Http(cluster.nodes[1].mgmt_port)("PUT", "/api/policies/%2F/v4ct", {
        "pattern": "^v4\\.ct\\.", "apply-to": "queues", "definition": {"consumer-timeout": 1000}})
    assert status in (201, 204)
    conn = connect(cluster, 1)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("v4.ct.classic")
        ch.queue_declare("v4.ct.prompt")
        publish(ch, "v4.ct.classic", [("x", None)])
        # a consumer that acknowledges at once keeps its channel for longer than the timeout
        prompt = conn.channel()
        acked = []
        prompt.basic_consume("v4.ct.prompt", lambda c, m, _p, _b: (c.basic_ack(m.delivery_tag), acked.append(1)))
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            ch.basic_publish("", "v4.ct.prompt", b"p")
            conn.process_data_events(0.05)
        assert prompt.is_open and len(acked) > 10
        seen, reason = hold_until_closed(conn, "v4.ct.classic")
        assert seen == [None] and reason.reply_code == 406 and "Timeout value used: 1000 ms" in reason.reply_text
        wait_until(lambda: ch.queue_declare("v4.ct.classic", passive=True).method.message_count == 1, 10,
                   "the message back in its queue")
    finally:
        conn.close()
        Http(cluster.nodes[1].mgmt_port)("DELETE", "/api/policies/%2F/v4ct")


def hutch_queues(cluster: HutchCluster, i: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--url",
                           f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}", *args],
                          capture_output=True, text=True, timeout=60)


def leaders(cluster: HutchCluster, prefix: str = "", node: int = 0) -> dict[str, str]:
    return {qu["name"]: qu["leader"] for qu in cluster.api(node, "/api/queues")
            if qu.get("type") == "quorum" and qu["name"].startswith(prefix)}


def test_rebalance_spreads_quorum_leaders_and_balanced_places_on_the_fewest(cluster):
    conn = connect(cluster, 0)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3):  # client-local: all led by node 1
            ch.queue_declare(f"v4.rb.{i}", durable=True, arguments=QUORUM)
        for node in (0, 1):  # as the node that plans the moves sees it too
            wait_until(lambda n=node: set(leaders(cluster, "v4.rb.", n).values()) == {cluster.names[0]}, 15,
                       "node 1 leads all")
        r = hutch_queues(cluster, 1, "rebalance", "quorum", "--queue-pattern", "^v4\\.rb\\.")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "Re-balancing leaders of quorum queues..."
        assert sum("moved:" in line for line in lines) == 2, r.stdout
        assert "Node name" in r.stdout and "Number of quorum queue leaders" in r.stdout
        for name in cluster.names:
            assert any(line.split()[:2] == [name, "1"] for line in lines), r.stdout
        wait_until(lambda: sorted(Counter(leaders(cluster, "v4.rb.").values()).values()) == [1, 1, 1], 15,
                   "one leader per node")
        # a second run finds nothing to move
        again = hutch_queues(cluster, 2, "rebalance", "all", "--queue-pattern", "^v4\\.rb\\.")
        assert again.returncode == 0 and "moved" not in again.stdout
        # the moved queues still work: publish and consume through the new leaders
        publish(ch, "v4.rb.1", [("after", None)])
        method, _props, body = ch.basic_get("v4.rb.1", auto_ack=True)
        assert body == b"after"
        # balanced: the new queue's leader is a node leading the fewest quorum queues now
        counts = Counter(leaders(cluster).values())
        fewest = min(counts.get(n, 0) for n in cluster.names)
        ch.queue_declare("v4.balanced", durable=True, arguments={**QUORUM, "x-queue-leader-locator": "balanced"})
        placed = leaders(cluster, "v4.balanced")["v4.balanced"]
        assert counts.get(placed, 0) == fewest, (placed, counts)
        bad = hutch_queues(cluster, 0, "rebalance", "classic")
        assert bad.returncode == 64 and "only quorum queues" in bad.stderr
    finally:
        conn.close()
