"""Operating streams on a real 3-node cluster: stream_status's row per member, add_replica and
delete_replica moving a stream's members with the new replica catching up from the others, the
figures of a stream on a node without a replica, and the quorum-critical check counting streams
(a Raft group each: its members must keep a majority)."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def tool(cluster: HutchCluster, i: int, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--url", f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}",
                           *args], capture_output=True, text=True, timeout=60)


def status(cluster: HutchCluster, i: int, stream: str) -> list[dict]:
    p = tool(cluster, i, "hutch.cli.streams", "--formatter", "json", "stream_status", stream)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def declare_and_publish(cluster: HutchCluster, stream: str, n: int, args: dict | None = None, via: int = 0,
                        start: int = 0) -> None:
    c = connect(cluster, via)
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare(stream, durable=True, arguments={**STREAM, **(args or {})})
    for i in range(start, start + n):
        ch.basic_publish("", stream, f"m{i}".encode())
    c.close()


def read_all(cluster: HutchCluster, i: int, stream: str, count: int) -> list[bytes]:
    c = connect(cluster, i)
    ch = c.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[bytes] = []

    def on_message(chan, method, _props, body):
        got.append(body)
        chan.basic_ack(method.delivery_tag)
    ch.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
    wait_until(lambda: c.process_data_events(0.05) or len(got) >= count, 30, f"{count} messages from {stream}")
    c.close()
    return got


def test_stream_status_has_a_writer_and_two_replicas_at_the_same_committed_offset(cluster):
    declare_and_publish(cluster, "s.status", 100)

    wait_until(lambda: [r["committed_offset"] for r in status(cluster, 1, "s.status")] == [99, 99, 99], 20,
               "every member at offset 99")
    rows = status(cluster, 1, "s.status")
    assert [r["node"] for r in rows] == sorted(cluster.names)
    assert sorted(r["role"] for r in rows) == ["replica", "replica", "writer"]
    assert all(r["first_offset"] == 0 and r["offset"] == 99 and r["segments"] == 1 and r["bytes"] > 0
               for r in rows)
    assert len({r["epoch"] for r in rows}) == 1
    (writer,) = [r["node"] for r in rows if r["role"] == "writer"]
    assert cluster.api(2, "/api/queues/%2F/s.status")["leader"] == writer
    text = tool(cluster, 2, "hutch.cli.streams", "stream_status", "s.status").stdout.splitlines()
    assert text[1] == "role\tnode\tepoch\toffset\tcommitted_offset\tfirst_offset\treaders\tsegments\tbytes"
    assert len(text) == 5


def test_delete_replica_then_add_replica_and_the_new_replica_catches_up(cluster):
    declare_and_publish(cluster, "s.moves", 50)
    third = cluster.names[2]
    p = tool(cluster, 0, "hutch.cli.streams", "delete_replica", "s.moves", third)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"Removing a replica of queue s.moves on node {third}...\n"
    info = cluster.api(1, "/api/queues/%2F/s.moves")
    assert third not in info["members"] and len(info["members"]) == 2
    assert [r["node"] for r in status(cluster, 0, "s.moves")] == sorted(cluster.names[:2])
    declare_and_publish(cluster, "s.moves", 30, start=50)  # two members: still a majority
    # a node without a replica shows the stream's figures as a member tells them
    wait_until(lambda: cluster.api(2, "/api/queues/%2F/s.moves")["messages"] == 80, 10, "80 messages seen on the third")
    p = tool(cluster, 1, "hutch.cli.streams", "add_replica", "s.moves", third)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"Adding a replica for queue s.moves on node {third}...\n"
    assert third in cluster.api(0, "/api/queues/%2F/s.moves")["members"]

    def caught_up() -> bool:
        rows = {r["node"]: r for r in status(cluster, 0, "s.moves")}
        return rows.get(third, {}).get("committed_offset") == 79 and rows[third]["first_offset"] == 0
    wait_until(caught_up, 30, "the new replica has offsets 0..79")
    # the new replica serves a consumer on its node from its own log, from the first offset
    assert read_all(cluster, 2, "s.moves", 80) == [f"m{i}".encode() for i in range(80)]
    p = tool(cluster, 0, "hutch.cli.streams", "add_replica", "s.moves", third)
    assert p.returncode == 69 and "already a member" in p.stderr


def test_check_if_node_is_quorum_critical_counts_a_stream_whose_members_would_lose_their_majority(cluster):
    declare_and_publish(cluster, "s.critical", 1, {"x-initial-cluster-size": 2})
    members = cluster.api(0, "/api/queues/%2F/s.critical")["members"]
    assert len(members) == 2
    for m in members:
        p = tool(cluster, cluster.names.index(m), "hutch.cli.diagnostics", "check_if_node_is_quorum_critical")
        assert p.returncode == 69 and "'s.critical' in vhost '/'" in p.stderr, p.stderr
    outsider = next(n for n in cluster.names if n not in members)
    p = tool(cluster, cluster.names.index(outsider), "hutch.cli.diagnostics", "check_if_node_is_quorum_critical")
    assert "'s.critical'" not in p.stderr
    # three members tolerate one stopped node: a stream of three is never critical alone
    declare_and_publish(cluster, "s.tolerant", 1)
    p = tool(cluster, 0, "hutch.cli.diagnostics", "check_if_node_is_quorum_critical")
    assert "'s.tolerant'" not in p.stderr
    c = connect(cluster, 0)
    c.channel().queue_delete("s.critical")
    c.close()


def test_hutchctl_list_queues_on_any_node_shows_streams_with_their_members(cluster):
    declare_and_publish(cluster, "s.listed", 5)
    for i in range(3):
        p = tool(cluster, i, "hutch.cli.ctl", "--formatter", "json", "list_queues", "name", "type", "leader",
                 "members", "online", "messages")
        assert p.returncode == 0, p.stderr
        (row,) = [r for r in json.loads(p.stdout) if r["name"] == "s.listed"]
        assert row["type"] == "stream" and row["leader"] in cluster.names and row["messages"] == 5
        assert sorted(row["members"]) == sorted(cluster.names) == sorted(row["online"])


def test_a_super_stream_made_on_one_node_is_there_on_every_node(cluster):
    p = tool(cluster, 1, "hutch.cli.streams", "add_super_stream", "orders", "--partitions", "2")
    assert p.returncode == 0, p.stderr
    for i in range(3):
        x = cluster.api(i, "/api/exchanges/%2F/orders")
        assert x["arguments"] == {"x-super-stream": True}
        assert sorted(b["destination"] for b in cluster.api(i, "/api/exchanges/%2F/orders/bindings/source")) == [
            "orders-0", "orders-1"]
    assert tool(cluster, 2, "hutch.cli.streams", "delete_super_stream", "orders").returncode == 0
    names = {q["name"] for q in cluster.api(0, "/api/queues/%2F?columns=name")}
    assert not {"orders-0", "orders-1"} & names


def test_a_member_that_is_down_shows_its_node_only_and_catches_up_when_it_returns(cluster):
    """Last in this module: it stops a node. A stream of three keeps serving with two; the
    remaining members become critical; the stopped member comes back and gets what it missed."""
    declare_and_publish(cluster, "s.down", 10)
    down = cluster.names[2]
    cluster.kill(2)
    try:
        wait_until(lambda: down not in cluster.api(0, "/api/queues/%2F/s.down")["online"], 20, f"{down} offline")
        declare_and_publish(cluster, "s.down", 15, start=10)  # two of three: still a majority
        rows = {r["node"]: r for r in status(cluster, 0, "s.down")}
        assert rows[down]["committed_offset"] is None and rows[down]["epoch"] is None
        assert [rows[n]["committed_offset"] for n in cluster.names[:2]] == [24, 24]
        p = tool(cluster, 1, "hutch.cli.diagnostics", "check_if_node_is_quorum_critical")
        assert p.returncode == 69 and "'s.down' in vhost '/'" in p.stderr
    finally:
        cluster.start_node(2)
    wait_until(lambda: {r["node"]: r["committed_offset"] for r in status(cluster, 0, "s.down")}.get(down) == 24,
               30, f"{down} caught up")
    p = tool(cluster, 1, "hutch.cli.diagnostics", "check_if_node_is_quorum_critical")
    assert "'s.down'" not in p.stderr
