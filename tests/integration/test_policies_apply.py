"""Policies and operator policies act on queues and exchanges of a real node.

Each test sets policies the way an operator does (hutchctl or the HTTP API), then watches the
queue with a real AMQP client (pika) and the management API: limits, TTLs, dead-lettering,
alternate exchanges, the precedence of `x-` arguments, policies and operator policies, and the
re-application of a changed policy to messages already queued.
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
import uuid
from pathlib import Path

import pika
import pytest

from tests.support.brokers import HutchNode, wait_until

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


def ctl(node, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=node.mgmt_url)
    return subprocess.run([str(BIN / "hutchctl"), *args], capture_output=True, text=True, env=env, timeout=60)


def ok(node, *args: str) -> str:
    r = ctl(node, *args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def http(node, method: str, path: str, body=None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(node.mgmt_url + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def queue_json(node, name: str) -> dict:
    status, q = http(node, "GET", "/api/queues/%2F/" + urllib.parse.quote(name, safe=""))
    assert status == 200, (status, q)
    return q


def ready(node, name: str) -> int:
    return queue_json(node, name)["messages_ready"]


@pytest.fixture
def ch(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = conn.channel()
    yield channel
    conn.close()


@pytest.fixture
def names(node):
    """A unique prefix for a test's queues and policies; its policies are cleared afterwards."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    yield prefix
    for kind in ("policies", "operator-policies"):
        status, items = http(node, "GET", f"/api/{kind}/%2F")
        for p in items if status == 200 else []:
            if p["name"].startswith(prefix):
                http(node, "DELETE", f"/api/{kind}/%2F/{p['name']}")


def publish(ch, queue: str, n: int, body: bytes = b"m", **props) -> None:
    for i in range(n):
        ch.basic_publish("", queue, body + str(i).encode(), pika.BasicProperties(**props))


def test_reproduction_message_ttl_and_max_length_by_policy(node, ch):
    """hutchctl set_policy ttlq '^t\\.' '{"message-ttl":1000,"max-length":2}' --apply-to queues"""
    ok(node, "set_policy", "ttlq", "^t\\.", '{"message-ttl":1000,"max-length":2}', "--apply-to", "queues")
    try:
        q = f"t.{uuid.uuid4().hex[:6]}"
        ch.queue_declare(q)
        ch.confirm_delivery()
        publish(ch, q, 3)
        assert ch.queue_declare(q, passive=True).method.message_count == 2
        j = queue_json(node, q)
        assert j["policy"] == "ttlq"
        assert j["effective_policy_definition"] == {"message-ttl": 1000, "max-length": 2}
        wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 0, 5, "messages expire")
    finally:
        ok(node, "clear_policy", "ttlq")


def test_each_key_on_a_classic_queue(node, ch, names):
    p = names
    ch.exchange_declare(f"{p}.dlx", "direct")
    ch.queue_declare(f"{p}.dead")
    ch.queue_bind(f"{p}.dead", f"{p}.dlx", "dead-rk")
    ok(node, "set_policy", f"{p}-bytes", f"^{p}\\.bytes$", '{"max-length-bytes":10}', "--apply-to", "queues")
    ok(node, "set_policy", f"{p}-reject", f"^{p}\\.reject$", '{"max-length":1,"overflow":"reject-publish"}')
    ok(node, "set_policy", f"{p}-dl", f"^{p}\\.dl$",
       json.dumps({"dead-letter-exchange": f"{p}.dlx", "dead-letter-routing-key": "dead-rk", "queue-mode": "lazy"}))
    ok(node, "set_policy", f"{p}-exp", f"^{p}\\.exp$", '{"expires":300}')
    ok(node, "set_policy", f"{p}-limit", f"^{p}\\.limit$", '{"delivery-limit":1}')

    # max-length-bytes: 10 bytes of bodies at most, heads dropped
    ch.queue_declare(f"{p}.bytes")
    publish(ch, f"{p}.bytes", 4, b"abcd")  # 5 bytes each
    wait_until(lambda: queue_json(node, f"{p}.bytes")["message_bytes_ready"] == 10, 5, "byte limit")
    assert ready(node, f"{p}.bytes") == 2

    # overflow reject-publish: the second publish is nacked
    ch.queue_declare(f"{p}.reject")
    ch.confirm_delivery()
    ch.basic_publish("", f"{p}.reject", b"one")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", f"{p}.reject", b"two")
    assert ready(node, f"{p}.reject") == 1

    # dead-letter-exchange and dead-letter-routing-key: a rejected message goes there, with x-death
    ch.queue_declare(f"{p}.dl")
    ch.basic_publish("", f"{p}.dl", b"bad")
    method, _props, _body = ch.basic_get(f"{p}.dl")
    ch.basic_reject(method.delivery_tag, requeue=False)
    wait_until(lambda: ready(node, f"{p}.dead") == 1, 5, "dead letter arrives")
    _m, props, body = ch.basic_get(f"{p}.dead", auto_ack=True)
    assert body == b"bad"
    death = props.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == f"{p}.dl"
    assert queue_json(node, f"{p}.dl")["effective_policy_definition"]["queue-mode"] == "lazy"

    # expires: an unused queue is deleted
    ch.queue_declare(f"{p}.exp")
    wait_until(lambda: http(node, "GET", f"/api/queues/%2F/{p}.exp")[0] == 404, 5, "queue expires")

    # delivery-limit: classic queues do not act on it, and say so
    ch.queue_declare(f"{p}.limit")
    j = queue_json(node, f"{p}.limit")
    assert j["unsupported_policy_keys"] == ["delivery-limit"]
    assert "delivery-limit" in node.log()


def test_precedence_argument_policy_operator_policy(node, ch, names):
    p = names
    ok(node, "set_policy", f"{p}-pol", f"^{p}\\.", '{"max-length":3,"dead-letter-exchange":"pol-dlx"}',
       "--apply-to", "queues")
    ch.queue_declare(f"{p}.argbig", arguments={"x-max-length": 5})
    ch.queue_declare(f"{p}.argsmall", arguments={"x-max-length": 2, "x-dead-letter-exchange": "arg-dlx"})
    ch.confirm_delivery()
    publish(ch, f"{p}.argbig", 6)
    publish(ch, f"{p}.argsmall", 6)
    assert ready(node, f"{p}.argbig") == 3  # the policy is stricter
    assert ready(node, f"{p}.argsmall") == 2  # the argument is stricter

    # an operator policy stricter still wins over both, at once
    ok(node, "set_operator_policy", f"{p}-op", f"^{p}\\.", '{"max-length":1}', "--apply-to", "queues")
    wait_until(lambda: ready(node, f"{p}.argbig") == 1 and ready(node, f"{p}.argsmall") == 1, 5, "operator limit")
    j = queue_json(node, f"{p}.argbig")
    assert j["policy"] == f"{p}-pol" and j["operator_policy"] == f"{p}-op"
    assert j["effective_policy_definition"] == {"max-length": 1, "dead-letter-exchange": "pol-dlx"}

    # a looser operator policy does not loosen the policy
    ok(node, "set_operator_policy", f"{p}-op", f"^{p}\\.", '{"max-length":10}', "--apply-to", "queues")
    assert queue_json(node, f"{p}.argbig")["effective_policy_definition"]["max-length"] == 3
    publish(ch, f"{p}.argbig", 6)
    assert ready(node, f"{p}.argbig") == 3

    # for dead-letter-exchange the argument wins: a rejected message goes to arg-dlx
    ch.exchange_declare("arg-dlx", "fanout")
    ch.queue_declare(f"{p}.argdead")
    ch.queue_bind(f"{p}.argdead", "arg-dlx")
    method, _props, _body = ch.basic_get(f"{p}.argsmall")
    ch.basic_reject(method.delivery_tag, requeue=False)
    wait_until(lambda: ready(node, f"{p}.argdead") == 1, 5, "dead letter through the argument's exchange")
    ch.exchange_delete("arg-dlx")


def test_live_policy_change_drops_and_dead_letters_heads(node, ch, names):
    p = names
    ch.queue_declare(f"{p}.live")
    ch.exchange_declare(f"{p}.dlx", "fanout")
    ch.queue_declare(f"{p}.dead")
    ch.queue_bind(f"{p}.dead", f"{p}.dlx")
    ch.confirm_delivery()
    publish(ch, f"{p}.live", 6)
    assert ready(node, f"{p}.live") == 6

    ok(node, "set_policy", f"{p}-live", f"^{p}\\.live$", '{"max-length":4}')
    assert ready(node, f"{p}.live") == 4  # at once, as the command returns
    assert ready(node, f"{p}.dead") == 0  # no dead-letter exchange yet: dropped

    ok(node, "set_policy", f"{p}-live", f"^{p}\\.live$", json.dumps({"max-length": 2,
                                                                       "dead-letter-exchange": f"{p}.dlx"}))
    assert ready(node, f"{p}.live") == 2
    wait_until(lambda: ready(node, f"{p}.dead") == 2, 5, "dropped heads dead-lettered")
    _m, props, body = ch.basic_get(f"{p}.dead", auto_ack=True)
    assert body == b"m2"  # the oldest left first
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", f"{p}.live", 1)
    _m, _props, body = ch.basic_get(f"{p}.live", auto_ack=True)
    assert body == b"m4"

    # clearing the policy lifts the limit
    ok(node, "clear_policy", f"{p}-live")
    publish(ch, f"{p}.live", 5)
    assert ready(node, f"{p}.live") == 6


def test_message_ttl_policy_applies_to_messages_published_after_it(node, ch, names):
    """As RabbitMQ: a message's expiry is fixed when it is enqueued; a new message-ttl applies to
    later messages only."""
    p = names
    ch.queue_declare(f"{p}.ttl")
    ch.queue_declare(f"{p}.ttlclock")  # the same policy, nothing older: shows when the TTL has passed
    ch.confirm_delivery()
    publish(ch, f"{p}.ttl", 2, b"old")
    ok(node, "set_policy", f"{p}-ttl", f"^{p}\\.ttl", '{"message-ttl":200}')
    publish(ch, f"{p}.ttl", 2, b"new")
    publish(ch, f"{p}.ttlclock", 1, b"new")
    wait_until(lambda: ready(node, f"{p}.ttlclock") == 0, 5, "a message published after the policy expires")
    assert ready(node, f"{p}.ttl") == 4  # the old ones did not expire (and the new ones wait behind them)
    _m, _p, body = ch.basic_get(f"{p}.ttl", auto_ack=True)
    assert body == b"old0"
    ch.basic_get(f"{p}.ttl", auto_ack=True)
    # the new messages are at the head now and past their TTL
    wait_until(lambda: ready(node, f"{p}.ttl") == 0, 5, "new messages expire")


def test_alternate_exchange_by_policy(node, ch, names):
    p = names
    ch.exchange_declare(f"{p}.main", "direct")
    ch.exchange_declare(f"{p}.ae", "fanout")
    ch.queue_declare(f"{p}.unrouted")
    ch.queue_bind(f"{p}.unrouted", f"{p}.ae")
    ch.confirm_delivery()
    ch.basic_publish(f"{p}.main", "nowhere", b"lost")
    assert ready(node, f"{p}.unrouted") == 0
    ok(node, "set_policy", f"{p}-ae", f"^{p}\\.main$", json.dumps({"alternate-exchange": f"{p}.ae"}),
       "--apply-to", "exchanges")
    ch.basic_publish(f"{p}.main", "nowhere", b"kept")
    assert ready(node, f"{p}.unrouted") == 1
    status, x = http(node, "GET", f"/api/exchanges/%2F/{p}.main")
    assert x["policy"] == f"{p}-ae"
    ok(node, "clear_policy", f"{p}-ae")
    ch.basic_publish(f"{p}.main", "nowhere", b"lost again")
    assert ready(node, f"{p}.unrouted") == 1


def test_operator_policy_api_cli_and_validation(node, names):
    p = names
    body = {"pattern": f"^{p}", "definition": {"max-length": 7, "message-ttl": 1000}, "apply-to": "queues",
            "priority": 2}
    assert http(node, "PUT", f"/api/operator-policies/%2F/{p}-a", body)[0] == 201
    assert http(node, "PUT", f"/api/operator-policies/%2F/{p}-a", body)[0] == 204
    status, got = http(node, "GET", f"/api/operator-policies/%2F/{p}-a")
    assert status == 200
    assert got == {"vhost": "/", "name": f"{p}-a", "pattern": f"^{p}", "apply-to": "queues",
                   "definition": {"max-length": 7, "message-ttl": 1000}, "priority": 2}
    assert any(x["name"] == f"{p}-a" for x in http(node, "GET", "/api/operator-policies")[1])
    assert not any(x["name"] == f"{p}-a" for x in http(node, "GET", "/api/policies")[1])

    # only the operator policy keys; RabbitMQ's validation wording
    status, err = http(node, "PUT", f"/api/operator-policies/%2F/{p}-b",
                       {"pattern": ".", "definition": {"ha-mode": "all"}})
    assert status == 400 and "not a recognised operator policy setting" in err["reason"]
    status, err = http(node, "PUT", f"/api/operator-policies/%2F/{p}-b",
                       {"pattern": ".", "definition": {"max-length": -1}})
    assert status == 400 and "is not a valid maximum length" in err["reason"]
    status, err = http(node, "PUT", f"/api/policies/%2F/{p}-b", {"pattern": ".", "definition": {"bogus": 1}})
    assert status == 400 and "not a recognised policy setting" in err["reason"]
    # queue-leader-locator is a policy key (and is checked)
    assert http(node, "PUT", f"/api/policies/%2F/{p}-loc",
                {"pattern": "^none$", "definition": {"queue-leader-locator": "balanced"}})[0] == 201
    assert http(node, "PUT", f"/api/policies/%2F/{p}-loc",
                {"pattern": "^none$", "definition": {"queue-leader-locator": "nearest"}})[0] == 400

    out = ok(node, "list_operator_policies")
    assert 'Listing operator policy overrides for vhost "/" ...' in out
    line = next(ln for ln in out.splitlines() if f"{p}-a" in ln)
    assert line.split("\t")[:4] == ["/", f"{p}-a", f"^{p}", "queues"]
    ok(node, "set_operator_policy", f"{p}-c", "^x$", '{"expires":1000}')
    r = ctl(node, "set_operator_policy", f"{p}-d", "^x$", '{"overflow":"drop-head"}')
    assert r.returncode != 0 and "not a recognised operator policy setting" in r.stderr
    ok(node, "clear_operator_policy", f"{p}-c")
    r = ctl(node, "clear_operator_policy", f"{p}-c")
    assert r.returncode != 0 and "Parameter does not exist" in r.stderr

    # definitions export carries them: as RabbitMQ writes them (runtime parameters of the
    # operator_policy component), or as a top-level "operator_policies" list
    status, doc = http(node, "GET", "/api/definitions")
    exported = [x for x in doc.get("operator_policies", []) if x["name"] == f"{p}-a"]
    exported += [dict(x["value"], name=x["name"]) for x in doc.get("parameters", [])
                 if x.get("component") == "operator_policy" and x["name"] == f"{p}-a"]
    assert [x["definition"] for x in exported] == [{"max-length": 7, "message-ttl": 1000}]

    # a user without the administrator tag may not see or set them
    assert http(node, "PUT", f"/api/users/{p}-pm", {"password": "pw", "tags": "policymaker"})[0] in (201, 204)
    req = urllib.request.Request(node.mgmt_url + "/api/operator-policies")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{p}-pm:pw".encode()).decode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    http(node, "DELETE", f"/api/users/{p}-pm")


def test_operator_policies_imported_from_definitions_act_on_queues(node, ch, names):
    p = names
    doc = {"operator_policies": [{"vhost": "/", "name": f"{p}-imp", "pattern": f"^{p}\\.imp$", "apply-to": "queues",
                                  "priority": 0, "definition": {"max-length": 1}}]}
    status, answer = http(node, "POST", "/api/definitions", doc)
    assert status in (200, 201, 204), (status, answer)
    status, got = http(node, "GET", f"/api/operator-policies/%2F/{p}-imp")
    assert status == 200 and got["definition"] == {"max-length": 1}
    ch.queue_declare(f"{p}.imp")
    ch.confirm_delivery()
    publish(ch, f"{p}.imp", 3)
    assert ready(node, f"{p}.imp") == 1
    assert queue_json(node, f"{p}.imp")["operator_policy"] == f"{p}-imp"
    # an operator policy with a key operators may not set is refused, and nothing is imported
    bad = {"operator_policies": [{"vhost": "/", "name": f"{p}-bad", "pattern": ".", "definition": {"ha-mode": "all"}}]}
    status, answer = http(node, "POST", "/api/definitions", bad)
    assert status == 400 and "operator policy" in answer["reason"], answer
    assert http(node, "GET", f"/api/operator-policies/%2F/{p}-bad")[0] == 404
