"""A partial partition on a 3-node `hutch lab` under `cluster_partition_handling = pause_minority`:
only the link between hutch-1 and hutch-2 is cut (`hutch lab cut`), and each still reaches
hutch-3. By the count alone both see a majority; as RabbitMQ's node monitor does, each asks
hutch-3 whether it still reaches the node it lost, hutch-3 pings that node, and on its answer the
asking node pauses until the entire cluster is back (docs/operations.md, "Partial
partitions"). A mirrored queue led on hutch-1 with a mirror on hutch-2 so never has a leader on
each side of the cut: the mirror on hutch-2 is never promoted (not while its node waits for
hutch-3's answer, nor while paused); the queue stays on hutch-1 or moves to hutch-3, whichever
its ring decides; after the heal every node serves again and every confirmed message is there
once."""

from __future__ import annotations

from pathlib import Path

import pika
import pika.exceptions
import pytest

from hutch.lab.cluster import Lab
from tests.support.brokers import wait_until
from tests.support.lab import api, free_base_port

pytestmark = pytest.mark.timeout(240)
MESSAGES = 50


def _log(lab: Lab, i: int) -> str:
    path = Path(lab.nodes[i].node_log)
    return path.read_text(errors="replace") if path.exists() else ""


def _leaders(lab: Lab) -> set[str]:
    return {api(lab, i, "/api/queues/%2F/pp.q")["node"] for i in range(3)}


def _serves(lab: Lab, i: int) -> bool:
    try:
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[i].amqp_port, heartbeat=0,
                                                          connection_attempts=1, socket_timeout=2)).close()
        return True
    except pika.exceptions.AMQPError:
        return False


def test_pause_minority_pauses_both_ends_of_a_cut_link_until_the_whole_cluster_is_back(tmp_path):
    lab = Lab.up(3, tmp_path / "lab", base_port=free_base_port(3), net_ticktime_s=2, metadata_timeout_ms=3000,
                 tied_to_caller=True, node_args=["--cluster-partition-handling", "pause_minority"])
    try:
        one, two, three = (n.name for n in lab.nodes)
        api(lab, 0, "/api/policies/%2F/pp", method="PUT",
            body={"pattern": "^pp\\.", "apply-to": "queues", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}})
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[0].amqp_port, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("pp.q", durable=True)
        wait_until(lambda: len(api(lab, 0, "/api/queues/%2F/pp.q").get("synchronised_slave_nodes") or []) == 2,
                   30, "two synchronised mirrors")
        ch.confirm_delivery()
        for i in range(MESSAGES):
            ch.basic_publish("", "pp.q", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()

        rec = lab.cut(1, 2, mode="reset")
        assert sorted(map(tuple, rec["links"])) == sorted([(one, two), (two, one)])
        for i, lost in ((0, two), (1, one)):
            wait_until(lambda i=i: "Partial partition detected" in _log(lab, i), 30, f"node {i + 1} detecting it")
            text = _log(lab, i)
            assert f"We saw DOWN from {lost}" in text and f"We can still see {three} which can see {lost}" in text
            assert "a partial partition, 2 of 3 nodes reachable): pausing node" in text
            wait_until(lambda i=i: not _serves(lab, i), 30, f"node {i + 1} refusing clients")
        assert "Partial partition detected" not in _log(lab, 2), "the node in the middle lost nobody"
        assert _serves(lab, 2)

        lab.heal()
        for i in (0, 1):
            wait_until(lambda i=i: "Partial partition over: every node is reachable again" in _log(lab, i), 60,
                       f"node {i + 1} seeing the whole cluster")
            wait_until(lambda i=i: _serves(lab, i), 60, f"node {i + 1} serving again")
        # both ends paused: the mirror on hutch-2, cut off from its leader, was never promoted
        # beside it; the queue is led where the nodes agree it is, on hutch-1 or hutch-3
        assert "Promoting" not in _log(lab, 1)
        wait_until(lambda: len(_leaders(lab)) == 1, 30, "every node naming the same leader")
        (leader,) = _leaders(lab)
        assert leader in (one, three)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[2].amqp_port, heartbeat=0))
        drain = conn.channel()
        got = []
        while (m := drain.basic_get("pp.q", auto_ack=True))[0] is not None:
            got.append(int(m[2]))
        conn.close()
        assert sorted(got) == list(range(MESSAGES))
    finally:
        lab.down(wipe=True)
