"""Policies act on replicated queues of a real 3-node cluster: a quorum queue takes max-length,
delivery-limit and dead-lettering from a policy, a mirrored classic queue takes message-ttl
next to its ha-mode, and a changed policy reaches every member and mirror (what a member holds
after the change is what it serves when it leads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def ctl(cluster: HutchCluster, i: int, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url",
                        f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stdout, r.stderr)


def info(cluster: HutchCluster, name: str, via: int = 0) -> dict:
    return cluster.api(via, f"/api/queues/%2F/{name}")


def ready_everywhere(cluster: HutchCluster, name: str, n: int) -> bool:
    return all(info(cluster, name, i)["messages_ready"] == n for i in range(cluster.n))


def publish(conn: pika.BlockingConnection, queue: str, n: int) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode(), PERSISTENT)
    ch.close()


def drain(conn: pika.BlockingConnection, queue: str) -> list[tuple[bytes, dict]]:
    ch = conn.channel()
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, props.headers or {}))


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def test_quorum_queue_max_length_dead_letter_and_delivery_limit_by_policy(cluster):
    c0, c1, c2 = connect(cluster, 0), connect(cluster, 1), connect(cluster, 2)
    try:
        ch = c0.channel()
        ch.exchange_declare("qp.dlx", "fanout", durable=True)
        ch.queue_declare("qp.dead", durable=True)
        ch.queue_bind("qp.dead", "qp.dlx")
        ctl(cluster, 1, "set_policy", "qp", "^qp\\.q", json.dumps(
            {"max-length": 3, "dead-letter-exchange": "qp.dlx", "delivery-limit": 1, "queue-mode": "lazy"}),
            "--apply-to", "queues")
        ch.queue_declare("qp.q", durable=True, arguments=QUORUM)
        publish(c1, "qp.q", 5)
        wait_until(lambda: ready_everywhere(cluster, "qp.q", 3), 10, "max-length 3 on every member")
        wait_until(lambda: info(cluster, "qp.dead")["messages_ready"] == 2, 10, "two heads dead-lettered")
        dead = drain(c2, "qp.dead")
        assert [b for b, _h in dead] == [b"m0", b"m1"]
        assert dead[0][1]["x-death"][0]["reason"] == "maxlen"
        q = info(cluster, "qp.q", 2)
        assert q["policy"] == "qp"
        assert q["effective_policy_definition"]["delivery-limit"] == 1
        assert q["unsupported_policy_keys"] == ["queue-mode"]  # a quorum queue has no queue mode

        # delivery-limit 1: the second return dead-letters the message (reason delivery_limit)
        ch2 = c2.channel()
        for _ in range(2):
            method, _p, body = ch2.basic_get("qp.q")
            assert body == b"m2"
            ch2.basic_nack(method.delivery_tag, requeue=True)
        wait_until(lambda: info(cluster, "qp.dead")["messages_ready"] == 1, 10, "delivery limit dead letter")
        (body, headers), = drain(c2, "qp.dead")
        assert body == b"m2" and headers["x-death"][0]["reason"] == "delivery_limit"

        # a live change: max-length 1 drops one more head on every member, dead-lettered
        ctl(cluster, 2, "set_policy", "qp", "^qp\\.q", json.dumps({"max-length": 1, "dead-letter-exchange": "qp.dlx"}),
            "--apply-to", "queues")
        wait_until(lambda: ready_everywhere(cluster, "qp.q", 1), 10, "max-length 1 on every member")
        wait_until(lambda: info(cluster, "qp.dead")["messages_ready"] == 1, 10, "dropped head dead-lettered")
        assert [b for b, _h in drain(c0, "qp.dead")] == [b"m3"]
        # an operator policy is stricter still: 0 messages
        ctl(cluster, 0, "set_operator_policy", "qp-op", "^qp\\.", '{"max-length":0}', "--apply-to", "queues")
        wait_until(lambda: ready_everywhere(cluster, "qp.q", 0), 10, "operator policy max-length 0")
        assert info(cluster, "qp.q", 1)["operator_policy"] == "qp-op"
        # clearing both lifts the limit
        ctl(cluster, 0, "clear_operator_policy", "qp-op")
        ctl(cluster, 0, "clear_policy", "qp")
        publish(c1, "qp.q", 4)
        wait_until(lambda: ready_everywhere(cluster, "qp.q", 4), 10, "no limit any more")
    finally:
        for c in (c0, c1, c2):
            c.close()


def test_quorum_queue_message_ttl_and_expires_by_policy(cluster):
    conn = connect(cluster, 2)
    try:
        ctl(cluster, 0, "set_policy", "qt", "^qt\\.", '{"message-ttl":300}', "--apply-to", "queues")
        conn.channel().queue_declare("qt.q", durable=True, arguments=QUORUM)
        publish(conn, "qt.q", 3)
        leader = cluster.names.index(info(cluster, "qt.q")["leader"])
        assert info(cluster, "qt.q", leader)["messages"] == 3  # confirmed: on the leader (TTL 300 ms)
        wait_until(lambda: ready_everywhere(cluster, "qt.q", 0), 10, "message-ttl on every member")
        # expires set later on the queue that exists: it goes once unused that long
        ctl(cluster, 1, "set_policy", "qt", "^qt\\.", '{"message-ttl":300,"expires":500}', "--apply-to", "queues")
        wait_until(lambda: "qt.q" not in [q["name"] for q in cluster.api(0, "/api/queues/%2F")], 15,
                   "the quorum queue expires")
    finally:
        conn.close()
        ctl(cluster, 0, "clear_policy", "qt")


def test_mirrored_queue_message_ttl_and_a_live_max_length_reach_the_mirrors(cluster):
    ctl(cluster, 0, "set_policy", "mt", "^mt\\.", '{"ha-mode":"all","ha-sync-mode":"automatic","message-ttl":300}',
        "--apply-to", "queues")
    conn = connect(cluster, 1)
    try:
        conn.channel().queue_declare("mt.q", durable=True)
        wait_until(lambda: len(info(cluster, "mt.q").get("synchronised_slave_nodes") or []) == 2, 30, "2 mirrors")
        leader = info(cluster, "mt.q")["node"]
        i = cluster.names.index(leader)  # asked directly: its figures are the queue's own
        publish(conn, "mt.q", 3)
        assert info(cluster, "mt.q", i)["messages"] == 3
        wait_until(lambda: info(cluster, "mt.q", i)["messages"] == 0, 10, "message-ttl from the policy")

        # no TTL any more, 6 messages, then max-length 2: the leader drops 4 and so do the mirrors
        ctl(cluster, 2, "set_policy", "mt", "^mt\\.", '{"ha-mode":"all","ha-sync-mode":"automatic"}',
            "--apply-to", "queues")
        # the change commits on node 3; the leader's node applies it when the commit reaches it
        wait_until(lambda: "message-ttl" not in info(cluster, "mt.q", i)["effective_policy_definition"], 10,
                   "the leader's node has the new policy")
        publish(conn, "mt.q", 6)
        assert info(cluster, "mt.q", i)["messages"] == 6
        ctl(cluster, 2, "set_policy", "mt", "^mt\\.", '{"ha-mode":"all","ha-sync-mode":"automatic","max-length":2}',
            "--apply-to", "queues")
        wait_until(lambda: info(cluster, "mt.q", i)["messages"] == 2, 10, "max-length 2 on the leader")
        conn.close()

        # the leader's node goes: a mirror takes over with the same two messages
        cluster.kill(i)
        other = (i + 1) % cluster.n
        wait_until(lambda: info(cluster, "mt.q", other)["node"] != leader, 30, "a mirror promoted")
        conn = connect(cluster, other)
        assert [b for b, _h in drain(conn, "mt.q")] == [b"m4", b"m5"]
        conn.close()
        cluster.start_node(i)
    finally:
        if conn.is_open:
            conn.close()
