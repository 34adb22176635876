"""Quorum queues on a single node, as a client sees them (`x-queue-type: quorum`).

The declaration rules (durable, never exclusive or auto-delete, no priorities), the
`x-delivery-count` header on every redelivery, `x-delivery-limit` dead-lettering with reason
`delivery_limit`, and the refusal of global qos, with RabbitMQ 3.10's codes and texts.
Replication itself is the cluster suite's subject.
"""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import channel_error, connection_error, drain

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def ch(conn):
    """A channel in confirm mode: a publish returns once the queue has committed it."""
    c = conn.channel()
    c.confirm_delivery()
    return c


@pytest.mark.parametrize("flags,prop", [
    ({"durable": False}, "non-durable"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": True, "auto_delete": True}, "auto-delete"),
], ids=["non-durable", "exclusive", "auto-delete"])
def test_quorum_queue_must_be_durable_and_shared(ch, names, flags, prop):
    q = names.queue()
    code, text = channel_error(ch.queue_declare, q, arguments=QUORUM, **flags)
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{q}' in vhost '/'")


def test_quorum_queue_declare_and_redeclare(ch, names):
    q = names.queue()
    ok = ch.queue_declare(q, durable=True, arguments=QUORUM).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 0)
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    ch.queue_declare(q, passive=True)


def test_redeclaring_a_quorum_queue_as_classic_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    code, text = channel_error(ch.queue_declare, q, durable=True, arguments={"x-queue-type": "classic"})
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{q}' in "
                                 "vhost '/': received 'classic' but current is 'quorum'")


def test_unknown_queue_type_is_406(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_declare, q, durable=True, arguments={"x-queue-type": "nope"})
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{q}' in "
                                 "vhost '/': \"unsupported queue type 'nope'\"")


def test_quorum_queue_refuses_max_priority(ch, names):
    q = names.queue()
    code, text = channel_error(ch.queue_declare, q, durable=True, arguments={**QUORUM, "x-max-priority": 5})
    assert code == 406
    assert text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{q}' in vhost '/'")


def test_quorum_queue_is_fifo_and_confirms_every_publish(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    for i in range(200):
        ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(q, passive=True).method.message_count == 200
    got = []
    ch.basic_qos(prefetch_count=50)
    ch.basic_consume(q, lambda c, m, _p, b: (got.append(int(b)), c.basic_ack(m.delivery_tag)))
    drain(ch.connection, lambda: len(got) == 200, timeout_s=20)
    assert got == list(range(200))


def test_every_redelivery_carries_x_delivery_count(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    ch.basic_publish("", q, b"m")
    seen = []
    for _ in range(3):
        method, props, _ = ch.basic_get(q)
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count")))
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert seen == [(False, 0), (True, 1), (True, 2)]


def test_delivery_limit_dead_letters_with_reason_delivery_limit(ch, names):
    q, dlq = names.queue("work"), names.queue("dead")
    ch.queue_declare(dlq)
    ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-delivery-limit": 1,
                                                 "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"poison")
    for _ in range(2):
        method, _, _ = ch.basic_get(q)
        ch.basic_reject(method.delivery_tag, requeue=True)
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(dlq, auto_ack=True))[0] and r,
                                what="dead-lettered message")
    assert body == b"poison"
    (death,) = props.headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", q, 1)
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    assert ch.basic_get(q) == (None, None, None)


def test_consuming_from_a_quorum_queue_with_global_qos_is_540(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    code, text = connection_error(ch.basic_consume, q, lambda *a: None)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos")


def test_message_ttl_expires_messages_at_the_head_and_dead_letters_them(ch, names):
    q = names.queue()
    dlq = q + ".dead"
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-message-ttl": 300, "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"short-lived")
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(dlq, auto_ack=True))[0] and r,
                                what="expired message")
    assert body == b"short-lived"
    assert props.headers["x-death"][0]["reason"] == "expired"
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_confirms_with_some_publishes_refused_settle_every_tag_exactly_once(broker, names):
    """reject-publish refuses some publishes while earlier ones still wait for their confirm:
    every tag gets one ack or one nack, and no `multiple` ack covers a nacked tag (aiormq drops
    such a frame, leaving its publishes unconfirmed)."""
    import asyncio

    import aiormq
    q = names.queue()

    async def run() -> list[str]:
        conn = await aiormq.connect(f"amqp://guest:guest@{broker.host}:{broker.port}/")
        ch = await conn.channel()
        await ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-max-length": 3,
                                                          "x-overflow": "reject-publish"})
        futures = [asyncio.ensure_future(ch.basic_publish(f"m{i}".encode(), routing_key=q)) for i in range(40)]
        done = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 20)
        await conn.close()
        return ["Nack" if isinstance(d, aiormq.exceptions.DeliveryError) else type(d).__name__ for d in done]
    outcomes = asyncio.run(run())
    assert len(outcomes) == 40
    assert "Ack" in outcomes and "Nack" in outcomes, outcomes


def test_consume_ok_comes_before_the_first_delivery_of_a_queue_with_messages_ready(ch, names, broker):
    """A client may register its consumer when basic.consume-ok arrives (hutch's own load tool
    does, and drops a delivery for a tag it does not know): the broker must send consume-ok
    first, as RabbitMQ does, also when messages are ready at once."""
    import asyncio

    from hutch.lab.client import Connection

    q = names.queue()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    for i in range(20):
        ch.basic_publish("", q, f"m{i}".encode())

    async def consume() -> list[bytes]:
        conn = await Connection.connect(broker.url)
        try:
            c = await conn.channel()
            await c.qos(50)
            got: list[bytes] = []
            await c.consume(q, lambda tag, _redelivered, body: (got.append(body), c.ack(tag)))
            for _ in range(100):
                if len(got) == 20:
                    break
                await asyncio.sleep(0.05)
            return got
        finally:
            await conn.close()
    assert asyncio.run(consume()) == [f"m{i}".encode() for i in range(20)]
