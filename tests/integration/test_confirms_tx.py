"""Publisher confirms and transactions, as RabbitMQ 3.10 does them.

Confirms: after confirm.select every publish is acked exactly once, in order of delivery tag,
possibly several at a time (`multiple`); an unroutable mandatory message gets basic.return
before its ack; a queue that refuses a message (reject-publish overflow) gets it nacked.
Transactions: publishes and acks take effect only at tx.commit; tx.rollback forgets them;
a channel is in confirm mode or tx mode, never both.
"""

from __future__ import annotations

import pika
import pika.exceptions
from pamqp import commands, frame
from pamqp.header import ContentHeader

from tests.integration.helpers import channel_error, drain
from tests.integration.rawamqp import RawClient, raw_frame


def raw_publish(c: RawClient, routing_key: str, body: bytes = b"m", exchange: str = "",
                mandatory: bool = False, channel: int = 1) -> None:
    c.send(b"".join([
        _marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory), channel),
        _marshal(ContentHeader(0, len(body), commands.Basic.Properties()), channel),
        raw_frame(3, channel, body),
    ]))


def _marshal(value, channel: int) -> bytes:
    return frame.marshal(value, channel)


def confirm_channel(c: RawClient) -> str:
    """Open channel 1 in confirm mode with an exclusive queue; the queue's name."""
    c.handshake()
    c.open_channel(1)
    c.send_frame(commands.Confirm.Select(), 1)
    c.expect(commands.Confirm.SelectOk)
    c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
    return c.expect(commands.Queue.DeclareOk).queue


def acked_tags(c: RawClient, n: int, kind=commands.Basic.Ack) -> tuple[list[int], int]:
    """Read confirms until tags 1..n are all covered; (tags in the order covered, frames read)."""
    covered: list[int] = []
    frames = 0
    while len(covered) < n:
        value = c.expect(kind)
        frames += 1
        last = covered[-1] if covered else 0
        assert value.delivery_tag > last, f"confirm for {value.delivery_tag} after {last}"
        if value.multiple:
            covered.extend(range(last + 1, value.delivery_tag + 1))
        else:
            assert value.delivery_tag == last + 1, "a single confirm skipped a tag"
            covered.append(value.delivery_tag)
    return covered, frames


# -- confirms ----------------------------------------------------------------------------------

def test_confirm_select_then_every_publish_is_acked_once_in_order(broker):
    with RawClient(broker.host, broker.port) as c:
        q = confirm_channel(c)
        n = 500
        for i in range(n):
            raw_publish(c, q, str(i).encode())
        tags, frames = acked_tags(c, n)
    assert tags == list(range(1, n + 1))
    assert frames <= n


def test_confirms_for_a_burst_are_coalesced_with_multiple(broker):
    with RawClient(broker.host, broker.port) as c:
        q = confirm_channel(c)
        n = 2000
        c.send(b"".join(_burst(q, n)))
        _, frames = acked_tags(c, n)
    assert frames < n


def _burst(q: str, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        body = str(i).encode()
        out.append(_marshal(commands.Basic.Publish(exchange="", routing_key=q), 1))
        out.append(_marshal(ContentHeader(0, len(body), commands.Basic.Properties()), 1))
        out.append(raw_frame(3, 1, body))
    return out


def test_unroutable_publish_is_acked(broker):
    with RawClient(broker.host, broker.port) as c:
        confirm_channel(c)
        raw_publish(c, "no-such-queue-anywhere", exchange="amq.direct")
        ack = c.expect(commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_unroutable_mandatory_publish_gets_basic_return_then_ack(broker):
    with RawClient(broker.host, broker.port) as c:
        confirm_channel(c)
        raw_publish(c, "no-such-queue-anywhere", exchange="amq.direct", mandatory=True)
        ret = c.expect(commands.Basic.Return)
        c.expect(ContentHeader)
        _, body = c.read_frame()
        ack = c.expect(commands.Basic.Ack)
    assert (ret.reply_code, ret.reply_text, ret.exchange) == (312, "NO_ROUTE", "amq.direct")
    assert body.value == b"m"
    assert ack.delivery_tag == 1


def test_queue_refusing_a_message_gets_it_nacked(broker, names):
    q = names.queue()
    with RawClient(broker.host, broker.port) as c:
        confirm_channel(c)
        c.send_frame(commands.Queue.Declare(queue=q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}), 1)
        c.expect(commands.Queue.DeclareOk)
        raw_publish(c, q, b"kept")
        assert c.expect(commands.Basic.Ack).delivery_tag == 1
        raw_publish(c, q, b"refused")
        nack = c.expect(commands.Basic.Nack)
    assert nack.delivery_tag == 2  # multiple or not: tag 1 was acked already, so it means the same


def test_confirm_select_twice_is_fine_and_keeps_counting(broker):
    with RawClient(broker.host, broker.port) as c:
        q = confirm_channel(c)
        raw_publish(c, q)
        assert c.expect(commands.Basic.Ack).delivery_tag == 1
        c.send_frame(commands.Confirm.Select(), 1)
        c.expect(commands.Confirm.SelectOk)
        raw_publish(c, q)
        assert c.expect(commands.Basic.Ack).delivery_tag == 2


def test_pika_blocking_publish_in_confirm_mode_raises_for_unroutable_mandatory(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("amq.direct", "no-such-queue-anywhere", b"m", mandatory=True)
        raise AssertionError("expected UnroutableError")
    except pika.exceptions.UnroutableError as e:
        assert e.messages[0].method.reply_code == 312


def test_publish_to_a_missing_exchange_in_confirm_mode_closes_the_channel(conn, names):
    ch = conn.channel()
    ch.confirm_delivery()
    x = names.exchange()
    code, text = channel_error(ch.basic_publish, x, "k", b"m")
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


# -- transactions ------------------------------------------------------------------------------

def test_publishes_in_a_transaction_appear_only_on_commit(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    observer = conn.channel()
    assert observer.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert observer.queue_declare(q, passive=True).method.message_count == 2
    assert [observer.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"1", b"2"]


def test_rollback_discards_publishes(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"dropped")
    ch.tx_rollback()
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    assert ch.basic_get(q, auto_ack=True)[2] == b"kept"
    assert ch.basic_get(q) == (None, None, None)


def test_acks_in_a_transaction_take_effect_only_on_commit(conn):
    setup = conn.channel()
    setup.confirm_delivery()
    q = setup.queue_declare("", exclusive=True).method.queue
    for body in (b"a", b"b"):
        setup.basic_publish("", q, body)
    ch = conn.channel()
    ch.tx_select()
    first, _, _ = ch.basic_get(q)
    second, _, _ = ch.basic_get(q)
    ch.basic_ack(first.delivery_tag)
    ch.tx_commit()          # "a" is acked for good
    ch.basic_ack(second.delivery_tag)
    ch.tx_rollback()        # "b"'s ack is forgotten: it stays unacked ...
    ch.close()              # ... and so comes back when the channel closes
    method, _, body = setup.basic_get(q, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"b", True, 0)


def test_unroutable_mandatory_publish_in_a_transaction_is_returned_before_commit_ok(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _c, method, _p, _b: returned.append(method.reply_code))
    ch.tx_select()
    ch.basic_publish("amq.direct", "no-such-queue-anywhere", b"m", mandatory=True)
    assert returned == []
    ch.tx_commit()
    drain(conn, lambda: returned, what="basic.return")
    assert returned == [312]


def test_commit_without_select_is_406(conn):
    ch = conn.channel()
    code, text = channel_error(ch.tx_commit)
    assert (code, text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_rollback_without_select_is_406(conn):
    ch = conn.channel()
    code, text = channel_error(ch.tx_rollback)
    assert (code, text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_confirm_select_on_a_tx_channel_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    code, text = channel_error(ch.confirm_delivery)
    assert (code, text) == (406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_select_on_a_confirm_channel_is_406(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    code, text = channel_error(ch.tx_select)
    assert (code, text) == (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


def test_empty_commit_and_rollback_are_fine(conn):
    ch = conn.channel()
    ch.tx_select()
    ch.tx_commit()
    ch.tx_rollback()
    ch.tx_select()  # selecting again is idempotent
    ch.tx_commit()


def test_pika_properties_survive_a_transaction(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"m", pika.BasicProperties(message_id="tx-1", headers={"k": 1}))
    ch.tx_commit()
    _, props, _ = ch.basic_get(q, auto_ack=True)
    assert (props.message_id, props.headers) == ("tx-1", {"k": 1})
