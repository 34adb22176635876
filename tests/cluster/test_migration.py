"""The way off mirrored classic queues (seed 000 recommends quorum queues): `hutchctl
migrate_to_quorum` turns a classic queue into a quorum queue of the same name with its
bindings and messages, cancels its consumers so they come back to the new queue, and removes
the policy keys that no longer apply; the diagnostics point to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(240)


def cli(cluster: HutchCluster, i: int, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--url", f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}",
                           *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0))


def test_migrate_to_quorum_keeps_name_bindings_and_every_message_and_cancels_consumers(cluster):
    c1 = connect(cluster, 0)
    ch = c1.channel()
    ch.exchange_declare("orders-x", "topic", durable=True)
    ch.queue_declare("orders", durable=True, arguments={"x-max-priority": 5, "x-message-ttl": 3600000})
    ch.queue_bind("orders", "orders-x", "eu.#")
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("orders-x", "eu.de", f"o{i}".encode(), pika.BasicProperties(delivery_mode=2))
    # a consumer elsewhere holding some messages unacknowledged: it is cancelled and gives them back
    c3 = connect(cluster, 2)
    cch = c3.channel()
    cch.basic_qos(prefetch_count=5)
    held, cancelled = [], []
    cch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    cch.basic_consume("orders", lambda c, m, p, b: held.append(m.delivery_tag))
    while len(held) < 5:
        c3.process_data_events(0.1)
    p = cli(cluster, 1, "hutch.cli.ctl", "--formatter", "json", "migrate_to_quorum", "orders",
            "--migration-timeout", "5")
    assert p.returncode != 0 and "still held by its consumers" in p.stderr  # 5 are held
    while not cancelled:
        c3.process_data_events(0.1)
    c3.close()  # the held messages come back to the classic queue
    p = cli(cluster, 1, "hutch.cli.ctl", "--formatter", "json", "migrate_to_quorum", "orders")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["result"] == "ok" and row["dropped_arguments"] == ["x-max-priority"]
    info = cluster.api(0, "/api/queues/%2F/orders")
    assert info["type"] == "quorum" and len(info["members"]) == 3
    assert info["arguments"] == {"x-message-ttl": 3600000, "x-queue-type": "quorum"}
    assert "orders.quorum-migration" not in {qu["name"] for qu in cluster.api(0, "/api/queues")}
    bindings = cluster.api(2, "/api/bindings/%2F/e/orders-x/q/orders")
    assert [b["routing_key"] for b in bindings] == ["eu.#"]
    # every message is there, and new ones route to the quorum queue
    ch.basic_publish("orders-x", "eu.fr", b"after", pika.BasicProperties(delivery_mode=2))
    got = []
    c2 = connect(cluster, 1)
    gch = c2.channel()
    while True:
        m, _p, body = gch.basic_get("orders", auto_ack=True)
        if m is None:
            break
        got.append(body)
    assert sorted(got) == sorted([f"o{i}".encode() for i in range(300)] + [b"after"])
    c1.close()
    c2.close()


def test_diagnostics_point_to_the_migration_and_it_removes_the_mirroring_keys(cluster):
    c = connect(cluster, 0)
    c.channel().queue_declare("ha.jobs", durable=True)
    c.close()
    p = cli(cluster, 0, "hutch.cli.ctl", "set_policy", "ha-two", "^ha\\.", '{"ha-mode":"exactly","ha-params":2,'
            '"max-length":100}')
    assert p.returncode == 0, p.stderr
    check = cli(cluster, 0, "hutch.cli.diagnostics", "check_if_cluster_has_classic_queue_mirroring_policy")
    assert check.returncode == 69 and "migrate_to_quorum" in check.stderr
    p = cli(cluster, 2, "hutch.cli.ctl", "--formatter", "json", "migrate_to_quorum", "--all-matching", "^ha\\.")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["name"] == "ha.jobs" and row["policies_changed"] == ["ha-two"]
    policy = cluster.api(1, "/api/policies/%2F/ha-two")
    assert policy["definition"] == {"max-length": 100}
    check = cli(cluster, 1, "hutch.cli.diagnostics", "check_if_cluster_has_classic_queue_mirroring_policy")
    assert check.returncode == 0, check.stderr
