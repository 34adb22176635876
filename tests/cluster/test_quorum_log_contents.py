"""A quorum queue's message contents stay in its Raft log (docs/quorum.md, "Where messages are
kept"), on real nodes: the log is compacted only to a snapshot whose every message has been
settled since, so it keeps the entries of the messages still queued; a member that restarts
reads them back from its own log; a member added later gets the snapshot and the entries after
it; and a queue holding more than 16 MiB has its log compacted all the same."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import deque

import pika
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
ONE_MEMBER = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}
HELD = 300
# enough entries for a snapshot (hutch.quorum.host.SNAPSHOT_LOG_FACTOR x (messages +
# SNAPSHOT_MESSAGES_MIN) = 9,392 with HELD messages queued)
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


def publish(cluster: HutchCluster, i: int, queue: str, bodies: list[bytes]) -> None:
    """Declare `queue` (one member, on node i) and publish `bodies` to it with confirms."""
    c = connect(cluster, i)
    ch = c.channel()
    ch.queue_declare(queue, durable=True, arguments=ONE_MEMBER)
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    c.close()


def hold_then_churn(cluster: HutchCluster, i: int, queue: str) -> tuple[pika.BlockingConnection, pika.channel.Channel]:
    """Declare `queue` with one member on node i; publish HELD messages that a consumer takes and
    holds unacknowledged, then CHURN more that another consumer takes and acknowledges. Returns
    the holder's connection and channel."""
    publish(cluster, i, queue, [f"held-{n}".encode() for n in range(HELD)])
    holder = connect(cluster, i)
    hch = holder.channel()
    hch.basic_qos(prefetch_count=HELD)
    held: list[bytes] = []
    hch.basic_consume(queue, lambda _c, _m, _p, body: held.append(body))
    wait_until(lambda: holder.process_data_events(0.05) or len(held) == HELD, 30, "the holder has its messages")
    assert held == [f"held-{n}".encode() for n in range(HELD)]
    churn(cluster, i, queue, CHURN)
    return holder, hch


def churn(cluster: HutchCluster, i: int, queue: str, count: int, size: int = 0) -> int:
    """Publish `count` persistent messages (of `size` bytes, or a few) to `queue` through node i
    while a consumer takes as many from its head and acknowledges them, never more than were
    published so far (so the queue never holds less than it did before); how many it
    acknowledged."""
    pub = connect(cluster, i)
    plain = pub.channel()
    acker = connect(cluster, i)
    ach = acker.channel()
    ach.basic_qos(prefetch_count=100)
    got: deque = deque()
    tag = ach.basic_consume(queue, lambda _c, method, _p, _b: got.append(method.delivery_tag))
    acked = 0

    def settle(published: int) -> None:
        nonlocal acked
        acker.process_data_events(0)
        while got and acked < min(published, count):
            ach.basic_ack(got.popleft())
            acked += 1
    persistent = pika.BasicProperties(delivery_mode=2)
    for n in range(count):
        plain.basic_publish("", queue, bytes(size) if size else b"churn-%d" % n, persistent)
        if n % 100 == 99:
            settle(n + 1)
    wait_until(lambda: settle(count) or acked >= count, 120, "the churn consumed")
    ach.basic_cancel(tag)  # what it holds beyond goes back
    acker.close()
    pub.close()
    return acked


def churned_until_compacted(cluster: HutchCluster, i: int, queue: str, past: int, size: int = 0) -> int:
    """Churn `queue` (node i its only member) in rounds of 4,000 messages, up to 8, until its
    snapshot index is past `past` (the log is compacted when it looks, which it does as entries
    come); the snapshot index then."""
    for _ in range(8):
        assert churn(cluster, i, queue, 4_000, size) == 4_000
        status = members(cluster, i, queue)[0]
        if status["Snapshot Index"] > past:
            return status["Snapshot Index"]
    raise AssertionError(f"the log of {queue} was not compacted past entry {past}: {status}")


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


def test_held_messages_keep_the_log_from_their_entries_and_a_restarted_member_reads_them_back():
    """While a consumer holds messages, the log is compacted to no snapshot that names them; a
    member that restarts reads their contents back from its own log; once they are settled, the
    log is compacted past them."""
    with HutchCluster(n=3) as cluster:
        name = "qq.restarted"
        holder, hch = hold_then_churn(cluster, 2, name)
        assert members(cluster, 2, name)[0]["Snapshot Index"] < 2  # the held messages are from index 2 on
        hch.close()  # the held messages go back to the queue
        holder.close()
        cluster.kill(2)
        cluster.start_node(2)
        got = consume_all(cluster, 2, name, HELD)
        assert got == [(f"held-{n}".encode(), True) for n in range(HELD)]
        assert churned_until_compacted(cluster, 2, name, HELD + 1) > HELD + 1  # past the held messages


def test_a_queue_holding_more_than_a_snapshot_once_carried_still_has_its_log_compacted():
    """A backlog of 16 MiB (1,024 messages of 16 KiB), then rounds of messages published while as
    many are consumed from the head: the log is compacted behind the oldest message still queued
    while the queue never holds less than 16 MiB (before, no snapshot was taken while a queue held
    more than 12 MiB of messages, and its log grew). A snapshot is due once the log is
    4 x (1,024 + 2,048) entries long, and the log is compacted to it once its messages are gone."""
    with HutchCluster(n=3) as cluster:
        name = "qq.big"
        size, backlog = 16 * 1024, 1024
        publish(cluster, 0, name, [bytes(size)] * backlog)
        churned_until_compacted(cluster, 0, name, backlog, size)  # one out for one in: the queue keeps its size
        depth = cluster.api(0, f"/api/queues/%2F/{name}")
        assert depth["messages"] == backlog and depth["message_bytes"] == backlog * size


def test_a_member_added_after_compaction_gets_the_snapshot_and_the_entries_after_it_and_serves_them():
    with HutchCluster(n=3) as cluster:
        name = "qq.added"
        publish(cluster, 0, name, [])
        churned_until_compacted(cluster, 0, name, 2 * HELD)
        # queued after the snapshot: their contents are in the entries after it
        publish(cluster, 0, name, [f"kept-{n}".encode() for n in range(HELD)])
        for node in cluster.names[1:]:
            p = hutch_queues(cluster, 0, "add_member", name, node)
            assert p.returncode == 0, p.stderr

        def caught_up() -> bool:
            rows = members(cluster, 0, name)
            return len(rows) == 3 and all(r["Membership"] == "voter" for r in rows) and len(
                {r["Last Applied"] for r in rows}) == 1
        wait_until(caught_up, 60, "both new members are voters with the leader's state")
        # the new members never had the compacted entries: they started from the snapshot
        assert all(r["Snapshot Index"] > 2 * HELD for r in members(cluster, 0, name))
        cluster.kill(0)
        wait_until(lambda: cluster.api(1, f"/api/queues/%2F/{name}")["leader"] in cluster.names[1:], 30,
                   "a new leader on node 2 or 3")
        leader = cluster.names.index(cluster.api(1, f"/api/queues/%2F/{name}")["leader"])
        got = consume_all(cluster, leader, name, HELD)
        assert [b for b, _r in got] == [f"kept-{n}".encode() for n in range(HELD)]
