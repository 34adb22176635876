"""Health as a cluster reports it: a member whose app was stopped, or whose process was stopped.

Three real nodes. After `hutchctl stop_app` on one of them, the others list it as not running
(in /api/nodes and in cluster_status' running nodes), its own checks fail while theirs pass,
and a quorum queue that has lost that member makes the survivors quorum-critical; after
`start_app` all of it returns. `hutchctl stop` ends a member's process and the others see it
go down.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

BIN = Path(sys.executable).parent
QUEUE = "health.qq"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def tool(node, name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=node.mgmt_url)
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, env=env, timeout=60)


def health(node, check: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{node.mgmt_url}/api/health/checks/{check}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def running(cluster: HutchCluster, i: int) -> dict[str, bool]:
    return {n["name"]: n["running"] for n in cluster.api(i, "/api/nodes")}


def test_a_member_with_a_stopped_app_is_reported_down_by_all_and_back_after_start_app(cluster):
    a, b, _c = cluster.nodes
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    path = f"/api/queues/%2F/{QUEUE}"
    wait_until(lambda: len(cluster.api(0, path).get("online") or []) == 3, WAIT_S, "three online members")
    assert tool(a, "hutch-diagnostics", "check_if_node_is_quorum_critical").returncode == 0

    assert tool(b, "hutchctl", "stop_app").returncode == 0
    try:
        everyone_else = {a.name: True, b.name: False, cluster.nodes[2].name: True}
        wait_until(lambda: running(cluster, 0) == everyone_else == running(cluster, 2), WAIT_S,
                   "the peers seeing the stopped app")
        assert cluster.cluster_status(0)["running_nodes"] == [a.name, cluster.nodes[2].name]
        assert running(cluster, 1)[b.name] is False and cluster.cluster_status(1)["running_nodes"] == []
        out = tool(a, "hutchctl", "cluster_status").stdout
        assert f"Running Nodes\n\n{a.name}\n{cluster.nodes[2].name}\n\n" in out

        r = tool(b, "hutch-diagnostics", "check_running")
        assert r.returncode == 69 and f"hutch on node {b.name} is not running" in r.stderr
        assert health(b, "virtual-hosts")[0] == 503 and health(b, "alarms")[0] == 503
        assert tool(a, "hutch-diagnostics", "check_running").returncode == 0
        assert health(a, "alarms") == (200, {"status": "ok"})
        assert health(a, f"port-listener/{a.amqp_port}")[0] == 200

        # two of three members online: losing this node as well would lose the queue's majority
        wait_until(lambda: len(cluster.api(0, path).get("online") or []) == 2, WAIT_S, "two online members")
        status, doc = health(a, "node-is-quorum-critical")
        assert status == 503 and doc["queues"][0]["name"] == QUEUE, doc
        r = tool(a, "hutch-diagnostics", "check_if_node_is_quorum_critical")
        assert r.returncode == 69 and f"queue '{QUEUE}' in vhost '/'" in r.stderr
    finally:
        assert tool(b, "hutchctl", "start_app").returncode == 0
    cluster.wait_healthy()
    all_up = {n.name: True for n in cluster.nodes}
    wait_until(lambda: all(running(cluster, i) == all_up for i in range(3)), WAIT_S, "every node running")
    wait_until(lambda: len(cluster.api(0, path).get("online") or []) == 3, WAIT_S, "three online members again")
    assert health(a, "node-is-quorum-critical") == (200, {"status": "ok"})
    assert tool(b, "hutch-diagnostics", "check_running").returncode == 0


def test_hutchctl_stop_ends_a_member_and_the_others_see_it_down(cluster):
    c = cluster.nodes[2]
    r = tool(c, "hutchctl", "stop")
    assert r.returncode == 0, r.stderr
    assert c.proc.wait(timeout=30) == 0
    wait_until(lambda: running(cluster, 0)[c.name] is False, WAIT_S, "the stopped member seen down")
    assert c.name not in cluster.cluster_status(0)["running_nodes"]
    r = tool(c, "hutch-diagnostics", "ping", "-t", "2")
    assert r.returncode == 69
    cluster.start_node(2)
    assert running(cluster, 0)[c.name] is True
