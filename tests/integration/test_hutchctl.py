"""hutchctl, hutch-diagnostics, hutch-queues and `hutch definitions` against a real node.

The commands run as a user runs them (console scripts in subprocesses, HUTCH_URL set to the
node's HTTP API); their output is compared with what rabbitmqctl prints, and their listings
field by field with the HTTP API they read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.brokers import HutchNode, free_port

BIN = Path(sys.executable).parent
SEED_COMMANDS = [  # rabbitmqctl's examples in the seed document, with hutchctl in place of rabbitmqctl
    ["set_policy", "ha-all", "^ha\\.", '{"ha-mode":"all"}'],
    ["set_policy", "ha-two", "^two\\.", '{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}'],
    ["set_policy", "ha-nodes", "^nodes\\.", '{"ha-mode":"nodes","ha-params":["rabbit@nodeA", "rabbit@nodeB"]}'],
]


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


def run(node, tool: str, *args: str, input: str | None = None, url: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=url or node.mgmt_url)
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=env, timeout=60,
                          input=input)


def ctl(node, *args: str, **kw) -> subprocess.CompletedProcess:
    return run(node, "hutchctl", *args, **kw)


def ok(node, *args: str) -> str:
    r = ctl(node, *args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def api(node, path: str):
    import base64
    import urllib.request

    req = urllib.request.Request(node.mgmt_url + path)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


def test_the_seed_set_policy_examples_work_verbatim_and_are_listed(node):
    for cmd in SEED_COMMANDS:
        out = ok(node, *cmd)
        assert out.startswith(f'Setting policy "{cmd[1]}" for pattern "{cmd[2]}" to "{cmd[3]}" with priority "0" '
                              'for vhost "/" ...')
    try:
        assert ok(node, "list_policies").splitlines() == [
            'Listing policies for vhost "/" ...',
            "vhost\tname\tpattern\tapply-to\tdefinition\tpriority",
            '/\tha-all\t^ha\\.\tall\t{"ha-mode":"all"}\t0',
            '/\tha-nodes\t^nodes\\.\tall\t{"ha-mode":"nodes","ha-params":["rabbit@nodeA","rabbit@nodeB"]}\t0',
            '/\tha-two\t^two\\.\tall\t{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}\t0']
        listed = json.loads(ok(node, "list_policies", "--formatter", "json"))
        assert [(p["name"], json.loads(p["definition"])) for p in listed] == [
            ("ha-all", {"ha-mode": "all"}),
            ("ha-nodes", {"ha-mode": "nodes", "ha-params": ["rabbit@nodeA", "rabbit@nodeB"]}),
            ("ha-two", {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"})]
        diag = run(node, "hutch-diagnostics", "check_if_cluster_has_classic_queue_mirroring_policy")
        assert diag.returncode == 69 and "'ha-two' in vhost '/'" in diag.stderr
        listed = run(node, "hutch-diagnostics", "list_policies_with_classic_queue_mirroring", "-q").stdout
        assert [line.split("\t")[1] for line in listed.splitlines()[1:]] == ["ha-all", "ha-nodes", "ha-two"]
    finally:
        for cmd in SEED_COMMANDS:
            ok(node, "clear_policy", cmd[1])
    diag = run(node, "hutch-diagnostics", "check_if_cluster_has_classic_queue_mirroring_policy")
    assert diag.returncode == 0 and "Cluster reported no classic queue mirroring policies" in diag.stdout


def test_an_invalid_policy_fails_with_the_reason_and_is_not_stored(node, name):
    r = ctl(node, "set_policy", name, ".", '{"ha-mode":"exactly"}')
    assert r.returncode == 69 and 'ha-mode="exactly" takes an integer, none given' in r.stderr
    r = ctl(node, "set_policy", name, ".", '{"max-priority":10}')
    assert r.returncode == 69 and '"max-priority" is not a recognised policy setting' in r.stderr
    r = ctl(node, "set_policy", name, ".", '{"ha-mode":')
    assert r.returncode == 65 and "could not parse JSON" in r.stderr
    assert name not in ok(node, "list_policies")
    r = ctl(node, "clear_policy", name)
    assert r.returncode == 69 and "Parameter does not exist" in r.stderr


def test_set_policy_priority_and_apply_to_options(node, name):
    ok(node, "set_policy", "--priority", "5", "--apply-to", "queues", name, f"^{name}", '{"max-length":3}')
    try:
        assert api(node, f"/api/policies/%2F/{name}") == {"vhost": "/", "name": name, "pattern": f"^{name}",
                                                         "apply-to": "queues", "definition": {"max-length": 3},
                                                         "priority": 5}
    finally:
        ok(node, "clear_policy", name)


def test_list_queues_prints_rabbitmqctl_table_and_matches_the_api(node, name):
    ok(node, "set_policy", "--apply-to", "queues", name, f"^{name}", '{"message-ttl":60000}')
    try:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port))
        ch = conn.channel()
        ch.queue_declare(f"{name}.q", durable=True, arguments={"x-max-length": 10})
        ch.basic_publish("", f"{name}.q", b"m1")
        ch.basic_publish("", f"{name}.q", b"m2")
        out = ok(node, "list_queues")
        lines = out.splitlines()
        assert lines[:3] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ...", "name\tmessages"]
        assert f"{name}.q\t2" in lines[3:]
        cols = ["name", "policy", "pid", "messages", "messages_ready", "messages_unacknowledged", "consumers",
                "durable", "auto_delete", "arguments", "type"]
        out = ok(node, "-q", "list_queues", *cols)
        rows = [line.split("\t") for line in out.splitlines()]
        assert rows[0] == cols
        row = dict(zip(cols, next(r for r in rows[1:] if r[0] == f"{name}.q"), strict=True))
        q = api(node, f"/api/queues/%2F/{name}.q")
        assert row == {"name": q["name"], "policy": q["policy"], "pid": "<hutch@localhost>",
                       "messages": str(q["messages"]), "messages_ready": str(q["messages_ready"]),
                       "messages_unacknowledged": str(q["messages_unacknowledged"]),
                       "consumers": str(q["consumers"]), "durable": "true", "auto_delete": "false",
                       "arguments": '[{"x-max-length",10}]', "type": "classic"}
        assert row["policy"] == name and row["messages"] == "2"
        listed = json.loads(ok(node, "list_queues", "name", "messages", "durable", "--formatter", "json"))
        assert {"name": f"{name}.q", "messages": 2, "durable": True} in listed
        ok(node, "purge_queue", f"{name}.q")
        assert api(node, f"/api/queues/%2F/{name}.q")["messages"] == 0
        assert ok(node, "delete_queue", f"{name}.q").splitlines() == [
            f"Deleting queue '{name}.q' on vhost '/' ...", "Queue was successfully deleted with 0 messages"]
        conn.close()
    finally:
        ok(node, "clear_policy", name)


def test_an_unknown_column_is_a_usage_error(node):
    r = ctl(node, "list_queues", "name", "bogus")
    assert r.returncode == 64 and "Info key(s) bogus are not supported" in r.stderr


def test_users_vhosts_and_permissions(node, name):
    out = ok(node, "add_user", name, "pw1")
    assert out.splitlines()[0] == f'Adding user "{name}" ...'
    assert ctl(node, "add_user", name, "pw1").returncode == 70
    ok(node, "set_user_tags", name, "monitoring", "management")
    assert f"{name}\t[monitoring, management]" in ok(node, "list_users").splitlines()
    ok(node, "add_vhost", name)
    ok(node, "set_permissions", "-p", name, name, "^c", ".*", ".*")
    assert ok(node, "list_permissions", "-p", name).splitlines() == [
        f'Listing permissions for vhost "{name}" ...', "user\tconfigure\twrite\tread",
        "guest\t.*\t.*\t.*", f"{name}\t^c\t.*\t.*"]
    ok(node, "change_password", name, "pw2")
    r = run(node, "hutchctl", "--username", name, "--password", "pw2", "list_vhosts", "-q")
    assert r.returncode == 0 and r.stdout.splitlines() == ["name", "/", name]
    assert run(node, "hutchctl", "--username", name, "--password", "pw1", "list_vhosts").returncode == 77
    ok(node, "clear_permissions", "-p", name, name)
    assert ok(node, "-q", "list_permissions", "-p", name).splitlines()[1:] == ["guest\t.*\t.*\t.*"]
    ok(node, "delete_vhost", name)
    assert name not in ok(node, "list_vhosts").splitlines()
    ok(node, "delete_user", name)
    r = ctl(node, "delete_user", name)
    assert r.returncode == 67 and f'User "{name}" does not exist' in r.stderr


def test_status_and_cluster_status_name_this_node(node):
    out = ok(node, "status")
    assert out.splitlines()[0] == "Status of node hutch@localhost ..."
    assert f"port: {node.amqp_port}, protocol: amqp" in out
    out = ok(node, "cluster_status")
    assert "Running Nodes\n\nhutch@localhost\n" in out
    doc = json.loads(ok(node, "cluster_status", "--formatter", "json"))
    assert doc["running_nodes"] == doc["disk_nodes"] == ["hutch@localhost"]
    assert ok(node, "-n", "hutch@localhost", "-q", "list_vhosts").splitlines() == ["name", "/"]
    r = ctl(node, "-n", "rabbit@elsewhere", "--url", node.mgmt_url, "list_vhosts")
    assert r.returncode == 69 and "is 'hutch@localhost', not 'rabbit@elsewhere'" in r.stderr


def test_diagnostics_and_queue_checks_on_a_single_node(node):
    r = run(node, "hutch-diagnostics", "check_running")
    assert r.returncode == 0 and "hutch on node hutch@localhost is fully booted and running" in r.stdout
    r = run(node, "hutch-diagnostics", "check_port_connectivity")
    assert r.returncode == 0, r.stderr
    # every listener: AMQP, the stream protocol, HTTP
    assert r.stdout.splitlines()[-1] == (f"Successfully connected to ports {node.amqp_port}, {node.stream_port}, "
                                         f"{node.mgmt_port} on node hutch@localhost.")
    for check in ("check_if_node_is_mirror_sync_critical", "check_if_node_is_quorum_critical"):
        r = run(node, "hutch-queues", check)
        assert r.returncode == 0 and "reported no queues for which it is critical" in r.stdout


def test_export_and_import_definitions(node, name, tmp_path):
    ok(node, "set_policy", name, f"^{name}$", '{"max-length":7}')
    path = tmp_path / "defs.json"
    ok(node, "export_definitions", str(path))
    doc = json.loads(path.read_text())
    assert any(p["name"] == name for p in doc["policies"])
    ok(node, "clear_policy", name)
    r = run(node, "hutch", "definitions", "import", str(path))
    assert r.returncode == 0, r.stderr
    assert api(node, f"/api/policies/%2F/{name}")["definition"] == {"max-length": 7}
    exported = json.loads(run(node, "hutch", "definitions", "export", "-").stdout)
    assert exported["policies"] == api(node, "/api/definitions")["policies"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policies": [{"vhost": "/", "name": name + "x", "pattern": ".",
                                             "definition": {"ha-mode": "sometimes"}}]}))
    r = ctl(node, "import_definitions", str(bad))
    assert r.returncode == 69 and "ha-mode" in r.stderr
    assert name + "x" not in ok(node, "list_policies")
    ok(node, "clear_policy", name)


def test_an_unreachable_node_exits_69(node):
    r = ctl(node, "list_queues", url=f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 69 and "unable to perform an operation" in r.stderr
