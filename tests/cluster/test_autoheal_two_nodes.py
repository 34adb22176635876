"""Seed 004's loss case, on a 2-node `hutch lab` under `cluster_partition_handling = autoheal`.

A mirrored queue's leader on node A holds every message; its mirror on node B has not been
synchronised (ha-sync-mode manual) and may be promoted on failure (ha-promote-on-failure
always, RabbitMQ's default). A partition cuts A from B. RabbitMQ promotes B's mirror; after the
heal autoheal restarts the losing side, and if B's side wins, what only A had is lost. In hutch a
promotion is a change to the catalogue, which a 2-node cluster cannot commit without both nodes:
B's mirror is not promoted while the partition lasts, nothing is restarted after it, and every
message is still there."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from hutch.lab.cluster import Lab
from tests.support.brokers import wait_until
from tests.support.lab import api, free_base_port

pytestmark = pytest.mark.timeout(240)
MESSAGES = 100


def _log(lab: Lab, i: int) -> str:
    path = Path(lab.nodes[i].node_log)
    return path.read_text(errors="replace") if path.exists() else ""


def _connect(lab: Lab, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[i].amqp_port, heartbeat=0))


def test_an_unsynchronised_mirror_is_not_promoted_across_a_partition_and_nothing_is_lost(tmp_path):
    lab = Lab.up(2, tmp_path / "lab", base_port=free_base_port(2), net_ticktime_s=2, metadata_timeout_ms=3000,
                 tied_to_caller=True, node_args=["--cluster-partition-handling", "autoheal"])
    try:
        a, b = lab.nodes[0].name, lab.nodes[1].name
        conn = _connect(lab, 0)
        ch = conn.channel()
        ch.queue_declare("ah.q", durable=True)
        ch.confirm_delivery()
        for i in range(MESSAGES):
            ch.basic_publish("", "ah.q", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
        api(lab, 0, "/api/policies/%2F/ah", method="PUT", body={"pattern": "^ah\\.", "apply-to": "queues",
                                                                "definition": {"ha-mode": "all"}})

        def view() -> dict:
            return api(lab, 0, "/api/queues/%2F/ah.q")
        wait_until(lambda: view().get("slave_nodes") == [b], 30, f"a mirror on {b}")
        assert view()["node"] == a and not view().get("synchronised_slave_nodes")

        lab.partition(1)
        wait_until(lambda: f"node {a} down" in _log(lab, 1), 30, f"{b} sees {a} down")
        wait_until(lambda: f"node {b} down" in _log(lab, 0), 30, f"{a} sees {b} down")
        # the mirror's promotion cannot commit: for as long as the partition lasts (3 s more
        # here), B names A as the queue's leader
        held_until = time.monotonic() + 3.0
        while time.monotonic() < held_until:
            assert api(lab, 1, "/api/queues/%2F/ah.q")["node"] == a
            time.sleep(0.2)
        lab.heal()
        wait_until(lambda: all(p is None for p in lab.health().values()), 60, "the lab healthy again")
        assert "Autoheal:" in _log(lab, 0) + _log(lab, 1)
        assert "Promoting" not in _log(lab, 1)
        assert view()["node"] == a

        conn = _connect(lab, 1)
        got = []
        drain = conn.channel()
        while (m := drain.basic_get("ah.q", auto_ack=True))[0] is not None:
            got.append(int(m[2]))
        conn.close()
        assert sorted(got) == list(range(MESSAGES))
    finally:
        lab.down(wipe=True)
