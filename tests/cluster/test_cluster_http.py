"""The management HTTP API of a real 3-node hutch cluster: a change made through one node is a
catalogue command, so every node shows it and serves it (docs/design/catalogue.md).

Reads are local to each node, and every node applies the catalogue's commands in the same
order. So "nothing changed anywhere" after a refused request is checked honestly without
sleeping: a later, accepted change made through the same node is waited for on every node,
and the refused one would have been applied before it.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pika.exceptions
import pytest

from tests.support.brokers import wait_until
from tests.support.http import Http
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(120)

PROPAGATION_S = 10.0  # a committed change reaches every node's view well within this


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3, net_ticktime_s=2) as c:
        yield c


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def apis(cluster: HutchCluster) -> list[Http]:
    return [Http(n.mgmt_port) for n in cluster.nodes]


def on_every_node(cluster: HutchCluster, path: str, want_status: int = 200) -> list:
    """Wait until GET `path` answers `want_status` on every node; the bodies."""
    out = []
    for i, http in enumerate(apis(cluster)):
        wait_until(lambda http=http: http("GET", path)[0] == want_status, PROPAGATION_S,
                   f"GET {path} -> {want_status} on node {i + 1}")
        out.append(http("GET", path)[1])
    return out


def amqp(cluster: HutchCluster, i: int, vhost: str, user: str, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[i].amqp_port, vhost, pika.PlainCredentials(user, password), heartbeat=0))


def build_topology(cluster: HutchCluster, tag: str) -> dict:
    """Through node 1's API: a vhost, a user with permissions, an exchange, two queues (one
    homed on node 2 by the body's `node`, one placed by the locator), a binding and a policy."""
    http = apis(cluster)[0]
    t = {"vhost": f"cv-{tag}", "user": f"cu-{tag}", "password": "secret", "exchange": "orders",
         "queue": "orders.eu", "queue_here": "orders.here", "policy": "ttl"}
    v = q(t["vhost"])
    assert http("PUT", f"/api/vhosts/{v}", {"description": "cluster test"})[0] == 201
    assert http("PUT", f"/api/users/{t['user']}", {"password": t["password"], "tags": "management"})[0] == 201
    assert http("PUT", f"/api/permissions/{v}/{t['user']}",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert http("PUT", f"/api/exchanges/{v}/orders", {"type": "topic", "durable": True})[0] == 201
    assert http("PUT", f"/api/queues/{v}/{t['queue']}", {"durable": True, "node": cluster.names[1]})[0] == 201
    assert http("PUT", f"/api/queues/{v}/{t['queue_here']}", {"durable": False})[0] == 201
    status, _ = http("POST", f"/api/bindings/{v}/e/orders/q/{t['queue']}", {"routing_key": "eu.#"})
    assert status == 201
    assert http("PUT", f"/api/policies/{v}/ttl", {"pattern": "^orders\\.", "apply-to": "queues",
                                                   "definition": {"message-ttl": 60000}, "priority": 1})[0] == 201
    return t


def test_objects_created_through_one_node_are_visible_on_every_node(cluster):
    t = build_topology(cluster, uuid.uuid4().hex[:8])
    v = q(t["vhost"])
    user = on_every_node(cluster, f"/api/users/{t['user']}")
    assert all(u["tags"] == ["management"] for u in user)
    on_every_node(cluster, f"/api/vhosts/{v}")
    perms = on_every_node(cluster, f"/api/permissions/{v}/{t['user']}")
    assert all((p["configure"], p["write"], p["read"]) == (".*", ".*", ".*") for p in perms)
    exchanges = on_every_node(cluster, f"/api/exchanges/{v}/orders")
    assert all((x["type"], x["durable"]) == ("topic", True) for x in exchanges)
    bindings = on_every_node(cluster, f"/api/bindings/{v}/e/orders/q/{t['queue']}")
    assert all([b["routing_key"] for b in bs] == ["eu.#"] for bs in bindings)
    policies = on_every_node(cluster, f"/api/policies/{v}/ttl")
    assert all((p["pattern"], p["apply-to"], p["priority"], p["definition"]) ==
               ("^orders\\.", "queues", 1, {"message-ttl": 60000}) for p in policies)
    # /api/queues on every node lists both queues, each on its home node, with the policy
    homes = {t["queue"]: cluster.names[1], t["queue_here"]: cluster.names[0]}
    for i, http in enumerate(apis(cluster)):
        def listed(http=http):
            rows = {r["name"]: r for r in http.get("/api/queues") if r["vhost"] == t["vhost"]}
            return {n: (r["node"], r["policy"]) for n, r in rows.items()}
        wait_until(lambda listed=listed: listed() == {n: (h, "ttl") for n, h in homes.items()}, PROPAGATION_S,
                   f"queues with their homes and policy on node {i + 1}")


def test_a_queue_declared_through_one_node_is_found_at_once_through_another(cluster):
    """Reads are local, but a GET, a passive declare or a bind that misses an object first waits
    for the catalogue to catch up (a barrier): what a client declared through node 1 is never a
    404 on node 3 the moment after, over AMQP or HTTP, as RabbitMQ's synchronously replicated
    metadata is not; a queue that does not exist is still a 404."""
    one, three = apis(cluster)[0], apis(cluster)[2]
    params = [pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0) for i in (0, 2)]
    conn, conn3 = pika.BlockingConnection(params[0]), pika.BlockingConnection(params[1])
    try:
        ch, ch3 = conn.channel(), conn3.channel()
        for i in range(20):
            name = f"ryw.{uuid.uuid4().hex[:8]}.{i}"
            if i % 2:
                ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            else:
                assert one("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})[0] == 201
            if i % 4 < 2:
                status, body = three("GET", f"/api/queues/%2F/{q(name)}")
                assert status == 200 and body["name"] == name, (name, status, body)
            else:  # over AMQP: a passive declare and a bind through node 3
                assert ch3.queue_declare(name, passive=True).method.queue == name
                ch3.queue_bind(name, "amq.direct", routing_key=name)
            ch.exchange_declare(name, "fanout")  # any object a GET reads: an exchange too
            assert three("GET", f"/api/exchanges/%2F/{q(name)}")[0] == 200, name
        assert three("GET", "/api/queues/%2F/ryw.never-declared")[0] == 404
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch3.queue_declare("ryw.never-declared", passive=True)
        assert e.value.reply_code == 404
    finally:
        conn.close()
        conn3.close()


def test_topology_created_through_one_node_is_usable_over_amqp_on_the_others(cluster):
    t = build_topology(cluster, uuid.uuid4().hex[:8])
    v = q(t["vhost"])
    on_every_node(cluster, f"/api/bindings/{v}/e/orders/q/{t['queue']}")
    on_every_node(cluster, f"/api/permissions/{v}/{t['user']}")
    c3 = amqp(cluster, 2, t["vhost"], t["user"], t["password"])
    c2 = amqp(cluster, 1, t["vhost"], t["user"], t["password"])
    try:
        ch3 = c3.channel()
        ch3.confirm_delivery()
        ch3.basic_publish("orders", "eu.fr", b"order-1", mandatory=True)  # confirmed, routed: no exception
        ch2 = c2.channel()
        method, _props, body = ch2.basic_get(t["queue"], auto_ack=True)
        assert body == b"order-1" and method.routing_key == "eu.fr" and method.exchange == "orders"
    finally:
        c3.close()
        c2.close()


def test_deletes_through_another_node_propagate_to_every_node(cluster):
    t = build_topology(cluster, uuid.uuid4().hex[:8])
    v = q(t["vhost"])
    binding = f"/api/bindings/{v}/e/orders/q/{t['queue']}"
    keys = on_every_node(cluster, binding)
    key = q(keys[1][0]["properties_key"])
    http2 = apis(cluster)[1]
    assert http2("DELETE", f"{binding}/{key}")[0] == 204
    for i, http in enumerate(apis(cluster)):
        wait_until(lambda http=http: http.get(binding) == [], PROPAGATION_S, f"binding gone on node {i + 1}")
    for path in (f"/api/policies/{v}/ttl", f"/api/queues/{v}/{t['queue']}", f"/api/queues/{v}/{t['queue_here']}",
                 f"/api/exchanges/{v}/orders", f"/api/permissions/{v}/{t['user']}"):
        on_every_node(cluster, path)
        assert http2("DELETE", path)[0] == 204, path
        on_every_node(cluster, path, want_status=404)
    assert http2("DELETE", f"/api/users/{t['user']}")[0] == 204
    on_every_node(cluster, f"/api/users/{t['user']}", want_status=404)
    assert http2("DELETE", f"/api/vhosts/{v}")[0] == 204
    on_every_node(cluster, f"/api/vhosts/{v}", want_status=404)
    # deleting what is not there is a 404, as on a single node
    assert http2("DELETE", f"/api/vhosts/{v}")[0] == 404


def test_vhost_delete_takes_its_objects_with_it_on_every_node(cluster):
    t = build_topology(cluster, uuid.uuid4().hex[:8])
    v = q(t["vhost"])
    on_every_node(cluster, f"/api/queues/{v}/{t['queue']}")
    assert apis(cluster)[2]("DELETE", f"/api/vhosts/{v}")[0] == 204
    on_every_node(cluster, f"/api/vhosts/{v}", want_status=404)
    for http in apis(cluster):
        assert not [r for r in http.get("/api/queues") if r["vhost"] == t["vhost"]]
        assert not [p for p in http.get("/api/permissions") if p["vhost"] == t["vhost"]]
        assert not [p for p in http.get("/api/policies") if p["vhost"] == t["vhost"]]


@pytest.mark.parametrize(("path", "body", "raw", "reason"), [
    ("/api/policies/%2F/bad", {"pattern": "(", "definition": {"message-ttl": 1}}, None, "pattern"),
    ("/api/policies/%2F/bad", {"pattern": ".*", "apply-to": "nothing", "definition": {"message-ttl": 1}}, None,
     "apply-to"),
    ("/api/exchanges/%2F/bad", None, b"{not json", "not_json"),
    ("/api/queues/%2F/bad", {"arguments": {"x-max-length": "ten"}}, None, "x-max-length"),
], ids=["bad-pattern", "unknown-apply-to", "bad-json", "bad-queue-argument"])
def test_a_bad_request_is_400_with_a_reason_and_changes_nothing_on_any_node(cluster, path, body, raw, reason):
    http = apis(cluster)[0]
    status, out = http("PUT", path, body, raw=raw)
    assert status == 400 and out["error"] == "bad_request" and reason in out["reason"], (status, out)
    # a later accepted change through the same node, seen on every node: the refused one, had it
    # been proposed, would have been applied before it
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    assert http("PUT", f"/api/exchanges/%2F/{marker}", {"type": "fanout"})[0] == 201
    on_every_node(cluster, f"/api/exchanges/%2F/{marker}")
    on_every_node(cluster, path, want_status=404)
    assert http("DELETE", f"/api/exchanges/%2F/{marker}")[0] == 204


def test_an_inequivalent_redeclare_through_another_node_is_400_with_rabbitmqs_reason(cluster):
    name = f"ineq-{uuid.uuid4().hex[:8]}"
    h1, h3 = apis(cluster)[0], apis(cluster)[2]
    assert h1("PUT", f"/api/exchanges/%2F/{name}", {"type": "direct"})[0] == 201
    on_every_node(cluster, f"/api/exchanges/%2F/{name}")
    status, out = h3("PUT", f"/api/exchanges/%2F/{name}", {"type": "fanout"})
    assert status == 400
    assert out["reason"] == (f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                             "received 'fanout' but current is 'direct'")
    assert all(x["type"] == "direct" for x in on_every_node(cluster, f"/api/exchanges/%2F/{name}"))
    assert h3("DELETE", f"/api/exchanges/%2F/{name}")[0] == 204


def test_definitions_imported_through_one_node_are_on_every_node(cluster):
    tag = uuid.uuid4().hex[:8]
    vhost = f"cd-{tag}"
    doc = {
        "vhosts": [{"name": vhost}],
        "users": [{"name": f"du-{tag}", "password": "pw", "tags": ""}],
        "permissions": [{"user": f"du-{tag}", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "policies": [{"vhost": vhost, "name": "lim", "pattern": ".*", "apply-to": "queues",
                      "definition": {"max-length": 10}, "priority": 0}],
        "exchanges": [{"name": "in", "vhost": vhost, "type": "fanout", "durable": True}],
        "queues": [{"name": "work", "vhost": vhost, "durable": True, "arguments": {}}],
        "bindings": [{"source": "in", "vhost": vhost, "destination": "work", "destination_type": "queue",
                      "routing_key": "", "arguments": {}},
                     {"source": "in", "vhost": vhost, "destination": "missing", "destination_type": "queue",
                      "routing_key": "", "arguments": {}}],
    }
    http2 = apis(cluster)[1]
    assert http2("POST", "/api/definitions", doc)[0] == 204
    v = q(vhost)
    for path in (f"/api/users/du-{tag}", f"/api/permissions/{v}/du-{tag}", f"/api/policies/{v}/lim",
                 f"/api/exchanges/{v}/in"):
        on_every_node(cluster, path)
    queues = on_every_node(cluster, f"/api/queues/{v}/work")
    assert {r["node"] for r in queues} == {cluster.names[1]}  # client-local: the node that imported it
    assert all(bs and bs[0]["destination"] == "work" for bs in on_every_node(cluster, f"/api/bindings/{v}/e/in/q/work"))
    conn = amqp(cluster, 0, vhost, f"du-{tag}", "pw")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("in", "", b"imported")
        assert ch.basic_get("work", auto_ack=True)[2] == b"imported"
    finally:
        conn.close()
    # a document the catalogue would refuse is refused whole, before anything is proposed
    bad = {"vhosts": [{"name": f"never-{tag}"}],
           "permissions": [{"user": "guest", "vhost": f"never-{tag}", "configure": "(", "write": "", "read": ""}]}
    status, out = http2("POST", "/api/definitions", bad)
    assert status == 400 and "not a valid regular expression" in out["reason"], out
    marker = f"marker-{tag}"
    assert http2("PUT", f"/api/exchanges/%2F/{marker}", {"type": "fanout"})[0] == 201
    on_every_node(cluster, f"/api/exchanges/%2F/{marker}")
    on_every_node(cluster, f"/api/vhosts/{q('never-' + tag)}", want_status=404)
    assert http2("DELETE", f"/api/vhosts/{v}")[0] == 204


# The fields RabbitMQ 3.10's /api/nodes object has that a hutch node reports about itself;
# every member is listed on every node with them (what a peer last reported, with `running` now).
NODE_FIELDS = {"name", "type", "running", "mem_used", "mem_limit", "mem_alarm", "disk_free", "disk_free_limit",
               "disk_free_alarm", "fd_used", "fd_total", "sockets_used", "proc_used", "uptime", "partitions"}


def test_every_node_lists_every_member_in_api_nodes_with_rabbitmqs_fields(cluster):
    names = set(cluster.names)
    for http in apis(cluster):
        def complete(http=http) -> bool:
            nodes = http.get("/api/nodes")
            return {n["name"] for n in nodes} == names and all(NODE_FIELDS <= set(n) for n in nodes)
        wait_until(complete, PROPAGATION_S, "full node objects")
        for n in http.get("/api/nodes"):
            assert n["running"] is True and n["type"] == "disc" and n["partitions"] == []
    status = apis(cluster)[1].get("/api/hutch/cluster")
    assert set(status["running_nodes"]) == names and status["leader"] in names
    assert apis(cluster)[2].get(f"/api/nodes/{q(cluster.names[0])}")["name"] == cluster.names[0]


def test_connections_and_channels_are_listed_cluster_wide_from_any_node(cluster):
    conns = [amqp(cluster, i, "/", "guest", "guest") for i in range(3)]
    try:
        for c in conns:
            c.channel()
        for http in apis(cluster):
            rows = http.get("/api/connections")
            nodes = {r["node"] for r in rows}
            assert set(cluster.names) <= nodes, nodes
            assert len(rows) >= 3
            chans = http.get("/api/channels")
            assert set(cluster.names) <= {r["node"] for r in chans}
    finally:
        for c in conns:
            c.close()


def test_a_change_without_a_majority_is_503_and_changes_nothing(cluster):
    """Last in this module: it leaves node 1 alone."""
    cluster.kill(1)
    cluster.kill(2)
    http = apis(cluster)[0]
    name = f"lonely-{uuid.uuid4().hex[:8]}"
    status, out = http("PUT", f"/api/vhosts/{name}")
    assert status == 503 and out["error"] == "timeout" and "timed out" in out["reason"], (status, out)
    assert http("GET", f"/api/vhosts/{name}")[0] == 404
