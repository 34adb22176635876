"""Definitions import and export against real RabbitMQ 3.10.8 exports and a real RabbitMQ node.

The fixtures under tests/fixtures/definitions/ are what a RabbitMQ 3.10.8 node wrote
(make_rabbitmq_export.py makes them): every kind of item RabbitMQ's format carries. These
tests hold hutch to RabbitMQ's "Schema Definition Export and Import" guide and to the rule
that an import loses nothing silently: each item is imported and visible through the HTTP
API afterwards, or the import is refused naming it; a refused import changes nothing;
`skip_unsupported` imports the rest and names what it left out. Exports go the other way: a
hutch export imports into a fresh hutch node unchanged, and into RabbitMQ 3.10.8.
`load_definitions` is imported at boot, and a file that cannot be imported fails the boot.

Each test starts its own hutch node (a blank catalogue makes "nothing changed" checkable).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import drain
from tests.support.brokers import HutchNode, RabbitMQNode, wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "definitions"
HTTP_EXPORT = FIXTURES / "rabbitmq-3.10.8.json"  # GET /api/definitions
CTL_EXPORT = FIXTURES / "rabbitmq-3.10.8-rabbitmqctl.json"  # rabbitmqctl export_definitions (vhost metadata)
BIN = Path(sys.executable).parent

# What hutch never honours in the fixtures (no federation plugin). Their stream, events-log, is
# imported as a stream.
ALWAYS_REFUSED = [
    "runtime parameter 'origin' of component 'federation-upstream' in vhost 'shop': component "
    "'federation-upstream' is not supported (hutch has no federation-upstream plugin)",
]
FEDERATION_UPSTREAM = ALWAYS_REFUSED[0]
STREAM_ARGUMENTS = {"x-max-age": "7D", "x-queue-type": "stream"}  # events-log's, in both fixtures
INTERNAL_FAN = ("binding from exchange 'events' to exchange 'internal-fan' in vhost 'shop': no exchange 'internal-fan' "
                "in vhost 'shop' (neither in the definitions nor on the node)")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def call(port_or_url, method: str, path: str, body=None, user: str = "guest", password: str = "guest"):
    """(status, decoded JSON or None) of one HTTP API request."""
    base = port_or_url if isinstance(port_or_url, str) else f"http://127.0.0.1:{port_or_url}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None)


def get(node, path: str, **kw):
    status, doc = call(node.mgmt_url, "GET", path, **kw)
    assert status == 200, (path, status, doc)
    return doc


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def ctl(node, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=node.mgmt_url)
    return subprocess.run([str(BIN / "hutchctl"), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def node():
    n = HutchNode()
    try:
        n.start()
        yield n
    finally:
        n.cleanup()


def refused_items(reason: str) -> str:
    return reason.split(": ", 1)[1] if ": " in reason else reason


def read_stream(conn: pika.BlockingConnection, name: str, n: int) -> list[bytes]:
    """The first `n` messages of stream `name`, read from its first offset."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)  # a stream consumer needs a prefetch
    got: list[bytes] = []

    def on(ch, method, _props, body):
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(name, on, arguments={"x-stream-offset": "first"})
    drain(conn, lambda: len(got) >= n, 10, f"{n} messages from stream '{name}'")
    ch.basic_cancel(tag)
    ch.close()
    return got[:n]


def assert_is_the_fixtures_stream(node, vhost: str = "shop", name: str = "events-log") -> None:
    got = get(node, f"/api/queues/{q(vhost)}/{q(name)}")
    assert (got["type"], got["durable"], got["auto_delete"], got["arguments"]) == \
        ("stream", True, False, STREAM_ARGUMENTS), got
    assert got["members"] and got["leader"] in got["members"], got  # a Raft group, as a declare makes it


# ---- RabbitMQ's export, imported ---------------------------------------------------------------


def test_rabbitmq_export_is_refused_whole_naming_every_item_hutch_cannot_honour(node):
    before = get(node, "/api/definitions")
    status, out = call(node.mgmt_url, "POST", "/api/definitions", load(HTTP_EXPORT))
    assert status == 400, out
    reason = out["reason"]
    assert reason.startswith("definitions refused, nothing was imported: 1 item(s) hutch cannot honour")
    for item in ALWAYS_REFUSED:
        assert item in reason
    assert "events-log" not in reason  # a stream is imported, not refused
    assert "skip_unsupported=true" in reason
    # all or nothing: not one of the many items it could have imported is there
    assert get(node, "/api/definitions") == before
    assert call(node.mgmt_url, "GET", "/api/vhosts/shop")[0] == 404
    assert call(node.mgmt_url, "GET", "/api/users/alice")[0] == 404


def test_rabbitmq_export_with_skip_unsupported_is_imported_without_loss(node):
    """Every item of rabbitmqctl's export is either visible through the HTTP API afterwards
    or named in the answer as skipped."""
    doc = load(CTL_EXPORT)
    status, report = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", doc)
    assert status == 200, report
    skipped = report["skipped"]
    for item in ALWAYS_REFUSED:
        assert any(item in s for s in skipped), item
    assert report["imported"]["queues"] == 7  # the stream among them

    # vhosts with their metadata
    shop = get(node, "/api/vhosts/shop")
    assert (shop["description"], shop["tags"]) == ("orders and payments", ["production", "eu"])
    billing = get(node, "/api/vhosts/billing")
    assert (billing["description"], billing["tags"], billing["default_queue_type"]) == \
        ("invoices", ["finance"], "quorum")
    assert billing["metadata"]["default_queue_type"] == "quorum"
    assert get(node, "/api/vhosts/lab")["description"] == "scratch space"
    # users: tags and the password hash RabbitMQ made (alice logs in with her password)
    users = {u["name"]: u for u in get(node, "/api/users")}
    assert {n: sorted(users[n]["tags"]) if isinstance(users[n]["tags"], list) else users[n]["tags"]
            for n in ("alice", "bob")} in (
        {"alice": ["management"], "bob": ["monitoring", "policymaker"]},
        {"alice": "management", "bob": "monitoring,policymaker"})
    assert get(node, "/api/whoami", user="alice", password="alice-secret")["name"] == "alice"
    assert call(node.mgmt_url, "GET", "/api/whoami", user="alice", password="wrong")[0] == 401
    # permissions, exactly as in the file
    perms = {(p["user"], p["vhost"]): (p["configure"], p["write"], p["read"]) for p in get(node, "/api/permissions")}
    for p in doc["permissions"]:
        assert perms[(p["user"], p["vhost"])] == (p["configure"], p["write"], p["read"])
    # policies and the operator policy
    policies = {(p["vhost"], p["name"]): p for p in get(node, "/api/policies")}
    for p in doc["policies"]:
        got = policies[(p["vhost"], p["name"])]
        assert (got["pattern"], got["apply-to"], got["definition"], got["priority"]) == \
            (p["pattern"], p["apply-to"], p["definition"], p["priority"])
    ops = {p["name"]: p for p in get(node, "/api/operator-policies/shop")}
    assert ops["cap-length"]["definition"] == {"max-length": 100000}
    # global runtime parameters
    params = {p["name"]: p["value"] for p in get(node, "/api/global-parameters")}
    for p in doc["global_parameters"]:
        assert params[p["name"]] == p["value"]
    # exchanges, queues (classic, quorum and stream, with their arguments), bindings
    for x in doc["exchanges"]:
        got = get(node, f"/api/exchanges/{q(x['vhost'])}/{q(x['name'])}")
        assert (got["type"], got["durable"], got["auto_delete"], got["internal"]) == \
            (x["type"], x["durable"], x["auto_delete"], x.get("internal", False))
    for qd in doc["queues"]:
        got = get(node, f"/api/queues/{q(qd['vhost'])}/{q(qd['name'])}")
        assert got["durable"] == qd["durable"] and got["arguments"] == qd["arguments"]
        assert got["type"] == qd["type"] == qd["arguments"].get("x-queue-type", "classic")
    assert_is_the_fixtures_stream(node)
    bindings = {(b["vhost"], b["source"], b["destination_type"], b["destination"], b["routing_key"])
                for b in get(node, "/api/bindings") if b["source"]}
    for b in doc["bindings"]:
        key = (b["vhost"], b["source"], b["destination_type"], b["destination"], b["routing_key"])
        assert (key in bindings) == (b["destination"] != "internal-fan"), key
    # rabbitmqctl's export leaves internal exchanges out, but not the bindings to them
    assert INTERNAL_FAN in skipped
    # the imported topology carries messages: a topic exchange to a quorum queue, a classic
    # queue and the stream (bound with '#')
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/shop"))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("events", "orders.eu.42", b"order 42")
        ch.basic_publish("events", "audit.login", b"alice logged in")
        for queue in ("orders", "orders.eu"):
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            assert method is not None and body == b"order 42", queue
        assert read_stream(conn, "events-log", 2) == [b"order 42", b"alice logged in"]
    finally:
        conn.close()
    # topic permissions, user limits and vhost limits
    tps = {(t["user"], t["vhost"], t["exchange"]): (t["write"], t["read"]) for t in get(node, "/api/topic-permissions")}
    for t in doc["topic_permissions"]:
        assert tps[(t["user"], t["vhost"], t["exchange"])] == (t["write"], t["read"])
    assert get(node, "/api/user-limits/alice")[0]["value"] == {"max-channels": 50, "max-connections": 10}
    assert get(node, "/api/vhost-limits/shop")[0]["value"] == {"max-connections": 100, "max-queues": 500}
    # and nothing else was skipped
    assert len(skipped) == len(ALWAYS_REFUSED) + 1, skipped


def test_the_http_export_of_rabbitmq_imports_too(node):
    """RabbitMQ 3.10's HTTP export carries vhosts by name only; it imports the same way."""
    status, report = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", load(HTTP_EXPORT))
    assert status == 200, report
    assert {v["name"] for v in get(node, "/api/vhosts")} == {"/", "shop", "lab", "billing"}
    assert get(node, "/api/queues/shop/orders")["type"] == "quorum"
    assert_is_the_fixtures_stream(node)
    assert report["imported"]["queues"] == 7 and report["skipped"] == [FEDERATION_UPSTREAM]


# ---- all or nothing ------------------------------------------------------------------------------


def test_an_import_is_all_or_nothing_and_names_every_refused_item(node):
    doc = {
        "vhosts": [{"name": "aon"}],
        "users": [{"name": "aon-user", "password_hash": "", "tags": []}],
        "queues": [{"name": "good", "vhost": "aon", "durable": True, "auto_delete": False, "arguments": {}},
                   {"name": "events", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {"x-queue-type": "jms"}}],
        "exchanges": [{"name": "delayed", "vhost": "/", "type": "x-delayed-message", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": "direct"}}],
        "parameters": [{"component": "shovel", "vhost": "/", "name": "move", "value": {"src-uri": "amqp://"}}],
        "bindings": [{"source": "delayed", "vhost": "/", "destination": "good", "destination_type": "queue",
                      "routing_key": "", "arguments": {}},
                     {"source": "amq.direct", "vhost": "/", "destination": "events", "destination_type": "queue",
                      "routing_key": "events", "arguments": {}}],
    }
    status, out = call(node.mgmt_url, "POST", "/api/definitions", doc)
    assert status == 400
    for item in ("queue 'events' in vhost '/': queue type 'jms' is not supported",
                 "exchange 'delayed' in vhost '/': exchange type 'x-delayed-message' is not supported",
                 "runtime parameter 'move' of component 'shovel' in vhost '/': component 'shovel' is not supported",
                 "binding from exchange 'delayed' to queue 'good' in vhost '/': its source exchange 'delayed' is "
                 "not imported",
                 "binding from exchange 'amq.direct' to queue 'events' in vhost '/': its destination queue 'events' "
                 "is not imported"):
        assert item in out["reason"]
    assert call(node.mgmt_url, "GET", "/api/vhosts/aon")[0] == 404
    assert call(node.mgmt_url, "GET", "/api/users/aon-user")[0] == 404

    # a malformed item refuses the import even with skip_unsupported
    broken = dict(doc, queues=doc["queues"] + [{"vhost": "aon", "durable": True}])
    status, out = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", broken)
    assert status == 400 and "queue '?' in vhost 'aon': 'name' is missing" in out["reason"]
    assert call(node.mgmt_url, "GET", "/api/vhosts/aon")[0] == 404

    # what the catalogue refuses (permissions of a user nobody defined) is found before anything is applied
    orphan = {"vhosts": [{"name": "aon"}], "permissions": [{"user": "nobody", "vhost": "aon", "configure": ".*",
                                                             "write": ".*", "read": ".*"}]}
    status, out = call(node.mgmt_url, "POST", "/api/definitions", orphan)
    assert status == 400 and "nobody" in out["reason"]
    assert call(node.mgmt_url, "GET", "/api/vhosts/aon")[0] == 404

    # skipping: the rest is imported, the answer names what was not
    status, report = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", doc)
    assert status == 200 and len(report["skipped"]) == 5, report
    assert get(node, "/api/queues/aon/good")["durable"] is True
    assert call(node.mgmt_url, "GET", "/api/exchanges/%2F/delayed")[0] == 404
    assert "Skipped exchange 'delayed' in vhost '/'" in node.log()

    # a binding whose queue is nowhere is skipped, as RabbitMQ 3.10 skips it, and named in the log
    dangling = {"exchanges": [{"name": "dx", "vhost": "/", "type": "fanout"}],
                "bindings": [{"source": "dx", "vhost": "/", "destination": "nowhere", "destination_type": "queue",
                              "routing_key": ""}]}
    assert call(node.mgmt_url, "POST", "/api/definitions", dangling)[0] == 204
    assert get(node, "/api/exchanges/%2F/dx")["type"] == "fanout"
    assert "Skipped binding from exchange 'dx' to queue 'nowhere' in vhost '/': no queue 'nowhere'" in node.log()

    status, out = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=maybe", doc)
    assert status == 400 and "skip_unsupported must be true or false" in out["reason"]


def test_per_vhost_import_and_export(node):
    assert call(node.mgmt_url, "PUT", "/api/vhosts/pv", {"description": "per vhost"})[0] == 201
    doc = {"queues": [{"name": "a", "durable": True, "auto_delete": False, "arguments": {}},
                      {"name": "j", "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "jms"}},
                      {"name": "s", "durable": True, "auto_delete": False,
                       "arguments": {"x-queue-type": "stream", "x-max-length-bytes": 1000000}}],
           "exchanges": [{"name": "x", "type": "fanout", "durable": True, "auto_delete": False, "internal": False,
                          "arguments": {}}],
           "bindings": [{"source": "x", "destination": "a", "destination_type": "queue", "routing_key": "",
                         "arguments": {}}],
           "policies": [{"name": "p", "pattern": "^a$", "apply-to": "queues", "definition": {"max-length": 3},
                         "priority": 0}]}
    status, out = call(node.mgmt_url, "POST", "/api/definitions/pv", doc)
    assert status == 400 and "queue 'j' in vhost 'pv': queue type 'jms' is not supported" in out["reason"]
    assert call(node.mgmt_url, "GET", "/api/queues/pv/a")[0] == 404
    assert call(node.mgmt_url, "GET", "/api/queues/pv/s")[0] == 404
    status, report = call(node.mgmt_url, "POST", "/api/definitions/pv?skip_unsupported=true", doc)
    assert status == 200 and report["skipped"] == ["queue 'j' in vhost 'pv': queue type 'jms' is not supported"]
    assert report["imported"]["queues"] == 2
    exported = get(node, "/api/definitions/pv")
    assert [(x["name"], x["arguments"]) for x in exported["queues"]] == [
        ("a", {}), ("s", {"x-queue-type": "stream", "x-max-length-bytes": 1000000})]
    assert get(node, "/api/queues/pv/s")["type"] == "stream"
    assert [(b["source"], b["destination"]) for b in exported["bindings"]] == [("x", "a")]
    assert exported["policies"][0]["definition"] == {"max-length": 3} and "vhost" not in exported["policies"][0]
    assert call(node.mgmt_url, "POST", "/api/definitions/nope", doc)[0] == 404
    # a per-vhost document cannot carry users: refused by name, not dropped
    status, out = call(node.mgmt_url, "POST", "/api/definitions/pv", {"users": [{"name": "u"}]})
    assert status == 400 and "'users (in a definitions document for one vhost)'" in out["reason"]


# ---- export, and round trips -------------------------------------------------------------------


def test_export_imports_into_a_fresh_node_unchanged(node):
    status, _ = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", load(CTL_EXPORT))
    assert status == 200
    assert call(node.mgmt_url, "PUT", "/api/vhosts/extra", {"description": "made here", "tags": "a,b",
                                                            "default_queue_type": "classic"})[0] == 201
    first = get(node, "/api/definitions")
    assert list(first) == ["rabbit_version", "rabbitmq_version", "product_name", "product_version", "users",
                           "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
                           "policies", "queues", "exchanges", "bindings"]
    assert {"name": "extra", "limits": [], "metadata": {"description": "made here", "tags": ["a", "b"],
                                                        "default_queue_type": "classic"}} in first["vhosts"]
    with HutchNode() as fresh:
        assert call(fresh.mgmt_url, "POST", "/api/definitions", first)[0] == 204
        second = get(fresh, "/api/definitions")
    assert second == first


def test_rabbitmq_imports_hutchs_export(node):
    status, _ = call(node.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", load(CTL_EXPORT))
    assert status == 200
    ours = get(node, "/api/definitions")
    with RabbitMQNode() as rmq:
        status, out = call(rmq.mgmt_port, "POST", "/api/definitions", ours)
        assert status in (201, 204), out
        theirs = call(rmq.mgmt_port, "GET", "/api/definitions")[1]
        status, shop = call(rmq.mgmt_port, "GET", "/api/vhosts/shop")
        assert status == 200 and shop["description"] == "orders and payments"
        assert shop["tags"] == ["production", "eu"]
        status, _ = call(rmq.mgmt_port, "GET", "/api/whoami", user="alice", password="alice-secret")
        assert status == 200
        status, ops = call(rmq.mgmt_port, "GET", "/api/operator-policies/shop")
        assert [(p["name"], p["definition"]) for p in ops] == [("cap-length", {"max-length": 100000})]

    def keyed(doc, key, fields):
        return sorted(tuple(json.dumps(r.get(f), sort_keys=True) for f in fields) for r in doc[key])

    for key, fields in (("queues", ("vhost", "name", "durable", "auto_delete", "arguments")),
                        ("exchanges", ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments")),
                        ("bindings", ("vhost", "source", "destination", "destination_type", "routing_key",
                                      "arguments")),
                        ("policies", ("vhost", "name", "pattern", "apply-to", "definition", "priority")),
                        ("permissions", ("user", "vhost", "configure", "write", "read")),
                        ("users", ("name", "password_hash", "tags", "limits")),
                        ("topic_permissions", ("user", "vhost", "exchange", "write", "read"))):
        assert keyed(theirs, key, fields) == keyed(ours, key, fields), key
    assert {p["name"]: p["value"] for p in theirs["global_parameters"]}["cluster_name"] == "shop-cluster"
    limits = [p for p in theirs["parameters"] if p["component"] == "vhost-limits"]
    assert [(p["vhost"], p["value"]) for p in limits] == [("shop", {"max-connections": 100, "max-queues": 500})]


# ---- the CLI -------------------------------------------------------------------------------------


def test_hutchctl_import_refuses_or_skips_and_add_vhost_takes_metadata(node, tmp_path):
    path = tmp_path / "rabbit.json"
    path.write_text(CTL_EXPORT.read_text())
    r = ctl(node, "import_definitions", str(path))
    assert r.returncode == 69  # rabbitmqctl 3.10.8's code for an import it refuses
    assert FEDERATION_UPSTREAM in r.stderr
    assert call(node.mgmt_url, "GET", "/api/vhosts/shop")[0] == 404
    r = ctl(node, "import_definitions", "--skip-unsupported", str(path))
    assert r.returncode == 0, r.stderr
    assert f"Skipped {FEDERATION_UPSTREAM}" in r.stdout
    assert "events-log" not in r.stdout
    assert get(node, "/api/vhosts/shop")["description"] == "orders and payments"
    assert_is_the_fixtures_stream(node)

    r = ctl(node, "add_vhost", "cli-vh", "--description", "from the CLI", "--tags", "x,y",
            "--default-queue-type", "quorum")
    assert r.returncode == 0, r.stderr
    vh = get(node, "/api/vhosts/cli-vh")
    assert (vh["description"], vh["tags"], vh["default_queue_type"]) == ("from the CLI", ["x", "y"], "quorum")
    # a vhost's default queue type may be classic, quorum or stream, as rabbitmqctl 3.10.8's add_vhost
    # takes them; another is refused (rabbitmqctl: invalid_queue_type)
    r = ctl(node, "add_vhost", "cli-st", "--default-queue-type", "stream")
    assert r.returncode == 0, r.stderr
    assert get(node, "/api/vhosts/cli-st")["default_queue_type"] == "stream"
    r = ctl(node, "add_vhost", "cli-jms", "--default-queue-type", "jms")
    assert r.returncode == 64 and "'jms' is not one of 'quorum', 'classic', 'stream'" in r.stderr
    status, out = call(node.mgmt_url, "PUT", "/api/vhosts/cli-jms", {"default_queue_type": "jms"})
    assert status == 400 and out["reason"] == "default_queue_type must be one of classic, quorum, stream, got 'jms'"
    assert call(node.mgmt_url, "GET", "/api/vhosts/cli-jms")[0] == 404

    out = tmp_path / "out.json"
    r = ctl(node, "export_definitions", str(out))
    assert r.returncode == 0, r.stderr
    exported = json.loads(out.read_text())
    assert {"name": "cli-vh", "limits": [], "metadata": {"default_queue_type": "quorum",
                                                         "description": "from the CLI",
                                                         "tags": ["x", "y"]}} in exported["vhosts"]


def test_a_vhost_whose_default_queue_type_is_stream(node):
    """A vhost imported with default queue type stream behaves as RabbitMQ 3.10.8's (measured
    side by side): a durable queue declared there without x-queue-type is a stream, a
    non-durable one stays classic, and a server-named one is refused."""
    doc = {"vhosts": [{"name": "logs", "metadata": {"description": "", "tags": [], "default_queue_type": "stream"}}],
           "permissions": [{"user": "guest", "vhost": "logs", "configure": ".*", "write": ".*", "read": ".*"}]}
    assert call(node.mgmt_url, "POST", "/api/definitions", doc)[0] == 204
    assert get(node, "/api/vhosts/logs")["default_queue_type"] == "stream"
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/logs"))
    try:
        ch = conn.channel()
        ch.queue_declare("audit", durable=True)
        ch.queue_declare("scratch", durable=False)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("", durable=True)
        assert (e.value.reply_code, e.value.reply_text) == (
            406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")
    finally:
        conn.close()
    audit, scratch = get(node, "/api/queues/logs/audit"), get(node, "/api/queues/logs/scratch")
    assert (audit["type"], audit["arguments"]) == ("stream", {"x-queue-type": "stream"})
    assert (scratch["type"], scratch["arguments"]) == ("classic", {})
    exported = get(node, "/api/definitions")
    assert {"name": "logs", "limits": [], "metadata": {"description": "", "tags": [],
                                                      "default_queue_type": "stream"}} in exported["vhosts"]


# ---- load_definitions at boot --------------------------------------------------------------------


def booting(tmp_path: Path, definitions_line: str) -> HutchNode:
    conf = tmp_path / "hutch.conf"
    conf.write_text(definitions_line + "\n")
    return HutchNode(data_dir=tmp_path / "data", extra_args=["--config", str(conf)])


def test_load_definitions_at_boot(tmp_path):
    with HutchNode() as source:  # a good file: what hutch exported after taking RabbitMQ's
        assert call(source.mgmt_url, "POST", "/api/definitions?skip_unsupported=true", load(CTL_EXPORT))[0] == 200
        doc = get(source, "/api/definitions")
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(doc))
    n = booting(tmp_path, f"load_definitions = {path}")
    try:
        n.start()
        assert get(n, "/api/vhosts/billing")["default_queue_type"] == "quorum"
        assert get(n, "/api/queues/shop/orders")["type"] == "quorum"
        # guest comes from the file (RabbitMQ's hash of "guest"); no default user is made besides
        assert sorted(u["name"] for u in get(n, "/api/users")) == ["alice", "bob", "guest", "svc"]
        log = n.log()
        assert f"Importing definitions from file at '{path}'" in log
        assert "Importing 4 users..." in log and "Importing 7 queues..." in log
        assert_is_the_fixtures_stream(n)
        # imported again at the next boot (as RabbitMQ does): the non-durable queue is declared
        # anew, and a durable queue keeps its messages
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/shop"))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "orders.eu", b"kept", pika.BasicProperties(delivery_mode=2))
            ch.basic_publish("", "events-log", b"logged")
        finally:
            conn.close()
        n.restart()
        assert get(n, "/api/definitions") == doc
        assert get(n, "/api/queues/%2F/scratch")["durable"] is False
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/shop"))
        try:
            assert conn.channel().basic_get("orders.eu", auto_ack=True)[2] == b"kept"
            assert read_stream(conn, "events-log", 1) == [b"logged"]  # the same stream, not a new one
        finally:
            conn.close()
        assert n.log().count(f"Importing definitions from file at '{path}'") == 2
    finally:
        n.cleanup()


@pytest.mark.parametrize("case", ["unsupported", "bad-json", "missing", "older-key", "newer-keys"])
def test_a_bad_definitions_file_fails_the_boot(tmp_path, case):
    path = tmp_path / "defs.json"
    line = f"load_definitions = {path}"
    if case in ("unsupported", "older-key", "newer-keys"):
        path.write_text(CTL_EXPORT.read_text())
    elif case == "bad-json":
        path.write_text('{"queues": [')
    if case == "older-key":
        line = f"management.load_definitions = {path}"
    elif case == "newer-keys":
        line = f"definitions.import_backend = local_filesystem\ndefinitions.local.path = {path}"
    n = booting(tmp_path, line)
    try:
        n.start(wait=False)
        wait_until(lambda: n.proc.poll() is not None, 30, "the node to exit")
        assert n.proc.returncode != 0
        log = n.log()
        assert "boot failed: definitions could not be imported" in log
        if case in ("unsupported", "older-key", "newer-keys"):
            assert f"definitions file '{path}' was not imported" in log
            assert FEDERATION_UPSTREAM in log
        elif case == "bad-json":
            assert f"definitions file '{path}' is not valid JSON" in log
        else:
            assert f"could not read definitions file '{path}'" in log
    finally:
        n.cleanup()


# ---- runtime parameters over HTTP ----------------------------------------------------------------


def test_global_and_vhost_runtime_parameters_over_http(node):
    url = node.mgmt_url
    assert call(url, "PUT", "/api/global-parameters/owner", {"value": {"team": "ops"}})[0] == 201
    assert get(node, "/api/global-parameters/owner") == {"name": "owner", "value": {"team": "ops"}}
    assert call(url, "PUT", "/api/global-parameters/owner", {"value": "ops"})[0] == 204
    assert call(url, "PUT", "/api/global-parameters/owner", {})[0] == 400
    # the cluster's own bookkeeping is neither listed nor writable
    names = {p["name"] for p in get(node, "/api/global-parameters")}
    assert "owner" in names and "cluster_name" in names and not any(n.startswith("hutch_") for n in names)
    assert call(url, "PUT", "/api/global-parameters/hutch_initialised", {"value": False})[0] == 400
    assert call(url, "DELETE", "/api/global-parameters/owner")[0] == 204
    assert call(url, "GET", "/api/global-parameters/owner")[0] == 404
    assert call(url, "DELETE", "/api/global-parameters/owner")[0] == 404

    assert call(url, "PUT", "/api/vhosts/rp", {})[0] == 201
    assert call(url, "PUT", "/api/vhost-limits/rp/max-queues", {"value": 7})[0] == 204
    expected = {"value": {"max-queues": 7}, "vhost": "rp", "component": "vhost-limits", "name": "limits"}
    assert expected in get(node, "/api/parameters")
    assert get(node, "/api/parameters/vhost-limits/rp") == [expected]
    assert get(node, "/api/parameters/vhost-limits/rp/limits") == expected
    assert call(url, "GET", "/api/parameters/vhost-limits/rp/other")[0] == 404
    assert call(url, "GET", "/api/parameters/vhost-limits/nope")[0] == 404
    # non-administrators may not read them
    assert call(url, "PUT", "/api/users/rp-mon", {"password": "pw", "tags": "monitoring"})[0] == 201
    assert call(url, "GET", "/api/global-parameters", user="rp-mon", password="pw")[0] == 401


def test_load_definitions_on_every_node_of_a_cluster(tmp_path):
    """Each node imports the file at its boot; the cluster ends with one copy of everything, a
    working quorum queue and stream, and a node that restarts imports it again without changing
    anything."""
    from tests.support.hutch_cluster import HutchCluster

    doc = load(CTL_EXPORT)
    doc["parameters"] = [p for p in doc["parameters"] if p["component"] != "federation-upstream"]
    doc["bindings"] = [b for b in doc["bindings"] if b["destination"] != "internal-fan"]
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(doc))
    conf = tmp_path / "hutch.conf"
    conf.write_text(f"load_definitions = {path}\n")
    with HutchCluster(3, extra_args=["--config", str(conf)]) as cluster:
        exports = [get(n, "/api/definitions") for n in cluster.nodes]
        assert exports[1] == exports[0] and exports[2] == exports[0]
        assert {q["name"] for q in exports[0]["queues"]} == {x["name"] for x in doc["queues"]}
        for n in cluster.nodes:
            assert f"Importing definitions from file at '{path}'" in n.log()
            assert_is_the_fixtures_stream(n)
        conn = pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@127.0.0.1:{cluster.nodes[2].amqp_port}/shop"))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("events", "orders.1", b"one")
            assert ch.basic_get("orders", auto_ack=True)[2] == b"one"
        finally:
            conn.close()
        conn = pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@127.0.0.1:{cluster.nodes[0].amqp_port}/shop"))
        try:
            assert read_stream(conn, "events-log", 1) == [b"one"]
        finally:
            conn.close()
        cluster.stop(1)
        cluster.start(1)
        assert cluster.nodes[1].log().count(f"Importing definitions from file at '{path}'") == 2
        assert get(cluster.nodes[1], "/api/definitions") == exports[0]


def test_load_definitions_from_a_directory_imports_its_files_in_name_order(tmp_path):
    d = tmp_path / "defs.d"
    d.mkdir()
    guest = [u for u in load(CTL_EXPORT)["users"] if u["name"] == "guest"]
    (d / "10-vhost.json").write_text(json.dumps({
        "users": guest, "vhosts": [{"name": "dir-vh", "metadata": {"description": "first file"}}],
        "permissions": [{"user": "guest", "vhost": "dir-vh", "configure": ".*", "write": ".*", "read": ".*"}]}))
    (d / "20-queue.json").write_text(json.dumps({"queues": [{"name": "dq", "vhost": "dir-vh", "durable": True}]}))
    (d / "notes.txt").write_text("not a definitions file")
    n = booting(tmp_path, f"load_definitions = {d}")
    try:
        n.start()
        assert get(n, "/api/vhosts/dir-vh")["description"] == "first file"
        assert get(n, "/api/queues/dir-vh/dq")["durable"] is True
        log = n.log()
        assert log.index(f"file at '{d / '10-vhost.json'}'") < log.index(f"file at '{d / '20-queue.json'}'")
        assert "notes.txt" not in log
    finally:
        n.cleanup()
