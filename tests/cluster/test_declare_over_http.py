"""Queue declarations over the management API of a three-node cluster, through broker/operations.py.

A PUT with `x-queue-type: quorum` makes a quorum queue with a member on every node (the
body's `node` is its first leader), served over AMQP by every node; a vhost whose default
queue type is quorum gives a durable queue declared on any node that type.
"""

from __future__ import annotations

import uuid

import pika
import pytest

from tests.integration.test_http_api import Http
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def connect(cluster: HutchCluster, i: int, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, vhost,
                                                             heartbeat=0))


def test_put_of_a_quorum_queue_on_a_cluster(cluster):
    name = f"qq.http.{uuid.uuid4().hex[:8]}"
    http = Http(cluster.nodes[1].mgmt_port)
    status, body, _ = http("PUT", f"/api/queues/%2F/{name}", {"durable": True, "node": cluster.names[2],
                                                              "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    info = cluster.api(0, f"/api/queues/%2F/{name}")
    assert (info["type"], info["arguments"]) == ("quorum", {"x-queue-type": "quorum"})
    assert sorted(info["members"]) == sorted(cluster.names)
    wait_until(lambda: cluster.api(0, f"/api/queues/%2F/{name}")["leader"] == cluster.names[2], 30,
               "the asked-for node leads")
    c0, c2 = connect(cluster, 0), connect(cluster, 2)
    try:
        ch = c0.channel()
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        assert c2.channel().queue_declare(name, passive=True).method.message_count == 20
        got = []
        ch2 = c2.channel()
        for _ in range(20):
            method, _props, payload = ch2.basic_get(name, auto_ack=True)
            assert method is not None
            got.append(payload)
        assert got == [f"m{i}".encode() for i in range(20)]
    finally:
        c0.close()
        c2.close()
        assert http("DELETE", f"/api/queues/%2F/{name}")[0] == 204


def test_a_quorum_default_applies_on_every_node(cluster):
    v = f"dq.{uuid.uuid4().hex[:8]}"
    http = Http(cluster.nodes[0].mgmt_port)
    assert http("PUT", f"/api/vhosts/{v}", {"default_queue_type": "quorum"})[0] == 201
    try:
        http.ok("PUT", f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        wait_until(lambda: cluster.api(2, f"/api/vhosts/{v}")["default_queue_type"] == "quorum", 30,
                   "the vhost on node 3")
        conn = connect(cluster, 2, v)
        try:
            conn.channel().queue_declare("durable", durable=True)
            conn.channel().queue_declare("transient", durable=False)
        finally:
            conn.close()
        assert Http(cluster.nodes[1].mgmt_port)("PUT", f"/api/queues/{v}/put", {"durable": True})[0] == 201
        for q, kind in (("durable", "quorum"), ("put", "quorum"), ("transient", "classic")):
            info = cluster.api(0, f"/api/queues/{v}/{q}")
            assert info["type"] == kind, (q, info)
            if kind == "quorum":
                assert sorted(info["members"]) == sorted(cluster.names)
    finally:
        http("DELETE", f"/api/vhosts/{v}")
