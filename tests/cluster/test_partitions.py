"""The catalogue across a network partition, on a `hutch lab` whose peer links pass through
fault proxies: the minority side cannot change the catalogue (a declare fails after the
metadata timeout with a clear error, never diverges), the majority side carries on, and after
healing every node has the majority's catalogue."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from hutch.lab.cluster import Lab
from tests.support.brokers import wait_until
from tests.support.lab import free_base_port

pytestmark = pytest.mark.timeout(240)
METADATA_TIMEOUT_MS = 3000


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab.up(3, tmp_path_factory.mktemp("lab") / "lab", base_port=free_base_port(3), net_ticktime_s=2,
                 metadata_timeout_ms=METADATA_TIMEOUT_MS, tied_to_caller=True)
    try:
        yield lab
    finally:
        lab.down(wipe=True)


def connect(lab: Lab, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[i].amqp_port, heartbeat=0))


def queue_names(lab: Lab, i: int) -> set[str]:
    import base64
    import json
    import urllib.request
    req = urllib.request.Request(lab.nodes[i].http_url + "/api/queues")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as r:
        return {q["name"] for q in json.loads(r.read())}


def test_minority_cannot_declare_majority_can_and_healing_converges(lab):
    minority = connect(lab, 2)
    lab.partition(3)  # hutch-3 alone
    try:
        ch = minority.channel()
        started = time.monotonic()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            ch.queue_declare("declared-on-the-minority", durable=True)
        waited = time.monotonic() - started
        assert e.value.reply_code == 541
        assert "timed out" in e.value.reply_text and "metadata store" in e.value.reply_text
        assert waited >= METADATA_TIMEOUT_MS / 1000 - 0.5
        majority = connect(lab, 0)
        majority.channel().queue_declare("declared-on-the-majority", durable=True)
        majority.close()
        assert "declared-on-the-majority" in queue_names(lab, 1)
        assert "declared-on-the-majority" not in queue_names(lab, 2)
    finally:
        lab.heal()
    wait_until(lambda: "declared-on-the-majority" in queue_names(lab, 2), 30, "minority catches up")
    for i in range(3):
        names = queue_names(lab, i)
        assert "declared-on-the-minority" not in names
    # the healed node can change the catalogue again
    c = connect(lab, 2)
    c.channel().queue_declare("after-heal")
    c.close()
    wait_until(lambda: all("after-heal" in queue_names(lab, i) for i in range(3)), 10, "everywhere")
