"""Declarations made over AMQP and over the management API are one operation (broker/operations.py).

Both kinds of client get the same queue type, the vhost's default queue type under the same
conditions, and the same refusals. What RabbitMQ 3.10.8 does was recorded against the real
broker: with `default_queue_type` quorum, a durable, non-exclusive, non-auto-delete queue
declared without `x-queue-type` becomes a quorum queue whose arguments show
`x-queue-type: quorum`; a transient, exclusive or auto-delete one stays classic with no
argument added; a server-named one is refused; an HTTP PUT follows the same rule.
"""

from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.test_http_api import Http
from tests.support.brokers import HutchNode


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
    return f"op.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def vhost(http, name):
    """A vhost whose default queue type is quorum, with guest allowed everything in it."""
    v = f"{name}-v"
    assert http("PUT", f"/api/vhosts/{v}", {"default_queue_type": "quorum"})[0] == 201
    http.ok("PUT", f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    yield v
    http("DELETE", f"/api/vhosts/{v}")


def connect(node, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, vhost, pika.PlainCredentials("guest", "guest")))


def channel_error(fn, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        fn(*args, **kwargs)
    return e.value.reply_code, e.value.reply_text


def queue_of(http, vhost: str, name: str) -> dict:
    return http.ok("GET", f"/api/queues/{vhost.replace('/', '%2F')}/{name}")


def test_put_of_a_quorum_queue_makes_a_quorum_queue(http, node, name):
    assert http("PUT", f"/api/queues/%2F/{name}", {"durable": True,
                                                   "arguments": {"x-queue-type": "quorum"}})[0] == 201
    try:
        q = queue_of(http, "/", name)
        assert (q["type"], q["arguments"]) == ("quorum", {"x-queue-type": "quorum"})
        # an AMQP redeclare of the same queue is equivalent; a classic one is not
        with connect(node) as conn:
            conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            code, text = channel_error(conn.channel().queue_declare, name, durable=True)
            assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{name}' "
                                         "in vhost '/': received none but current is the value 'quorum' of type "
                                         "'longstr'")
            ch = conn.channel()
            ch.confirm_delivery()  # confirmed: the quorum queue holds it when basic.get asks
            ch.basic_publish("", name, b"m1")
            assert ch.basic_get(name, auto_ack=True)[2] == b"m1"
        # again over HTTP: 204, nothing changes
        assert http("PUT", f"/api/queues/%2F/{name}", {"durable": True,
                                                       "arguments": {"x-queue-type": "quorum"}})[0] == 204
    finally:
        http("DELETE", f"/api/queues/%2F/{name}")


def test_put_of_a_non_durable_quorum_queue_is_refused(http, name):
    status, body, _ = http("PUT", f"/api/queues/%2F/{name}", {"durable": False,
                                                              "arguments": {"x-queue-type": "quorum"}})
    assert status == 400 and "non-durable" in body["reason"] and name in body["reason"], body
    assert http("GET", f"/api/queues/%2F/{name}")[0] == 404


def test_the_vhost_default_type_applies_to_amqp_declares_it_can_hold(http, node, vhost, name):
    with connect(node, vhost) as conn:
        ch = conn.channel()
        ch.queue_declare(f"{name}-durable", durable=True)
        ch.queue_declare(f"{name}-transient", durable=False)
        ch.queue_declare(f"{name}-autodelete", durable=True, auto_delete=True)
        excl = ch.queue_declare("", durable=True, exclusive=True).method.queue
        assert (queue_of(http, vhost, f"{name}-durable")["type"],
                queue_of(http, vhost, f"{name}-durable")["arguments"]) == ("quorum", {"x-queue-type": "quorum"})
        for q in (f"{name}-transient", f"{name}-autodelete", excl):
            shown = queue_of(http, vhost, q)
            assert (shown["type"], shown["arguments"]) == ("classic", {}), q
        # a redeclare without x-queue-type gets the same default, so it is equivalent
        ch.queue_declare(f"{name}-durable", durable=True)
        code, text = channel_error(conn.channel().queue_declare, f"{name}-durable", durable=True,
                                   arguments={"x-queue-type": "classic"})
        assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue "
                                     f"'{name}-durable' in vhost '{vhost}': received 'classic' but current is "
                                     "'quorum'")
        # as RabbitMQ: a quorum queue cannot be server-named
        code, text = channel_error(conn.channel().queue_declare, "", durable=True)
        assert (code, text) == (406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
                                     "rabbit_quorum_queue")
        # an explicit type wins over the default
        conn.channel().queue_declare(f"{name}-classic", durable=True, arguments={"x-queue-type": "classic"})
        assert queue_of(http, vhost, f"{name}-classic")["type"] == "classic"


def test_the_vhost_default_type_applies_to_http_puts(http, vhost, name):
    assert http("PUT", f"/api/queues/{vhost}/{name}-d", {"durable": True})[0] == 201
    assert http("PUT", f"/api/queues/{vhost}/{name}-t", {"durable": False})[0] == 201
    d, t = queue_of(http, vhost, f"{name}-d"), queue_of(http, vhost, f"{name}-t")
    assert (d["type"], d["arguments"]) == ("quorum", {"x-queue-type": "quorum"})
    assert (t["type"], t["arguments"]) == ("classic", {})
    assert http("PUT", f"/api/queues/{vhost}/{name}-d", {"durable": True})[0] == 204


def test_a_classic_default_is_recorded_in_the_arguments(http, node, name):
    v = f"{name}-c"
    assert http("PUT", f"/api/vhosts/{v}", {"default_queue_type": "classic"})[0] == 201
    try:
        http.ok("PUT", f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        with connect(node, v) as conn:
            conn.channel().queue_declare(name, durable=False, exclusive=False)
            conn.channel().queue_declare(name)  # no x-queue-type, and "classic" on record: equivalent
        q = queue_of(http, v, name)
        assert (q["type"], q["arguments"]) == ("classic", {"x-queue-type": "classic"})
    finally:
        http("DELETE", f"/api/vhosts/{v}")


def test_a_vhost_without_a_default_adds_nothing(http, node, name):
    with connect(node) as conn:
        conn.channel().queue_declare(name, durable=True)
        try:
            q = queue_of(http, "/", name)
            assert (q["type"], q["arguments"]) == ("classic", {})
            conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "classic"})  # equivalent
        finally:
            conn.channel().queue_delete(name)


def test_http_put_of_a_dead_lettering_queue_needs_write_on_the_exchange(http, node, name):
    user = f"{name}-u"
    http.ok("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})
    try:
        http.ok("PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": "^nothing$", "read": ".*"})
        as_user = Http(node.mgmt_port, user, "pw")
        status, body, _ = as_user("PUT", f"/api/queues/%2F/{name}",
                                  {"arguments": {"x-dead-letter-exchange": "amq.fanout"}})
        assert status == 401, body
        assert body["reason"].startswith("ACCESS_REFUSED - access to exchange 'amq.fanout' in vhost '/' "
                                         f"refused for user '{user}'"), body
        assert http("GET", f"/api/queues/%2F/{name}")[0] == 404
        # the same declare over AMQP is refused with the same text
        with pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", node.port, "/", pika.PlainCredentials(user, "pw"))) as conn:
            code, text = channel_error(conn.channel().queue_declare, name,
                                       arguments={"x-dead-letter-exchange": "amq.fanout"})
            assert (code, text) == (403, body["reason"])
    finally:
        http("DELETE", f"/api/users/{user}")


def test_put_of_an_exchange_of_an_unknown_type(http, name):
    status, body, _ = http("PUT", f"/api/exchanges/%2F/{name}", {"type": "nope"})
    assert (status, body) == (400, {"error": "bad_request", "reason": "unknown exchange type 'nope'"})
    assert http("GET", f"/api/exchanges/%2F/{name}")[0] == 404


def test_exchange_checks_are_the_same_over_http_and_amqp(http, node, name):
    status, body, _ = http("PUT", f"/api/exchanges/%2F/amq.{name}", {"type": "direct"})
    assert (status, body["reason"]) == (401, f"ACCESS_REFUSED - exchange name 'amq.{name}' contains reserved "
                                             "prefix 'amq.*'")
    assert http("PUT", f"/api/exchanges/%2F/{name}", {"type": "direct"})[0] == 201
    try:
        status, body, _ = http("PUT", f"/api/exchanges/%2F/{name}", {"type": "fanout"})
        with connect(node) as conn:
            code, text = channel_error(conn.channel().exchange_declare, name, "fanout", durable=True)
        assert (status, body["reason"]) == (400, text) and code == 406
        assert text == (f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                        "received 'fanout' but current is 'direct'")
        http.ok("PUT", f"/api/queues/%2F/{name}", {})
        http.ok("POST", f"/api/bindings/%2F/e/{name}/q/{name}", {"routing_key": "k"})
        status, body, _ = http("DELETE", f"/api/exchanges/%2F/{name}?if-unused=true")
        assert (status, body["reason"]) == (400, f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use")
    finally:
        http("DELETE", f"/api/queues/%2F/{name}")
        http("DELETE", f"/api/exchanges/%2F/{name}")
