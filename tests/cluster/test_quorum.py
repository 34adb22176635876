"""Quorum queues on real 3-node clusters (seed 003): a Raft group per queue, confirms after a
majority has the message, delivery from the leader to consumers on any node, leader failover
with nothing lost, and the failure-tolerance rule (a majority of members must be up)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
QUORUM = {"x-queue-type": "quorum"}
# A command on a queue with no majority of its members up fails with 541 after this long; the
# tests that take majorities away wait for it once per refused command.
METADATA_TIMEOUT_MS = 2000


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def queue_info(cluster: HutchCluster, name: str, via: int = 0) -> dict:
    return cluster.api(via, f"/api/queues/%2F/{name}")


def consume_all(conn: pika.BlockingConnection, queue: str, count: int, timeout_s: float = 30.0) -> list[bytes]:
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    got: list[bytes] = []

    def on_message(c, method, _props, body):
        got.append(body)
        c.basic_ack(method.delivery_tag)
    tag = ch.basic_consume(queue, on_message)
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    ch.basic_cancel(tag)
    return got


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def test_a_quorum_queue_has_three_members_and_serves_clients_on_every_node(cluster):
    c1, c2, c3 = connect(cluster, 0), connect(cluster, 1), connect(cluster, 2)
    try:
        c1.channel().queue_declare("qq.everywhere", durable=True, arguments=QUORUM)
        info = queue_info(cluster, "qq.everywhere", via=2)
        assert info["type"] == "quorum" and sorted(info["members"]) == sorted(cluster.names)
        assert info["leader"] in cluster.names and sorted(info["online"]) == sorted(cluster.names)
        ch = c2.channel()
        ch.confirm_delivery()
        for i in range(300):
            ch.basic_publish("", "qq.everywhere", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        assert c3.channel().queue_declare("qq.everywhere", passive=True).method.message_count == 300
        assert consume_all(c3, "qq.everywhere", 300) == [f"m{i}".encode() for i in range(300)]
        wait_until(lambda: queue_info(cluster, "qq.everywhere")["messages"] == 0, 10, "settled everywhere")
    finally:
        for c in (c1, c2, c3):
            c.close()


def test_initial_group_size_bounds_the_members(cluster):
    c = connect(cluster, 1)
    try:
        c.channel().queue_declare("qq.two", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 2})
        info = queue_info(cluster, "qq.two")
        assert len(info["members"]) == 2 and cluster.names[1] in info["members"]  # client-local: node 2 leads
        c.channel().queue_declare("qq.nine", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 9})
        assert len(queue_info(cluster, "qq.nine")["members"]) == 3
    finally:
        c.close()


def test_leader_killed_a_new_leader_is_elected_and_no_confirmed_message_is_lost():
    with HutchCluster(n=3) as cluster:
        c1 = connect(cluster, 0)
        c1.channel().queue_declare("qq.failover", durable=True, arguments=QUORUM)
        wait_until(lambda: queue_info(cluster, "qq.failover")["leader"] == cluster.names[0], 10, "leader on node 1")
        ch = c1.channel()
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", "qq.failover", f"a{i}".encode(), pika.BasicProperties(delivery_mode=2))
        c1.close()
        started = time.monotonic()
        cluster.kill(0)

        def new_leader() -> bool:
            try:
                leader = queue_info(cluster, "qq.failover", via=1)["leader"]
            except OSError:
                return False
            return leader in cluster.names[1:]
        wait_until(new_leader, 30, "a new leader")
        failover_s = time.monotonic() - started
        c2 = connect(cluster, 1)
        ch = c2.channel()
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", "qq.failover", f"b{i}".encode(), pika.BasicProperties(delivery_mode=2))
        got = consume_all(connect(cluster, 2), "qq.failover", 300)
        assert got == [f"a{i}".encode() for i in range(200)] + [f"b{i}".encode() for i in range(100)]
        assert failover_s < 15
        # the old leader comes back as a follower and catches up
        cluster.start_node(0)
        wait_until(lambda: queue_info(cluster, "qq.failover", via=0)["messages"] == 0, 30, "caught up")
        c2.close()


def test_with_two_of_three_members_down_the_queue_stops_and_resumes_without_loss():
    """Seed 003's table: 3 members tolerate 1 failure, not 2."""
    with HutchCluster(n=3, metadata_timeout_ms=METADATA_TIMEOUT_MS) as cluster:
        c1 = connect(cluster, 0)
        c1.channel().queue_declare("qq.majority", durable=True, arguments=QUORUM)
        ch = c1.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "qq.majority", b"before", pika.BasicProperties(delivery_mode=2))
        cluster.kill(1)
        ch.basic_publish("", "qq.majority", b"one-down", pika.BasicProperties(delivery_mode=2))  # still a majority
        cluster.kill(2)
        # a publish while the queue has no leader is held, as RabbitMQ's are: neither confirmed
        # nor nacked until a majority is back, then confirmed
        held = connect(cluster, 0)
        outcome: list = []

        def publish_held() -> None:
            hch = held.channel()
            hch.confirm_delivery()
            try:
                hch.basic_publish("", "qq.majority", b"held", pika.BasicProperties(delivery_mode=2))
                outcome.append("confirmed")
            except pika.exceptions.NackError:
                outcome.append("nacked")
        publisher = threading.Thread(target=publish_held, daemon=True)
        publisher.start()
        ch2 = c1.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            ch2.basic_get("qq.majority")
        assert e.value.reply_code == 541 and "no majority of its members" in e.value.reply_text
        publisher.join(2.0)
        assert outcome == [], "a publish without a leader was answered before a majority returned"
        cluster.start_node(1, wait_healthy=False)
        cluster.start_node(2)
        publisher.join(30)
        assert outcome == ["confirmed"]
        held.close()
        c = connect(cluster, 2)
        got = consume_all(c, "qq.majority", 3)
        assert sorted(got) == [b"before", b"held", b"one-down"]  # the timed-out get's message may come back later
        c.close()


def hutch_queues(cluster: HutchCluster, i: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch.cli.queues", "--url",
                           f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}", *args],
                          capture_output=True, text=True, timeout=60)


def test_quorum_status_lists_every_member_with_its_raft_state(cluster):
    c = connect(cluster, 0)
    c.channel().queue_declare("qq.status", durable=True, arguments=QUORUM)
    c.close()
    wait_until(lambda: queue_info(cluster, "qq.status")["leader"] in cluster.names, 10, "a leader")
    def rows_with_one_leader() -> list | None:
        p = hutch_queues(cluster, 1, "--formatter", "json", "quorum_status", "qq.status")
        assert p.returncode == 0, p.stderr
        rows = json.loads(p.stdout)
        return rows if sorted(r["Raft State"] for r in rows) == ["follower", "follower", "leader"] else None
    wait_until(lambda: rows_with_one_leader() is not None, 10, "one leader and two followers")
    rows = rows_with_one_leader()
    assert sorted(r["Node Name"] for r in rows) == sorted(cluster.names)
    assert sorted(r["Raft State"] for r in rows) == ["follower", "follower", "leader"]
    assert len({r["Term"] for r in rows}) == 1 and all(r["Membership"] == "voter" for r in rows)
    wait_until(lambda: len({r["Commit Index"] for r in json.loads(
        hutch_queues(cluster, 1, "--formatter", "json", "quorum_status", "qq.status").stdout)}) == 1, 10, "same commit")
    text = hutch_queues(cluster, 2, "quorum_status", "qq.status").stdout
    assert "Node Name\tRaft State\tMembership\tLast Log Index" in text


def test_delete_member_then_add_member_and_the_new_member_catches_up(cluster):
    c = connect(cluster, 0)
    ch = c.channel()
    ch.queue_declare("qq.members", durable=True, arguments=QUORUM)
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", "qq.members", f"x{i}".encode())
    third = cluster.names[2]
    p = hutch_queues(cluster, 0, "delete_member", "qq.members", third)
    assert p.returncode == 0, p.stderr
    wait_until(lambda: third not in queue_info(cluster, "qq.members")["members"], 10, "removed")
    for i in range(50, 80):
        ch.basic_publish("", "qq.members", f"x{i}".encode())  # two members: still a majority
    p = hutch_queues(cluster, 1, "add_member", "qq.members", third)
    assert p.returncode == 0, p.stderr
    assert third in queue_info(cluster, "qq.members")["members"]

    def caught_up() -> bool:
        rows = json.loads(hutch_queues(cluster, 0, "--formatter", "json", "quorum_status", "qq.members").stdout)
        mine = [r for r in rows if r["Node Name"] == third]
        return bool(mine) and mine[0]["Membership"] == "voter" and mine[0]["Last Applied"] == max(
            r["Last Applied"] for r in rows)
    wait_until(caught_up, 30, "the new member is a voter with the whole log")
    p = hutch_queues(cluster, 0, "add_member", "qq.members", third)
    assert p.returncode == 69 and "already a member" in p.stderr
    # the new member serves a consumer connected to it
    got = consume_all(connect(cluster, 2), "qq.members", 80)
    assert got == [f"x{i}".encode() for i in range(80)]
    c.close()


def test_grow_and_shrink_add_and_remove_one_nodes_replicas_across_the_matching_queues(cluster):
    """`hutch-queues grow NODE all|even` and `shrink NODE`, as rabbitmq-queues' (seed 003's
    membership commands): grow adds a replica on NODE to every matching queue (`even`: only to
    those with an even member count), and the new replica catches up; shrink removes NODE's
    replicas, never a queue's last one."""
    c = connect(cluster, 0)
    ch = c.channel()
    ch.queue_declare("qg.two", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "qg.two", f"g{i}".encode())
    third = next(n for n in cluster.names if n not in queue_info(cluster, "qg.two")["members"])
    solo = connect(cluster, cluster.names.index(third))  # client-local: its one member is on `third`
    solo.channel().queue_declare("qg.solo", durable=True, arguments={
        **QUORUM, "x-quorum-initial-group-size": 1, "x-queue-leader-locator": "client-local"})
    solo.close()
    assert queue_info(cluster, "qg.solo")["members"] == [third]
    ch.queue_declare("qg.one", durable=True, arguments={
        **QUORUM, "x-quorum-initial-group-size": 1, "x-queue-leader-locator": "client-local"})
    assert third not in queue_info(cluster, "qg.one")["members"]

    def grow(strategy: str) -> dict[str, str]:
        p = hutch_queues(cluster, 0, "--formatter", "json", "grow", third, strategy, "--queue-pattern", "^qg\\.")
        assert p.returncode == 0, p.stderr
        return {r["name"]: r["result"] for r in json.loads(p.stdout)}
    assert grow("even") == {"qg.two": "ok"}  # qg.one has one member, qg.solo already has `third`
    assert third in queue_info(cluster, "qg.two")["members"]
    assert grow("all") == {"qg.one": "ok"}
    assert len(queue_info(cluster, "qg.one")["members"]) == 2
    got = consume_all(connect(cluster, cluster.names.index(third)), "qg.two", 10)
    assert got == [f"g{i}".encode() for i in range(10)]

    p = hutch_queues(cluster, 0, "--formatter", "json", "shrink", third)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout) if r["name"].startswith("qg.")}
    assert rows["qg.two"]["result"] == "ok" and rows["qg.one"]["result"] == "ok"
    assert rows["qg.solo"]["result"].startswith("error"), rows["qg.solo"]
    assert third not in queue_info(cluster, "qg.two")["members"] + queue_info(cluster, "qg.one")["members"]
    assert queue_info(cluster, "qg.solo")["members"] == [third]
    for name in ("qg.two", "qg.one", "qg.solo"):
        ch.queue_delete(name)
    c.close()


def test_check_if_node_is_quorum_critical_names_the_queues(cluster):
    """Seed 003: a queue of 2 members tolerates no failure, so each of its members is critical."""
    c = connect(cluster, 0)
    c.channel().queue_declare("qq.critical", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    c.close()
    info = queue_info(cluster, "qq.critical")
    critical = hutch_queues(cluster, cluster.names.index(info["members"][0]), "check_if_node_is_quorum_critical")
    assert critical.returncode == 69 and "'qq.critical' in vhost '/'" in critical.stderr
    outsider = next(n for n in cluster.names if n not in info["members"])
    p = hutch_queues(cluster, cluster.names.index(outsider), "check_if_node_is_quorum_critical")
    assert "'qq.critical'" not in p.stderr


def test_five_members_tolerate_two_failures_not_three():
    """Seed 003's table, 5-member row: a majority is 3."""
    with HutchCluster(n=5, metadata_timeout_ms=METADATA_TIMEOUT_MS) as cluster:
        c1 = connect(cluster, 0)
        c1.channel().queue_declare("qq.five", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 5})
        assert len(queue_info(cluster, "qq.five")["members"]) == 5
        ch = c1.channel()
        ch.confirm_delivery()
        cluster.kill(3)
        cluster.kill(4)
        for i in range(10):  # three of five: still a majority
            ch.basic_publish("", "qq.five", f"f{i}".encode(), pika.BasicProperties(delivery_mode=2))
        cluster.kill(2)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            connect(cluster, 1).channel().basic_get("qq.five")
        assert e.value.reply_code == 541
        cluster.start_node(2, wait_healthy=False)
        c2 = connect(cluster, 1)
        # every confirmed message is there; the one the timed-out get took comes back redelivered,
        # so the order may change
        assert sorted(consume_all(c2, "qq.five", 10)) == sorted(f"f{i}".encode() for i in range(10))
        c2.close()


def test_the_failure_tolerance_table_for_one_to_five_members():
    """Seed 003's table, every row: a queue of n members serves while a majority of its members
    (n // 2 + 1) is up, whatever the cluster's other nodes do."""
    with HutchCluster(n=5, metadata_timeout_ms=METADATA_TIMEOUT_MS) as cluster:
        c = connect(cluster, 0)
        for n in range(1, 6):
            c.channel().queue_declare(f"qq.size{n}", durable=True,
                                      arguments={**QUORUM, "x-quorum-initial-group-size": n})
        members = {n: queue_info(cluster, f"qq.size{n}")["members"] for n in range(1, 6)}
        c.close()
        assert {n: len(m) for n, m in members.items()} == {1: 1, 2: 2, 3: 3, 4: 4, 5: 5}
        alive = set(cluster.names)
        # kill the nodes in an order that takes members away from every queue in turn
        for victim in reversed(range(1, 5)):
            cluster.kill(victim)
            alive.discard(cluster.names[victim])
            conn = connect(cluster, 0)
            for n, mem in members.items():
                up = len([m for m in mem if m in alive])
                ch = conn.channel()
                if up >= n // 2 + 1:
                    ch.confirm_delivery()
                    ch.basic_publish("", f"qq.size{n}", b"x", pika.BasicProperties(delivery_mode=2))
                    assert ch.basic_get(f"qq.size{n}", auto_ack=True)[2] == b"x", (n, up)
                else:
                    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
                        ch.basic_get(f"qq.size{n}")
                    assert e.value.reply_code == 541, (n, up)
                    conn = connect(cluster, 0)
            conn.close()


def test_hutchctl_lists_quorum_queues_with_type_leader_members_online(cluster):
    c = connect(cluster, 0)
    c.channel().queue_declare("qq.listed", durable=True, arguments=QUORUM)
    c.close()
    wait_until(lambda: queue_info(cluster, "qq.listed")["leader"] in cluster.names, 10, "a leader")
    p = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url",
                        f"http://127.0.0.1:{cluster.nodes[1].mgmt_port}", "--formatter", "json", "list_queues",
                        "name", "type", "leader", "members", "online"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (row,) = [r for r in json.loads(p.stdout) if r["name"] == "qq.listed"]
    assert row["type"] == "quorum" and row["leader"] in cluster.names
    assert sorted(row["members"]) == sorted(cluster.names) == sorted(row["online"])


def test_acks_from_another_node_are_applied_on_their_own_and_a_close_right_after_them_gives_back_none(cluster):
    """A consumer's acks wait on its node and go to the leader together (docs/quorum.md,
    "Performance"): with nothing else happening on the queue they are still applied, and a
    connection closed right after its acks gives back only the messages it had not acked."""
    q = "qq.acks-later"
    conn0 = connect(cluster, 0)
    try:
        ch0 = conn0.channel()
        ch0.confirm_delivery()
        ch0.queue_declare(q, durable=True, arguments=QUORUM)
        for i in range(20):
            ch0.basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    finally:
        conn0.close()
    conn2 = connect(cluster, 2)
    ch2 = conn2.channel()
    ch2.basic_qos(prefetch_count=100)
    tags: list[int] = []
    ch2.basic_consume(q, lambda _c, m, _p, _b: tags.append(m.delivery_tag))
    wait_until(lambda: conn2.process_data_events(0.05) or len(tags) == 20, 10, "20 deliveries on node 3")
    for tag in tags[:5]:  # 5 acked, 15 unacknowledged: under half the prefetch, so the acks wait
        ch2.basic_ack(tag)

    def counts() -> tuple[int, int]:
        info = queue_info(cluster, q)
        return info["messages_ready"], info["messages_unacknowledged"]
    wait_until(lambda: conn2.process_data_events(0.05) or counts() == (0, 15), 5, "the 5 acks applied")
    for tag in tags[5:12]:
        ch2.basic_ack(tag)
    conn2.close()  # at once: the 7 acks are most likely still waiting on node 3 when the channel closes
    wait_until(lambda: counts() == (8, 0), 10, "the 8 never acked back in the queue")
    conn1 = connect(cluster, 1)
    try:
        assert sorted(int(b) for b in consume_all(conn1, q, 8)) == list(range(12, 20))
    finally:
        conn1.close()
