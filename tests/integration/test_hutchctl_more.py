"""hutchctl's further rabbitmqctl commands (hutch.cli.ctl_more) against real hutch nodes.

Each command runs as an operator runs it (the console script in a subprocess, HUTCH_URL set
to the node's HTTP API). Banners, output and exit codes are those rabbitmqctl 3.10.8 printed
for the same commands against a RabbitMQ node; effects are checked through the HTTP API and
real AMQP clients.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.support.brokers import HutchNode, free_port, wait_until
from tests.support.hutch_cluster import HutchCluster

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


@pytest.fixture
def name() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


def ctl(node, *args: str, input: str | None = None, url: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=url or node.mgmt_url)
    return subprocess.run([str(BIN / "hutchctl"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, input=input)


def ok(node, *args: str, **kw) -> list[str]:
    r = ctl(node, *args, **kw)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout.splitlines()


def http(node, method: str, path: str, body=None, user: str = "guest", password: str = "guest"):
    """(status, JSON answer or None) of one request to the node's API."""
    req = urllib.request.Request(node.mgmt_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw.strip() else None


def get(node, path: str):
    status, doc = http(node, "GET", path)
    assert status == 200, (path, status, doc)
    return doc


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# ---------------------------------------------------------------- hash_password, authenticate_user

def test_hash_password_is_rabbitmqs_salted_sha256_and_the_node_accepts_it(node, name):
    lines = ok(node, "hash_password", "s3cret")
    assert lines[0] == "Will hash password s3cret"
    hashed = lines[1]
    raw = base64.b64decode(hashed)
    assert len(raw) == 4 + 32 and raw[4:] == hashlib.sha256(raw[:4] + b"s3cret").digest()
    assert ok(node, "-q", "hash_password", "s3cret") != [hashed]  # a new salt each time
    status, _ = http(node, "PUT", f"/api/users/{name}", {"password_hash": hashed, "tags": "management"})
    assert status == 201
    try:
        status, me = http(node, "GET", "/api/whoami", user=name, password="s3cret")
        assert status == 200 and me["name"] == name
        assert http(node, "GET", "/api/whoami", user=name, password="other")[0] == 401
        assert ok(node, "authenticate_user", name, "s3cret") == [f'Authenticating user "{name}" ...', "Success"]
    finally:
        http(node, "DELETE", f"/api/users/{name}")


def test_hash_password_reads_stdin_and_refuses_an_empty_password(node):
    lines = ok(node, "hash_password", input="from-stdin\n")
    assert lines[0] == "Will hash provided password"
    raw = base64.b64decode(lines[1])
    assert raw[4:] == hashlib.sha256(raw[:4] + b"from-stdin").digest()
    r = ctl(node, "hash_password", "")
    assert r.returncode == 65 and "password cannot be an empty string" in r.stderr
    r = ctl(node, "hash_password", input="")
    assert r.returncode == 65 and "Password is not provided" in r.stderr
    r = ctl(node, "hash_password", "a", "b")
    assert r.returncode == 64


def test_authenticate_user_success_and_refusals(node, name):
    assert ok(node, "authenticate_user", "guest", "guest") == ['Authenticating user "guest" ...', "Success"]
    r = ctl(node, "authenticate_user", "guest", "wrong")
    assert r.returncode == 65
    assert r.stdout.splitlines() == ['Authenticating user "guest" ...']
    assert r.stderr.splitlines() == ["Error:", 'Error: failed to authenticate user "guest"',
                                     "user 'guest' - invalid credentials"]
    r = ctl(node, "authenticate_user", name, "x")
    assert r.returncode == 65 and f"user '{name}' - invalid credentials" in r.stderr
    assert ctl(node, "authenticate_user", "guest").returncode == 65  # no password on stdin at all
    assert ok(node, "authenticate_user", "guest", input="guest\n")[-1] == "Success"
    # a user without a management tag authenticates all the same
    assert http(node, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})[0] == 201
    try:
        assert ok(node, "authenticate_user", name, "pw")[-1] == "Success"
        assert ctl(node, "authenticate_user", name, "nope").returncode == 65
    finally:
        http(node, "DELETE", f"/api/users/{name}")
    r = ctl(node, "authenticate_user", "guest", "guest", url=dead_url())
    assert r.returncode == 69


# ---------------------------------------------------------------- close_all_connections

def _connect(node, vhost: str = "/", name: str = "") -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", node.amqp_port, vhost,
                                       client_properties={"connection_name": name})
    return pika.BlockingConnection(params)


def _open_names(node, vhost: str | None = None) -> set[str]:
    return {c["client_properties"].get("connection_name") for c in get(node, "/api/connections")
            if vhost is None or c["vhost"] == vhost}


def test_close_all_connections_of_a_vhost_with_a_limit_then_globally(node, name):
    assert http(node, "PUT", f"/api/vhosts/{name}", {})[0] == 201
    conns = []
    try:
        conns = [_connect(node, "/", f"{name}-root-{i}") for i in range(3)] + [_connect(node, name, f"{name}-v")]
        mine = {f"{name}-root-{i}" for i in range(3)} | {f"{name}-v"}
        wait_until(lambda: mine <= _open_names(node), 10, "connections listed")
        before_root = len(_open_names(node, "/"))
        lines = ok(node, "close_all_connections", "--limit", "2", "--per-connection-delay", "10", "maintenance")
        assert lines == ["Closing 2 connections in vhost /, reason: maintenance...", "Closed 2 connections"]
        wait_until(lambda: len(_open_names(node, "/")) == before_root - 2, 10, "two connections closed")
        assert f"{name}-v" in _open_names(node, name)
        closed = [c for c in conns[:3] if f"{name}-root-{conns.index(c)}" not in _open_names(node)]
        assert len(closed) == 2
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            closed[0].process_data_events(time_limit=5)
            closed[0].channel()
        assert info.value.reply_code == 320
        assert "Closed via hutchctl: maintenance" in info.value.reply_text

        lines = ok(node, "close_all_connections", "-p", name, "bye")
        assert lines == [f"Closing all connections in vhost {name}, reason: bye...", "Closed 1 connections"]
        wait_until(lambda: not _open_names(node, name), 10, "vhost's connection closed")

        left = len(_open_names(node))
        assert left >= 1
        lines = ok(node, "close_all_connections", "--global", "all")
        assert lines == ["Closing all connections to node hutch@localhost (across all vhosts), reason: all...",
                         f"Closed {left} connections"]
        wait_until(lambda: not get(node, "/api/connections"), 10, "every connection closed")
        assert ok(node, "close_all_connections", "-p", "no-such-vhost", "x")[-1] == "Closed 0 connections"
        assert json.loads(ctl(node, "--formatter", "json", "close_all_connections", "x").stdout) == {"closed": 0}
    finally:
        for c in conns:
            try:
                c.close()
            except pika.exceptions.AMQPError:
                pass
        http(node, "DELETE", f"/api/vhosts/{name}")


def test_close_all_connections_bad_input(node):
    assert ctl(node, "close_all_connections").returncode == 64  # no explanation
    assert ctl(node, "close_all_connections", "--limit", "-1", "x").returncode == 64
    assert ctl(node, "close_all_connections", "--per-connection-delay", "soon", "x").returncode == 64
    assert ctl(node, "close_all_connections", "x", url=dead_url()).returncode == 69


# ---------------------------------------------------------------- runtime parameters, cluster name

def test_global_parameters_set_list_clear(node, name):
    lines = ok(node, "set_global_parameter", name, '{"a":1,"b":[true,null]}')
    assert lines == [f'Setting global runtime parameter "{name}" to "{{"a":1,"b":[true,null]}}" ...']
    try:
        assert get(node, f"/api/global-parameters/{name}")["value"] == {"a": 1, "b": [True, None]}
        lines = ok(node, "list_global_parameters")
        assert lines[:2] == ["Listing global runtime parameters ...", "name\tvalue"]
        rows = dict(line.split("\t", 1) for line in lines[2:])
        assert rows[name] == '{"a":1,"b":[true,null]}'
        assert rows["cluster_name"] == json.dumps(get(node, "/api/overview")["cluster_name"])
        listed = json.loads(ctl(node, "--formatter", "json", "list_global_parameters").stdout)
        assert {"name": name, "value": '{"a":1,"b":[true,null]}'} in listed
        ok(node, "set_global_parameter", name, '"plain"')
        assert get(node, f"/api/global-parameters/{name}")["value"] == "plain"
    finally:
        lines = ok(node, "clear_global_parameter", name)
    assert lines == [f'Clearing global runtime parameter "{name}" ...']
    assert http(node, "GET", f"/api/global-parameters/{name}")[0] == 404
    r = ctl(node, "clear_global_parameter", name)
    assert r.returncode == 69 and r.stderr.splitlines() == ["Error:", "Parameter does not exist"]


def test_set_global_parameter_bad_input(node, name):
    r = ctl(node, "set_global_parameter", name, "notjson")
    assert r.returncode == 69
    assert r.stdout.splitlines() == [f'Setting global runtime parameter "{name}" to "notjson" ...']
    assert "JSON decoding error. Reason:" in r.stderr
    assert http(node, "GET", f"/api/global-parameters/{name}")[0] == 404
    assert ctl(node, "set_global_parameter", name).returncode == 64
    assert ctl(node, "set_global_parameter", name, "1", url=dead_url()).returncode == 69


def test_list_parameters_of_a_vhost(node):
    lines = ok(node, "list_parameters")
    assert lines[0] == 'Listing runtime parameters for vhost "/" ...'
    expected = [p for p in get(node, "/api/parameters") if p["vhost"] == "/"]
    assert len(lines) == (1 if not expected else 2 + len(expected))
    r = ctl(node, "list_parameters", "-p", "no-such-vhost")
    assert r.returncode == 65 and "Virtual host 'no-such-vhost' does not exist" in r.stderr


def test_list_parameters_shows_a_vhosts_limits_parameter(node, name):
    assert http(node, "PUT", f"/api/vhosts/{name}", {})[0] == 201
    try:
        assert http(node, "PUT", f"/api/vhost-limits/{name}/max-queues", {"value": 7})[0] in (201, 204)
        lines = ok(node, "list_parameters", "-p", name)
        assert lines == [f'Listing runtime parameters for vhost "{name}" ...', "component\tname\tvalue",
                         'vhost-limits\tlimits\t{"max-queues":7}']
        listed = json.loads(ctl(node, "--formatter", "json", "list_parameters", "-p", name).stdout)
        assert listed == [{"component": "vhost-limits", "name": "limits", "value": '{"max-queues":7}'}]
    finally:
        http(node, "DELETE", f"/api/vhosts/{name}")


def test_set_cluster_name_end_to_end(node, name):
    before = get(node, "/api/overview")["cluster_name"]
    try:
        assert ok(node, "set_cluster_name", name) == [f"Setting cluster name to {name} ..."]
        assert get(node, "/api/overview")["cluster_name"] == name
        assert get(node, "/api/cluster-name") == {"name": name}
        assert f"Cluster name: {name}" in ok(node, "cluster_status")
        rows = dict(line.split("\t", 1) for line in ok(node, "-q", "list_global_parameters")[1:])
        assert rows["cluster_name"] == json.dumps(name)
        # the global parameter is the cluster name: setting it is the same as set_cluster_name
        ok(node, "set_global_parameter", "cluster_name", json.dumps(name + "-2"))
        wait_until(lambda: get(node, "/api/overview")["cluster_name"] == name + "-2", 10, "cluster name")
    finally:
        ok(node, "set_cluster_name", before)
    r = ctl(node, "set_cluster_name", "")
    assert r.returncode == 65 and "cluster name cannot be an empty string" in r.stderr
    assert get(node, "/api/overview")["cluster_name"] == before


# ---------------------------------------------------------------- ping, environment, health

def test_ping_and_environment(node):
    lines = ok(node, "ping")
    assert lines[0].startswith(f"Will ping {node.mgmt_url}.") and lines[1] == "Ping succeeded"
    r = ctl(node, "ping", url=dead_url())
    assert r.returncode == 69 and "Failed to connect and authenticate" in r.stderr
    r = ctl(node, "--password", "wrong", "ping")
    assert r.returncode == 77
    lines = ok(node, "environment")
    assert lines[0] == "Application environment of node hutch@localhost ..."
    settings = dict(line.split(" = ", 1) for line in lines[1:])
    assert json.loads(settings["node_name"]) == "hutch@localhost"
    assert json.loads(settings["amqp_port"]) == node.amqp_port
    assert ctl(node, "environment", url=dead_url()).returncode == 69


def test_node_health_check_passes_then_fails_while_the_app_is_stopped(node):
    banner = ["This command is DEPRECATED and will be removed in a future version.",
              "It performs intrusive, opinionated health checks and requires a fully booted node.",
              "Use one of the options covered in https://www.rabbitmq.com/monitoring.html#health-checks instead.",
              "Timeout: 70 seconds ...", "Checking health of node hutch@localhost ..."]
    assert ok(node, "node_health_check") == [*banner, "Health check passed"]
    ok(node, "stop_app")
    try:
        r = ctl(node, "node_health_check")
        assert r.returncode == 70
        assert r.stdout.splitlines() == banner
        assert "Error: health check failed. Message:" in r.stderr and "not running" in r.stderr
    finally:
        ok(node, "start_app")
    assert ok(node, "-q", "node_health_check") == ["Health check passed"]
    assert ctl(node, "node_health_check", url=dead_url()).returncode == 69


def test_rotate_logs_is_refused_as_rabbitmqctl_310_refuses_it(node):
    r = ctl(node, "rotate_logs")
    assert r.returncode == 69 and "This command does not rotate logs anymore [deprecated]" in r.stderr


# ---------------------------------------------------------------- await_online_nodes

def test_await_online_nodes_on_one_node(node):
    assert ok(node, "await_online_nodes", "1") == [
        "Will wait for at least 1 nodes to join the cluster of hutch@localhost. Timeout: 300 seconds."]
    r = ctl(node, "await_online_nodes", "2", "--timeout", "1")
    assert r.returncode == 70
    assert r.stderr.splitlines() == ["Error:", "Error: timed out while waiting. Not enough nodes joined "
                                               "hutch@localhost's cluster."]
    for bad in ("0", "x", "1.5"):
        r = ctl(node, "await_online_nodes", bad)
        assert r.returncode == 65 and "Argument must be a positive integer" in r.stderr, bad
    assert ctl(node, "await_online_nodes", "-3").returncode == 64  # read as an unknown option
    assert ctl(node, "await_online_nodes").returncode == 64
    assert ctl(node, "await_online_nodes", "1", url=dead_url()).returncode == 69


def test_await_online_nodes_waits_for_a_member_to_come_back():
    with HutchCluster(n=3) as cluster:
        first = cluster.nodes[0]
        cluster.stop(2)
        wait_until(lambda: len(cluster.cluster_status(0)["running_nodes"]) == 2, 30, "node 3 seen down")
        env = dict(os.environ, HUTCH_URL=first.mgmt_url)
        waiter = subprocess.Popen([str(BIN / "hutchctl"), "await_online_nodes", "3", "--timeout", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            with pytest.raises(subprocess.TimeoutExpired):  # still waiting while a member is down
                waiter.wait(2)
            cluster.start(2)
            out, err = waiter.communicate(timeout=60)
            assert waiter.returncode == 0, (out, err)
            assert out.splitlines() == [
                f"Will wait for at least 3 nodes to join the cluster of {first.name}. Timeout: 60 seconds."]
            assert len(cluster.cluster_status(0)["running_nodes"]) == 3
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait(10)


# ---------------------------------------------------------------- shutdown

def test_shutdown_stops_the_node_and_waits_for_its_process():
    with HutchNode() as n:
        pid = n.proc.pid
        r = ctl(n, "shutdown")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.splitlines() == [f"Shutting down hutch node hutch@localhost running at PID {pid}",
                                         f"Waiting for PID {pid} to terminate",
                                         f"hutch node hutch@localhost running at PID {pid} successfully shut down"]
        # the command returned only once the process had exited: there is only its status to collect
        assert n.proc.wait(timeout=1) is not None
        r = ctl(n, "shutdown")
        assert r.returncode == 69 and "Error:" in r.stderr


def test_shutdown_no_wait_returns_at_once():
    with HutchNode() as n:
        r = ctl(n, "shutdown", "--no-wait")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.splitlines() == [f"Shutting down hutch node hutch@localhost running at PID {n.proc.pid}"]
        n.proc.wait(timeout=30)
