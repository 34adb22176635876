"""User and vhost limits count the whole cluster, as RabbitMQ counts them.

Two real nodes. Connections and channels of a user or vhost opened on one node count against
the limit when a client connects to the other: each node tells the others its counts every
second, so a refusal on the other node is waited for as a condition (it comes within about a
second), as is the slot that a closed connection frees. Queue limits use the replicated
catalogue, so they hold across nodes at once. Topic permissions set through one node are
enforced on the other.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

PASSWORD = "limit-pw-1"


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=2, net_ticktime_s=2) as c:
        yield c


def http(cluster, i: int, method: str, path: str, body=None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def connect(cluster, i: int, user: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[i].amqp_port, vhost, pika.PlainCredentials(user, PASSWORD), connection_attempts=1))


def opens(cluster, i: int, user: str, vhost: str = "/") -> bool:
    """Whether a connection opens on node i now (closed again at once if it does)."""
    try:
        connect(cluster, i, user, vhost).close()
        return True
    except pika.exceptions.AMQPConnectionError as e:
        assert "530" in str(e), e  # refused by a limit, nothing else
        return False


def new_user(cluster, vhost: str = "/") -> str:
    user = f"lim-{uuid.uuid4().hex[:8]}"
    http(cluster, 0, "PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": ""})
    http(cluster, 0, "PUT", f"/api/permissions/{urllib.request.quote(vhost, safe='')}/{user}",
         {"configure": ".*", "write": ".*", "read": ".*"})
    wait_until(lambda: opens(cluster, 1, user, vhost), 10, f"user {user} usable on node 1")
    return user


def test_user_connection_limit_counts_both_nodes(cluster):
    user = new_user(cluster)
    http(cluster, 0, "PUT", f"/api/user-limits/{user}/max-connections", {"value": 2})
    on0 = connect(cluster, 0, user)
    on1 = connect(cluster, 1, user)
    try:
        wait_until(lambda: not opens(cluster, 0, user), 10, "node 0 counting node 1's connection")
        wait_until(lambda: not opens(cluster, 1, user), 10, "node 1 counting node 0's connection")
        on1.close()
        wait_until(lambda: opens(cluster, 0, user), 10, "the slot node 1 freed, seen on node 0")
    finally:
        for c in (on0, on1):
            if c.is_open:
                c.close()


def test_vhost_connection_limit_counts_both_nodes(cluster):
    vhost = f"vl-{uuid.uuid4().hex[:8]}"
    http(cluster, 0, "PUT", f"/api/vhosts/{vhost}")
    try:
        user = new_user(cluster, vhost)
        http(cluster, 0, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 1})
        conn = connect(cluster, 1, user, vhost)
        try:
            wait_until(lambda: not opens(cluster, 0, user, vhost), 10, "node 0 counting node 1's connection")
            with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
                connect(cluster, 0, user, vhost)
            assert (f"access to vhost '{vhost}' refused for user '{user}': connection limit (1) is reached"
                    in str(info.value).replace("\\'", "'"))
        finally:
            conn.close()
    finally:
        http(cluster, 0, "DELETE", f"/api/vhosts/{vhost}")


def test_user_channel_limit_counts_both_nodes(cluster):
    user = new_user(cluster)
    http(cluster, 0, "PUT", f"/api/user-limits/{user}/max-channels", {"value": 2})
    on1 = connect(cluster, 1, user)
    on0 = connect(cluster, 0, user)
    try:
        on1.channel()
        on0.channel()

        def third_channel_refused() -> bool:
            conn = connect(cluster, 0, user)
            try:
                conn.channel()
            except pika.exceptions.ConnectionClosedByBroker as e:
                assert e.reply_code == 530, e
                return True
            conn.close()
            return False
        wait_until(third_channel_refused, 10, "node 0 counting node 1's channel")
    finally:
        for c in (on0, on1):
            if c.is_open:
                c.close()


def test_queue_limit_and_topic_permissions_hold_on_every_node(cluster):
    vhost = f"vq-{uuid.uuid4().hex[:8]}"
    http(cluster, 0, "PUT", f"/api/vhosts/{vhost}")
    try:
        user = new_user(cluster, vhost)
        http(cluster, 0, "PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 1})
        http(cluster, 0, "PUT", f"/api/topic-permissions/{vhost}/{user}",
             {"exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"})
        c0 = connect(cluster, 0, user, vhost)
        c1 = connect(cluster, 1, user, vhost)
        try:
            c0.channel().queue_declare("first")
            ch = c1.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                ch.queue_declare("second")
            assert (info.value.reply_code, info.value.reply_text) == (
                406, f"PRECONDITION_FAILED - cannot declare queue 'second': queue limit in vhost '{vhost}' (1) "
                     "is reached")
            ch = c1.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.topic", f"{user}.ok", b"allowed")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                ch.basic_publish("amq.topic", "someone.else", b"refused")
            assert info.value.reply_code == 403
        finally:
            c0.close()
            c1.close()
    finally:
        http(cluster, 0, "DELETE", f"/api/vhosts/{vhost}")
