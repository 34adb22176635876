"""The basic class: publish (mandatory, immediate), consume and cancel, get, qos, ack/nack/
reject, recover, requeue on close, ordering and message properties.

Every expectation is what RabbitMQ 3.10 does, including its reading of basic.qos (global=false
limits each consumer, global=true the whole channel) and its reply texts.
"""

from __future__ import annotations

import datetime
import decimal
import re

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from tests.integration.helpers import channel_error, connect, connection_error, drain
from tests.integration.rawamqp import RawClient, raw_frame


@pytest.fixture
def ch(conn):
    """A channel in confirm mode: basic_publish returns once the queues have the message."""
    c = conn.channel()
    c.confirm_delivery()
    return c


def fill(ch, queue: str, n: int, prefix: str = "") -> None:
    for i in range(n):
        ch.basic_publish("", queue, f"{prefix}{i}".encode())


class Recorder:
    """A consumer callback that keeps what it was given."""

    def __init__(self):
        self.deliveries: list[tuple] = []

    def __call__(self, ch, method, props, body):
        self.deliveries.append((method, props, body))

    @property
    def bodies(self) -> list[bytes]:
        return [b for _, _, b in self.deliveries]

    @property
    def tags(self) -> list[int]:
        return [m.delivery_tag for m, _, _ in self.deliveries]


def settle(conn, seconds: float = 0.3) -> None:
    """Let deliveries that are on their way arrive: for asserting that nothing more comes."""
    conn.process_data_events(time_limit=seconds)


# -- publish -----------------------------------------------------------------------------------

def test_mandatory_unroutable_message_is_returned_with_312_no_route(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    returned = []
    ch.add_on_return_callback(lambda _c, method, props, body: returned.append((method, props, body)))
    ch.basic_publish(x, "nowhere", b"lost", pika.BasicProperties(message_id="m1"), mandatory=True)
    drain(conn, lambda: returned, what="basic.return")
    method, props, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == (x, "nowhere")
    assert (props.message_id, body) == ("m1", b"lost")


def test_mandatory_routable_message_is_not_returned(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.confirm_delivery()
    ch.basic_publish("", q, b"m", mandatory=True)
    settle(conn)
    assert returned == []


def test_non_mandatory_unroutable_message_is_dropped_silently(conn, names):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("amq.direct", names.prefix, b"m")
    settle(conn)
    assert returned == []
    assert ch.is_open


def test_immediate_publish_closes_connection_with_540_not_implemented(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Basic.Publish(exchange="", routing_key="x", immediate=True), 1)
        c.send_frame(ContentHeader(0, 1, commands.Basic.Properties()), 1)
        c.send(raw_frame(3, 1, b"m"))
        close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")
    assert (close.class_id, close.method_id) == (60, 40)


def test_user_id_property_must_match_the_authenticated_user(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"m", pika.BasicProperties(user_id="someone-else"))
    code, text = channel_error(ch.queue_declare, "", exclusive=True)
    assert (code, text) == (406, "PRECONDITION_FAILED - user_id property set to 'someone-else' but "
                                 "authenticated user was 'guest'")


# -- consume and cancel ----------------------------------------------------------------------

def test_consume_without_tag_gets_a_generated_amq_ctag(broker):
    with RawClient(broker.host, broker.port) as c:  # pika always makes up a tag of its own
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        q = c.expect(commands.Queue.DeclareOk).queue
        tags = []
        for _ in range(2):
            c.send_frame(commands.Basic.Consume(queue=q, consumer_tag=""), 1)
            tags.append(c.expect(commands.Basic.ConsumeOk).consumer_tag)
    for tag in tags:
        assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag), tag
    assert tags[0] != tags[1]


def test_consume_with_a_tag_uses_it_for_deliveries(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    rec = Recorder()
    assert ch.basic_consume(q, rec, consumer_tag="my-tag") == "my-tag"
    ch.basic_publish("", q, b"m")
    drain(conn, lambda: rec.deliveries)
    method, _, body = rec.deliveries[0]
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, body) == ("my-tag", 1, False, b"m")
    assert (method.exchange, method.routing_key) == ("", q)


def test_duplicate_consumer_tag_on_a_channel_closes_connection_with_530(broker):
    with RawClient(broker.host, broker.port) as c:  # pika refuses to send it
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        q = c.expect(commands.Queue.DeclareOk).queue
        c.send_frame(commands.Basic.Consume(queue=q, consumer_tag="dup"), 1)
        c.expect(commands.Basic.ConsumeOk)
        c.send_frame(commands.Basic.Consume(queue=q, consumer_tag="dup"), 1)
        close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")
    assert (close.class_id, close.method_id) == (60, 20)


def test_same_consumer_tag_on_two_channels_is_fine(conn):
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    conn.channel().basic_consume(q, Recorder(), consumer_tag="same")
    conn.channel().basic_consume(q, Recorder(), consumer_tag="same")


def test_consume_from_a_missing_queue_is_404(ch, names):
    q = names.queue()
    code, text = channel_error(ch.basic_consume, q, Recorder())
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_second_consumer_on_a_queue_with_an_exclusive_consumer_is_403(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_consume(q, Recorder(), exclusive=True)
    code, text = channel_error(conn.channel().basic_consume, q, Recorder())
    assert (code, text) == (403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


def test_exclusive_consumer_on_a_queue_with_consumers_is_403(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_consume(q, Recorder())
    code, text = channel_error(conn.channel().basic_consume, q, Recorder(), exclusive=True)
    assert (code, text) == (403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


def test_consumers_share_a_queue_round_robin(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    a, b = Recorder(), Recorder()
    ch.basic_consume(q, a, auto_ack=True)
    ch.basic_consume(q, b, auto_ack=True)
    fill(ch, q, 10)
    drain(conn, lambda: len(a.deliveries) + len(b.deliveries) == 10)
    assert len(a.deliveries) == len(b.deliveries) == 5


def test_higher_priority_consumer_gets_messages_while_it_has_capacity(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_qos(prefetch_count=3)
    low, high = Recorder(), Recorder()
    ch.basic_consume(q, low, arguments={"x-priority": 1})
    ch.basic_consume(q, high, arguments={"x-priority": 10})
    fill(ch, q, 5)
    drain(conn, lambda: len(low.deliveries) + len(high.deliveries) == 5)
    assert high.bodies == [b"0", b"1", b"2"]  # high fills its prefetch first
    assert low.bodies == [b"3", b"4"]


def test_no_ack_consumer_messages_are_settled_on_delivery(broker, conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    rec = Recorder()
    tag = ch.basic_consume(q, rec, auto_ack=True)
    fill(ch, q, 3)
    drain(conn, lambda: len(rec.deliveries) == 3)
    ch.basic_cancel(tag)
    ch.close()  # nothing is unacked, so nothing comes back
    ok = conn.channel().queue_declare(q, passive=True).method
    assert ok.message_count == 0


def test_cancel_stops_deliveries_but_keeps_unacked_messages_on_the_channel(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    rec = Recorder()
    tag = ch.basic_consume(q, rec)
    fill(ch, q, 2)
    drain(conn, lambda: len(rec.deliveries) == 2)
    ch.basic_cancel(tag)
    fill(ch, q, 1, prefix="after-")
    settle(conn)
    assert rec.bodies == [b"0", b"1"]
    ch.basic_ack(rec.tags[1], multiple=True)  # still ackable after cancel
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_cancel_of_an_unknown_consumer_tag_is_ok(ch):
    ch.basic_cancel("never-was")
    assert ch.is_open


def test_deleting_a_queue_under_a_consumer_sends_basic_cancel(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    tag = ch.basic_consume(q, Recorder())
    conn.channel().queue_delete(q)
    drain(conn, lambda: cancelled, what="server-sent basic.cancel")
    assert cancelled[0].consumer_tag == tag
    assert ch.is_open


# -- get -----------------------------------------------------------------------------------

def test_get_returns_message_with_remaining_count_then_get_empty(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 2)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.message_count, method.redelivered) == (b"0", 1, False)
    assert (method.exchange, method.routing_key, method.delivery_tag) == ("", q, 1)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.message_count, method.delivery_tag) == (b"1", 0, 2)
    assert ch.basic_get(q) == (None, None, None)


def test_get_from_a_missing_queue_is_404(ch, names):
    q = names.queue()
    code, text = channel_error(ch.basic_get, q)
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_get_is_not_limited_by_prefetch(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=1)
    fill(ch, q, 3)
    got = [ch.basic_get(q)[0] for _ in range(3)]
    assert all(m is not None for m in got)


# -- qos -----------------------------------------------------------------------------------

def _two_queues_two_consumers(conn, ch, per_queue: int):
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q1, per_queue)
    fill(ch, q2, per_queue)
    return q1, q2


def test_prefetch_count_without_global_limits_each_consumer(conn, ch):
    q1, q2 = _two_queues_two_consumers(conn, ch, 5)
    ch.basic_qos(prefetch_count=2, global_qos=False)
    a, b = Recorder(), Recorder()
    ch.basic_consume(q1, a)
    ch.basic_consume(q2, b)
    drain(conn, lambda: len(a.deliveries) == 2 and len(b.deliveries) == 2)
    settle(conn)
    assert (len(a.deliveries), len(b.deliveries)) == (2, 2)
    ch.basic_ack(a.tags[0])
    drain(conn, lambda: len(a.deliveries) == 3)
    settle(conn)
    assert (len(a.deliveries), len(b.deliveries)) == (3, 2)


def test_prefetch_count_with_global_limits_the_whole_channel(conn, ch):
    q1, q2 = _two_queues_two_consumers(conn, ch, 5)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Recorder(), Recorder()
    ch.basic_consume(q1, a)
    ch.basic_consume(q2, b)
    drain(conn, lambda: len(a.deliveries) + len(b.deliveries) == 3)
    settle(conn)
    assert len(a.deliveries) + len(b.deliveries) == 3
    ch.basic_ack(0, multiple=True)
    drain(conn, lambda: len(a.deliveries) + len(b.deliveries) == 6)
    settle(conn)
    assert len(a.deliveries) + len(b.deliveries) == 6


def test_per_consumer_and_global_prefetch_apply_together(conn, ch):
    q1, q2 = _two_queues_two_consumers(conn, ch, 5)
    ch.basic_qos(prefetch_count=2, global_qos=False)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Recorder(), Recorder()
    ch.basic_consume(q1, a)
    ch.basic_consume(q2, b)
    drain(conn, lambda: len(a.deliveries) + len(b.deliveries) == 3)
    settle(conn)
    assert len(a.deliveries) + len(b.deliveries) == 3
    assert max(len(a.deliveries), len(b.deliveries)) == 2


def test_prefetch_applies_to_consumers_created_after_it_only(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 5)
    rec = Recorder()
    ch.basic_consume(q, rec)  # before qos: unlimited
    ch.basic_qos(prefetch_count=1)
    drain(conn, lambda: len(rec.deliveries) == 5)


def test_prefetch_zero_is_unlimited(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=0)
    fill(ch, q, 50)
    rec = Recorder()
    ch.basic_consume(q, rec)
    drain(conn, lambda: len(rec.deliveries) == 50)


def test_prefetch_size_nonzero_is_540_not_implemented(conn):
    ch = conn.channel()
    code, text = connection_error(ch.basic_qos, prefetch_size=1024)
    assert (code, text) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (1024)")


# -- ack, nack, reject ---------------------------------------------------------------------------

def test_ack_multiple_acks_everything_up_to_the_tag(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 4)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(4)]
    assert tags == [1, 2, 3, 4]
    ch.basic_ack(3, multiple=True)
    ch.close()  # only tag 4 was unacked: it alone comes back
    c2 = conn.channel()
    method, _, body = c2.basic_get(q, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"3", True, 0)


def test_ack_tag_zero_multiple_acks_all_outstanding(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    for _ in range(3):
        ch.basic_get(q)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert conn.channel().queue_declare(q, passive=True).method.message_count == 0


def test_reject_with_requeue_redelivers_with_redelivered_flag(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 1)
    method, _, _ = ch.basic_get(q)
    assert method.redelivered is False
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)


def test_reject_without_requeue_drops_the_message(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 1)
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.basic_get(q) == (None, None, None)


def test_nack_multiple_with_requeue_puts_messages_back_in_original_order(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 5)
    for _ in range(3):
        ch.basic_get(q)
    ch.basic_nack(3, multiple=True, requeue=True)
    got = [ch.basic_get(q, auto_ack=True) for _ in range(5)]
    assert [b for _, _, b in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert [m.redelivered for m, _, _ in got] == [True, True, True, False, False]


def test_nack_without_requeue_drops_the_messages(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    for _ in range(2):
        ch.basic_get(q)
    ch.basic_nack(2, multiple=True, requeue=False)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.message_count) == (b"2", 0)


def test_ack_of_an_unknown_delivery_tag_is_406(ch):
    code, text = channel_error(lambda: (ch.basic_ack(42), ch.queue_declare("", exclusive=True)))
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 42")


def test_double_ack_is_406_unknown_delivery_tag(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 1)
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    code, text = channel_error(lambda: (ch.basic_ack(method.delivery_tag), ch.queue_declare("", exclusive=True)))
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_ack_of_a_no_ack_delivery_is_406(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 1)
    method, _, _ = ch.basic_get(q, auto_ack=True)
    code, text = channel_error(lambda: (ch.basic_ack(method.delivery_tag), ch.queue_declare("", exclusive=True)))
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_reject_of_an_unknown_delivery_tag_is_406(ch):
    code, text = channel_error(lambda: (ch.basic_reject(7), ch.queue_declare("", exclusive=True)))
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 7")


def test_delivery_tags_are_per_channel(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 2)
    other = conn.channel()
    assert ch.basic_get(q)[0].delivery_tag == 1
    assert other.basic_get(q)[0].delivery_tag == 1


# -- recover and requeue on close --------------------------------------------------------------------

def test_recover_requeue_redelivers_unacked_messages(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 2)
    rec = Recorder()
    ch.basic_consume(q, rec)
    drain(conn, lambda: len(rec.deliveries) == 2)
    ch.basic_recover(requeue=True)
    drain(conn, lambda: len(rec.deliveries) == 4)
    assert rec.bodies == [b"0", b"1", b"0", b"1"]
    assert [m.redelivered for m, _, _ in rec.deliveries] == [False, False, True, True]
    assert rec.tags == [1, 2, 3, 4]


def test_recover_without_requeue_is_540_not_implemented(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Basic.Recover(requeue=False), 1)
        close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")
    assert (close.class_id, close.method_id) == (60, 110)


def test_unacked_messages_are_requeued_when_the_channel_closes(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    rec = Recorder()
    ch.basic_consume(q, rec)
    drain(conn, lambda: len(rec.deliveries) == 3)
    ch.basic_ack(rec.tags[0])
    ch.close()
    other = conn.channel()
    got = [other.basic_get(q, auto_ack=True) for _ in range(2)]
    assert [b for _, _, b in got] == [b"1", b"2"]
    assert all(m.redelivered for m, _, _ in got)


def test_unacked_messages_are_requeued_when_the_connection_closes(broker, names):
    q = names.queue()
    c1 = connect(broker)
    ch1 = c1.channel()
    ch1.confirm_delivery()
    ch1.queue_declare(q)
    fill(ch1, q, 2)
    ch1.basic_get(q)
    ch1.basic_get(q)
    c1.close()
    c2 = connect(broker)
    try:
        ch2 = c2.channel()
        method, _, body = ch2.basic_get(q, auto_ack=True)
        assert (body, method.redelivered, method.message_count) == (b"0", True, 1)
    finally:
        c2.close()


def test_unacked_messages_are_requeued_when_the_client_vanishes_without_closing(broker, names):
    q = names.queue()
    setup = connect(broker)
    try:
        ch = setup.channel()
        ch.confirm_delivery()
        ch.queue_declare(q)
        fill(ch, q, 3)
        with RawClient(broker.host, broker.port) as c:
            c.handshake()
            c.open_channel(1)
            c.send_frame(commands.Basic.Consume(queue=q, consumer_tag="doomed"), 1)
            c.expect(commands.Basic.ConsumeOk)
            for _ in range(3):
                c.expect(commands.Basic.Deliver)
                c.expect(ContentHeader)
                c.read_frame()  # the body
            # the socket closes here: no channel.close, no connection.close
        got = drain(setup, lambda: [r for r in [ch.basic_get(q, auto_ack=True)] if r[0]] or None,
                    what="requeued message")
        method, _, body = got[0]
        assert (body, method.redelivered, method.message_count) == (b"0", True, 2)
    finally:
        setup.close()


def test_message_cut_off_by_a_vanishing_publisher_is_not_delivered(broker, names):
    q = names.queue()
    setup = connect(broker)
    try:
        ch = setup.channel()
        ch.queue_declare(q)
        with RawClient(broker.host, broker.port) as c:
            c.handshake()
            c.open_channel(1)
            c.send_frame(commands.Basic.Publish(exchange="", routing_key=q), 1)
            c.send_frame(ContentHeader(0, 10, commands.Basic.Properties()), 1)
            c.send(raw_frame(3, 1, b"12345"))  # half the body, then the socket closes
        other = connect(broker)  # a later, complete publish is the only message
        other_ch = other.channel()
        other_ch.confirm_delivery()
        other_ch.basic_publish("", q, b"complete")
        other.close()
        assert ch.queue_declare(q, passive=True).method.message_count == 1
        assert ch.basic_get(q, auto_ack=True)[2] == b"complete"
    finally:
        setup.close()


# -- ordering ------------------------------------------------------------------------------------

def test_one_publisher_one_queue_is_fifo(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    n = 2000
    for i in range(n):
        ch.basic_publish("", q, str(i).encode())
    rec = Recorder()
    ch.basic_consume(q, rec, auto_ack=True)
    drain(conn, lambda: len(rec.deliveries) == n, timeout_s=20)
    assert rec.bodies == [str(i).encode() for i in range(n)]


def test_each_publishers_messages_stay_in_order_when_channels_interleave(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    publishers = [conn.channel() for _ in range(4)]
    n = 300
    for i in range(n):
        for p, pub in enumerate(publishers):
            pub.basic_publish("", q, f"{p}:{i}".encode())
    rec = Recorder()
    ch.basic_consume(q, rec, auto_ack=True)
    drain(conn, lambda: len(rec.deliveries) == 4 * n, timeout_s=20)
    by_publisher: dict[str, list[int]] = {}
    for body in rec.bodies:
        p, i = body.decode().split(":")
        by_publisher.setdefault(p, []).append(int(i))
    assert by_publisher == {str(p): list(range(n)) for p in range(4)}


def test_priority_queue_delivers_higher_priority_first(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    for body, prio in [(b"low", 1), (b"high", 9), (b"none", None), (b"mid", 5), (b"over", 200)]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    bodies = [ch.basic_get(q, auto_ack=True)[2] for _ in range(5)]
    assert bodies == [b"over", b"high", b"mid", b"low", b"none"]  # above max counts as max


# -- message properties ------------------------------------------------------------------------------

ALL_PROPERTIES = dict(
    content_type="application/json", content_encoding="gzip",
    headers={"h": "v"}, delivery_mode=2, priority=7, correlation_id="corr-1",
    reply_to="amq.rabbitmq.reply-to-not-really", expiration="600000", message_id="msg-1",
    timestamp=1_700_000_000, type="order.created", user_id="guest", app_id="hutch-tests",
    cluster_id="cluster-a",
)

RICH_HEADERS = {
    "str": "text", "utf8": "h\u00e9llo \u2713", "int": 42, "negative": -7, "big": 2**40,
    "true": True, "false": False, "void": None,
    "decimal": decimal.Decimal("3.14"), "timestamp": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    "bytes": b"\x00\x01\xff",
    "array": [1, "two", [3, 4], {"five": 5}],
    "table": {"nested": {"deeper": {"deepest": "yes"}}, "list": [True, None]},
    "empty-table": {}, "empty-array": [],
}


def test_all_fourteen_basic_properties_round_trip(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"{}", pika.BasicProperties(**ALL_PROPERTIES))
    _, props, _ = ch.basic_get(q, auto_ack=True)
    for name, value in ALL_PROPERTIES.items():
        assert getattr(props, name) == value, name


def test_headers_table_with_nested_values_round_trips(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"m", pika.BasicProperties(headers=RICH_HEADERS))
    _, props, _ = ch.basic_get(q, auto_ack=True)
    assert props.headers == RICH_HEADERS


def test_content_header_bytes_come_back_unchanged(broker):
    """What a consumer receives is the publisher's content header, byte for byte: field
    types a client library would not produce (short ints, unsigned bytes, floats) included."""
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"short": 7, "table": {"a": [1, 2.5, "x"]}, "flag": True},
        delivery_mode=1, priority=3, message_id="raw-1", timestamp=datetime.datetime(2020, 1, 2, 3, 4, 5))
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        q = c.expect(commands.Queue.DeclareOk).queue
        sent = ContentHeader(0, 3, props)
        c.send_frame(commands.Basic.Publish(exchange="", routing_key=q), 1)
        c.send_frame(sent, 1)
        c.send(raw_frame(3, 1, b"abc"))
        c.send_frame(commands.Basic.Get(queue=q, no_ack=True), 1)
        c.expect(commands.Basic.GetOk)
        got = c.expect(ContentHeader)
    assert got.marshal() == sent.marshal()


# -- direct reply-to ---------------------------------------------------------------------------

def test_direct_reply_to_routes_the_reply_to_the_requesting_channel(conn, ch):
    replies = Recorder()
    ch.basic_consume("amq.rabbitmq.reply-to", replies, auto_ack=True)
    server_q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", server_q, b"request", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    _, props, _ = ch.basic_get(server_q, auto_ack=True)
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
    conn.channel().basic_publish("", props.reply_to, b"response")
    drain(conn, lambda: replies.deliveries, what="reply")
    method, _, body = replies.deliveries[0]
    assert (body, method.routing_key) == (b"response", props.reply_to)


def test_direct_reply_to_needs_a_no_ack_consumer(conn):
    ch = conn.channel()
    code, text = channel_error(ch.basic_consume, "amq.rabbitmq.reply-to", Recorder(), auto_ack=False)
    assert (code, text) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_publishing_with_direct_reply_to_without_consuming_it_is_406(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"request", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    code, text = channel_error(ch.queue_declare, "", exclusive=True)
    assert (code, text) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
