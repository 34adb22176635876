"""Exchanges: the predeclared set, declare/delete rules, and how each type routes.

Routing is checked end to end: bind real queues, publish, and see which queues got the
message. Reply codes and texts are RabbitMQ 3.10's.
"""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import channel_error, connect, connection_error, drain


@pytest.fixture
def ch(conn):
    """A channel in confirm mode: basic_publish returns once the message is in every queue it
    routes to, so what a test reads next is not a race with the publish."""
    c = conn.channel()
    c.confirm_delivery()
    return c


def routed_to(ch, queues: list[str]) -> list[str]:
    """The queues among `queues` that hold a message now (each drained by basic.get)."""
    got = []
    for q in queues:
        method, _, _ = ch.basic_get(q, auto_ack=True)
        if method is not None:
            got.append(q)
    return got


def temp_queue(ch) -> str:
    return ch.queue_declare("", exclusive=True).method.queue


# -- the predeclared exchanges -------------------------------------------------------------------

@pytest.mark.parametrize("name,type_", [
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
    ("amq.headers", "headers"), ("amq.match", "headers"),
])
def test_predeclared_exchange_exists_with_its_type(ch, name, type_):
    ch.exchange_declare(name, passive=True)
    ch.exchange_declare(name, type_, durable=True)  # an equivalent redeclare is fine


def test_default_exchange_routes_to_the_queue_named_by_the_routing_key(ch):
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_publish("", q2, b"m")
    assert routed_to(ch, [q1, q2]) == [q2]


def test_default_exchange_cannot_be_bound_to(ch):
    q = temp_queue(ch)
    code, text = channel_error(ch.queue_bind, q, "", routing_key="k")
    assert (code, text) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


@pytest.mark.parametrize("operation", ["declare", "passive-declare", "delete"])
def test_default_exchange_cannot_be_declared_or_deleted(ch, operation):
    call = {"declare": lambda: ch.exchange_declare("", "direct"),
            "passive-declare": lambda: ch.exchange_declare("", passive=True),
            "delete": lambda: ch.exchange_delete("")}[operation]
    code, text = channel_error(call)
    assert (code, text) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_predeclared_exchange_cannot_be_deleted(ch):
    code, text = channel_error(ch.exchange_delete, "amq.direct")
    assert (code, text) == (403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")


def test_predeclared_exchange_redeclared_with_another_type_is_406(ch):
    code, text = channel_error(ch.exchange_declare, "amq.direct", "fanout")
    assert (code, text) == (406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in "
                                 "vhost '/': received 'fanout' but current is 'direct'")


def test_default_exchange_returns_mandatory_message_for_a_missing_queue(conn, names):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _c, method, _p, _b: returned.append((method.reply_code, method.routing_key)))
    q = names.queue()
    ch.basic_publish("", q, b"m", mandatory=True)
    drain(conn, lambda: returned, what="basic.return")
    assert returned == [(312, q)]


def test_declaring_an_amq_prefixed_exchange_is_403(ch):
    code, text = channel_error(ch.exchange_declare, "amq.hutch-test", "direct")
    assert (code, text) == (403, "ACCESS_REFUSED - exchange name 'amq.hutch-test' contains reserved "
                                 "prefix 'amq.*'")


# -- declare and delete ----------------------------------------------------------------------

def test_passive_declare_of_a_missing_exchange_is_404(ch, names):
    x = names.exchange()
    code, text = channel_error(ch.exchange_declare, x, passive=True)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


def test_passive_declare_of_an_existing_exchange_ignores_type(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic")
    ch.exchange_declare(x, "fanout", passive=True)


def test_redeclare_with_the_same_properties_is_fine(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic", durable=True)
    ch.exchange_declare(x, "topic", durable=True)


def test_redeclare_with_a_different_type_is_406(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    code, text = channel_error(ch.exchange_declare, x, "fanout")
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in "
                                 "vhost '/': received 'fanout' but current is 'direct'")


def test_redeclare_with_different_durability_is_406(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct", durable=False)
    code, text = channel_error(ch.exchange_declare, x, "direct", durable=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{x}' in "
                                 "vhost '/': received 'true' but current is 'false'")


def test_declare_with_an_unknown_type_closes_the_connection_with_503(ch, names):
    x = names.exchange()
    code, text = connection_error(ch.exchange_declare, x, "no-such-type")
    assert (code, text) == (503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")


def test_delete_if_unused_of_a_bound_exchange_is_406(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    ch.queue_bind(temp_queue(ch), x, routing_key="k")
    code, text = channel_error(ch.exchange_delete, x, if_unused=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use")


def test_delete_if_unused_of_an_unbound_exchange_deletes_it(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    ch.exchange_delete(x, if_unused=True)
    code, _ = channel_error(ch.exchange_declare, x, passive=True)
    assert code == 404


def test_delete_of_a_missing_exchange_is_ok(ch, names):
    ch.exchange_delete(names.exchange())


def test_delete_removes_the_exchange_and_its_bindings(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    q = temp_queue(ch)
    ch.queue_bind(q, x)
    ch.exchange_delete(x)
    ch.exchange_declare(x, "fanout")
    ch.basic_publish(x, "", b"m")
    assert routed_to(ch, [q]) == []


def test_auto_delete_exchange_goes_when_its_last_binding_goes(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct", auto_delete=True)
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q1, x, routing_key="a")
    ch.queue_bind(q2, x, routing_key="b")
    ch.queue_unbind(q1, x, routing_key="a")
    ch.exchange_declare(x, passive=True)
    ch.queue_unbind(q2, x, routing_key="b")
    code, _ = channel_error(ch.exchange_declare, x, passive=True)
    assert code == 404


def test_auto_delete_exchange_without_bindings_stays(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.exchange_declare(x, passive=True)


def test_publish_to_a_missing_exchange_closes_the_channel_with_404(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.basic_publish(x, "k", b"m")
    code, text = channel_error(ch.queue_declare, "", exclusive=True)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")
    assert conn.is_open


def test_publish_to_an_internal_exchange_is_403(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", internal=True)
    ch.basic_publish(x, "", b"m")
    code, text = channel_error(ch.queue_declare, "", exclusive=True)
    assert (code, text) == (403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'")


def test_internal_exchange_routes_what_another_exchange_forwards(ch, names):
    front, inner = names.exchange("front"), names.exchange("inner")
    ch.exchange_declare(front, "fanout")
    ch.exchange_declare(inner, "fanout", internal=True)
    ch.exchange_bind(inner, front)
    q = temp_queue(ch)
    ch.queue_bind(q, inner)
    ch.basic_publish(front, "", b"m")
    assert routed_to(ch, [q]) == [q]


# -- alternate exchange -------------------------------------------------------------------------

def test_alternate_exchange_receives_unroutable_messages(ch, names):
    main, alt = names.exchange("main"), names.exchange("alt")
    ch.exchange_declare(alt, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": alt})
    routed, unrouted = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(routed, main, routing_key="known")
    ch.queue_bind(unrouted, alt)
    ch.basic_publish(main, "known", b"1")
    assert routed_to(ch, [routed, unrouted]) == [routed]
    ch.basic_publish(main, "unknown", b"2")
    assert routed_to(ch, [routed, unrouted]) == [unrouted]


def test_alternate_exchange_suppresses_basic_return_for_mandatory(conn, names):
    ch = conn.channel()
    main, alt = names.exchange("main"), names.exchange("alt")
    ch.exchange_declare(alt, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": alt})
    q = temp_queue(ch)
    ch.queue_bind(q, alt)
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.confirm_delivery()
    ch.basic_publish(main, "unknown", b"m", mandatory=True)
    conn.process_data_events(time_limit=0.1)
    assert returned == []
    assert routed_to(ch, [q]) == [q]


def test_missing_alternate_exchange_leaves_message_unroutable(conn, names):
    ch = conn.channel()
    main = names.exchange("main")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": names.exchange("absent")})
    returned = []
    ch.add_on_return_callback(lambda _ch, method, _p, _b: returned.append(method.reply_code))
    ch.basic_publish(main, "k", b"m", mandatory=True)
    drain(conn, lambda: returned, what="basic.return")
    assert returned == [312]


# -- exchange-to-exchange bindings ------------------------------------------------------------------

def test_exchange_to_exchange_binding_forwards_by_routing_key(ch, names):
    src, dst = names.exchange("src"), names.exchange("dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    ch.exchange_bind(dst, src, routing_key="orders.*")
    q = temp_queue(ch)
    ch.queue_bind(q, dst, routing_key="orders.new")
    ch.basic_publish(src, "orders.new", b"m")
    assert routed_to(ch, [q]) == [q]
    ch.basic_publish(src, "orders.old", b"m")  # passes src, not dst
    ch.basic_publish(src, "invoices.new", b"m")  # stops at src
    assert routed_to(ch, [q]) == []


def test_exchange_unbind_stops_forwarding(ch, names):
    src, dst = names.exchange("src"), names.exchange("dst")
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src)
    q = temp_queue(ch)
    ch.queue_bind(q, dst)
    ch.exchange_unbind(dst, src)
    ch.basic_publish(src, "", b"m")
    assert routed_to(ch, [q]) == []


def test_exchange_binding_cycle_delivers_each_message_once_per_queue(ch, names):
    a, b = names.exchange("a"), names.exchange("b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    q = temp_queue(ch)
    ch.queue_bind(q, a)
    ch.queue_bind(q, b)
    ch.basic_publish(a, "", b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_exchange_bind_to_a_missing_exchange_is_404(ch, names):
    src, missing = names.exchange("src"), names.exchange("missing")
    ch.exchange_declare(src, "fanout")
    code, text = channel_error(ch.exchange_bind, missing, src)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'")


# -- direct and fanout routing --------------------------------------------------------------------

def test_direct_exchange_routes_on_exact_routing_key(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    q1, q2, q3 = temp_queue(ch), temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q1, x, routing_key="red")
    ch.queue_bind(q2, x, routing_key="red")
    ch.queue_bind(q2, x, routing_key="green")
    ch.queue_bind(q3, x, routing_key="blue")
    ch.basic_publish(x, "red", b"m")
    assert routed_to(ch, [q1, q2, q3]) == [q1, q2]
    ch.basic_publish(x, "green", b"m")
    assert routed_to(ch, [q1, q2, q3]) == [q2]
    ch.basic_publish(x, "RED", b"m")
    assert routed_to(ch, [q1, q2, q3]) == []


def test_two_bindings_that_match_deliver_one_copy(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic")
    q = temp_queue(ch)
    ch.queue_bind(q, x, routing_key="a.*")
    ch.queue_bind(q, x, routing_key="*.b")
    ch.basic_publish(x, "a.b", b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_unbind_stops_routing(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, routing_key="k")
    ch.queue_unbind(q, x, routing_key="k")
    ch.basic_publish(x, "k", b"m")
    assert routed_to(ch, [q]) == []


def test_fanout_exchange_routes_to_every_bound_queue_whatever_the_key(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    queues = [temp_queue(ch) for _ in range(3)]
    for i, q in enumerate(queues):
        ch.queue_bind(q, x, routing_key=f"ignored-{i}")
    ch.basic_publish(x, "anything", b"m")
    assert routed_to(ch, queues) == queues


# -- topic routing -------------------------------------------------------------------------------

TOPIC_CASES = [
    # binding key, routing key, matches
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("a.*.c", "a..c", True),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", "", False),  # the empty routing key has no words at all
    ("*.*", "a.", True),
    ("*.*", "a", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.#", "a", True),
    ("#.#", "", True),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("#.*", "a", True),
    ("#.*", "", False),
    ("*.#", "", False),
    ("a..c", "a..c", True),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b.c.d", True),
]


@pytest.mark.parametrize("binding_key,routing_key,matches", TOPIC_CASES,
                         ids=[f"{b or '<empty>'}~{r or '<empty>'}" for b, r, _ in TOPIC_CASES])
def test_topic_exchange_matching(ch, names, binding_key, routing_key, matches):
    x = names.exchange()
    ch.exchange_declare(x, "topic", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, x, routing_key=binding_key)
    ch.basic_publish(x, routing_key, b"m")
    assert routed_to(ch, [q]) == ([q] if matches else [])


def test_topic_exchange_routes_each_message_to_all_matching_queues(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic")
    stock, nyse, all_ = temp_queue(ch), temp_queue(ch), temp_queue(ch)
    ch.queue_bind(stock, x, routing_key="stock.*.*")
    ch.queue_bind(nyse, x, routing_key="*.nyse.*")
    ch.queue_bind(all_, x, routing_key="#")
    ch.basic_publish(x, "stock.nyse.ibm", b"m")
    assert routed_to(ch, [stock, nyse, all_]) == [stock, nyse, all_]
    ch.basic_publish(x, "bond.lse.gilt", b"m")
    assert routed_to(ch, [stock, nyse, all_]) == [all_]


# -- headers routing -----------------------------------------------------------------------------

HEADERS_CASES = [
    # binding arguments, message headers, matches
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": True}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"a": 1, "b": "x"}, {"a": 1}, False),  # all is the default
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1}, {}, False),
    ({"x-match": "all"}, {}, True),
    ({"x-match": "all"}, {"anything": 1}, True),
    ({"x-match": "all", "a": 1, "x-ignored": "q"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "x-ignored": "q"}, {"x-ignored": "q"}, False),
    ({"x-match": "all", "a": "1"}, {"a": 1}, False),  # types must match too
    ({"x-match": "all", "a": None}, {"a": "whatever"}, True),  # void: the key must be there
    ({"x-match": "all", "a": None}, {"b": 1}, False),
]


@pytest.mark.parametrize("binding,headers,matches", HEADERS_CASES, ids=[str(i) for i in range(len(HEADERS_CASES))])
def test_headers_exchange_matching(ch, names, binding, headers, matches):
    x = names.exchange()
    ch.exchange_declare(x, "headers", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, x, arguments=binding)
    ch.basic_publish(x, "routing-key-is-ignored", b"m", pika.BasicProperties(headers=headers))
    assert routed_to(ch, [q]) == ([q] if matches else [])


def test_headers_exchange_without_headers_property_matches_only_empty_all(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "headers", auto_delete=True)
    everything, keyed = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(everything, x, arguments={"x-match": "all"})
    ch.queue_bind(keyed, x, arguments={"x-match": "any", "k": 1})
    ch.basic_publish(x, "", b"m")
    assert routed_to(ch, [everything, keyed]) == [everything]


def test_headers_unbind_needs_the_same_arguments(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "headers")
    q = temp_queue(ch)
    ch.queue_bind(q, x, arguments={"x-match": "any", "k": 1})
    ch.queue_unbind(q, x, arguments={"x-match": "any", "k": 2})  # not that binding: nothing happens
    ch.basic_publish(x, "", b"m", pika.BasicProperties(headers={"k": 1}))
    assert routed_to(ch, [q]) == [q]
    ch.queue_unbind(q, x, arguments={"x-match": "any", "k": 1})
    ch.basic_publish(x, "", b"m", pika.BasicProperties(headers={"k": 1}))
    assert routed_to(ch, [q]) == []


def test_durable_exchange_is_visible_from_another_connection(broker, ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic", durable=True)
    other = connect(broker)
    try:
        other.channel().exchange_declare(x, "topic", passive=True)
    finally:
        other.close()


def test_an_auto_delete_exchange_gone_with_its_last_queue_can_be_declared_again_at_once(broker, names):
    """kombu's SimpleBuffer does this: an auto-delete exchange and queue, used, closed, and the
    same names declared at once on a new connection; the bind must find the new exchange."""
    x, q = names.exchange(), names.queue()
    for round_ in range(3):
        c = connect(broker)
        ch = c.channel()
        ch.exchange_declare(x, "direct", auto_delete=True)
        ch.queue_declare(q, auto_delete=True)
        ch.queue_bind(q, x, q)
        ch.basic_publish(x, q, f"r{round_}".encode())
        tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
        ch.basic_cancel(tag)  # the last consumer: the queue goes, then the exchange
        c.close()
