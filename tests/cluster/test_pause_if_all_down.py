"""cluster_partition_handling = pause_if_all_down on a 3-node `hutch lab` (peer links through
fault proxies), as RabbitMQ 3.13 defines it: a node pauses while it reaches none of the listed
nodes, whatever the size of its side, and resumes when one is reachable again; a listed node
never pauses. During the partition each node's cluster_status and /api/nodes name the nodes it
is cut off from (the HTTP API stays up on a paused node)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from hutch.lab.cluster import Lab
from tests.support.brokers import ROOT, amqp_ready, wait_until
from tests.support.lab import free_base_port

pytestmark = pytest.mark.timeout(240)
DETECT_S = 20  # net_ticktime 2 s: a cut link is noticed within a few seconds


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pause-if-all-down")
    conf = tmp / "hutch.conf"
    conf.write_text("cluster_partition_handling = pause_if_all_down\n"
                    "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch-1@localhost\n"
                    "cluster_partition_handling.pause_if_all_down.recover = autoheal\n")
    lab = Lab.up(3, tmp / "lab", base_port=free_base_port(3), net_ticktime_s=2, tied_to_caller=True,
                 node_args=["--config", str(conf)])
    try:
        yield lab
    finally:
        lab.down(wipe=True)


def get(lab: Lab, i: int, path: str):
    req = urllib.request.Request(lab.nodes[i].http_url + path)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def serving(lab: Lab, i: int) -> bool:
    return amqp_ready("127.0.0.1", lab.nodes[i].amqp_port)


def ctl(lab: Lab, i: int, tool: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-c", f"from hutch.cli.{tool} import main; main()",
                           "--url", lab.nodes[i].http_url, *args],
                          capture_output=True, text=True, env=env, timeout=60)


def name(lab: Lab, i: int) -> str:
    return lab.nodes[i].name


def test_every_node_serves_while_the_cluster_is_whole(lab):
    for i in range(3):
        assert serving(lab, i)
        assert get(lab, i, "/api/hutch/cluster")["partitions"] == {}


def test_the_majority_side_pauses_when_the_listed_node_is_cut_off_and_resumes_on_heal(lab):
    lab.partition(1)  # hutch-1, the listed node, alone: the other two reach each other but not it
    try:
        wait_until(lambda: not serving(lab, 1) and not serving(lab, 2), DETECT_S, "hutch-2 and hutch-3 pause")
        assert serving(lab, 0), "the listed node itself never pauses, even in a minority"
        # the HTTP API stays up on a paused node and says why
        st = get(lab, 1, "/api/hutch/cluster")
        assert st["partitions"].get(name(lab, 1)) == [name(lab, 0)]
        assert name(lab, 0) in st["last_seen"]
        wait_until(lambda: get(lab, 0, "/api/hutch/cluster")["partitions"].get(name(lab, 0))
                   == [name(lab, 1), name(lab, 2)], DETECT_S, "hutch-1 sees both cut off")
        nodes = {n["name"]: n for n in get(lab, 0, "/api/nodes")}
        assert nodes[name(lab, 0)]["partitions"] == [name(lab, 1), name(lab, 2)]
        out = ctl(lab, 0, "ctl", "cluster_status")
        assert out.returncode == 0, out.stderr
        section = out.stdout.split("Network Partitions", 1)[1].split("Listeners", 1)[0]
        assert f"Node {name(lab, 0)} cannot communicate with {name(lab, 1)}" in section
        diag = ctl(lab, 1, "diagnostics", "cluster_status")
        assert diag.returncode == 0, diag.stderr
        assert f"Node {name(lab, 1)} cannot communicate with {name(lab, 0)}" in diag.stdout
    finally:
        lab.heal()
    wait_until(lambda: all(serving(lab, i) for i in range(3)), 30, "every node resumes after the heal")
    wait_until(lambda: all(get(lab, i, "/api/hutch/cluster")["partitions"] == {} for i in range(3)), 30,
               "no partition reported after the heal")
    log = open(lab.nodes[1].node_log).read()
    assert "pausing node" in log and "resuming node" in log and "Autoheal" in log


def test_a_node_that_still_reaches_the_listed_node_keeps_serving(lab):
    lab.partition(3)  # hutch-3 alone: it loses hutch-1 and pauses; hutch-2 still reaches hutch-1
    try:
        wait_until(lambda: not serving(lab, 2), DETECT_S, "hutch-3 pauses")
        wait_until(lambda: get(lab, 1, "/api/hutch/cluster")["partitions"].get(name(lab, 1)) == [name(lab, 2)],
                   DETECT_S, "hutch-2 sees hutch-3 cut off")
        assert serving(lab, 0) and serving(lab, 1)
    finally:
        lab.heal()
    wait_until(lambda: serving(lab, 2), 30, "hutch-3 resumes")


def test_a_stopped_node_is_not_reported_as_a_partition(lab):
    lab.stop(3)
    try:
        wait_until(lambda: name(lab, 2) not in get(lab, 0, "/api/hutch/cluster")["running_nodes"], DETECT_S,
                   "hutch-3 seen stopped")
        assert get(lab, 0, "/api/hutch/cluster")["partitions"] == {}
        assert serving(lab, 0) and serving(lab, 1)
    finally:
        lab.start(3)
    wait_until(lambda: serving(lab, 2), 60, "hutch-3 back")
