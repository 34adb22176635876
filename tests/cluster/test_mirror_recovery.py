"""Mirrors that remember (hutch's own, `mirroring_recover_from_disk`): a mirror of a durable
queue keeps the persistent messages of its copy on its node's journal, comes back with them
after its node restarts, and is synchronised with the delta only; seed 004 §5.1 and seed 002
("sync blocks") name the full sync of a restarted mirror as the design's flaw. With the key
off, a restarted mirror starts empty and needs the whole queue, as in RabbitMQ.

Real 3-node clusters and pika; each test waits on conditions it can observe (the queue's
listing, its leader's log)."""

from __future__ import annotations

import re

import pika
import pytest

from tests.cluster.test_mirroring import (
    PERSISTENT,
    connect,
    ctl,
    info,
    log_of,
    mirrored_everywhere,
    wait_mirrors,
)
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(600)

N = 20_000
MORE = 1_000
ACKED = 500
QUEUE = "mr.q"
SYNC_LINE = re.compile(r"Mirrored queue 'mr\.q' in vhost '/': Synchronising: (\d+) messages to synchronise"
                       r"(?: \(the mirror on (\S+) recovered (\d+) from disk\))?")


def publish(conn: pika.BlockingConnection, first: int, count: int, confirmed: bool = False) -> None:
    """`confirmed`: each publish waits for its confirm, which a mirrored queue sends once every
    mirror has the message."""
    ch = conn.channel()
    if confirmed:
        ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", QUEUE, str(i).encode(), PERSISTENT)
    ch.close()


def depth(cluster: HutchCluster, via: int) -> int:
    try:
        return int(info(cluster, QUEUE, via).get("messages", -1))
    except (OSError, KeyError, ValueError):
        return -1


def wait_depth(cluster: HutchCluster, via: int, n: int) -> None:
    wait_until(lambda: depth(cluster, via) == n, 60, f"{QUEUE} holds {n} messages (saw {depth(cluster, via)})")


def ack_oldest(conn: pika.BlockingConnection, count: int) -> list[int]:
    """basic.get and ack `count` messages: the oldest ones."""
    ch = conn.channel()
    got = []
    for _ in range(count):
        method, _props, body = ch.basic_get(QUEUE, auto_ack=False)
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        got.append(int(body))
    ch.close()
    return got


def consume_all(conn: pika.BlockingConnection, expected: int) -> list[int]:
    """Consume (auto-ack) `expected` messages, then check the queue is empty."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2000)
    got: list[int] = []
    for _method, _props, body in ch.consume(QUEUE, auto_ack=True):
        got.append(int(body))
        if len(got) == expected:
            break
    ch.cancel()
    method, _props, _body = ch.basic_get(QUEUE, auto_ack=True)
    assert method is None, "the queue holds more than it should"
    ch.close()
    return got


def sync_lines(cluster: HutchCluster, i: int) -> list[tuple[int, str | None, int | None]]:
    return [(int(a), b or None, int(c) if c else None) for a, b, c in SYNC_LINE.findall(log_of(cluster, i))]


def fill_and_restart_a_mirror(cluster: HutchCluster, kill: bool) -> int:
    """A durable ha-all queue led by node 0 with N persistent messages; node 2 goes down (stop or
    kill -9), MORE are published and the ACKED oldest acknowledged meanwhile, node 2 comes back
    and its mirror is synchronised. Returns how many sync lines the leader had logged before."""
    assert ctl(cluster, 0, "set_policy", "ha-mr", "^mr\\.",
               '{"ha-mode":"all","ha-sync-mode":"automatic"}').returncode == 0
    conn = connect(cluster, 0)
    conn.channel().queue_declare(QUEUE, durable=True)
    wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
    publish(conn, 0, N)
    wait_depth(cluster, 0, N)
    wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
    if kill:
        cluster.kill(2)
    else:
        cluster.stop(2)
    wait_mirrors(cluster, QUEUE, 1, synced=1, timeout_s=120)
    publish(conn, N, MORE)
    assert ack_oldest(conn, ACKED) == list(range(ACKED))
    wait_depth(cluster, 0, N + MORE - ACKED)
    conn.close()
    before = len(sync_lines(cluster, 0))
    cluster.start(2)
    wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
    return before


def check_delta_then_promote_the_restarted_mirror(cluster: HutchCluster, before: int, killed: bool = False) -> None:
    lines = sync_lines(cluster, 0)[before:]
    recovered = [ln for ln in lines if ln[1] == cluster.names[2]]
    assert recovered, f"no delta sync logged for {cluster.names[2]}: {lines}"
    synced, _node, from_disk = recovered[-1]
    print(f"\nrestarted mirror: {from_disk} messages recovered from disk, {synced} synchronised")
    if killed:
        # kill -9 may cut off the newest part of the copy, not yet handed to the journal: the
        # leader sends that part too, and nothing more than the copy lacks
        assert from_disk <= N - ACKED and from_disk + synced == N - ACKED + MORE and synced < N
    else:
        assert synced == MORE  # the messages published while it was away, not the whole queue
        assert from_disk == N - ACKED  # the acknowledged ones were dropped
    assert all(n < N for n, node, _r in lines)  # no full sync of the queue happened
    # the restarted mirror becomes the only one, then the leader dies: it is promoted
    assert ctl(cluster, 0, "set_policy", "ha-mr", "^mr\\.",
               '{"ha-mode":"nodes","ha-params":["hutch-1@localhost","hutch-3@localhost"],'
               '"ha-sync-mode":"automatic"}').returncode == 0
    wait_until(lambda: info(cluster, QUEUE, 0).get("slave_nodes") == [cluster.names[2]], 60,
               "the mirror on node 3 only")
    wait_mirrors(cluster, QUEUE, 1, synced=1, timeout_s=120)
    cluster.kill(0)
    wait_until(lambda: info(cluster, QUEUE, 1).get("node") == cluster.names[2], 60, "the node 3 mirror promoted")
    conn = connect(cluster, 2)
    got = consume_all(conn, N + MORE - ACKED)
    conn.close()
    assert sorted(got) == list(range(ACKED, N + MORE))  # none lost, none resurrected, none twice


def test_a_gracefully_restarted_mirror_recovers_its_copy_and_is_synchronised_with_the_delta():
    with HutchCluster(n=3) as cluster:
        before = fill_and_restart_a_mirror(cluster, kill=False)
        assert "recovered 20000 messages of the mirror's copy from disk" in log_of(cluster, 2)
        check_delta_then_promote_the_restarted_mirror(cluster, before)


def test_a_mirror_killed_with_sigkill_recovers_its_copy_and_is_synchronised_with_the_delta():
    with HutchCluster(n=3) as cluster:
        before = fill_and_restart_a_mirror(cluster, kill=True)
        check_delta_then_promote_the_restarted_mirror(cluster, before, killed=True)


def test_with_mirroring_recover_from_disk_false_a_restarted_mirror_needs_a_full_sync(tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text("mirroring_recover_from_disk = false\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        before = fill_and_restart_a_mirror(cluster, kill=False)
        lines = sync_lines(cluster, 0)[before:]
        assert lines and lines[-1] == (N + MORE - ACKED, None, None), lines
        assert "copy from disk" not in log_of(cluster, 2)
        conn = connect(cluster, 1)
        assert sorted(consume_all(conn, N + MORE - ACKED)) == list(range(ACKED, N + MORE))
        conn.close()


def test_a_mirror_of_a_queue_declared_anew_while_its_node_was_down_discards_its_copy():
    with HutchCluster(n=3) as cluster:
        conn = mirrored_everywhere(cluster, QUEUE, pattern="^mr\\.", timeout_s=120)
        publish(conn, 0, 100, confirmed=True)  # node 3's mirror holds all 100 before it stops
        wait_depth(cluster, 0, 100)
        cluster.stop(2)
        wait_mirrors(cluster, QUEUE, 1, synced=1, timeout_s=120)
        ch = conn.channel()
        ch.queue_delete(QUEUE)
        ch.queue_declare(QUEUE, durable=True)
        publish(conn, 1000, 10)
        wait_depth(cluster, 0, 10)
        cluster.start(2)
        # both mirrors of the new queue, synchronised: node 2's joins the new ring (its first
        # look-up may name the leader's member of the queue deleted, which refuses it) and the
        # restarted node 3's discards its copy of the old queue
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
        wait_until(lambda: "discarding the mirror's copy of 100 messages on disk (the queue was declared anew)"
                   in log_of(cluster, 2), 30, "node 3 to log that it discards its copy of the old queue")
        # the restarted mirror is promoted: it serves the new queue's messages only
        assert ctl(cluster, 0, "set_policy", "ha-all", "^mr\\.",  # mirrored_everywhere's policy, replaced
                   '{"ha-mode":"nodes","ha-params":["hutch-1@localhost","hutch-3@localhost"]}').returncode == 0
        wait_until(lambda: info(cluster, QUEUE, 0).get("slave_nodes") == [cluster.names[2]], 60,
                   "the mirror on node 3 only")
        wait_mirrors(cluster, QUEUE, 1, synced=1, timeout_s=120)
        conn.close()
        cluster.kill(0)
        wait_until(lambda: info(cluster, QUEUE, 1).get("node") == cluster.names[2], 60, "the node 3 mirror promoted")
        conn = connect(cluster, 2)
        assert sorted(consume_all(conn, 10)) == list(range(1000, 1010))
        conn.close()


def test_sync_queue_in_the_background_sends_the_delta_while_the_queue_serves():
    """ha-sync-mode manual and ha-sync-background: the restarted mirror waits unsynchronised
    for sync_queue, which sends only what it lacks while a consumer goes on receiving."""
    with HutchCluster(n=3) as cluster:
        assert ctl(cluster, 0, "set_policy", "ha-mr", "^mr\\.",
                   '{"ha-mode":"all","ha-sync-background":true}').returncode == 0
        conn = connect(cluster, 0)
        conn.channel().queue_declare(QUEUE, durable=True)
        wait_mirrors(cluster, QUEUE, 2, timeout_s=120)
        publish(conn, 0, 5_000)
        wait_depth(cluster, 0, 5_000)
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)  # both joined before the first message
        cluster.stop(2)
        wait_mirrors(cluster, QUEUE, 1, synced=1, timeout_s=120)
        publish(conn, 5_000, 300)
        wait_depth(cluster, 0, 5_300)
        before = len(sync_lines(cluster, 0))
        cluster.start(2)
        wait_mirrors(cluster, QUEUE, 2, synced=1, timeout_s=120)  # manual: it waits for sync_queue
        assert ctl(cluster, 1, "sync_queue", QUEUE).returncode == 0
        got = ack_oldest(conn, 100)  # the queue serves while it synchronises
        assert got == list(range(100))
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
        lines = sync_lines(cluster, 0)[before:]
        assert lines and lines[-1] == (300, cluster.names[2], 5_000), lines
        assert "Synchronising: in the background, the queue goes on serving" in log_of(cluster, 0)
        conn.close()


def test_mirrors_of_a_leader_that_restarted_from_its_own_journal_discard_their_copies():
    """A full restart, the leader's node last down: the leader numbers the messages it recovers
    afresh (a new epoch), so the mirrors' copies cannot be matched and they start empty."""
    with HutchCluster(n=3) as cluster:
        conn = mirrored_everywhere(cluster, QUEUE, pattern="^mr\\.", timeout_s=120)
        publish(conn, 0, 2_000)
        wait_depth(cluster, 0, 2_000)
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
        conn.close()
        cluster.stop(2)
        cluster.stop(1)
        cluster.stop(0)
        cluster.start()
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=120)
        for i in (1, 2):
            assert "the leader does not know the epoch of the mirror's copy; discarding its 2000 messages" \
                in log_of(cluster, i)
        conn = connect(cluster, 0)
        assert sorted(consume_all(conn, 2_000)) == list(range(2_000))
        conn.close()
