"""Prometheus metrics and cluster-wide message statistics on a 3-node cluster under load.

Each node serves rabbitmq_prometheus's endpoints on its own port. The scrapes are parsed
with prometheus_client's parser and held to RabbitMQ's names, types, help texts and labels;
counters must only grow from one scrape to the next; a quorum queue's publishes are counted
(RabbitMQ counts them on the publishing channel, whatever the queue type); and every metric
name the published Grafana dashboards "RabbitMQ-Overview" and "RabbitMQ-Quorum-Queues-Raft"
query (tests/fixtures/prometheus/grafana-dashboard-metrics.txt) has a series.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.brokers import free_port, wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
QUORUM = {"x-queue-type": "quorum"}
PER_NODE = 60  # messages each node's publisher sends
QUEUES = ("prom.classic1", "prom.classic2", "prom.qq", "prom.mirrored")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus" / "grafana-dashboard-metrics.txt"

# (name, type, help) as rabbitmq_prometheus 3.10 exposes them
EXPECTED = [
    ("rabbitmq_queue_messages_ready", "gauge", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "gauge", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "gauge", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "gauge", "Consumers on a queue"),
    ("rabbitmq_connections", "gauge", "Connections currently open"),
    ("rabbitmq_channels", "gauge", "Channels currently open"),
    ("rabbitmq_queues", "gauge", "Queues available"),
    ("rabbitmq_global_messages_received", "counter", "Total number of messages received from publishers"),
    ("rabbitmq_global_messages_confirmed", "counter", "Total number of messages confirmed to publishers"),
    ("rabbitmq_global_messages_delivered", "counter", "Total number of messages delivered to consumers"),
    ("rabbitmq_global_messages_routed", "counter", "Total number of messages routed to queues or streams"),
    ("rabbitmq_global_messages_acknowledged", "counter", "Total number of messages acknowledged by consumers"),
    ("rabbitmq_process_resident_memory_bytes", "gauge", "Memory used in bytes"),
    ("rabbitmq_disk_space_available_bytes", "gauge", "Disk space available in bytes"),
    ("rabbitmq_resident_memory_limit_bytes", "gauge", "Memory high watermark in bytes"),
    ("rabbitmq_raft_term", "counter", "Current Raft term number"),
    ("rabbitmq_raft_log_commit_index", "gauge", "Raft log commit index"),
    ("rabbitmq_raft_entry_commit_latency_seconds", "gauge", "Time taken for a log entry to be committed"),
    ("rabbitmq_identity_info", "unknown", "RabbitMQ node & cluster identity info"),
    ("rabbitmq_build_info", "unknown", "RabbitMQ & Erlang/OTP version info"),
]


def scrape(port: int, path: str = "/metrics") -> dict:
    """{family name: family} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families: dict) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of the counters of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.values() if f.type == "counter" for s in f.samples}


def sample_names(families: dict) -> set[str]:
    return {s.name for f in families.values() for s in f.samples}


def dashboard_names() -> list[str]:
    return [ln.strip() for ln in FIXTURE.read_text().splitlines()
            if ln.strip() and not ln.startswith(("#", "["))]


@pytest.fixture(scope="module")
def cluster():
    c = HutchCluster(n=3, extra_args=["--collect-statistics-interval", "500"])
    for node in c.nodes:
        node.prometheus_port = free_port()
        node.extra_args += ["--prometheus-port", str(node.prometheus_port)]
    with c:
        yield c


def put_policy(cluster: HutchCluster, name: str, body: dict) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{cluster.nodes[0].mgmt_port}/api/policies/%2F/{name}",
                                 data=json.dumps(body).encode(), method="PUT")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (201, 204)


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0))


def publish_from(cluster: HutchCluster, i: int, count: int, errors: list) -> None:
    try:
        conn = connect(cluster, i)
        ch = conn.channel()
        ch.confirm_delivery()
        for n in range(count):
            ch.basic_publish("fan.prom", "", f"{i}-{n}".encode(), properties=pika.BasicProperties(delivery_mode=2))
        conn.close()
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


loaded_scrapes: list[list[dict]] = []  # every round of scrapes the load saw, in order


@pytest.fixture(scope="module")
def loaded(cluster):
    """A fanout to a classic queue on node 1, a classic queue on node 2, a quorum queue of
    three members and a queue mirrored on every node; a scrape of every node before, then
    publishers on all three nodes at once and a consumer on node 3 that reads the node-1
    queue, then a scrape after."""
    put_policy(cluster, "prom-ha", {"pattern": r"^prom\.mirrored$", "definition": {"ha-mode": "all"},
                                    "apply-to": "queues"})
    c1, c2 = connect(cluster, 0), connect(cluster, 1)
    ch1, ch2 = c1.channel(), c2.channel()
    ch1.exchange_declare("fan.prom", "fanout", durable=True)
    ch1.queue_declare("prom.classic1", durable=True)
    ch2.queue_declare("prom.classic2", durable=True)
    ch1.queue_declare("prom.qq", durable=True, arguments=QUORUM)
    ch1.queue_declare("prom.mirrored", durable=True)
    for q in QUEUES:
        ch1.queue_bind(q, "fan.prom")
    wait_until(lambda: len(cluster.api(0, "/api/queues/%2F/prom.mirrored").get("synchronised_slave_nodes") or [])
               == 2, 30, "the mirrors of prom.mirrored")
    c1.close()
    c2.close()
    before = [scrape(n.prometheus_port) for n in cluster.nodes]
    errors: list = []
    threads = [threading.Thread(target=publish_from, args=(cluster, i, PER_NODE, errors)) for i in range(3)]
    for t in threads:
        t.start()
    consumer = connect(cluster, 2)
    cch = consumer.channel()
    got = []

    def on_message(ch, method, _props, _body):
        got.append(1)
        ch.basic_ack(method.delivery_tag)
    cch.basic_consume("prom.classic1", on_message)
    deadline = time.monotonic() + 60
    during = []  # scrapes of every node while the load runs
    while len(got) < 3 * PER_NODE and time.monotonic() < deadline and not errors:
        consumer.process_data_events(time_limit=0.1)
        during.append([scrape(n.prometheus_port) for n in cluster.nodes])
    assert len(got) == 3 * PER_NODE
    for t in threads:
        t.join(60)
    assert not errors, errors
    consumer.close()
    after = [scrape(n.prometheus_port) for n in cluster.nodes]
    loaded_scrapes.extend([before, *during, after])
    return before, after


def test_names_types_and_help_are_rabbitmq_prometheus(cluster, loaded):
    _before, after = loaded
    for families in after:
        for name, mtype, help_text in EXPECTED:
            assert name in families, name
            assert (families[name].type, families[name].documentation) == (mtype, help_text), name


def test_labels_are_rabbitmq_prometheus(cluster, loaded):
    _before, after = loaded
    for node, families in zip(cluster.nodes, after, strict=True):
        [ident] = families["rabbitmq_identity_info"].samples
        assert ident.labels["rabbitmq_node"] == node.name and ident.labels["rabbitmq_cluster"]
        [received] = families["rabbitmq_global_messages_received"].samples
        assert received.labels == {"protocol": "amqp091"} and received.value == PER_NODE
        delivered = {s.labels["queue_type"]: s for s in families["rabbitmq_global_messages_delivered"].samples}
        assert set(delivered) == {"rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue"}
        assert {s.labels["protocol"] for s in delivered.values()} == {"amqp091"}
        assert families["rabbitmq_queue_messages_ready"].samples[0].labels == {}  # aggregated
    per_object = scrape(cluster.nodes[0].prometheus_port, "/metrics/per-object")
    queues = {s.labels["queue"]: s.labels for s in per_object["rabbitmq_queue_messages_ready"].samples}
    assert queues["prom.qq"] == {"vhost": "/", "queue": "prom.qq"}
    raft = {s.labels["queue"] for s in per_object["rabbitmq_raft_term"].samples}
    assert "prom.qq" in raft
    detailed = scrape(cluster.nodes[0].prometheus_port, "/metrics/detailed?family=queue_coarse_metrics&vhost=%2F")
    assert {n for n in detailed if n.startswith("rabbitmq_detailed_")} == {
        "rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
        "rabbitmq_detailed_queue_messages"}
    assert "rabbitmq_identity_info" in detailed


def test_counters_only_grow_across_scrapes(cluster, loaded):
    before, after = loaded
    rounds = [*loaded_scrapes, [scrape(n.prometheus_port) for n in cluster.nodes]]
    assert len(rounds) >= 4  # before, at least one round during the load, after, and now
    for earlier, later in itertools.pairwise(rounds):
        for e, lt in zip(earlier, later, strict=True):
            se, sl = samples(e), samples(lt)
            for key, value in se.items():
                assert sl.get(key, value) >= value, key
    received = sum(samples(a)[("rabbitmq_global_messages_received_total", (("protocol", "amqp091"),))]
                   - samples(b)[("rabbitmq_global_messages_received_total", (("protocol", "amqp091"),))]
                   for b, a in zip(before, after, strict=True))
    assert received == 3 * PER_NODE


def test_quorum_queue_publishes_are_counted_cluster_wide(cluster, loaded):
    per_object = [scrape(n.prometheus_port, "/metrics/per-object") for n in cluster.nodes]
    published = sum(s.value for fams in per_object for s in fams["rabbitmq_queue_messages_published"].samples
                    if s.labels.get("queue") == "prom.qq")
    assert published == 3 * PER_NODE
    for via in range(3):  # any node's API adds up every node's channels
        stats = cluster.api(via, "/api/queues/%2F/prom.qq")["message_stats"]
        assert stats["publish"] == 3 * PER_NODE
        x = cluster.api(via, "/api/exchanges/%2F/fan.prom")["message_stats"]
        assert (x["publish_in"], x["publish_out"]) == (3 * PER_NODE, 12 * PER_NODE)
        mirrored = cluster.api(via, "/api/queues/%2F/prom.mirrored")["message_stats"]
        assert mirrored["publish"] == 3 * PER_NODE
    remote = cluster.api(1, "/api/queues/%2F/prom.classic1")["message_stats"]
    assert (remote["deliver"], remote["ack"]) == (3 * PER_NODE, 3 * PER_NODE)


def test_overview_counts_a_message_routed_to_three_queues_once(cluster, loaded):
    overview = cluster.api(1, "/api/overview")
    assert overview["rates_mode"] == "basic"
    assert overview["message_stats"]["publish"] == 3 * PER_NODE
    assert overview["message_stats"]["confirm"] == 3 * PER_NODE


def test_rates_are_merged_across_nodes(cluster, loaded):
    path = "/api/overview?msg_rates_age=30&msg_rates_incr=1"

    def history_has_publishes() -> bool:
        samples_ = cluster.api(2, path)["message_stats"]["publish_details"]["samples"]
        return bool(samples_) and samples_[0]["sample"] == 3 * PER_NODE
    wait_until(history_has_publishes, 15, "the publishes in the merged history")


def test_every_dashboard_metric_has_a_series(cluster, loaded):
    _before, after = loaded
    names = dashboard_names()
    assert len(names) > 30 and "rabbitmq_raft_log_commit_index" in names
    for families in after:
        present = sample_names(families)
        missing = [n for n in names if n not in present]
        assert not missing, missing


def test_each_queue_is_reported_by_one_node(cluster, loaded):
    """A queue's figures come from its home node (a quorum queue's leader), so summing the
    nodes' series, as the dashboards do, counts every queue once."""
    families = [scrape(n.prometheus_port) for n in cluster.nodes]
    assert sum(f["rabbitmq_queues"].samples[0].value for f in families) == 4
    assert sum(f["rabbitmq_queues_created"].samples[0].value for f in families) == 4
    ready = sum(f["rabbitmq_queue_messages_ready"].samples[0].value for f in families)
    assert ready == 3 * 3 * PER_NODE  # prom.classic2, prom.qq, prom.mirrored; prom.classic1 was read empty
    per_object = [scrape(n.prometheus_port, "/metrics/per-object") for n in cluster.nodes]
    reported = [s.labels["queue"] for f in per_object for s in f["rabbitmq_queue_messages_ready"].samples]
    assert sorted(reported) == sorted(QUEUES)
