"""Queues: declare (server-named, passive, durable, exclusive, auto-delete, arguments),
bind/unbind, purge, delete, and the queue arguments clients rely on (TTL, length limits,
dead-lettering). Reply codes and texts are RabbitMQ 3.10's.
"""

from __future__ import annotations

import re

import pika
import pytest

from tests.integration.helpers import channel_error, connect, drain, shortstr_reply_text, wait_until

EXCLUSIVE_LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. "
                    "It could be originally declared on another connection or the exclusive property "
                    "value does not match that of the original declaration.")


@pytest.fixture
def ch(conn):
    """A channel in confirm mode: basic_publish returns once the queues have the message."""
    c = conn.channel()
    c.confirm_delivery()
    return c


def queue_exists(broker, name: str) -> bool:
    c = connect(broker)
    try:
        c.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        return e.reply_code != 404  # 405: there, but exclusive to another connection
    finally:
        if c.is_open:
            c.close()


# -- declare --------------------------------------------------------------------------------

def test_server_named_queue_is_amq_gen_and_exclusive_use_works(ch):
    ok = ch.queue_declare("", exclusive=True).method
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", ok.queue), ok.queue
    assert (ok.message_count, ok.consumer_count) == (0, 0)


def test_server_named_queues_are_distinct(ch):
    a = ch.queue_declare("", exclusive=True).method.queue
    b = ch.queue_declare("", exclusive=True).method.queue
    assert a != b


def test_declare_ok_reports_ready_message_and_consumer_counts(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=1)
    delivered = []
    ch.basic_consume(q, lambda _c, m, _p, _b: delivered.append(m))
    drain(ch.connection, lambda: delivered, what="first delivery")
    ok = ch.connection.channel().queue_declare(q).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)  # the one checked out is not counted


def test_declare_ok_counts_only_ready_messages(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    method, _, _ = ch.basic_get(q)  # checked out, unacked
    assert method.message_count == 2
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    ch.basic_ack(method.delivery_tag)


def test_passive_declare_of_a_missing_queue_is_404(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_declare, q, passive=True)
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_declaring_an_amq_prefixed_queue_is_403(ch):
    code, text = channel_error(ch.queue_declare, "amq.hutch-test")
    assert (code, text) == (403, "ACCESS_REFUSED - queue name 'amq.hutch-test' contains reserved prefix 'amq.*'")


def test_redeclare_with_the_same_properties_is_fine(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 10})
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 10})


def test_redeclare_with_different_durability_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=False)
    code, text = channel_error(ch.queue_declare, q, durable=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in "
                                 "vhost '/': received 'true' but current is 'false'")


def test_redeclare_with_an_added_argument_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    code, text = channel_error(ch.queue_declare, q, arguments={"x-message-ttl": 2000})
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{q}' "
                                 "in vhost '/': received the value '2000' of type 'signedint' but current is none")


def test_redeclare_with_a_changed_argument_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 10})
    code, text = channel_error(ch.queue_declare, q, arguments={"x-max-length": 20})
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in "
                                 "vhost '/': received '20' but current is '10'")


def test_redeclare_with_different_auto_delete_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, auto_delete=False)
    code, text = channel_error(ch.queue_declare, q, auto_delete=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{q}' in "
                                 "vhost '/': received 'true' but current is 'false'")


def test_invalid_argument_value_is_406(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_declare, q, arguments={"x-max-length": -1})
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue "
                                 f"'{q}' in vhost '/': {{value_negative,-1}}")


# -- exclusive and auto-delete ------------------------------------------------------------------

def test_exclusive_queue_is_locked_to_its_connection(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q, exclusive=True)
    other = connect(broker)
    try:
        expected = (405, shortstr_reply_text(EXCLUSIVE_LOCKED.format(q=q)))
        assert channel_error(other.channel().queue_declare, q, exclusive=True) == expected
        assert channel_error(other.channel().queue_declare, q, passive=True) == expected
        assert channel_error(other.channel().basic_consume, q, lambda *a: None) == expected
        assert channel_error(other.channel().basic_get, q) == expected
        assert channel_error(other.channel().queue_purge, q) == expected
        assert channel_error(other.channel().queue_delete, q) == expected
    finally:
        other.close()


def test_exclusive_queue_is_usable_from_another_channel_of_its_connection(conn, names):
    q = names.queue()
    conn.channel().queue_declare(q, exclusive=True)
    other = conn.channel()
    other.confirm_delivery()
    other.basic_publish("", q, b"m")
    assert other.queue_declare(q, passive=True).method.message_count == 1


def test_exclusive_queue_is_deleted_when_its_connection_closes(broker, names):
    q = names.queue()
    c = connect(broker)
    c.channel().queue_declare(q, exclusive=True)
    assert queue_exists(broker, q)
    c.close()
    wait_until(lambda: not queue_exists(broker, q), what="exclusive queue deleted")


def test_auto_delete_queue_goes_when_its_last_consumer_cancels(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q, auto_delete=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    assert queue_exists(broker, q)
    ch.basic_cancel(t2)
    wait_until(lambda: not queue_exists(broker, q), what="auto-delete queue deleted")


def test_auto_delete_queue_goes_when_its_consumers_channel_closes(broker, conn, names):
    q = names.queue()
    ch = conn.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    wait_until(lambda: not queue_exists(broker, q), what="auto-delete queue deleted")


def test_auto_delete_queue_never_consumed_from_stays(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"m")
    assert queue_exists(broker, q)


# -- bind and unbind -----------------------------------------------------------------------------

def test_bind_to_a_missing_exchange_is_404(ch, names):
    q, x = names.queue(), names.exchange()
    ch.queue_declare(q)
    code, text = channel_error(ch.queue_bind, q, x, routing_key="k")
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


def test_bind_a_missing_queue_is_404(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_bind, q, "amq.direct", routing_key="k")
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_bind_is_idempotent_and_unbind_of_a_missing_binding_is_ok(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.direct", routing_key=q)
    ch.queue_bind(q, "amq.direct", routing_key=q)
    ch.basic_publish("amq.direct", q, b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    ch.queue_unbind(q, "amq.direct", routing_key=q)
    ch.queue_unbind(q, "amq.direct", routing_key=q)
    ch.basic_publish("amq.direct", q, b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_bind_with_empty_queue_name_uses_the_channels_last_declared_queue(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind("", "amq.fanout")
    try:
        ch.basic_publish("amq.fanout", "", b"m")
        assert ch.queue_declare(q, passive=True).method.message_count == 1
    finally:
        ch.queue_unbind(q, "amq.fanout")


# -- purge and delete ----------------------------------------------------------------------------

def test_purge_returns_the_number_of_ready_messages_removed(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    held, _, _ = ch.basic_get(q)
    assert ch.queue_purge(q).method.message_count == 4
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_reject(held.delivery_tag, requeue=True)  # the unacked one survives the purge
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"0" and method.redelivered


def test_purge_of_a_missing_queue_is_404(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_purge, q)
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_delete_returns_the_message_count_and_removes_bindings(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.direct", routing_key=q)
    for _ in range(3):
        ch.basic_publish("", q, b"m")
    assert ch.queue_delete(q).method.message_count == 3
    ch.queue_declare(q)
    ch.basic_publish("amq.direct", q, b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_delete_of_a_missing_queue_is_ok_with_zero_messages(ch, names):
    assert ch.queue_delete(names.queue()).method.message_count == 0


def test_delete_if_unused_with_a_consumer_is_406(conn, ch, names):
    q = names.queue()
    ch.queue_declare(q)
    conn.channel().basic_consume(q, lambda *a: None)
    code, text = channel_error(ch.queue_delete, q, if_unused=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")


def test_delete_if_empty_with_messages_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    code, text = channel_error(ch.queue_delete, q, if_empty=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty")


def test_delete_if_unused_and_if_empty_of_an_idle_empty_queue_deletes_it(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_delete(q, if_unused=True, if_empty=True)
    assert not queue_exists(broker, q)


# -- queue arguments: TTL, length limits, dead-lettering -----------------------------------------------

def test_message_ttl_argument_expires_messages(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"m")
    drain(ch.connection, lambda: ch.queue_declare(q, passive=True).method.message_count == 0,
          timeout_s=5, what="message expired")


def test_per_message_expiration_expires_messages(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    drain(ch.connection, lambda: ch.queue_declare(q, passive=True).method.message_count == 1,
          timeout_s=5, what="first message expired")
    _, props, body = ch.basic_get(q, auto_ack=True)
    assert (body, props.expiration) == (b"long", "60000")


def test_max_length_drops_from_the_head(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    bodies = [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"3", b"4"]
    assert ch.basic_get(q)[0] is None


def test_max_length_reject_publish_nacks_the_overflow(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"second")
    assert ch.basic_get(q, auto_ack=True)[2] == b"first"


def test_rejected_message_is_dead_lettered_with_x_death(ch, names):
    q, dlq = names.queue("work"), names.queue("dead")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"k": "v"}))
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(dlq, auto_ack=True))[0] and r,
                                what="dead-lettered message")
    assert body == b"poison"
    assert props.headers["k"] == "v"
    (death,) = props.headers["x-death"]
    assert death["queue"] == q
    assert death["reason"] == "rejected"
    assert death["count"] == 1
    assert death["exchange"] == ""
    assert death["routing-keys"] == [q]
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == q


def test_expired_message_is_dead_lettered_with_reason_expired(ch, names):
    q, dlq = names.queue("work"), names.queue("dead")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
                                   "x-message-ttl": 50})
    ch.basic_publish("", q, b"late")
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(dlq, auto_ack=True))[0] and r,
                                what="dead-lettered message")
    assert body == b"late"
    assert props.headers["x-death"][0]["reason"] == "expired"


def test_overflowed_message_is_dead_lettered_with_reason_maxlen(ch, names):
    q, dlq = names.queue("work"), names.queue("dead")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
                                   "x-max-length": 1})
    ch.basic_publish("", q, b"old")
    ch.basic_publish("", q, b"new")
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(dlq, auto_ack=True))[0] and r,
                                what="dead-lettered message")
    assert body == b"old"
    assert props.headers["x-death"][0]["reason"] == "maxlen"


def test_unbind_from_a_missing_queue_or_exchange_is_ok(ch, names):
    """RabbitMQ 3.10 answers unbind-ok when the queue or the exchange no longer exists (clients
    such as aio-pika unbind in their clean-up after an auto-delete queue is gone)."""
    ch.queue_unbind(names.queue(), "amq.direct", "k")
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_unbind(q, names.exchange(), "k")
    ch.exchange_unbind(names.exchange(), "amq.direct", "k")
    ch.queue_delete(q)
