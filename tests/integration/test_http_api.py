"""The management HTTP API of one node, held to RabbitMQ 3.10's routes, shapes and errors.

One hutch node for the module (with its HTTP listener on a free port); each test uses its
own names. Bodies are compared field by field with what docs/http-api.md documents, and
every refused request is checked to have changed nothing.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import wait_until
from tests.support.brokers import HutchNode

QUEUE_FIELDS = {"name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "node", "policy",
                "effective_policy_definition", "messages", "messages_ready", "messages_unacknowledged",
                "consumers", "state", "type"}
EXCHANGE_FIELDS = {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"}
CONNECTION_FIELDS = {"name", "node", "user", "vhost", "peer_host", "peer_port", "host", "port", "state",
                     "channels", "client_properties", "protocol", "auth_mechanism", "ssl", "timeout",
                     "frame_max", "channel_max", "connected_at", "type"}
CHANNEL_FIELDS = {"name", "node", "number", "user", "vhost", "connection_details", "consumer_count",
                  "prefetch_count", "global_prefetch_count", "messages_unacknowledged", "confirm", "transactional",
                  "state"}
CONSUMER_FIELDS = {"consumer_tag", "queue", "channel_details", "ack_required", "exclusive", "prefetch_count",
                   "arguments", "active"}


class Http:
    def __init__(self, port: int, user: str = "guest", password: str = "guest"):
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def __call__(self, method: str, path: str, body=None, raw: bytes | None = None, headers=None,
                 auth: bool = True) -> tuple[int, object, dict]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if auth:
            req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, text, hdrs = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            status, text, hdrs = e.code, e.read(), dict(e.headers)
        return status, (json.loads(text) if text.strip() else None), hdrs

    def ok(self, method: str, path: str, body=None):
        status, out, _ = self(method, path, body)
        assert 200 <= status < 300, (method, path, status, out)
        return out


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


@pytest.fixture(scope="module")
def http(node) -> Http:
    return Http(node.mgmt_port)


@pytest.fixture
def name() -> str:
    return f"t.{uuid.uuid4().hex[:10]}"


def amqp(node, **kw) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, **kw))


# ---------------------------------------------------------------- node, auth


def test_overview_names_node_versions_totals_and_listeners(http, node):
    o = http.ok("GET", "/api/overview")
    assert {"management_version", "rabbitmq_version", "product_name", "product_version", "cluster_name", "node",
            "object_totals", "queue_totals", "message_stats", "listeners"} <= set(o)
    assert o["node"] == "hutch@localhost" and o["product_name"] == "hutch"
    assert o["management_version"] == o["rabbitmq_version"] == "3.10.8"
    assert set(o["object_totals"]) == {"channels", "connections", "consumers", "exchanges", "queues"}
    ports = {ln["protocol"]: ln["port"] for ln in o["listeners"]}
    assert ports == {"amqp": node.amqp_port, "http": node.mgmt_port, "stream": node.stream_port}
    assert all(ln["node"] == "hutch@localhost" for ln in o["listeners"])


def test_nodes_lists_this_node_and_answers_it_by_name(http):
    nodes = http.ok("GET", "/api/nodes")
    assert [n["name"] for n in nodes] == ["hutch@localhost"]
    one = http.ok("GET", "/api/nodes/hutch@localhost")
    assert one["running"] is True and one["mem_alarm"] is False and one["mem_used"] > 0
    assert http("GET", "/api/nodes/rabbit@elsewhere")[0] == 404


def test_whoami_gives_the_user_and_its_tags(http):
    assert http.ok("GET", "/api/whoami") == {"name": "guest", "tags": ["administrator"]}


def test_bad_or_missing_credentials_are_401_with_a_json_reason(node):
    status, body, headers = Http(node.mgmt_port, "guest", "wrong")("GET", "/api/overview")
    assert status == 401 and body == {"error": "not_authorized", "reason": "Login failed"}
    assert headers["WWW-Authenticate"].startswith("Basic")
    status, body, _ = Http(node.mgmt_port)("GET", "/api/overview", auth=False)
    assert status == 401 and body["reason"] == "Login failed"


def test_user_tags_decide_what_a_user_may_do(http, node, name):
    http.ok("PUT", f"/api/users/{name}-none", {"password": "pw", "tags": ""})
    http.ok("PUT", f"/api/users/{name}-mon", {"password": "pw", "tags": "monitoring"})
    try:
        status, body, _ = Http(node.mgmt_port, f"{name}-none", "pw")("GET", "/api/overview")
        assert (status, body) == (401, {"error": "not_authorised", "reason": "Not management user"})
        mon = Http(node.mgmt_port, f"{name}-mon", "pw")
        assert mon.ok("GET", "/api/overview")["node"] == "hutch@localhost"
        assert [v["name"] for v in mon.ok("GET", "/api/vhosts")] == ["/"]  # monitoring sees every vhost
        status, body, _ = mon("GET", "/api/users")
        assert (status, body) == (401, {"error": "not_authorised", "reason": "Not administrator user"})
        status, _, _ = mon("PUT", f"/api/policies/%2F/{name}", {"pattern": ".", "definition": {"max-length": 1}})
        assert status == 401
        assert http("GET", f"/api/policies/%2F/{name}")[0] == 404
    finally:
        http.ok("POST", "/api/users/bulk-delete", {"users": [f"{name}-none", f"{name}-mon"]})
    assert http("GET", f"/api/users/{name}-mon")[0] == 404


# ---------------------------------------------------------------- queues and policies


def test_queue_put_get_delete_with_rabbitmq_fields(http, name):
    assert http("PUT", f"/api/queues/%2F/{name}", {"durable": True, "arguments": {"x-max-length": 10}})[0] == 201
    assert http("PUT", f"/api/queues/%2F/{name}", {"durable": True, "arguments": {"x-max-length": 10}})[0] == 204
    q = http.ok("GET", f"/api/queues/%2F/{name}")
    assert QUEUE_FIELDS <= set(q)
    assert {k: q[k] for k in QUEUE_FIELDS} == {
        "name": name, "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
        "arguments": {"x-max-length": 10}, "node": "hutch@localhost", "policy": None,
        "effective_policy_definition": {}, "messages": 0, "messages_ready": 0, "messages_unacknowledged": 0,
        "consumers": 0, "state": "running", "type": "classic"}
    assert q["consumer_details"] == []
    assert name in [x["name"] for x in http.ok("GET", "/api/queues/%2F")]
    assert http("DELETE", f"/api/queues/%2F/{name}")[0] == 204
    assert http("GET", f"/api/queues/%2F/{name}")[:2] == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert http("DELETE", f"/api/queues/%2F/{name}")[0] == 404


def test_queue_redeclare_with_other_properties_is_400_and_keeps_the_queue(http, name):
    http.ok("PUT", f"/api/queues/%2F/{name}", {"durable": True})
    status, body, _ = http("PUT", f"/api/queues/%2F/{name}", {"durable": False})
    assert status == 400 and "inequivalent arg 'durable'" in body["reason"]
    status, body, _ = http("PUT", f"/api/queues/%2F/{name}-bad", {"arguments": {"x-max-length": "ten"}})
    assert status == 400 and "x-max-length" in body["reason"]
    assert http("GET", f"/api/queues/%2F/{name}-bad")[0] == 404
    assert http.ok("GET", f"/api/queues/%2F/{name}")["durable"] is True
    http.ok("DELETE", f"/api/queues/%2F/{name}")


def test_the_highest_priority_matching_policy_applies_to_a_queue(http, name):
    http.ok("PUT", f"/api/queues/%2F/{name}.q", {})
    pols = {"low": {"pattern": f"^{name}", "definition": {"max-length": 5}, "priority": 1},
            "high": {"pattern": r"\.q$", "definition": {"message-ttl": 100}, "priority": 7, "apply-to": "queues"},
            "xonly": {"pattern": ".*", "definition": {"alternate-exchange": "ae"}, "priority": 99,
                      "apply-to": "exchanges"}}
    try:
        for p, body in pols.items():
            assert http("PUT", f"/api/policies/%2F/{name}-{p}", body)[0] == 201
        q = http.ok("GET", f"/api/queues/%2F/{name}.q")
        assert (q["policy"], q["effective_policy_definition"]) == (f"{name}-high", {"message-ttl": 100})
        assert http.ok("GET", "/api/exchanges/%2F/amq.direct")["policy"] == f"{name}-xonly"
        http.ok("DELETE", f"/api/policies/%2F/{name}-high")
        assert http.ok("GET", f"/api/queues/%2F/{name}.q")["policy"] == f"{name}-low"
    finally:
        for p in pols:
            http("DELETE", f"/api/policies/%2F/{name}-{p}")
        http("DELETE", f"/api/queues/%2F/{name}.q")


SEED_POLICIES = {
    "ha-two": {"pattern": r"^two\.", "definition": {"ha-mode": "exactly", "ha-params": 2,
                                                    "ha-sync-mode": "automatic"}},
    "ha-all": {"pattern": r"^ha\.", "definition": {"ha-mode": "all"}},
    "ha-nodes": {"pattern": r"^nodes\.", "definition": {"ha-mode": "nodes",
                                                       "ha-params": ["rabbit@nodeA", "rabbit@nodeB"]}},
}


def test_the_seed_mirroring_policies_are_stored_as_given(http):
    try:
        for pname, body in SEED_POLICIES.items():
            assert http("PUT", f"/api/policies/%2f/{pname}", body)[0] == 201
        for pname, body in SEED_POLICIES.items():
            assert http.ok("GET", f"/api/policies/%2F/{pname}") == {
                "vhost": "/", "name": pname, "pattern": body["pattern"], "apply-to": "all",
                "definition": body["definition"], "priority": 0}
        listed = {p["name"] for p in http.ok("GET", "/api/policies/%2F")}
        assert set(SEED_POLICIES) <= listed
    finally:
        for pname in SEED_POLICIES:
            http("DELETE", f"/api/policies/%2F/{pname}")


INVALID_POLICIES = [
    ({"pattern": "x", "definition": {"foo": "bar"}}, '"foo" is not a recognised policy setting'),
    ({"pattern": "x", "definition": {"max-priority": 5}}, '"max-priority" is not a recognised policy setting'),
    ({"pattern": "x", "definition": {"ha-mode": "exactly"}}, 'ha-mode="exactly" takes an integer, none given'),
    ({"pattern": "x", "definition": {"ha-mode": "exactly", "ha-params": "two"}},
     'ha-mode="exactly" takes an integer, "two" given'),
    ({"pattern": "x", "definition": {"ha-mode": "nodes", "ha-params": 2}}, 'ha-mode="nodes" takes a list, 2 given'),
    ({"pattern": "x", "definition": {"ha-mode": "all", "ha-params": 1}}, 'ha-mode="all" does not take parameters'),
    ({"pattern": "x", "definition": {"ha-mode": "bogus"}}, '"bogus" is not a valid ha-mode value'),
    ({"pattern": "x", "definition": {"ha-mode": "all", "ha-sync-mode": "sometimes"}},
     'ha-sync-mode must be "manual" or "automatic", got "sometimes"'),
    ({"pattern": "x", "definition": {"ha-params": 2}}, "ha-mode must be specified"),
    ({"pattern": "x", "definition": {"message-ttl": -1}}, "-1 is not a valid message TTL"),
    ({"pattern": "x", "definition": {"overflow": "x"}}, '"x" is not a valid overflow value'),
    ({"pattern": "x", "definition": {}}, "no policy provided"),
    ({"pattern": "(", "definition": {"max-length": 1}}, "pattern should be regular expression but is invalid"),
    ({"pattern": "x", "apply-to": "things", "definition": {"max-length": 1}}, "apply-to \"things\" unrecognised"),
    ({"pattern": "x", "priority": "high", "definition": {"max-length": 1}}, "priority should be a number"),
    ({"definition": {"max-length": 1}}, "key_missing,pattern"),
]


@pytest.mark.parametrize("body,reason", INVALID_POLICIES, ids=[r for _, r in INVALID_POLICIES])
def test_an_invalid_policy_is_400_naming_the_problem_and_nothing_changes(http, name, body, reason):
    http.ok("PUT", f"/api/policies/%2F/{name}", {"pattern": "^keep$", "definition": {"max-length": 3}})
    try:
        status, out, _ = http("PUT", f"/api/policies/%2F/{name}", body)
        assert status == 400 and out["error"] == "bad_request" and reason in out["reason"], out
        assert http.ok("GET", f"/api/policies/%2F/{name}")["definition"] == {"max-length": 3}
    finally:
        http.ok("DELETE", f"/api/policies/%2F/{name}")


def test_a_body_that_is_not_json_is_400_not_json(http, name):
    status, out, _ = http("PUT", f"/api/policies/%2F/{name}", raw=b"{bad json")
    assert (status, out) == (400, {"error": "bad_request", "reason": "not_json"})
    assert http("GET", f"/api/policies/%2F/{name}")[0] == 404
    status, out, _ = http("PUT", "/api/policies/no-such-vhost/p", {"pattern": "x", "definition": {"max-length": 1}})
    assert status == 404


# ---------------------------------------------------------------- messages, bindings


def test_publish_and_get_over_http(http, name):
    http.ok("PUT", f"/api/queues/%2F/{name}", {})
    props = {"delivery_mode": 2, "headers": {"h": 1}, "content_type": "text/plain"}
    assert http.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                   {"routing_key": name, "payload": "hello", "payload_encoding": "string",
                    "properties": props}) == {"routed": True}
    assert http.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                   {"routing_key": name, "payload": base64.b64encode(b"\xff\x00").decode(),
                    "payload_encoding": "base64", "properties": {}}) == {"routed": True}
    assert http.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                   {"routing_key": name + "-nowhere", "payload": "x", "payload_encoding": "string",
                    "properties": {}}) == {"routed": False}
    got = http.ok("POST", f"/api/queues/%2F/{name}/get", {"count": 5, "ackmode": "ack_requeue_true",
                                                          "encoding": "auto", "truncate": 3})
    assert got == [
        {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": name, "message_count": 1,
         "properties": props, "payload": "hel", "payload_encoding": "string"},
        {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": name, "message_count": 0,
         "properties": {}, "payload": base64.b64encode(b"\xff\x00").decode(), "payload_encoding": "base64"}]
    again = http.ok("POST", f"/api/queues/%2F/{name}/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                            "encoding": "auto"})
    assert again[0]["redelivered"] is True and again[0]["payload"] == "hello"
    assert http.ok("GET", f"/api/queues/%2F/{name}")["messages"] == 1
    assert http("DELETE", f"/api/queues/%2F/{name}/contents")[0] == 204
    assert http.ok("GET", f"/api/queues/%2F/{name}")["messages"] == 0
    status, out, _ = http("POST", f"/api/queues/%2F/{name}/get", {"count": 1, "ackmode": "bogus", "encoding": "auto"})
    assert status == 400 and "ackmode" in out["reason"]
    http.ok("DELETE", f"/api/queues/%2F/{name}")


def test_bindings_are_created_listed_and_deleted_by_properties_key(http, name):
    http.ok("PUT", f"/api/queues/%2F/{name}", {})
    http.ok("PUT", f"/api/exchanges/%2F/{name}.x", {"type": "topic"})
    status, _, headers = http("POST", f"/api/bindings/%2F/e/{name}.x/q/{name}",
                              {"routing_key": "a.#", "arguments": {"k": "v"}})
    assert status == 201
    key = headers["Location"]
    listed = http.ok("GET", f"/api/bindings/%2F/e/{name}.x/q/{name}")
    assert listed == [{"source": f"{name}.x", "vhost": "/", "destination": name, "destination_type": "queue",
                       "routing_key": "a.#", "arguments": {"k": "v"}, "properties_key": key}]
    on_queue = http.ok("GET", f"/api/queues/%2F/{name}/bindings")
    assert [b["source"] for b in on_queue] == ["", f"{name}.x"]  # the default exchange's binding first
    assert http.ok("GET", f"/api/bindings/%2F/e/{name}.x/q/{name}/{key}") == listed[0]
    assert http("POST", f"/api/bindings/%2F/e/{name}.x/e/amq.direct", {"routing_key": "r"})[0] == 201
    assert len(http.ok("GET", f"/api/exchanges/%2F/{name}.x/bindings/source")) == 2
    assert http("DELETE", f"/api/bindings/%2F/e/{name}.x/q/{name}/{key}")[0] == 204
    assert http("DELETE", f"/api/bindings/%2F/e/{name}.x/q/{name}/{key}")[0] == 404
    assert http("DELETE", f"/api/bindings/%2F/e/{name}.x/e/amq.direct/r")[0] == 204
    assert http.ok("GET", f"/api/exchanges/%2F/{name}.x/bindings/source") == []
    x = http.ok("GET", f"/api/exchanges/%2F/{name}.x")
    assert {k: x[k] for k in EXCHANGE_FIELDS} == {"name": f"{name}.x", "vhost": "/", "type": "topic",
                                                  "durable": True, "auto_delete": False, "internal": False,
                                                  "arguments": {}}
    http.ok("DELETE", f"/api/exchanges/%2F/{name}.x")
    http.ok("DELETE", f"/api/queues/%2F/{name}")


def test_amqp_clients_show_as_connections_channels_and_consumers(http, node, name):
    conn = amqp(node, client_properties={"connection_name": name})
    try:
        ch = conn.channel()
        ch.queue_declare(name, auto_delete=True)
        ch.basic_qos(prefetch_count=3)
        ch.basic_consume(name, lambda *a: None, consumer_tag=f"{name}-tag")
        conns = [c for c in http.ok("GET", "/api/connections") if c["user_provided_name"] == name]
        assert len(conns) == 1
        c = conns[0]
        assert CONNECTION_FIELDS <= set(c)
        assert (c["user"], c["vhost"], c["node"], c["port"], c["channels"], c["state"]) == (
            "guest", "/", "hutch@localhost", node.amqp_port, 1, "running")
        assert c["client_properties"]["product"] == "Pika Python Client Library"
        assert http.ok("GET", "/api/connections/" + urllib.parse.quote(c["name"], safe=""))["name"] == c["name"]
        chans = [x for x in http.ok("GET", "/api/channels") if x["connection_details"]["name"] == c["name"]]
        assert len(chans) == 1 and CHANNEL_FIELDS <= set(chans[0])
        assert (chans[0]["number"], chans[0]["consumer_count"], chans[0]["prefetch_count"]) == (1, 1, 3)
        cons = [x for x in http.ok("GET", "/api/consumers/%2F") if x["queue"]["name"] == name]
        assert len(cons) == 1 and CONSUMER_FIELDS <= set(cons[0])
        assert cons[0]["consumer_tag"] == f"{name}-tag" and cons[0]["channel_details"]["name"] == chans[0]["name"]
        assert http.ok("GET", f"/api/queues/%2F/{name}")["consumer_details"][0]["consumer_tag"] == f"{name}-tag"
        status, _, _ = http("DELETE", "/api/connections/" + urllib.parse.quote(c["name"], safe=""),
                            headers={"X-Reason": "test says goodbye"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=5)
            conn.process_data_events(time_limit=5)
        assert closed.value.reply_code == 320 and "test says goodbye" in closed.value.reply_text
        wait_until(lambda: not [x for x in http.ok("GET", "/api/connections") if x["user_provided_name"] == name],
                   what="connection gone from the list")
    finally:
        if conn.is_open:
            conn.close()


def test_a_new_vhost_gets_its_creator_and_deleting_it_closes_its_connections(http, node, name):
    assert http("PUT", f"/api/vhosts/{name}", None)[0] == 201
    assert http.ok("GET", f"/api/vhosts/{name}")["name"] == name
    assert http.ok("GET", f"/api/permissions/{name}/guest") == {"user": "guest", "vhost": name, "configure": ".*",
                                                                "write": ".*", "read": ".*"}
    conn = amqp(node, virtual_host=name)
    ch = conn.channel()
    ch.queue_declare("inside", durable=True)
    assert http.ok("GET", f"/api/queues/{name}/inside")["vhost"] == name
    assert http("DELETE", f"/api/vhosts/{name}")[0] == 204
    ch.close()  # a moment after the answer, as with RabbitMQ: a channel closed right away gets its close-ok
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(time_limit=5)
        conn.process_data_events(time_limit=5)
    assert (closed.value.reply_code, closed.value.reply_text) == (320, f"CONNECTION_FORCED - vhost '{name}' is deleted")
    assert http("GET", f"/api/vhosts/{name}")[0] == 404
    assert all(p["vhost"] != name for p in http.ok("GET", "/api/permissions"))
    assert http("DELETE", f"/api/vhosts/{name}")[0] == 404


def test_users_and_permissions(http, node, name):
    assert http("PUT", f"/api/users/{name}", {"password": "s3cret", "tags": "management,policymaker"})[0] == 201
    u = http.ok("GET", f"/api/users/{name}")
    assert u["tags"] == ["management", "policymaker"] and u["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert Http(node.mgmt_port, name, "s3cret").ok("GET", "/api/whoami")["name"] == name
    status, out, _ = http("PUT", f"/api/permissions/%2F/{name}", {"configure": "(", "write": ".*", "read": ".*"})
    assert status == 400 and "configure" in out["reason"]
    assert http("GET", f"/api/permissions/%2F/{name}")[0] == 404
    assert http("PUT", f"/api/permissions/%2F/{name}", {"configure": "", "write": ".*", "read": ".*"})[0] == 201
    assert http.ok("GET", f"/api/users/{name}/permissions") == [
        {"user": name, "vhost": "/", "configure": "", "write": ".*", "read": ".*"}]
    status, out, _ = http("PUT", "/api/permissions/%2F/nobody", {"configure": "", "write": "", "read": ""})
    assert (status, out["reason"]) == (400, "vhost_or_user_not_found")
    assert http("PUT", f"/api/users/{name}", {"password_hash": u["password_hash"], "tags": ["monitoring"]})[0] == 204
    assert Http(node.mgmt_port, name, "s3cret").ok("GET", "/api/whoami")["tags"] == ["monitoring"]
    assert http("DELETE", f"/api/permissions/%2F/{name}")[0] == 204
    assert http("DELETE", f"/api/users/{name}")[0] == 204
    assert Http(node.mgmt_port, name, "s3cret")("GET", "/api/whoami")[0] == 401


def test_definitions_export_and_an_import_that_fails_changes_nothing(http, name):
    http.ok("PUT", f"/api/queues/%2F/{name}", {"durable": True})
    doc = http.ok("GET", "/api/definitions")
    assert {"rabbit_version", "users", "vhosts", "permissions", "policies", "queues", "exchanges",
            "bindings"} <= set(doc)
    assert any(q["name"] == name for q in doc["queues"])
    bad = {"queues": [{"name": f"{name}-new", "vhost": "/", "durable": True, "arguments": {}}],
           "policies": [{"vhost": "/", "name": f"{name}-p", "pattern": ".", "definition": {"nope": 1}}]}
    status, out, _ = http("POST", "/api/definitions", bad)
    assert status == 400 and "nope" in out["reason"]
    assert http("GET", f"/api/queues/%2F/{name}-new")[0] == 404
    good = {"queues": bad["queues"],
            "policies": [{"vhost": "/", "name": f"{name}-p", "pattern": f"^{name}-new$",
                          "definition": {"max-length": 2}}]}
    assert http("POST", "/api/definitions", good)[0] == 204
    assert http.ok("GET", f"/api/queues/%2F/{name}-new")["policy"] == f"{name}-p"
    for path in (f"/api/queues/%2F/{name}", f"/api/queues/%2F/{name}-new", f"/api/policies/%2F/{name}-p"):
        http.ok("DELETE", path)


def test_aliveness_and_health_checks(http):
    assert http.ok("GET", "/api/aliveness-test/%2F") == {"status": "ok"}
    assert http.ok("GET", "/api/healthchecks/node") == {"status": "ok"}
    assert http.ok("GET", "/api/healthchecks/node/hutch@localhost") == {"status": "ok"}
    assert http.ok("GET", "/api/health/checks/alarms") == {"status": "ok"}
    assert http("GET", "/api/aliveness-test/no-such-vhost")[0] == 404


def test_listings_filter_sort_and_paginate(http, name):
    http.ok("PUT", f"/api/vhosts/{name}")
    try:
        for q in ("abc", "abd", "xyz"):
            http.ok("PUT", f"/api/queues/{name}/{q}", {})
        assert [q["name"] for q in http.ok("GET", f"/api/queues/{name}?name=ab")] == ["abc", "abd"]
        assert [q["name"] for q in http.ok("GET", f"/api/queues/{name}?name=^x&use_regex=true")] == ["xyz"]
        assert [q["name"] for q in http.ok("GET", f"/api/queues/{name}?sort=name&sort_reverse=true")] == [
            "xyz", "abd", "abc"]
        assert http.ok("GET", f"/api/queues/{name}?columns=name,messages") == [
            {"name": n, "messages": 0} for n in ("abc", "abd", "xyz")]
        page = http.ok("GET", f"/api/queues/{name}?page=2&page_size=2")
        assert {k: page[k] for k in ("page", "page_count", "page_size", "item_count", "filtered_count",
                                     "total_count")} == {"page": 2, "page_count": 2, "page_size": 2, "item_count": 1,
                                                         "filtered_count": 3, "total_count": 3}
        assert [q["name"] for q in page["items"]] == ["xyz"]
        assert http("GET", f"/api/queues/{name}?page=3&page_size=2")[0] == 400
    finally:
        http.ok("DELETE", f"/api/vhosts/{name}")


def test_http_changes_are_durable_across_a_restart(name):
    with HutchNode() as n:
        h = Http(n.mgmt_port)
        h.ok("PUT", f"/api/queues/%2F/{name}", {"durable": True})
        h.ok("PUT", f"/api/policies/%2F/{name}", {**SEED_POLICIES["ha-two"], "pattern": f"^{name}$"})
        h.ok("PUT", f"/api/users/{name}", {"password": "pw", "tags": "management"})
        h.ok("PUT", f"/api/vhosts/{name}")
        n.restart()
        wait_until(lambda: h("GET", "/api/overview")[0] == 200, 10, "HTTP API back")
        assert h.ok("GET", f"/api/queues/%2F/{name}")["policy"] == name
        assert h.ok("GET", f"/api/policies/%2F/{name}")["definition"] == SEED_POLICIES["ha-two"]["definition"]
        assert Http(n.mgmt_port, name, "pw").ok("GET", "/api/whoami")["tags"] == ["management"]
        assert h.ok("GET", f"/api/vhosts/{name}")["name"] == name


def test_a_node_started_with_mgmt_port_0_serves_no_http(node):
    with HutchNode(mgmt_port=0) as n:
        assert n.mgmt_url is None
        assert "started HTTP listener" not in n.log()
    assert "started HTTP listener on" in node.log()
