"""A real 3-node hutch cluster on loopback, driven by pika: queues homed on one node are
used through the others (seed 000, "Non-mirrored Queue Behavior in a Cluster"), home node
placement (seed 004 §3.3.4 queue-master-locator), and what happens to a queue whose home
node goes down and comes back."""

from __future__ import annotations

import subprocess
import sys
import time

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port,
                                                             heartbeat=0, blocked_connection_timeout=30))


def home_of(cluster: HutchCluster, queue: str, via: int = 0) -> str:
    return cluster.queue_home(queue, i=via)


def test_queue_declared_on_one_node_is_published_through_a_second_and_consumed_through_a_third(cluster):
    c1, c2, c3 = connect(cluster, 0), connect(cluster, 1), connect(cluster, 2)
    try:
        ch1 = c1.channel()
        ch1.queue_declare("across", durable=True)
        ch1.exchange_declare("across-x", "direct", durable=True)
        ch1.queue_bind("across", "across-x", "k")
        assert home_of(cluster, "across", via=2) == cluster.names[0]
        ch2 = c2.channel()
        ch2.confirm_delivery()
        for i in range(500):
            ch2.basic_publish("across-x", "k", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2),
                              mandatory=True)
        ch3 = c3.channel()
        assert ch3.queue_declare("across", passive=True).method.message_count == 500
        ch3.basic_qos(prefetch_count=50)
        got: list[bytes] = []

        def on_message(ch, method, _props, body):
            got.append(body)
            ch.basic_ack(method.delivery_tag)
        ch3.basic_consume("across", on_message)
        deadline = time.monotonic() + 30
        while len(got) < 500 and time.monotonic() < deadline:
            c3.process_data_events(0.1)
        assert got == [f"m{i}".encode() for i in range(500)]
        wait_until(lambda: ch1.queue_declare("across", passive=True).method.message_count == 0, 10, "acks home")
        # nothing is left unacknowledged at home: the acks travelled back
        wait_until(lambda: cluster.api(0, "/api/queues/%2F/across")["messages_unacknowledged"] == 0, 10, "unacked 0")
    finally:
        for c in (c1, c2, c3):
            c.close()


def test_get_nack_and_purge_through_another_node_act_on_the_home_queue(cluster):
    c1, c2 = connect(cluster, 0), connect(cluster, 1)
    try:
        ch1 = c1.channel()
        ch1.queue_declare("remote-get", durable=False)
        for i in range(3):
            ch1.basic_publish("", "remote-get", f"g{i}".encode())
        ch2 = c2.channel()
        method, _props, body = ch2.basic_get("remote-get")
        assert body == b"g0" and not method.redelivered and method.message_count == 2
        ch2.basic_nack(method.delivery_tag, requeue=True)
        wait_until(lambda: ch1.queue_declare("remote-get", passive=True).method.message_count == 3, 10, "requeued")
        method, _props, body = ch2.basic_get("remote-get", auto_ack=True)
        assert body == b"g0" and method.redelivered
        assert ch2.queue_purge("remote-get").method.message_count == 2
        assert ch1.queue_declare("remote-get", passive=True).method.message_count == 0
        assert ch2.basic_get("remote-get") == (None, None, None)
    finally:
        c1.close()
        c2.close()


def test_unacked_deliveries_to_another_node_are_requeued_when_its_channel_closes(cluster):
    c1, c3 = connect(cluster, 0), connect(cluster, 2)
    try:
        ch1 = c1.channel()
        ch1.queue_declare("requeue-on-close")
        for i in range(10):
            ch1.basic_publish("", "requeue-on-close", f"r{i}".encode())
        ch3 = c3.channel()
        ch3.basic_qos(prefetch_count=4)
        seen = []
        ch3.basic_consume("requeue-on-close", lambda ch, m, p, b: seen.append(b))
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            c3.process_data_events(0.1)
        assert len(seen) == 4  # the prefetch limit holds across nodes
        c3.process_data_events(0.3)
        assert len(seen) == 4
        ch3.close()
        wait_until(lambda: ch1.queue_declare("requeue-on-close", passive=True).method.message_count == 10, 10,
                   "all requeued")
    finally:
        c1.close()
        c3.close()


def test_queue_master_locator_client_local_min_masters_and_random(cluster):
    conns = [connect(cluster, i) for i in range(3)]
    try:
        chans = [c.channel() for c in conns]
        # client-local (the default): the queue lives where its declaring client is connected
        for i, ch in enumerate(chans):
            ch.queue_declare(f"local-{i}")
            assert home_of(cluster, f"local-{i}", via=i) == cluster.names[i]  # the declaring node knows it
        # min-masters: the node homing the fewest queues, whatever node is asked
        homes = set()
        for i in range(6):
            counts = dict.fromkeys(cluster.names, 0)
            for q in cluster.api(0, "/api/queues"):
                counts[q["node"]] += 1
            fewest = min(counts.values())
            chans[0].queue_declare(f"mm-{i}", arguments={"x-queue-master-locator": "min-masters"})
            home = home_of(cluster, f"mm-{i}")
            assert counts[home] == fewest, (home, counts)
            homes.add(home)
        assert len(homes) >= 2
        # random: some member
        for i in range(6):
            chans[1].queue_declare(f"rnd-{i}", arguments={"x-queue-master-locator": "random"})
            assert home_of(cluster, f"rnd-{i}", via=1) in cluster.names
    finally:
        for c in conns:
            c.close()


def _declare_and_count_homes(cluster: HutchCluster, ch, names: list[str]) -> list[tuple[str, int, int]]:
    """Declare each queue through `ch`; (its home, the queues its home held before, the fewest any
    node held before) for each."""
    out = []
    for name in names:
        counts = dict.fromkeys(cluster.names, 0)
        for q in cluster.api(0, "/api/queues"):
            counts[q["node"]] += 1
        ch.queue_declare(name)
        home = home_of(cluster, name)
        out.append((home, counts[home], min(counts.values())))
    return out


def test_queue_master_locator_set_by_policy_places_the_queues_it_matches(cluster):
    """Seed 000, "Queue Leader Location": the locator comes from the queue's x-queue-master-locator
    argument, else its policy's queue-master-locator key, else the node's queue_master_locator."""
    p = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url", f"http://127.0.0.1:{cluster.nodes[0].mgmt_port}",
                        "set_policy", "loc", "^pl\\.", '{"queue-master-locator":"min-masters"}',
                        "--apply-to", "queues"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    conn = connect(cluster, 0)
    try:
        ch = conn.channel()
        placed = _declare_and_count_homes(cluster, ch, [f"pl.{i}" for i in range(6)])
        assert all(before == fewest for _home, before, fewest in placed), placed
        assert len({home for home, _b, _f in placed}) >= 2, placed  # client-local would put all on node 1
        ch.queue_declare("other.local")  # the policy does not match: client-local
        assert home_of(cluster, "other.local") == cluster.names[0]
    finally:
        conn.close()


def test_queue_master_locator_set_in_the_config_file_is_every_queues_default(tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text("queue_master_locator = min-masters\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        conn = connect(cluster, 0)
        placed = _declare_and_count_homes(cluster, conn.channel(), ["cf.0", "cf.1", "cf.2"])
        assert sorted(home for home, _b, _f in placed) == sorted(cluster.names), placed
        conn.close()


def test_exclusive_queue_lives_on_the_declaring_node_and_vanishes_with_its_connection(cluster):
    c2, c3 = connect(cluster, 1), connect(cluster, 2)
    ch2 = c2.channel()
    q = ch2.queue_declare("", exclusive=True).method.queue
    assert home_of(cluster, q, via=2) == cluster.names[1]
    ch3 = c3.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch3.queue_declare(q, passive=True)
    assert e.value.reply_code == 405
    c2.close()

    def gone() -> bool:
        ch = c3.channel()
        try:
            ch.queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as err:
            return err.reply_code == 404
        return False
    wait_until(gone, 10, "exclusive queue deleted on every node")
    c3.close()


def test_home_node_down_durable_queue_404_non_durable_deleted_and_durable_back_after_restart():
    with HutchCluster(n=3) as cluster:
        c1 = connect(cluster, 0)
        ch1 = c1.channel()
        ch1.queue_declare("dur", durable=True)
        ch1.queue_declare("tra", durable=False)
        ch1.confirm_delivery()
        for i in range(20):
            ch1.basic_publish("", "dur", f"d{i}".encode(), pika.BasicProperties(delivery_mode=2))
        c1.close()
        cluster.kill(0)
        c2 = connect(cluster, 1)

        def declare_error(name: str) -> tuple[int, str] | None:
            ch = c2.channel()
            try:
                ch.queue_declare(name, durable=name == "dur", passive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code, e.reply_text
            return None
        wait_until(lambda: "tra" not in {q["name"] for q in cluster.api(1, "/api/queues")}, 30,
                   "non-durable queue deleted from the catalogue")
        assert declare_error("tra") == (404, "NOT_FOUND - no queue 'tra' in vhost '/'")
        assert declare_error("dur") == (404, f"NOT_FOUND - home node '{cluster.names[0]}' of durable queue 'dur' "
                                             "in vhost '/' is down or inaccessible")
        # publishing to it with confirms: nacked, not silently confirmed
        ch = c2.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "dur", b"lost?", pika.BasicProperties(delivery_mode=2))
        c2.close()
        cluster.start_node(0)
        c3 = connect(cluster, 2)
        ch3 = c3.channel()
        assert ch3.queue_declare("dur", durable=True, passive=True).method.message_count == 20
        bodies = []
        for _ in range(20):
            _m, _p, body = ch3.basic_get("dur", auto_ack=True)
            bodies.append(body)
        assert bodies == [f"d{i}".encode() for i in range(20)]
        c3.close()


def test_a_node_with_the_wrong_cluster_secret_is_refused_and_logged(cluster, tmp_path):
    from tests.support.brokers import HutchNode, free_port
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-the-secret\n")
    first = cluster.nodes[0]
    intruder_port = free_port()
    members = f"{first.name}:{first.peer_port},intruder@localhost:{intruder_port}"
    node = HutchNode(name="intruder@localhost", data_dir=tmp_path / "intruder",
                     extra_args=["--peer-port", str(intruder_port), "--cluster-nodes", members,
                                 "--cluster-secret-file", str(wrong), "--net-ticktime", "2"])
    node.start(wait=False)
    try:
        log_file = first.data_dir / "log" / f"{first.name}.log"
        wait_until(lambda: "Connection attempt from node intruder@localhost rejected: invalid challenge reply"
                   in log_file.read_text(), 30, "refusal logged")
        status = cluster.cluster_status(0)
        assert "intruder@localhost" not in status["running_nodes"]
        assert "intruder@localhost" not in status["members"]
    finally:
        node.kill()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
