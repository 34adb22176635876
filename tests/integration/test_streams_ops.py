"""Operating streams on one node: hutch-streams (rabbitmq-streams' commands), the stream fields of
the management API's queue objects and of hutchctl list_queues, super streams, and the stream
connection, consumer and publisher listings.

The commands run as a user runs them (a subprocess against the node's HTTP API); what they print
is rabbitmq-streams' banners, columns, messages and errors.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hutch.streamproto import frames as f
from tests.support.brokers import HutchNode, free_port, wait_until
from tests.support.stream_client import amqp_body, raw

STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


@pytest.fixture
def name() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


@pytest.fixture
def ch(node):
    c = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = c.channel()
    channel.confirm_delivery()
    yield channel
    c.close()


def tool(node, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--url", node.mgmt_url, *args], capture_output=True,
                          text=True, timeout=60)


def streams(node, *args: str) -> subprocess.CompletedProcess:
    return tool(node, "hutch.cli.streams", *args)


def api(node, path: str, method: str = "GET", body=None):
    req = urllib.request.Request(node.mgmt_url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def api_error(node, path: str, method: str = "GET", body=None) -> tuple[int, dict]:
    with pytest.raises(urllib.error.HTTPError) as e:
        api(node, path, method, body)
    return e.value.code, json.loads(e.value.read())


def publish(ch, stream: str, n: int) -> None:
    for i in range(n):
        ch.basic_publish("", stream, f"m{i}".encode())


# ---------------------------------------------------------------- the queue object of a stream

def test_the_queue_object_of_a_stream_has_its_type_members_leader_and_committed_messages(node, ch, name):
    ch.queue_declare(name, durable=True, arguments={**STREAM, "x-max-age": "7D"})
    publish(ch, name, 25)
    info = api(node, f"/api/queues/%2F/{name}")
    assert info["type"] == "stream"
    assert info["members"] == [node.name] and info["leader"] == node.name and info["online"] == [node.name]
    assert info["arguments"] == {"x-queue-type": "stream", "x-max-age": "7D"}
    assert (info["messages"], info["messages_ready"], info["messages_unacknowledged"]) == (25, 25, 0)
    assert info["committed_offset"] == 24 and info["segments"] == 1 and info["message_bytes"] > 0
    (row,) = [r for r in api(node, "/api/queues/%2F?columns=name,type,messages,members") if r["name"] == name]
    assert row == {"name": name, "type": "stream", "messages": 25, "members": [node.name]}


def test_a_policy_on_a_stream_shows_its_keys_as_the_effective_definition(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    api(node, f"/api/policies/%2F/{name}", "PUT",
        {"pattern": f"^{name}$", "definition": {"max-age": "1h", "max-length-bytes": 1000000},
         "apply-to": "queues"})
    try:
        info = api(node, f"/api/queues/%2F/{name}")
        assert info["policy"] == name
        assert info["effective_policy_definition"] == {"max-age": "1h", "max-length-bytes": 1000000}
    finally:
        api(node, f"/api/policies/%2F/{name}", "DELETE")


def test_hutchctl_list_queues_shows_a_stream_with_its_type_and_members(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    publish(ch, name, 3)
    p = tool(node, "hutch.cli.ctl", "--formatter", "json", "list_queues", "name", "type", "messages", "leader",
             "members", "online")
    assert p.returncode == 0, p.stderr
    (row,) = [r for r in json.loads(p.stdout) if r["name"] == name]
    assert row == {"name": name, "type": "stream", "messages": 3, "leader": node.name, "members": [node.name],
                   "online": [node.name]}


# ---------------------------------------------------------------- stream_status

def test_stream_status_prints_one_row_per_member_in_rabbitmq_streams_columns(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    publish(ch, name, 40)
    p = streams(node, "stream_status", name)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"Status of stream {name} on node {node.name} ..."
    assert lines[1] == "role\tnode\tepoch\toffset\tcommitted_offset\tfirst_offset\treaders\tsegments\tbytes"
    role, member, epoch, offset, committed, first, readers, segments, size = lines[2].split("\t")
    assert (role, member, offset, committed, first, readers, segments) == ("writer", node.name, "39", "39", "0",
                                                                         "0", "1")
    assert int(epoch) >= 1 and int(size) > 0
    assert len(lines) == 3


def test_stream_status_counts_the_readers_of_a_replica(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(name, lambda *_a: None, arguments={"x-stream-offset": "first"})
    (row,) = json.loads(streams(node, "--formatter", "json", "stream_status", name).stdout)
    assert row["readers"] == 1
    assert api(node, f"/api/queues/%2F/{name}")["readers"] == 1


def test_stream_status_tracking_lists_the_writers_publishing_sequences(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    publish(ch, name, 7)
    p = streams(node, "--formatter", "json", "stream_status", "--tracking", name)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [(r["type"], r["value"]) for r in rows] == [("sequence", 7)]


def test_stream_status_of_other_queue_types_and_of_no_queue_fails_as_rabbitmq_streams(node, ch, name):
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    p = streams(node, "stream_status", name)
    assert p.returncode == 69 and p.stderr == "Error:\nCannot get stream status of a quorum queue\n"
    classic = name + ".c"
    ch.queue_declare(classic, auto_delete=True)
    p = streams(node, "stream_status", classic)
    assert p.returncode == 69 and p.stderr == "Error:\nCannot get stream status of a classic queue\n"
    p = streams(node, "stream_status", name + ".none")
    assert p.returncode == 69
    assert p.stderr == f"Error:\n{{:error, :not_found}}: queue '{name}.none' in vhost '/' does not exist\n"
    ch.queue_delete(name)


# ---------------------------------------------------------------- replicas on one node

def test_replica_commands_refuse_what_rabbitmq_streams_refuses(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    p = streams(node, "delete_replica", name, node.name)
    assert p.stdout == f"Removing a replica of queue {name} on node {node.name}...\n"
    assert p.returncode == 69 and p.stderr == "Error:\nCannot delete the last member of a stream\n"
    p = streams(node, "add_replica", name, "nobody@nowhere")
    assert p.returncode == 69 and "node nobody@nowhere is not a member of the cluster" in p.stderr
    p = streams(node, "add_replica", name, node.name)
    assert p.returncode == 69 and "already a member" in p.stderr
    quorum = name + ".q"
    ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    p = streams(node, "add_replica", quorum, node.name)
    assert p.returncode == 69 and p.stderr == "Error:\nCannot add replicas to a quorum queue\n"
    p = streams(node, "delete_replica", quorum, node.name)
    assert p.returncode == 69 and p.stderr == "Error:\nCannot delete replicas from a quorum queue\n"
    ch.queue_delete(quorum)
    assert api(node, f"/api/queues/%2F/{name}")["members"] == [node.name]


# ---------------------------------------------------------------- super streams

def test_add_super_stream_makes_the_exchange_the_partitions_and_ordered_bindings(node, ch, name):
    p = streams(node, "add_super_stream", name, "--partitions", "3")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"Adding a super stream...\nSuper stream {name} has been created\n"
    x = api(node, f"/api/exchanges/%2F/{name}")
    assert (x["type"], x["durable"], x["arguments"]) == ("direct", True, {"x-super-stream": True})
    bindings = api(node, f"/api/exchanges/%2F/{name}/bindings/source")
    assert sorted((b["destination"], b["routing_key"], b["arguments"]["x-stream-partition-order"])
                  for b in bindings) == [(f"{name}-0", "0", 0), (f"{name}-1", "1", 1), (f"{name}-2", "2", 2)]
    for i in range(3):
        q = api(node, f"/api/queues/%2F/{name}-{i}")
        assert q["type"] == "stream" and q["arguments"]["x-queue-leader-locator"] == "balanced"
    # routed by key: the exchange delivers into the partition bound with it
    ch.basic_publish(name, "1", b"to partition 1")
    assert [api(node, f"/api/queues/%2F/{name}-{i}")["messages"] for i in range(3)] == [0, 1, 0]
    p = streams(node, "add_super_stream", name, "--partitions", "2")
    assert p.returncode == 70 and p.stderr == f"Error:\nthere is already an exchange named {name}\n"
    p = streams(node, "delete_super_stream", name)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"Deleting a super stream...\nSuper stream {name} has been deleted\n"
    names = {q["name"] for q in api(node, "/api/queues/%2F?columns=name")}
    assert not {f"{name}-{i}" for i in range(3)} & names
    assert name not in {x["name"] for x in api(node, "/api/exchanges/%2F?columns=name")}


def test_add_super_stream_with_binding_keys_and_stream_arguments(node, name):
    p = streams(node, "add_super_stream", name, "--binding-keys", "amer, emea,apac", "--max-age", "P1DT2H",
                "--max-length-bytes", "2gb", "--stream-max-segment-size-bytes", "50mb",
                "--leader-locator", "client-local")
    assert p.returncode == 0, p.stderr
    try:
        for order, key in enumerate(("amer", "emea", "apac")):
            q = api(node, f"/api/queues/%2F/{name}-{key}")
            assert q["arguments"] == {"x-queue-type": "stream", "x-max-age": "93600s",
                                      "x-max-length-bytes": 2_000_000_000,
                                      "x-stream-max-segment-size-bytes": 50_000_000,
                                      "x-queue-leader-locator": "client-local"}
            (b,) = [b for b in api(node, f"/api/queues/%2F/{name}-{key}/bindings") if b["source"] == name]
            assert (b["routing_key"], b["arguments"]) == (key, {"x-stream-partition-order": order})
    finally:
        assert streams(node, "delete_super_stream", name).returncode == 0


def test_add_super_stream_refuses_before_changing_anything(node, ch, name):
    ch.queue_declare(f"{name}-1", durable=True, arguments=STREAM)
    p = streams(node, "add_super_stream", name, "--partitions", "3")
    assert p.returncode == 70 and p.stderr == f"Error:\nthere is already a queue named {name}-1\n"
    assert name not in {x["name"] for x in api(node, "/api/exchanges/%2F?columns=name")}
    assert f"{name}-0" not in {q["name"] for q in api(node, "/api/queues/%2F?columns=name")}
    for args, text in ((["--partitions", "2", "--binding-keys", "a"], "Specify --partitions or --binding-keys, not both."),
                       (["--partitions", "0"], "The partition number must be greater than 0"),
                       (["--max-age", "10 minutes"], "Invalid value for --max-age"),
                       (["--max-length-bytes", "lots"], "Invalid value for --max-length-bytes")):
        p = streams(node, "add_super_stream", name + "x", *args)
        assert p.returncode == 64 and text in p.stderr, (args, p.stderr)
    code, err = api_error(node, f"/api/stream/super-streams/%2F/{name}x", "PUT",
                          {"partitions": 2, "arguments": {"max-age": "forever"}})
    assert code == 400 and err["reason"] == (f"invalid arg 'x-max-age' for queue '{name}x-0' in vhost '/': "
                                             "invalid_max_age")
    code, err = api_error(node, f"/api/stream/super-streams/%2F/{name}x", "PUT", {})
    assert (code, err["reason"]) == (400, "Must specify partitions or binding keys")
    assert name + "x" not in {x["name"] for x in api(node, "/api/exchanges/%2F?columns=name")}
    ch.queue_delete(f"{name}-1")


def test_delete_super_stream_of_no_super_stream_fails(node, name):
    p = streams(node, "delete_super_stream", name)
    assert p.returncode == 70 and p.stderr == "Error:\n{:error, :stream_not_found}\n"


# ---------------------------------------------------------------- listings

def test_the_stream_listings_answer_empty_lists_without_stream_connections(node):
    for path in ("/api/stream/connections", "/api/stream/connections/%2F", "/api/stream/consumers",
                 "/api/stream/consumers/%2F", "/api/stream/publishers", "/api/stream/publishers/%2F"):
        assert api(node, path) == [], path
    p = streams(node, "list_stream_connections")
    assert (p.returncode, p.stdout) == (0, "Listing stream connections ...\n")
    for cmd, banner in (("list_stream_consumers", "Listing stream consumers ..."),
                        ("list_stream_publishers", "Listing stream publishers ...")):
        p = streams(node, cmd)
        assert (p.returncode, p.stdout) == (0, banner + "\n"), cmd
    p = streams(node, "--formatter", "json", "list_stream_consumers", "stream", "offset_lag")
    assert (p.returncode, json.loads(p.stdout)) == (0, [])


def test_the_stream_listings_show_a_connection_its_publisher_and_its_consumer(node, name):
    """What a stream-protocol client does shows in the listings while it is connected: the
    connection (user, vhost, client properties), its publisher's published and confirmed counts,
    its subscription's consumed messages and offset; nothing once it has gone."""
    with raw(node) as c:
        assert c.call(f.Create(c.cid(), name, {})).code == f.OK
        assert c.call(f.DeclarePublisher(c.cid(), 7, "listed", name)).code == f.OK
        c.send(f.Publish(7, [(i, amqp_body(f"m{i}")) for i in range(1, 6)]))
        assert sorted(c.recv(f.PublishConfirm).publishing_ids) == [1, 2, 3, 4, 5]
        assert c.call(f.Subscribe(c.cid(), 3, name, f.OFFSET_TYPE_FIRST, None, 10, {})).code == f.OK
        c.recv(f.Deliver, f.DeliverV2)
        (conn,) = [x for x in api(node, "/api/stream/connections") if x["user"] == "guest"]
        assert conn["vhost"] == "/" and conn["protocol"] == "stream" and conn["subscriptions"] == 1
        assert conn["client_properties"].get("product") == "hutch tests"
        (pub,) = api(node, "/api/stream/publishers/%2F")
        assert (pub["publisher_id"], pub["reference"], pub["published"], pub["confirmed"]) == (7, "listed", 5, 5)
        assert pub["queue"] == {"name": name, "vhost": "/"}
        (sub,) = api(node, "/api/stream/consumers/%2F")
        assert (sub["subscription_id"], sub["consumed"], sub["offset"]) == (3, 5, 4)
        p = streams(node, "list_stream_connections", "user", "vhost")
        assert p.returncode == 0 and "guest" in p.stdout
    wait_until(lambda: api(node, "/api/stream/connections") == [], 10, "the connection gone from the listing")
    assert api(node, "/api/stream/consumers") == [] and api(node, "/api/stream/publishers") == []


def test_the_stream_listings_check_their_columns(node):
    p = streams(node, "list_stream_publishers", "stream", "nonsense")
    assert p.returncode == 64 and "Info key(s) nonsense are not supported" in p.stderr
    assert "messages_published" in p.stderr and "reference" in p.stderr


def test_a_group_that_does_not_exist_is_reported_as_rabbitmq_streams_does(node, ch, name):
    ch.queue_declare(name, durable=True, arguments=STREAM)
    p = streams(node, "list_stream_group_consumers", "--stream", name, "--reference", "app")
    assert p.returncode == 70 and p.stderr == "Error:\nThe group does not exist\n"
    p = streams(node, "list_stream_group_consumers", "--stream", name)
    assert p.returncode == 64


# ---------------------------------------------------------------- Prometheus

def test_prometheus_reports_a_stream_with_its_figures_and_its_raft_group():
    port = free_port()
    with HutchNode(extra_args=["--prometheus-port", str(port)]) as n:
        c = pika.BlockingConnection(pika.URLParameters(n.url))
        ch = c.channel()
        ch.confirm_delivery()
        ch.queue_declare("prom.s", durable=True, arguments=STREAM)
        publish(ch, "prom.s", 4)
        c.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/per-object", timeout=10) as resp:
            families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
        ready = {s.labels["queue"]: s.value for s in families["rabbitmq_queue_messages_ready"].samples}
        assert ready["prom.s"] == 4
        terms = {s.labels["queue"]: s.value for s in families["rabbitmq_raft_term"].samples}
        assert terms["prom.s"] >= 1
