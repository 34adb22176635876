"""Classic queue mirroring on real 3-node clusters, as the seed documents describe it.

Each test is named after the seed section it checks: seed 000 is RabbitMQ's "Classic Queue
Mirroring" guide (configuration by policy, mirror placement, unsynchronised mirrors and
synchronisation, promotion on failure and on shutdown, exclusive queues), seed 002 the blog
on its gotchas (sync blocks consumers, cancel-on-failover), seed 004 §4.1 the path of a
publish (a publish in flight while the leader fails is not lost)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def accepts_connections(cluster: HutchCluster, i: int) -> bool:
    try:
        connect(cluster, i).close()
    except pika.exceptions.AMQPConnectionError:
        return False
    return True


def http(cluster: HutchCluster, i: int, method: str, path: str, body=None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def ctl(cluster: HutchCluster, i: int, *args: str, tool: str = "ctl") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"hutch.cli.{tool}", "--url",
                           f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}", *args],
                          capture_output=True, text=True, timeout=60)


def info(cluster: HutchCluster, name: str, via: int = 0) -> dict:
    return cluster.api(via, f"/api/queues/%2F/{name}")


def mirrors(cluster: HutchCluster, name: str, via: int = 0) -> tuple[str, list[str], list[str]]:
    o = info(cluster, name, via)
    return o["node"], sorted(o.get("slave_nodes") or []), sorted(o.get("synchronised_slave_nodes") or [])


def wait_mirrors(cluster: HutchCluster, name: str, count: int, synced: int | None = None, via: int = 0,
                 timeout_s: float = 30.0) -> tuple[str, list[str], list[str]]:
    """Wait until the queue has `count` mirrors (and `synced` synchronised ones)."""
    seen = []

    def ok() -> bool:
        try:
            seen[:] = [mirrors(cluster, name, via)]
        except (urllib.error.URLError, OSError, KeyError):
            return False
        _node, ms, ss = seen[0]
        return len(ms) == count and (synced is None or len(ss) == synced)
    wait_until(ok, timeout_s, f"{count} mirrors of {name} (last seen {seen})")
    return seen[0]


def publish_confirmed(conn: pika.BlockingConnection, queue: str, bodies) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", queue, b, PERSISTENT)
    ch.close()


def drain(conn: pika.BlockingConnection, queue: str) -> list[tuple[bytes, bool]]:
    ch = conn.channel()
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


def drain_when_served(cluster: HutchCluster, i: int, queue: str, timeout_s: float = 15.0) -> list[tuple[bytes, bool]]:
    deadline = time.monotonic() + timeout_s
    while True:
        conn = connect(cluster, i)
        try:
            return drain(conn, queue)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            if conn.is_open:
                conn.close()


def mirrored_everywhere(cluster: HutchCluster, queue: str, via: int = 0,
                        definition: str = '{"ha-mode":"all","ha-sync-mode":"automatic"}',
                        pattern: str = "^ha\\.", timeout_s: float = 30.0) -> pika.BlockingConnection:
    """Policy ha-all on `pattern`, `queue` declared durable through node `via`, both mirrors
    synchronised; the declaring connection."""
    assert ctl(cluster, 0, "set_policy", "ha-all", pattern, definition).returncode == 0
    conn = connect(cluster, via)
    conn.channel().queue_declare(queue, durable=True)
    wait_mirrors(cluster, queue, 2, synced=2, timeout_s=timeout_s)
    return conn


def node_index(cluster: HutchCluster, name: str) -> int:
    return cluster.names.index(name)


def log_of(cluster: HutchCluster, i: int) -> str:
    return cluster.nodes[i].log()


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


# ---------------------------------------------------------------- configuration (seed 000)

def test_000_queue_arguments_that_control_mirroring_the_three_policy_examples_work_verbatim(cluster):
    r1 = ctl(cluster, 0, "set_policy", "ha-all", "^ha\\.", '{"ha-mode":"all"}')
    r2 = ctl(cluster, 0, "set_policy", "ha-two", "^two\\.",
             '{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}')
    r3 = ctl(cluster, 0, "set_policy", "ha-nodes", "^nodes\\.",
             '{"ha-mode":"nodes","ha-params":["hutch-2@localhost", "hutch-3@localhost"]}')
    assert (r1.returncode, r2.returncode, r3.returncode) == (0, 0, 0), (r1.stderr, r2.stderr, r3.stderr)
    c = connect(cluster, 0)
    ch = c.channel()
    for q in ("ha.all", "two.replicas", "nodes.listed"):
        ch.queue_declare(q, durable=True)
    node, ms, _ = wait_mirrors(cluster, "ha.all", 2)
    assert node == cluster.names[0] and ms == sorted(cluster.names[1:])
    node, ms, _ = wait_mirrors(cluster, "two.replicas", 1)
    assert node == cluster.names[0] and ms[0] in cluster.names[1:]
    # ha-mode nodes: the queue goes to a listed node (the declaring client's node is not listed)
    node, ms, _ = wait_mirrors(cluster, "nodes.listed", 1)
    assert sorted([node, *ms]) == ["hutch-2@localhost", "hutch-3@localhost"]
    for q in ("ha.all", "two.replicas", "nodes.listed"):
        ch.queue_delete(q)
    c.close()
    for p in ("ha-all", "ha-two", "ha-nodes"):
        assert ctl(cluster, 0, "clear_policy", p).returncode == 0
    assert "Adding mirror on node hutch-2@localhost" in log_of(cluster, 0)


def test_000_policies_set_over_http_and_listed_by_list_queues_mirror_pids(cluster):
    assert http(cluster, 1, "PUT", "/api/policies/%2F/ha-listed",
                {"pattern": "^listed$", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}}) == 201
    c = connect(cluster, 1)
    c.channel().queue_declare("listed", durable=True)
    c.close()
    wait_mirrors(cluster, "listed", 2, synced=2)
    p = ctl(cluster, 2, "--formatter", "json", "list_queues", "name", "policy", "pid", "mirror_pids",
            "synchronised_mirror_pids", "slave_pids", "synchronised_slave_pids")
    assert p.returncode == 0, p.stderr
    (row,) = [r for r in json.loads(p.stdout) if r["name"] == "listed"]
    assert row["policy"] == "ha-listed" and row["pid"] == "<hutch-2@localhost>"
    assert sorted(row["mirror_pids"]) == ["<hutch-1@localhost>", "<hutch-3@localhost>"]
    assert sorted(row["synchronised_mirror_pids"]) == sorted(row["mirror_pids"]) == sorted(row["slave_pids"])
    o = info(cluster, "listed", via=0)
    assert o["effective_policy_definition"]["ha-mode"] == "all" and o["node"] == "hutch-2@localhost"
    assert sorted(o["synchronised_slave_nodes"]) == sorted(o["mirror_nodes"])
    # the migration aids see the policy
    check = ctl(cluster, 0, "check_if_cluster_has_classic_queue_mirroring_policy", tool="diagnostics")
    assert check.returncode != 0 and "ha-listed" in (check.stdout + check.stderr)
    listed = ctl(cluster, 0, "list_policies_with_classic_queue_mirroring", "-s", "--formatter=pretty_table",
                 tool="diagnostics")
    assert listed.returncode == 0 and "ha-listed" in listed.stdout
    assert http(cluster, 0, "DELETE", "/api/policies/%2F/ha-listed") == 204
    wait_mirrors(cluster, "listed", 0)  # and back to a plain classic queue
    assert http(cluster, 0, "DELETE", "/api/queues/%2F/listed") == 204


def test_000_exclusive_queues_are_never_mirrored(cluster):
    assert ctl(cluster, 0, "set_policy", "ha-excl", ".*excl.*", '{"ha-mode":"all"}').returncode == 0
    c = connect(cluster, 0)
    ch = c.channel()
    ch.queue_declare("excl.q", exclusive=True)
    ch.queue_declare("shared.excl", durable=False)
    wait_mirrors(cluster, "shared.excl", 2)
    assert mirrors(cluster, "excl.q")[1] == []
    time.sleep(1.5)  # two rounds of the placement check: still none
    assert mirrors(cluster, "excl.q")[1] == []
    ch.queue_delete("shared.excl")
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-excl").returncode == 0


def test_000_a_policy_makes_a_queue_mirrored_and_its_change_keeps_mirrors_that_still_fit(cluster):
    c = connect(cluster, 0)
    c.channel().queue_declare("later.q", durable=True)
    assert mirrors(cluster, "later.q")[1] == []
    assert ctl(cluster, 0, "set_policy", "ha-later", "^later\\.", '{"ha-mode":"all"}').returncode == 0
    wait_mirrors(cluster, "later.q", 2)
    assert ctl(cluster, 0, "set_policy", "ha-later", "^later\\.",
               '{"ha-mode":"exactly","ha-params":2}').returncode == 0
    _n, ms, _ = wait_mirrors(cluster, "later.q", 1)
    assert ms[0] in cluster.names[1:]
    c.channel().queue_delete("later.q")
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-later").returncode == 0


# ---------------------------------------------------------------- synchronisation (seeds 000, 001)

def test_000_unsynchronised_mirrors_a_new_mirror_starts_empty_and_sync_queue_synchronises_it(cluster):
    c = connect(cluster, 0)
    c.channel().queue_declare("sync.q", durable=True)
    publish_confirmed(c, "sync.q", [b"old-%d" % i for i in range(300)])
    assert ctl(cluster, 0, "set_policy", "ha-sync", "^sync\\.",
               '{"ha-mode":"all","ha-sync-batch-size":50}').returncode == 0
    _n, ms, ss = wait_mirrors(cluster, "sync.q", 2)
    assert ss == []  # they hold none of the 300 messages that were there before them
    publish_confirmed(c, "sync.q", [b"new"])
    time.sleep(1.2)
    assert mirrors(cluster, "sync.q")[2] == []  # new messages do not make them synchronised
    p = ctl(cluster, 1, "sync_queue", "sync.q")
    assert p.returncode == 0, p.stderr
    wait_mirrors(cluster, "sync.q", 2, synced=2)
    log = log_of(cluster, 0)
    assert "Mirrored queue 'sync.q' in vhost '/': Synchronising: 301 messages to synchronise" in log
    assert "Mirrored queue 'sync.q' in vhost '/': Synchronising: batch size: 50" in log
    assert "Mirrored queue 'sync.q' in vhost '/': Synchronising: complete" in log
    # draining the head also synchronises: a fresh mirror of a queue consumed to empty
    assert http(cluster, 0, "POST", "/api/queues/%2F/sync.q/actions", {"action": "bogus"}) == 400
    got = drain(c, "sync.q")
    assert len(got) == 301
    c.channel().queue_delete("sync.q")
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-sync").returncode == 0


def _log_time(line: str) -> float:
    stamp = line[:23]  # 2026-11-22 12:40:28.460
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) - time.timezone + float(stamp[19:])


def test_002_automatic_sync_blocks_a_slow_consumer_until_it_is_complete(cluster):
    """Seed 002, "Synchronisation blocks": while 40,000 messages sync in batches of 2 a consumer
    taking 10 msg/s receives nothing, from the sync's first log line to its last."""
    c = connect(cluster, 0)
    ch = c.channel()
    ch.queue_declare("block.q", durable=True)
    for _ in range(40000):
        ch.basic_publish("", "block.q", b"x" * 256)
    wait_until(lambda: ch.queue_declare("block.q", passive=True).method.message_count == 40000, 30, "40,000 queued")
    deliveries: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        cc = connect(cluster, 2)
        cch = cc.channel()
        cch.basic_qos(prefetch_count=1)

        def on_msg(chan, method, _p, _b):
            deliveries.append(time.time())
            time.sleep(0.1)  # 10 msg/s
            chan.basic_ack(method.delivery_tag)
        cch.basic_consume("block.q", on_msg)
        while not stop.is_set():
            cc.process_data_events(0.05)
        cc.close()
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    wait_until(lambda: len(deliveries) >= 5, 10, "the consumer running")
    assert ctl(cluster, 0, "set_policy", "ha-block", "^block\\.",
               '{"ha-mode":"all","ha-sync-mode":"automatic","ha-sync-batch-size":2}').returncode == 0
    wait_mirrors(cluster, "block.q", 2, synced=2, timeout_s=120)
    time.sleep(1.0)
    stop.set()
    t.join(10)
    lines = [ln for ln in log_of(cluster, 0).splitlines() if "'block.q'" in ln and "Synchronising" in ln]
    assert any("Synchronising: batch size: 2" in ln for ln in lines), lines
    first = [_log_time(ln) for ln in lines if "messages to synchronise" in ln]
    last = [_log_time(ln) for ln in lines if "Synchronising: complete" in ln]
    assert first and last, lines
    # each sync (one per mirror that joined) ran for a while, and nobody was served meanwhile
    for begin, end in zip(first, last, strict=True):
        assert end - begin > 0.1, lines
        inside = [d for d in deliveries if begin + 0.15 < d < end]
        assert inside == [], (begin, end, inside)
    assert any(d > last[-1] for d in deliveries)  # and deliveries resumed
    ch.queue_delete("block.q")
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-block").returncode == 0


# ---------------------------------------------------------------- failure and promotion (seed 000)

def test_000_tx_commit_ok_comes_only_once_every_mirror_has_the_transaction(cluster):
    """Seed 000, "Publisher Confirms and Transactions": tx.commit-ok is returned only when the
    transaction has been applied across all mirrors. With one mirror's node suspended, a commit
    on the mirrored queue waits (a commit on an unmirrored queue of the same node does not), and
    it completes when the node runs again."""
    conn = mirrored_everywhere(cluster, "ha.tx", via=0)
    leader = node_index(cluster, info(cluster, "ha.tx")["node"])
    mirror = next(i for i in range(3) if i != leader)
    plain_conn = connect(cluster, leader)
    plain_conn.channel().queue_declare("plain.tx", durable=True)
    conn.close()
    conn = connect(cluster, leader)
    tx, plain = conn.channel(), plain_conn.channel()
    tx.tx_select()
    plain.tx_select()
    tx.basic_publish("", "ha.tx", b"in-a-transaction", PERSISTENT)
    plain.basic_publish("", "plain.tx", b"in-a-transaction", PERSISTENT)
    committed = threading.Event()
    pid = cluster.nodes[mirror].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        waiter = threading.Thread(target=lambda: (tx.tx_commit(), committed.set()), daemon=True)
        waiter.start()
        started = time.monotonic()
        plain.tx_commit()  # no mirror: at once
        assert time.monotonic() - started < 1.0
        assert not committed.wait(1.5), "tx.commit-ok came while a mirror could not have the transaction"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert committed.wait(15), "tx.commit-ok never came after the mirror's node ran again"
    waiter.join(5)
    assert wait_mirrors(cluster, "ha.tx", 2, synced=2)[2] == sorted(n for i, n in enumerate(cluster.names) if i != leader)
    got = drain(connect(cluster, mirror), "ha.tx")
    assert got == [(b"in-a-transaction", False)]
    conn.close()
    plain_conn.close()


def test_000_flow_control_a_mirror_that_gives_no_credit_stalls_the_publisher_until_it_does():
    """Seed 000, "Flow Control": publishers may publish as long as every mirror gives credit; a
    mirror that does not (its node suspended, not yet considered disconnected) stalls them. Here
    the leader holds back a publisher once 20,000 messages wait for the ring (docs/mirroring.md),
    and lets it go on when the mirror runs again."""
    with HutchCluster(n=3, net_ticktime_s=30) as cluster:  # the suspended node is not declared down
        conn = mirrored_everywhere(cluster, "ha.flow", via=0, definition='{"ha-mode":"all"}')
        leader = node_index(cluster, info(cluster, "ha.flow")["node"])
        mirror = next(i for i in range(3) if i != leader)
        publisher = connect(cluster, leader)
        total = 30_000
        done = threading.Event()

        def publish() -> None:
            ch = publisher.channel()
            for i in range(total):
                ch.basic_publish("", "ha.flow", b"%d" % i)
            ch.close()  # once the broker has read every publish (the client buffers what it cannot send)
            done.set()
        pid = cluster.nodes[mirror].proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            threading.Thread(target=publish, daemon=True).start()
            depths: list[int] = []

            def plateau() -> bool:  # the queue past the ring's limit, and no longer growing
                depths.append(info(cluster, "ha.flow", via=leader)["messages"])
                return len(depths) > 10 and depths[-1] == depths[-10] >= 20_000
            wait_until(plateau, 60, "the queue past 20,000 messages and no longer growing")
            assert depths[-1] < total and not done.is_set(), depths[-10:]
        finally:
            os.kill(pid, signal.SIGCONT)
        assert done.wait(60), "the publisher was never let go on"
        wait_until(lambda: info(cluster, "ha.flow", via=leader)["messages"] == total, 30, "every message in the queue")
        publisher.close()
        conn.close()


def test_000_leader_failure_promotes_the_oldest_mirror_requeues_unacked_and_loses_nothing_confirmed():
    with HutchCluster(n=3) as cluster:
        c1 = mirrored_everywhere(cluster, "ha.fail")
        c2 = connect(cluster, 1)
        publish_confirmed(c2, "ha.fail", [b"%d" % i for i in range(500)])
        # a consumer on node 3 holds 20 unacknowledged; another asked to be cancelled on failover
        c3 = connect(cluster, 2)
        ch3 = c3.channel()
        ch3.basic_qos(prefetch_count=20)
        seen: list[tuple[bytes, bool]] = []
        held: list[int] = []
        acking = []

        def on_msg(chan, m, _p, b):
            seen.append((b, m.redelivered))
            if acking:
                chan.basic_ack(m.delivery_tag)
            else:
                held.append(m.delivery_tag)
        ch3.basic_consume("ha.fail", on_msg)
        cancelled = []
        ch3b = c3.channel()
        ch3b.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        ch3b.basic_consume("ha.fail", lambda *_a: None, arguments={"x-cancel-on-ha-failover": True})
        wait_until(lambda: (c3.process_data_events(0.05) or True) and len(held) >= 20, 10, "20 deliveries")
        first = {b for b, _r in seen}
        c1.close()
        cluster.kill(0)
        wait_until(lambda: (c3.process_data_events(0.05) or True) and cancelled, 30, "basic.cancel on failover")
        node, _ms, _ = wait_mirrors(cluster, "ha.fail", 1, via=1)
        # the longest-running mirror: the first the leader added (the two join at about the same time)
        added = [ln.split("Adding mirror on node ")[1].split(":")[0] for ln in log_of(cluster, 0).splitlines()
                 if "'ha.fail'" in ln and "Adding mirror on node " in ln]
        assert node == added[0], added
        promoted = log_of(cluster, cluster.names.index(node))
        assert "Promoting slave" in promoted and "to master" in promoted
        # the consumer without x-cancel-on-ha-failover goes on receiving from the new leader; its
        # old tags settle nothing (the new leader requeued those messages: they come again)
        acking.append(True)
        for tag in held:
            ch3.basic_ack(tag)
        wait_until(lambda: (c3.process_data_events(0.05) or True) and len(seen) >= 520, 30, "all 500 after failover")
        after = seen[20:]
        assert {b for b, _r in after} == {b"%d" % i for i in range(500)} and len(after) == 500
        assert all(r for b, r in after if b in first)
        assert drain(c2, "ha.fail") == []
        c3.close()
        c2.close()


def test_004_a_publish_in_flight_while_the_leader_fails_is_confirmed_and_not_lost():
    with HutchCluster(n=3) as cluster:
        mirrored_everywhere(cluster, "ha.flight").close()
        confirmed: list[int] = []
        nacked: list[int] = []
        stop = threading.Event()

        def publisher() -> None:
            conn = connect(cluster, 1)
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            while not stop.is_set():
                try:
                    ch.basic_publish("", "ha.flight", b"%d" % i, PERSISTENT)
                    confirmed.append(i)
                except pika.exceptions.NackError:
                    nacked.append(i)
                i += 1
            conn.close()
        t = threading.Thread(target=publisher, daemon=True)
        t.start()
        wait_until(lambda: len(confirmed) > 200, 20, "publishing")
        cluster.kill(0)
        before = len(confirmed)
        wait_until(lambda: len(confirmed) > before + 200, 60, "confirms after the promotion")
        stop.set()
        t.join(30)
        got = drain(connect(cluster, 2), "ha.flight")
        bodies = [int(b) for b, _r in got]
        assert set(confirmed) <= set(bodies), sorted(set(confirmed) - set(bodies))[:10]
        assert len(bodies) == len(set(bodies))  # resent publishes were recognised, not enqueued twice


def test_000_promote_on_failure_when_synced_an_unsynchronised_mirror_is_not_promoted():
    with HutchCluster(n=3) as cluster:
        c1 = connect(cluster, 0)
        for q in ("ws.q", "ws.gone"):
            c1.channel().queue_declare(q, durable=True)
            publish_confirmed(c1, q, [b"%d" % i for i in range(50)])
        assert ctl(cluster, 0, "set_policy", "ha-ws", "^ws\\.",
                   '{"ha-mode":"all","ha-promote-on-failure":"when-synced"}').returncode == 0
        wait_mirrors(cluster, "ws.q", 2, synced=0)
        wait_mirrors(cluster, "ws.gone", 2, synced=0)
        c1.close()
        cluster.kill(0)
        time.sleep(8)  # the failure is noticed (net_ticktime 4 s) and nobody may take over
        o = info(cluster, "ws.q", via=1)
        assert o["node"] == "hutch-1@localhost"
        assert "no synchronised mirror to promote" in log_of(cluster, 1) + log_of(cluster, 2)
        c2 = connect(cluster, 1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c2.channel().basic_get("ws.q")
        assert e.value.reply_code == 404 and "is down or inaccessible" in e.value.reply_text
        # a publish with confirms to the queue without a leader is nacked: nothing is confirmed
        # that no copy of the queue holds
        ch = connect(cluster, 2).channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "ws.q", b"while-down", PERSISTENT)
        # seed 001: if the leader is lost for good, the queue is deleted (with its contents) and
        # declared again; the new queue is mirrored by the same policy and serves at once
        c3 = connect(cluster, 1)
        c3.channel().queue_delete("ws.gone")
        c3.channel().queue_declare("ws.gone", durable=True)
        publish_confirmed(c3, "ws.gone", [b"new-%d" % i for i in range(5)])
        assert info(cluster, "ws.gone", via=1)["node"] != "hutch-1@localhost"
        cluster.start(0)  # the leader returns with its messages
        got = drain(connect(cluster, 1), "ws.q")
        assert sorted(int(b) for b, _r in got) == list(range(50))
        # the returning node's old copy of the deleted queue does not come back with it
        wait_mirrors(cluster, "ws.gone", 2, via=1)
        got = drain(connect(cluster, 0), "ws.gone")
        assert sorted(b for b, _r in got) == [b"new-%d" % i for i in range(5)]


def test_000_stopping_nodes_a_controlled_shutdown_does_not_promote_an_unsynchronised_mirror():
    with HutchCluster(n=3) as cluster:
        c1 = connect(cluster, 0)
        for q in ("stop.synced", "stop.always", "stop.overridden"):
            c1.channel().queue_declare(q, durable=True)
            publish_confirmed(c1, q, [b"%d" % i for i in range(20)])
        assert ctl(cluster, 0, "set_policy", "ha-stop", "^stop\\.synced$", '{"ha-mode":"all"}').returncode == 0
        assert ctl(cluster, 0, "set_policy", "ha-always", "^stop\\.always$",
                   '{"ha-mode":"all","ha-promote-on-shutdown":"always"}').returncode == 0
        # seed 001: when-synced on failure overrides always on shutdown
        assert ctl(cluster, 0, "set_policy", "ha-overridden", "^stop\\.overridden$",
                   '{"ha-mode":"all","ha-promote-on-shutdown":"always",'
                   '"ha-promote-on-failure":"when-synced"}').returncode == 0
        for q in ("stop.synced", "stop.always", "stop.overridden"):
            wait_mirrors(cluster, q, 2, synced=0)
        c1.close()
        cluster.stop(0)
        wait_until(lambda: info(cluster, "stop.always", via=1)["node"] != "hutch-1@localhost", 30,
                   "ha-promote-on-shutdown always promotes")
        time.sleep(2)
        assert info(cluster, "stop.synced", via=1)["node"] == "hutch-1@localhost"  # the queue shut down
        assert info(cluster, "stop.overridden", via=1)["node"] == "hutch-1@localhost"
        # the promoted one lost the 20 messages only its old leader had: the documented price
        assert drain(connect(cluster, 1), "stop.always") == []
        cluster.start(0)
        for q in ("stop.synced", "stop.overridden"):
            got = drain(connect(cluster, 2), q)
            assert sorted(int(b) for b, _r in got) == list(range(20)), q


def test_000_exactly_a_mirror_on_a_node_that_goes_down_is_replaced_elsewhere():
    with HutchCluster(n=3) as cluster:
        assert ctl(cluster, 0, "set_policy", "ha-two", "^two\\.",
                   '{"ha-mode":"exactly","ha-params":2}').returncode == 0
        connect(cluster, 0).channel().queue_declare("two.q", durable=True)
        _n, (first,), _ = wait_mirrors(cluster, "two.q", 1)
        cluster.kill(node_index(cluster, first))
        other = [n for n in cluster.names[1:] if n != first][0]
        wait_until(lambda: mirrors(cluster, "two.q")[1] == [other], 30, f"a mirror on {other}")


def test_000_nodes_policy_change_moves_the_leader_once_a_listed_mirror_is_synchronised(cluster):
    """Seed 000: changing a `nodes` policy so that the leader is not listed keeps the leader until
    a listed mirror is synchronised; then the queue moves and its consumers are cancelled."""
    assert ctl(cluster, 0, "set_policy", "ha-move", "^move\\.",
               '{"ha-mode":"nodes","ha-params":["hutch-1@localhost","hutch-2@localhost"]}').returncode == 0
    c = connect(cluster, 0)
    c.channel().queue_declare("move.q", durable=True)
    node, ms, _ = wait_mirrors(cluster, "move.q", 1, synced=1)
    assert (node, ms) == ("hutch-1@localhost", ["hutch-2@localhost"])
    publish_confirmed(c, "move.q", [b"%d" % i for i in range(100)])
    cancelled = []
    ch = c.channel()
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_qos(prefetch_count=5)
    ch.basic_consume("move.q", lambda *_a: None)  # holds 5 unacknowledged
    c.process_data_events(0.5)
    assert ctl(cluster, 0, "set_policy", "ha-move", "^move\\.",
               '{"ha-mode":"nodes","ha-params":["hutch-2@localhost","hutch-3@localhost"]}').returncode == 0
    wait_until(lambda: info(cluster, "move.q", via=2)["node"] == "hutch-2@localhost", 30, "the leader moved")
    wait_until(lambda: (c.process_data_events(0.05) or True) and cancelled, 20, "the consumer on the old leader cancelled")
    wait_until(lambda: mirrors(cluster, "move.q", via=2)[1] == ["hutch-3@localhost"], 20, "a mirror on hutch-3")
    got = drain_when_served(cluster, 2, "move.q")  # a move leaves the queue briefly without a leader
    assert sorted(int(b) for b, _r in got) == list(range(100))
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-move").returncode == 0


def test_000_a_restarting_mirror_rejoins_empty_and_unsynchronised(tmp_path):
    conf = tmp_path / "hutch.conf"  # RabbitMQ's behaviour: hutch's mirrors remember by default
    conf.write_text("mirroring_recover_from_disk = false\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        c = mirrored_everywhere(cluster, "ha.restart", definition='{"ha-mode":"all"}')
        publish_confirmed(c, "ha.restart", [b"%d" % i for i in range(30)])
        cluster.kill(2)
        wait_mirrors(cluster, "ha.restart", 1, synced=1)
        cluster.start(2)
        _n, ms, ss = wait_mirrors(cluster, "ha.restart", 2)
        assert ms == ["hutch-2@localhost", "hutch-3@localhost"] and ss == ["hutch-2@localhost"]
        assert drain(c, "ha.restart") != []
        wait_mirrors(cluster, "ha.restart", 2, synced=2)  # drained: nothing older is left
        c.close()


def test_002_pause_minority_a_node_cut_off_from_the_majority_closes_its_clients():
    """cluster_partition_handling = pause_minority (seed 002, seed 004 §3.3.3): a node that can
    reach no majority (here its two peers are gone: it cannot tell that from a partition) stops
    serving clients, so its leader of a mirrored queue confirms nothing alone, and serves again
    once the majority is back."""
    with HutchCluster(n=3, extra_args=["--cluster-partition-handling", "pause_minority"]) as cluster:
        conn = connect(cluster, 0)
        cluster.kill(1)
        time.sleep(1)
        assert conn.is_open  # one peer gone: 2 of 3 is a majority
        cluster.kill(2)
        wait_until(lambda: "Cluster minority status detected" in log_of(cluster, 0), 30, "node 1 pausing")
        with pytest.raises(pika.exceptions.AMQPError):
            for _ in range(100):
                conn.process_data_events(0.1)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[0].amqp_port,
                                                              connection_attempts=1))
        cluster.start_node(1, wait_healthy=False)
        wait_until(lambda: "Cluster majority status regained" in log_of(cluster, 0), 60, "node 1 resuming")
        # it lets clients in once a catalogue barrier has committed (docs/operations.md)
        wait_until(lambda: accepts_connections(cluster, 0), 30, "node 1 serving again")


def test_000_randomised_leader_kills_with_when_synced_and_automatic_sync_lose_no_confirmed_message():
    """Publishers with confirms and consumers with manual acks while the leader's node is killed
    (kill -9) and restarted, round after round, under ha-promote-on-failure: when-synced and
    automatic sync: every confirmed message is delivered, and a message delivered twice carries
    `redelivered` the second time."""
    import random
    rnd = random.Random(7)
    with HutchCluster(n=3) as cluster:
        assert ctl(cluster, 0, "set_policy", "ha-rnd", "^rnd\\.",
                   '{"ha-mode":"all","ha-sync-mode":"automatic","ha-promote-on-failure":"when-synced"}'
                   ).returncode == 0
        connect(cluster, 0).channel().queue_declare("rnd.q", durable=True)
        wait_mirrors(cluster, "rnd.q", 2, synced=2)
        confirmed: set[int] = set()
        deliveries: list[tuple[int, bool]] = []
        stop = threading.Event()
        lock = threading.Lock()

        def live_nodes(avoid: str | None) -> list[int]:
            return [i for i in range(3) if cluster.running(i) and cluster.names[i] != avoid] or [0]

        def leader() -> str | None:
            for i in live_nodes(None):
                try:
                    return info(cluster, "rnd.q", via=i)["node"]
                except Exception:
                    continue
            return None

        def publisher() -> None:
            n = 0
            while not stop.is_set():
                try:
                    conn = connect(cluster, rnd.choice(live_nodes(leader())))
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while not stop.is_set():
                        ch.basic_publish("", "rnd.q", b"%d" % n, PERSISTENT)
                        with lock:
                            confirmed.add(n)
                        n += 1
                except (pika.exceptions.AMQPError, OSError):
                    n += 1  # that one is unconfirmed: never counted
                    time.sleep(0.2)

        def consumer() -> None:
            while not stop.is_set():
                try:
                    conn = connect(cluster, rnd.choice(live_nodes(leader())))
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=50)

                    def on_msg(c, m, _p, b):
                        with lock:
                            deliveries.append((int(b), m.redelivered))
                        c.basic_ack(m.delivery_tag)
                    ch.basic_consume("rnd.q", on_msg)
                    while not stop.is_set():
                        conn.process_data_events(0.1)
                    conn.close()
                except (pika.exceptions.AMQPError, OSError):
                    time.sleep(0.2)
        threads = [threading.Thread(target=publisher, daemon=True), threading.Thread(target=consumer, daemon=True)]
        for t in threads:
            t.start()
        for _round in range(3):
            wait_until(lambda: len(confirmed) > 0, 20, "publishing")
            time.sleep(rnd.uniform(2, 4))
            victim = cluster.names.index(leader())
            cluster.kill(victim)
            gone = cluster.names[victim]
            wait_until(lambda gone=gone: leader() not in (None, gone), 60, "a promoted leader")
            cluster.start(victim)
            wait_mirrors(cluster, "rnd.q", 2, synced=2, via=(victim + 1) % 3, timeout_s=60)
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(20)
        rest = drain_when_served(cluster, 0, "rnd.q")
        delivered = [b for b, _r in deliveries] + [int(b) for b, _r in rest]
        missing = confirmed - set(delivered)
        assert len(confirmed) > 300  # the kills happened under load
        assert not missing, sorted(missing)[:20]
        seen: set[int] = set()
        for b, redelivered in deliveries + [(int(b), r) for b, r in rest]:
            assert b not in seen or redelivered, f"message {b} delivered again without redelivered"
            seen.add(b)


def test_000_stopping_nodes_one_by_one_the_queue_keeps_its_messages_across_a_full_restart():
    """Seed 000, "Stopping Nodes and Synchronisation": stopping the nodes one at a time hands a
    synchronised queue on while a majority can commit the change; the last leader that could be
    recorded recovers the messages from its journal when the cluster starts again. The queue
    goes to its longest-running mirror, hutch-2's or hutch-3's as their joins raced; after that
    only one more change can commit: with hutch-2 stopped next, the successor is the last
    leader either way (if it is hutch-2, hutch-3 alone cannot commit taking it over)."""
    others = ("hutch-2@localhost", "hutch-3@localhost")
    with HutchCluster(n=3) as cluster:
        c = mirrored_everywhere(cluster, "ha.stops")
        publish_confirmed(c, "ha.stops", [b"%d" % i for i in range(200)])
        c.close()
        cluster.stop(0)
        wait_until(lambda: info(cluster, "ha.stops", via=1)["node"] in others, 30, "handed to a mirror")
        successor = info(cluster, "ha.stops", via=1)["node"]
        cluster.stop(1)
        cluster.stop(2)
        cluster.start()
        assert info(cluster, "ha.stops", via=2)["node"] == successor
        got = drain_when_served(cluster, 2, "ha.stops")
        assert sorted(int(b) for b, _r in got) == list(range(200))


def test_000_a_mirrored_queue_deleted_and_declared_again_is_mirrored_again(cluster):
    assert ctl(cluster, 0, "set_policy", "ha-again", "^again$", '{"ha-mode":"all"}').returncode == 0
    c = connect(cluster, 0)
    ch = c.channel()
    ch.queue_declare("again", durable=True)
    wait_mirrors(cluster, "again", 2)
    ch.queue_delete("again")
    ch.queue_declare("again", durable=True)
    _n, _ms, ss = wait_mirrors(cluster, "again", 2, synced=2)
    publish_confirmed(c, "again", [b"x"])
    assert info(cluster, "again")["messages"] == 1
    ch.queue_delete("again")
    c.close()
    assert ctl(cluster, 0, "clear_policy", "ha-again").returncode == 0


def test_000_a_suspended_leader_node_is_replaced_and_rejoins_as_a_mirror():
    """A hung leader (SIGSTOP: its sockets stay open, it answers nothing) is noticed by the
    failure detector within seconds (net_ticktime 4 s here), a synchronised mirror takes over,
    and when the old leader resumes it follows the catalogue: its copy goes, it mirrors again,
    and so does the mirror that was not promoted."""
    import os
    import signal
    with HutchCluster(n=3) as cluster:
        c = mirrored_everywhere(cluster, "ha.hung", via=1)  # led by hutch-2 (client-local)
        publish_confirmed(c, "ha.hung", [b"%d" % i for i in range(100)])
        c.close()
        node, _ms, _ = wait_mirrors(cluster, "ha.hung", 2, synced=2)
        leader = node_index(cluster, node)
        other = (leader + 1) % 3
        pid = cluster.nodes[leader].proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            wait_until(lambda: info(cluster, "ha.hung", via=other)["node"] != node, 30, "a promoted mirror")
            assert time.monotonic() - started < 15
        finally:
            os.kill(pid, signal.SIGCONT)
        new = info(cluster, "ha.hung", via=other)["node"]
        # every other node mirrors it again: the old leader, and the mirror that was not promoted
        # (the two leaders may declare each other dead in the ring as the old one resumes: the
        # new leader then founds a ring of its own, and the mirrors join it)
        others = sorted(n for n in cluster.names if n != new)
        wait_until(lambda: mirrors(cluster, "ha.hung", via=other)[1] == others, 60, "the old leader mirroring again")
        got = drain_when_served(cluster, other, "ha.hung")
        assert sorted(int(b) for b, _r in got) == list(range(100)) and new != node


def test_000_configuring_synchronisation_max_throughput_paces_a_sync_and_gets_wait_for_it(tmp_path):
    """Seed 000, "Configuring Synchronisation": `mirroring_sync_max_throughput` caps the bytes a
    sync sends per second; while it runs, basic.get (on the leader's node and on another) and
    the management API's get are answered only once it is complete."""
    conf = tmp_path / "hutch.conf"
    conf.write_text("mirroring_sync_max_throughput = 40kb\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        c = connect(cluster, 0)
        c.channel().queue_declare("ha.paced", durable=True)
        publish_confirmed(c, "ha.paced", [b"%04d" % i + b"x" * 1020 for i in range(120)])  # 120 KiB
        assert ctl(cluster, 0, "set_policy", "ha-all", "^ha\\.",
                   '{"ha-mode":"all","ha-sync-batch-size":10}').returncode == 0
        wait_mirrors(cluster, "ha.paced", 2, synced=0)
        started = time.monotonic()
        assert http(cluster, 0, "POST", "/api/queues/%2F/ha.paced/actions", {"action": "sync"}) == 204
        answers: dict[str, float] = {}

        def get_amqp(i: int) -> None:
            conn = connect(cluster, i)
            method, _p, _b = conn.channel().basic_get("ha.paced", auto_ack=False)
            answers[f"amqp via node {i + 1}"] = time.monotonic() - started
            assert method is not None
            conn.close()  # the message goes back

        def get_http() -> None:
            req = urllib.request.Request(f"http://127.0.0.1:{cluster.nodes[0].mgmt_port}/api/queues/%2F/ha.paced/get",
                                         method="POST", data=json.dumps({"count": 1, "ackmode": "ack_requeue_true",
                                                                         "encoding": "auto"}).encode())
            req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert len(json.loads(resp.read())) == 1
            answers["http on node 1"] = time.monotonic() - started
        threads = [threading.Thread(target=get_amqp, args=(0,)), threading.Thread(target=get_amqp, args=(1,)),
                   threading.Thread(target=get_http)]
        for t in threads:
            t.start()
        wait_mirrors(cluster, "ha.paced", 2, synced=2, timeout_s=60)
        synced_after = time.monotonic() - started
        for t in threads:
            t.join(30)
        assert synced_after > 2.0  # 120 KiB at 40 kB/s: about three seconds, not milliseconds
        assert len(answers) == 3 and min(answers.values()) > 2.0, answers
        lines = [ln for ln in log_of(cluster, 0).splitlines() if "'ha.paced'" in ln and "Synchronising" in ln]
        assert any(ln.endswith("Synchronising: complete") for ln in lines)
        assert any(ln.endswith("Synchronising: 120 messages to synchronise") for ln in lines)
        # seed 000, "Unsynchronised Mirrors": an in-progress synchronisation is cancelled with
        # `cancel_sync_queue` (and the HTTP API's cancel_sync action); the mirrors stay
        # unsynchronised, and the queue serves again at once
        c.channel().queue_declare("hb.cancel", durable=True)
        publish_confirmed(c, "hb.cancel", [b"%04d" % i + b"x" * 1020 for i in range(240)])  # 6 s at 40 kB/s
        assert ctl(cluster, 0, "set_policy", "hb-all", "^hb\\.",
                   '{"ha-mode":"all","ha-sync-batch-size":10}').returncode == 0
        for how in ("cli", "http"):
            wait_mirrors(cluster, "hb.cancel", 2, synced=0)
            assert ctl(cluster, 0, "sync_queue", "hb.cancel").returncode == 0
            wait_until(lambda how=how: "Synchronising: 240 messages to synchronise" in _after_cancels(cluster, how), 10,
                       f"a synchronisation started ({how})")
            if how == "cli":
                done = ctl(cluster, 1, "cancel_sync_queue", "hb.cancel")
                assert done.returncode == 0, done.stderr
            else:
                assert http(cluster, 1, "POST", "/api/queues/%2F/hb.cancel/actions", {"action": "cancel_sync"}) == 204
            wait_until(lambda how=how: "Synchronising: cancelled after" in _after_cancels(cluster, how), 10,
                       f"the synchronisation cancelled ({how})")
            assert mirrors(cluster, "hb.cancel")[2] == []
            started = time.monotonic()
            method, _p, _b = connect(cluster, 1).channel().basic_get("hb.cancel", auto_ack=False)
            assert method is not None and time.monotonic() - started < 2.0
        c.close()


def _after_cancels(cluster: HutchCluster, how: str) -> str:
    """Node 1's log of queue hb.cancel, from its first cancelled synchronisation on (how="http"),
    or all of it."""
    text = "\n".join(ln for ln in log_of(cluster, 0).splitlines() if "'hb.cancel'" in ln)
    if how == "http":
        at = text.find("Synchronising: cancelled after")
        return text[text.index("\n", at) + 1:] if at >= 0 else ""
    return text
