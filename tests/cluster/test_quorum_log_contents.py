"""A quorum queue's message contents stay in its Raft log (docs/quorum.md, "Where messages are
kept"), on real nodes: the log is compacted behind a snapshot that names the held messages'
entries, a member that restarts reads them back from its own log, and a member added later,
which never had those entries, gets their contents in the snapshot its leader sends."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
ONE_MEMBER = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}
HELD = 300
# enough entries after the held messages for the leader to compact its log behind them
# (hutch.quorum.host.SNAPSHOT_LOG_FACTOR x (messages + SNAPSHOT_MESSAGES_MIN) = 9,392 here)
CHURN = 12_000


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def hutch_queues(cluster: HutchCluster, i: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--url",
                           f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}", *args],
                          capture_output=True, text=True, timeout=60)


def members(cluster: HutchCluster, i: int, queue: str) -> list[dict]:
    p = hutch_queues(cluster, i, "--formatter", "json", "quorum_status", queue)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def hold_then_churn(cluster: HutchCluster, i: int, queue: str) -> tuple[pika.BlockingConnection, pika.channel.Channel]:
    """Declare `queue` with one member on node i; publish HELD messages that a consumer takes and
    holds unacknowledged, then CHURN more that another consumer takes and acknowledges, and
    wait until the log is compacted past the held ones. Returns the holder's connection and channel."""
    pub = connect(cluster, i)
    ch = pub.channel()
    ch.queue_declare(queue, durable=True, arguments=ONE_MEMBER)
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for n in range(HELD):
        ch.basic_publish("", queue, f"held-{n}".encode(), persistent)
    holder = connect(cluster, i)
    hch = holder.channel()
    hch.basic_qos(prefetch_count=HELD)
    held: list[bytes] = []
    hch.basic_consume(queue, lambda _c, _m, _p, body: held.append(body))
    wait_until(lambda: holder.process_data_events(0.05) or len(held) == HELD, 30, "the holder has its messages")
    assert held == [f"held-{n}".encode() for n in range(HELD)]

    acker = connect(cluster, i)
    ach = acker.channel()
    ach.basic_qos(prefetch_count=1000)
    acked = [0]

    def ack(c, method, _props, _body) -> None:
        c.basic_ack(method.delivery_tag)
        acked[0] += 1
    ach.basic_consume(queue, ack)
    plain = pub.channel()
    for n in range(CHURN):
        plain.basic_publish("", queue, b"churn-%d" % n, persistent)
        if n % 500 == 0:
            acker.process_data_events(0)
    wait_until(lambda: acker.process_data_events(0.05) or acked[0] == CHURN, 60, "the churn consumed")
    acker.close()
    pub.close()
    wait_until(lambda: members(cluster, i, queue)[0]["Snapshot Index"] > 2 * HELD, 30,
               "the log compacted behind the held messages")
    return holder, hch


def consume_all(cluster: HutchCluster, i: int, queue: str, count: int) -> list[tuple[bytes, bool]]:
    c = connect(cluster, i)
    ch = c.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[tuple[bytes, bool]] = []

    def on_message(chan, method, _props, body) -> None:
        got.append((body, method.redelivered))
        chan.basic_ack(method.delivery_tag)
    ch.basic_consume(queue, on_message)
    wait_until(lambda: c.process_data_events(0.05) or len(got) >= count, 60, f"{count} messages consumed")
    c.process_data_events(0.3)  # and nothing more
    c.close()
    return got


def test_a_member_restarted_after_compaction_reads_the_held_messages_back_from_its_log():
    with HutchCluster(n=3) as cluster:
        holder, hch = hold_then_churn(cluster, 2, "qq.restarted")
        hch.close()  # the held messages go back to the queue
        holder.close()
        cluster.kill(2)
        cluster.start_node(2)
        got = consume_all(cluster, 2, "qq.restarted", HELD)
        assert got == [(f"held-{n}".encode(), True) for n in range(HELD)]


def test_a_member_added_after_compaction_gets_the_held_messages_in_its_snapshot_and_serves_them():
    with HutchCluster(n=3) as cluster:
        name = "qq.added"
        holder, _hch = hold_then_churn(cluster, 0, name)
        for node in cluster.names[1:]:
            p = hutch_queues(cluster, 0, "add_member", name, node)
            assert p.returncode == 0, p.stderr

        def caught_up() -> bool:
            rows = members(cluster, 0, name)
            return len(rows) == 3 and all(r["Membership"] == "voter" for r in rows) and len(
                {r["Last Applied"] for r in rows}) == 1
        wait_until(caught_up, 60, "both new members are voters with the leader's state")
        # the new members never had the held messages' entries: they came in the snapshot
        assert all(r["Snapshot Index"] > 2 * HELD for r in members(cluster, 0, name))
        cluster.kill(0)  # the leader, and the holder's connection with it: its messages come back
        wait_until(lambda: cluster.api(1, f"/api/queues/%2F/{name}")["leader"] in cluster.names[1:], 30,
                   "a new leader on node 2 or 3")
        leader = cluster.names.index(cluster.api(1, f"/api/queues/%2F/{name}")["leader"])
        got = consume_all(cluster, leader, name, HELD)
        assert got == [(f"held-{n}".encode(), True) for n in range(HELD)]
        del holder
