"""Health checks that tell the truth, JSON errors, and the CLIs' exit codes, on real nodes.

A node whose app was stopped with `hutchctl stop_app` refuses AMQP connections; every health
check (HTTP and hutch-diagnostics) must say so, writes must answer 503 with a reason, and all
of it must pass again after `start_app`. The CLIs run as console scripts in subprocesses and
their exit codes are compared with rabbitmqctl's (64 usage, 65 no such vhost, 67 no such
user, 69 unavailable, 70 internal error, 75 timeout).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.support.brokers import HutchNode, free_port

BIN = Path(sys.executable).parent
NODE = "hutch@localhost"
CHECKS = ("alarms", "local-alarms", "virtual-hosts", "node-is-quorum-critical", "protocol-listener/amqp")


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


def run(node, tool: str, *args: str, url: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=url or node.mgmt_url)
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=env, timeout=timeout)


def diag(node, *args: str, **kw) -> subprocess.CompletedProcess:
    return run(node, "hutch-diagnostics", *args, **kw)


def ctl(node, *args: str, **kw) -> subprocess.CompletedProcess:
    return run(node, "hutchctl", *args, **kw)


def http(node, method: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, object]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(node.mgmt_url + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read()
            return resp.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as e:
        text = e.read()
        assert e.headers.get("Content-Type", "").startswith("application/json"), (e.code, text)
        return e.code, json.loads(text)


def amqp_connects(node) -> bool:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(node.url + "?connection_attempts=1&socket_timeout=5"))
    except pika.exceptions.AMQPConnectionError:
        return False
    conn.close()
    return True


def health_passes(node) -> None:
    for check in (*CHECKS, f"port-listener/{node.amqp_port}"):
        status, doc = http(node, "GET", f"/api/health/checks/{check}")
        assert (status, doc["status"]) == (200, "ok"), (check, doc)
    for cmd in (["check_running"], ["check_alarms"], ["check_local_alarms"], ["check_virtual_hosts"],
                ["check_if_node_is_quorum_critical"], ["check_port_listener", str(node.amqp_port)],
                ["check_protocol_listener", "amqp"]):
        r = diag(node, *cmd)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    nodes = http(node, "GET", "/api/nodes")[1]
    assert [(n["name"], n["running"]) for n in nodes] == [(NODE, True)]
    assert http(node, "GET", "/api/hutch/cluster")[1]["running_nodes"] == [NODE]
    assert amqp_connects(node)


def test_a_stopped_app_fails_every_health_check_and_passes_again_after_start_app(node):
    health_passes(node)
    r = ctl(node, "stop_app")
    assert r.returncode == 0, r.stderr
    try:
        assert not amqp_connects(node)
        for check in (*CHECKS, f"port-listener/{node.amqp_port}"):
            status, doc = http(node, "GET", f"/api/health/checks/{check}")
            assert status == 503 and doc["status"] == "failed" and doc["reason"], (check, doc)
        assert http(node, "GET", "/api/health/checks/protocol-listener/amqp")[1]["protocols"] == ["http"]
        assert http(node, "GET", f"/api/health/checks/port-listener/{node.amqp_port}")[1]["ports"] == [node.mgmt_port]
        assert http(node, "GET", "/api/health/checks/virtual-hosts")[1]["virtual-hosts"] == ["/"]
        assert http(node, "GET", "/api/healthchecks/node")[1]["status"] == "failed"
        assert [(n["name"], n["running"]) for n in http(node, "GET", "/api/nodes")[1]] == [(NODE, False)]
        assert http(node, "GET", f"/api/nodes/{NODE}")[1]["running"] is False
        assert http(node, "GET", "/api/hutch/cluster")[1]["running_nodes"] == []
        assert [ln["protocol"] for ln in http(node, "GET", "/api/overview")[1]["listeners"]] == ["http"]

        r = diag(node, "check_running")
        assert r.returncode == 69 and f"hutch on node {NODE} is not running" in r.stderr
        for cmd, says in ((["check_alarms"], "start_app"), (["check_local_alarms"], "start_app"),
                          (["check_virtual_hosts"], "Some virtual hosts are down"),
                          (["check_if_node_is_quorum_critical"], "start_app"),
                          (["check_port_listener", str(node.amqp_port)], f"No listener for port {node.amqp_port}"),
                          (["check_protocol_listener", "amqp"], "No listener for protocol amqp")):
            r = diag(node, *cmd)
            assert r.returncode == 69 and says in r.stderr, (cmd, r.stdout, r.stderr)
        r = diag(node, "ping")
        assert r.returncode == 0 and "Ping succeeded" in r.stdout  # the process is up; only its app is not
        assert "Running Nodes\n\n\n" in ctl(node, "cluster_status").stdout
    finally:
        r = ctl(node, "start_app")
        assert r.returncode == 0, r.stderr
    health_passes(node)


def test_writes_while_the_app_is_stopped_answer_503_with_a_reason(node):
    assert ctl(node, "stop_app").returncode == 0
    try:
        for method, path, body in (("PUT", "/api/vhosts/while-stopped", {}),
                                   ("PUT", "/api/queues/%2F/while-stopped", {"durable": True}),
                                   ("DELETE", "/api/queues/%2F/while-stopped", None),
                                   ("POST", "/api/exchanges/%2F/amq.default/publish",
                                    {"routing_key": "x", "payload": "p", "payload_encoding": "string",
                                     "properties": {}}),
                                   ("PUT", "/api/policies/%2F/while-stopped", {"pattern": ".", "definition": {}})):
            status, doc = http(node, method, path, body)
            assert status == 503, (method, path, doc)
            assert doc["error"] == "service_unavailable" and "start_app" in doc["reason"], doc
        status, doc = http(node, "GET", "/api/aliveness-test/%2F")
        assert status == 503 and doc["status"] == "failed"
        r = ctl(node, "add_vhost", "while-stopped")
        assert r.returncode == 69 and f"hutch is not running on node {NODE}" in r.stderr
    finally:
        assert ctl(node, "start_app").returncode == 0
    assert http(node, "GET", "/api/vhosts/while-stopped")[0] == 404  # nothing was half done
    assert http(node, "GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})


def test_await_startup_returns_once_start_app_has_run(node):
    assert ctl(node, "stop_app").returncode == 0
    waiting = None
    try:
        r = diag(node, "await_startup", "--timeout", "1")
        assert r.returncode == 75 and "did not start within 1 seconds" in r.stderr
        env = dict(os.environ, HUTCH_URL=node.mgmt_url)
        waiting = subprocess.Popen([str(BIN / "hutchctl"), "await_startup", "--timeout", "60"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        assert ctl(node, "start_app").returncode == 0
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and f"Node {NODE} has started up" in out, err
    r = diag(node, "await_startup", "-t", "1", url=f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 69 and "unable to perform an operation" in r.stderr  # nothing ever answered


def test_an_internal_error_answers_json_500_and_logs_its_traceback_once(node):
    log_file = node.data_dir / "log" / f"{NODE}.log"
    before = log_file.read_text().count("Traceback")
    nested = b'{"vhosts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # deeper than the JSON decoder recurses
    status, doc = http(node, "POST", "/api/definitions", raw=nested)
    assert status == 500 and doc["error"] == "internal_server_error" and "RecursionError" in doc["reason"]
    assert log_file.read_text().count("Traceback") == before + 1
    assert "POST /api/definitions failed" in log_file.read_text()
    path = node.data_dir / "nested.json"
    path.write_bytes(nested)
    r = ctl(node, "import_definitions", str(path))  # the CLI's own JSON decoder gives up the same way
    assert r.returncode == 70 and "RecursionError" in r.stderr and "Traceback" not in r.stderr
    assert http(node, "GET", "/api/overview")[0] == 200  # the node serves on


def test_http_errors_from_aiohttp_itself_are_json(node):
    status, doc = http(node, "GET", "/api/no-such-route")
    assert status == 404 and doc["reason"]
    status, doc = http(node, "PATCH", "/api/vhosts/%2F")
    assert status == 405 and doc["error"] == "method_not_allowed"


@pytest.mark.parametrize("args", [("list_queues", "--bogus"), ("no_such_command",), ("set_permissions",),
                                  ("list_queues", "name", "bogus")])
def test_usage_errors_exit_64(node, args):
    r = ctl(node, *args)
    assert r.returncode == 64, (r.stdout, r.stderr)


def test_diagnostics_and_queues_usage_errors_exit_64(node):
    assert diag(node).returncode == 64  # no command: the usage, as rabbitmq-diagnostics prints it
    assert any(ln.split()[:1] == ["check_port_listener"] for ln in ok(diag(node, "help")))
    assert ok(diag(node, "help", "log_tail"))[0] == "Usage: hutch-diagnostics log_tail [OPTIONS]"
    assert diag(node, "help", "no_such_command").returncode == 64
    assert diag(node, "check_port_listener", "notaport").returncode == 64
    assert diag(node, "log_tail", "-N", "0").returncode == 64
    assert run(node, "hutch-queues", "quorum_status").returncode == 64


def test_a_missing_vhost_exits_65_and_is_named(node):
    r = ctl(node, "list_queues", "-p", "nosuch")
    assert r.returncode == 65 and "Virtual host 'nosuch' does not exist" in r.stderr
    r = ctl(node, "set_permissions", "-p", "nosuch", "guest", ".*", ".*", ".*")
    assert r.returncode == 65 and "Virtual host 'nosuch' does not exist" in r.stderr
    r = ctl(node, "delete_vhost", "nosuch")
    assert r.returncode == 65 and "Virtual host 'nosuch' does not exist" in r.stderr


def test_a_missing_user_exits_67(node):
    user = f"nobody-{uuid.uuid4().hex[:6]}"
    for args in (("change_password", user, "pw"), ("delete_user", user), ("set_user_tags", user, "management"),
                 ("set_permissions", user, ".*", ".*", ".*")):
        r = ctl(node, *args)
        assert r.returncode == 67 and f'User "{user}" does not exist' in r.stderr, (args, r.stderr)


def test_an_unreachable_node_exits_69_and_a_hung_one_75(node):
    r = ctl(node, "list_vhosts", url=f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 69 and "unable to perform an operation" in r.stderr
    os.kill(node.proc.pid, signal.SIGSTOP)  # the node's process hangs: it accepts, never answers
    try:
        r = ctl(node, "--timeout", "1", "list_vhosts")
        assert r.returncode == 75 and "operation list_vhosts on node" in r.stderr
        assert "timed out. Timeout value used: 1000" in r.stderr
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    assert ctl(node, "list_vhosts").returncode == 0


def test_the_timeout_banner_shows_the_timeout_given(node):
    assert ctl(node, "list_queues").stdout.splitlines()[0] == "Timeout: 60.0 seconds ..."
    assert ctl(node, "-t", "7", "list_queues").stdout.splitlines()[0] == "Timeout: 7.0 seconds ..."
    assert ctl(node, "list_queues", "--timeout", "12.5").stdout.splitlines()[0] == "Timeout: 12.5 seconds ..."


def ok(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode == 0, (r.args, r.stdout, r.stderr)
    return r.stdout.splitlines()


def test_each_diagnostics_command_prints_what_rabbitmq_diagnostics_prints(node):
    assert ok(diag(node, "ping"))[-1] == "Ping succeeded"
    assert ok(diag(node, "check_running"))[-1] == f"hutch on node {NODE} is fully booted and running"
    assert ok(diag(node, "alarms")) == [f"Asking node {NODE} to report any known resource alarms ...",
                                         f"Node {NODE} reported no alarms, local or clusterwide"]
    assert ok(diag(node, "check_alarms"))[-1] == f"Node {NODE} reported no alarms, local or clusterwide"
    assert ok(diag(node, "check_local_alarms"))[-1] == f"Node {NODE} reported no local alarms"
    assert ok(diag(node, "check_virtual_hosts"))[-1] == f"Node {NODE} reported all vhosts as running"
    assert ok(diag(node, "check_port_listener", str(node.amqp_port)))[-1] == \
        f"A listener for port {node.amqp_port} is running on node {NODE}."
    assert ok(diag(node, "check_protocol_listener", "amqp"))[-1] == \
        f"A listener for protocol amqp is running on node {NODE}."
    unused = free_port()
    r = diag(node, "check_port_listener", str(unused))
    assert r.returncode == 69 and f"No listener for port {unused} is active on node {NODE}" in r.stderr
    assert f"{node.amqp_port}, {node.stream_port}, {node.mgmt_port}" in r.stderr
    r = diag(node, "check_protocol_listener", "stomp")
    assert r.returncode == 69 and "Found listeners for the following protocols: amqp, stream, http" in r.stderr

    assert ok(diag(node, "listeners")) == [
        f"Asking node {NODE} to report its protocol listeners ...",
        f"Interface: 0.0.0.0, port: {node.amqp_port}, protocol: amqp, purpose: AMQP 0-9-1",
        f"Interface: 0.0.0.0, port: {node.stream_port}, protocol: stream, purpose: stream protocol",
        f"Interface: 0.0.0.0, port: {node.mgmt_port}, protocol: http, purpose: HTTP API"]
    listed = json.loads(diag(node, "listeners", "--formatter", "json").stdout)
    assert [(ln["port"], ln["protocol"]) for ln in listed] == [(node.amqp_port, "amqp"), (node.stream_port, "stream"),
                                                               (node.mgmt_port, "http")]

    lines = ok(diag(node, "memory_breakdown", "--unit", "mb"))
    assert lines[0] == f"Reporting memory breakdown on node {NODE}..."
    assert {ln.split(":")[0] for ln in lines[1:-1]} == {"runtime_at_startup", "queue_messages", "other"}
    assert lines[-1].startswith("total (resident set size): ") and lines[-1].endswith(" mb")
    mem = json.loads(diag(node, "memory_breakdown", "--formatter", "json").stdout)
    assert sum(mem["breakdown"].values()) <= mem["total"]["rss"]

    env = ok(diag(node, "environment"))
    assert env[0] == f"Application environment of node {NODE} ..."
    assert f'node_name = "{NODE}"' in env and f"amqp_port = {node.amqp_port}" in env
    assert 'default_pass = "********"' in env  # the default user's password is not shown

    assert ok(diag(node, "status"))[0] == f"Status of node {NODE} ..."
    tail = ok(diag(node, "log_tail", "-N", "5"))
    assert tail[0] == f"Last 5 log lines on node {NODE} ..."
    logged = (node.data_dir / "log" / f"{NODE}.log").read_text().splitlines()
    at = len(logged) - 5
    while at >= 0 and logged[at:at + 5] != tail[1:]:  # the node may have logged more since
        at -= 1
    assert at >= 0, (tail, logged[-10:])
    assert len(json.loads(diag(node, "log_tail", "--number", "2", "--formatter", "json").stdout)) == 2

    out = ok(diag(node, "cluster_status"))
    assert out[0] == f"Cluster status of node {NODE} ..." and "Running Nodes" in out
    assert out[out.index("Running Nodes") + 2] == NODE
    assert ok(diag(node, "check_if_node_is_quorum_critical"))[-1] == \
        f"Node {NODE} reported no queues for which it is critical"
    assert ok(run(node, "hutch-queues", "check_if_node_is_quorum_critical"))[-1] == \
        f"Node {NODE} reported no queues for which it is critical"
    assert ok(diag(node, "await_startup"))[-1] == f"Node {NODE} has started up"


def test_a_resource_alarm_fails_the_alarm_checks_but_not_check_running(tmp_path):
    with HutchNode(data_dir=tmp_path, extra_args=["--disk-free-limit", str(10 ** 18)]) as n:
        r = diag(n, "check_alarms")
        assert r.returncode == 69 and "There are alarms in effect in the cluster" in r.stderr
        assert f"Free disk space alarm on node {NODE}" in r.stderr
        r = diag(n, "check_local_alarms")
        assert r.returncode == 69 and "There are alarms in effect on the node" in r.stderr
        assert ok(diag(n, "alarms"))[-1] == f"Free disk space alarm on node {NODE}"
        status, doc = http(n, "GET", "/api/health/checks/alarms")
        assert status == 503 and doc["alarms"] == [{"node": NODE, "resource": "disk"}]
        assert diag(n, "check_running").returncode == 0


def test_hutchctl_stop_stops_the_node_process(tmp_path):
    n = HutchNode(data_dir=tmp_path)
    n.start()
    try:
        r = ctl(n, "stop")
        assert r.returncode == 0 and r.stdout.splitlines() == [f"Stopping and halting node {NODE} ..."], r.stderr
        assert n.proc.wait(timeout=30) == 0
        assert "Successfully stopped hutch node" in (tmp_path / "log" / f"{NODE}.log").read_text()
        r = diag(n, "ping", "-t", "2")
        assert r.returncode == 69 and "Failed to connect and authenticate" in r.stderr
    finally:
        n.cleanup()
