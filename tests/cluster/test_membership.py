"""Cluster membership through hutchctl, as rabbitmqctl does it: stop_app, join_cluster,
start_app, cluster_status, forget_cluster_node, and what a stopped node means for the
others."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from tests.support.brokers import HutchNode, free_port, wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(240)
HUTCHCTL = [sys.executable, "-m", "hutch.cli.ctl"]


def ctl(node, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*HUTCHCTL, "--url", f"http://127.0.0.1:{node.mgmt_port}", *args], capture_output=True,
                       text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"hutchctl {' '.join(args)} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p


def status(node) -> dict:
    return json.loads(ctl(node, "--formatter", "json", "cluster_status").stdout)


def running(node) -> set[str]:
    """running_nodes as `node` sees it; empty while it has no catalogue yet (its users come
    with the catalogue, so a node that just started or joined refuses logins for a moment)."""
    p = ctl(node, "--formatter", "json", "cluster_status", check=False)
    return set(json.loads(p.stdout)["running_nodes"]) if p.returncode == 0 else set()


def test_a_standalone_node_joins_with_stop_app_join_cluster_start_app_and_is_forgotten(tmp_path):
    with HutchCluster(n=3) as cluster:
        first = cluster.nodes[0]
        peer_port = free_port()
        newcomer = HutchNode(name="hutch-4@localhost", data_dir=tmp_path / "hutch-4",
                             extra_args=["--peer-port", str(peer_port), "--cluster-secret-file",
                                         str(cluster.secret_file), "--net-ticktime", "4"])
        newcomer.start()
        try:
            # a standalone node first: a queue there is lost by the join (join_cluster resets)
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", newcomer.amqp_port))
            c.channel().queue_declare("before-join", durable=True)
            c.close()
            refused = ctl(newcomer, "join_cluster", first.name, "--address", f"127.0.0.1:{first.peer_port}",
                          check=False)
            assert refused.returncode != 0 and "stop it first" in refused.stderr
            ctl(newcomer, "stop_app")
            ctl(newcomer, "join_cluster", first.name, "--address", f"127.0.0.1:{first.peer_port}")
            ctl(newcomer, "start_app")
            everyone = {*cluster.names, "hutch-4@localhost"}
            wait_until(lambda: running(newcomer) == everyone, 30, "joined")
            st = status(cluster.nodes[1])
            assert set(st["disk_nodes"]) == everyone and st["leader"] in everyone
            # it has the cluster's catalogue, and not what it had before
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", newcomer.amqp_port))
            ch = c.channel()
            ch.queue_declare("on-4", durable=True)
            # a quorum queue and a stream led there, each with two more members, holding messages
            ch.queue_declare("quorum-on-4", durable=True, arguments={"x-queue-type": "quorum",
                                                                     "x-quorum-initial-group-size": 3})
            ch.queue_declare("stream-on-4", durable=True, arguments={"x-queue-type": "stream",
                                                                     "x-initial-cluster-size": 3})
            ch.confirm_delivery()
            for i in range(20):
                for q in ("quorum-on-4", "stream-on-4"):
                    ch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                c.channel().queue_declare("before-join", passive=True)
            c.close()
            assert cluster.queue_home("on-4", i=2) == "hutch-4@localhost"
            assert cluster.queue_home("quorum-on-4", i=2) == "hutch-4@localhost"
            # forgetting a running node is refused
            p = ctl(first, "forget_cluster_node", "hutch-4@localhost", check=False)
            assert p.returncode == 69 and "is running" in p.stderr
            ctl(newcomer, "stop_app")
            wait_until(lambda: "hutch-4@localhost" not in status(first)["running_nodes"], 30, "seen down")
            ctl(first, "forget_cluster_node", "hutch-4@localhost")
            st = status(cluster.nodes[2])
            assert set(st["disk_nodes"]) == set(cluster.names)
            # its classic queue went with it; the quorum queue and the stream it led lost it as a
            # member and kept their messages on the others, as RabbitMQ's forget_cluster_node does
            queues = {q["name"]: q for q in cluster.api(1, "/api/queues")}
            assert "on-4" not in queues
            for name in ("quorum-on-4", "stream-on-4"):
                wait_until(lambda name=name: len(cluster.api(1, f"/api/queues/%2F/{name}")["members"]) == 2, 30,
                           f"{name} shrunk")
                assert "hutch-4@localhost" not in cluster.api(1, f"/api/queues/%2F/{name}")["members"]
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[1].amqp_port))
            ch = c.channel()
            ch.basic_qos(prefetch_count=100)
            for q, args in (("quorum-on-4", None), ("stream-on-4", {"x-stream-offset": "first"})):
                got = []
                ch.basic_consume(q, lambda ch, m, _p, body, got=got: (got.append(body.decode()),
                                                                       ch.basic_ack(m.delivery_tag)),
                                 arguments=args)
                wait_until(lambda got=got: (c.process_data_events(0.1), len(got) >= 20)[1], 30, f"{q} consumed")
                assert got == [f"m{i}" for i in range(20)]
            c.close()
        finally:
            newcomer.kill()


def test_stop_app_takes_a_member_out_of_running_nodes_and_start_app_brings_it_back():
    with HutchCluster(n=3) as cluster:
        third = cluster.nodes[2]
        ctl(third, "stop_app")
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", third.amqp_port,
                                                              connection_attempts=1))
        wait_until(lambda: third.name not in status(cluster.nodes[0])["running_nodes"], 30, "down")
        assert third.name in status(cluster.nodes[0])["disk_nodes"]
        ctl(third, "start_app")
        cluster.wait_healthy()
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", third.amqp_port))
        c.channel().queue_declare("after-start-app")
        c.close()
        assert cluster.queue_home("after-start-app") == third.name
