"""The broker through the other client libraries people use: pika's asynchronous
SelectConnection, aio-pika (asyncio), kombu (Celery's transport) and py-amqp.

These are end-to-end conversations the way applications hold them: declare, publish with
confirms, consume with acks, RPC over reply queues, transactions. aio-pika runs inside
`asyncio.run` in each test, with a deadline on the whole conversation.
"""

from __future__ import annotations

import asyncio

import aio_pika
import amqp
import kombu
import pika
import pytest
from kombu import Exchange, Queue
from kombu.simple import SimpleQueue
from pamqp import commands

CONVERSATION_TIMEOUT_S = 30


# -- pika SelectConnection --------------------------------------------------------------------

def test_pika_select_connection_publishes_with_confirms_and_consumes_with_acks(broker, names):
    """The asynchronous adapter: confirm.select, 500 publishes, every one acked, then a
    consumer with prefetch 20 acks all 500 in order."""
    n = 500
    queue = names.queue()
    state = {"acked": set(), "received": [], "error": None}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["ch"] = ch
        ch.add_on_close_callback(lambda _ch, reason: fail(ch.connection, f"channel closed: {reason}"))
        ch.queue_declare(queue, callback=lambda _f: ch.confirm_delivery(on_confirm, callback=lambda _f: publish(ch)))

    def publish(ch):
        for i in range(n):
            ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))

    def on_confirm(frame):
        method = frame.method
        assert isinstance(method, pika.spec.Basic.Ack), method
        last = max(state["acked"], default=0)
        tags = range(last + 1, method.delivery_tag + 1) if method.multiple else [method.delivery_tag]
        state["acked"].update(tags)
        if len(state["acked"]) == n:
            ch = state["ch"]
            ch.basic_qos(prefetch_count=20, callback=lambda _f: ch.basic_consume(queue, on_message))

    def on_message(ch, method, _props, body):
        state["received"].append(int(body))
        ch.basic_ack(method.delivery_tag)
        if len(state["received"]) == n:
            ch.connection.close()

    def fail(conn, why):
        if state["error"] is None and len(state["received"]) < n:
            state["error"] = why
        if conn.is_open:
            conn.close()

    params = pika.ConnectionParameters(host=broker.host, port=broker.port,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.SelectConnection(params, on_open_callback=on_open,
                                 on_open_error_callback=lambda c, e: (state.update(error=repr(e)), c.ioloop.stop()),
                                 on_close_callback=lambda c, _r: c.ioloop.stop())
    timer = conn.ioloop.call_later(CONVERSATION_TIMEOUT_S, lambda: fail(conn, "timed out"))
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    assert state["error"] is None, state["error"]
    assert state["acked"] == set(range(1, n + 1))
    assert state["received"] == list(range(n))


# -- aio-pika ---------------------------------------------------------------------------------

def run(coro):
    async def bounded():
        async with asyncio.timeout(CONVERSATION_TIMEOUT_S):
            return await coro
    return asyncio.run(bounded())


def test_aio_pika_declare_publish_confirm_and_iterate(broker, names):
    async def conversation():
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.declare_exchange(names.exchange(), aio_pika.ExchangeType.TOPIC,
                                                      auto_delete=True)
            queue = await channel.declare_queue(names.queue(), auto_delete=True)
            await queue.bind(exchange, "orders.#")
            for i in range(10):
                confirmation = await exchange.publish(
                    aio_pika.Message(str(i).encode(), headers={"i": i}, message_id=f"m{i}"), f"orders.eu.{i}")
                assert isinstance(confirmation, commands.Basic.Ack), confirmation
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append((message.body, message.headers["i"], message.message_id, message.routing_key))
                    if len(got) == 10:
                        break
            return got

    got = run(conversation())
    assert got == [(str(i).encode(), i, f"m{i}", f"orders.eu.{i}") for i in range(10)]


def test_aio_pika_reject_with_requeue_redelivers(broker):
    async def conversation():
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"again"), queue.name)
            first = await queue.get(timeout=5)
            assert not first.redelivered
            await first.reject(requeue=True)
            second = await queue.get(timeout=5)
            await second.ack()
            return second.body, second.redelivered

    assert run(conversation()) == (b"again", True)


def test_aio_pika_transaction_commit_and_rollback(broker):
    async def conversation():
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            queue = await channel.declare_queue(exclusive=True)
            tx = channel.transaction()
            await tx.select()
            await channel.default_exchange.publish(aio_pika.Message(b"rolled back"), queue.name)
            await tx.rollback()
            await channel.default_exchange.publish(aio_pika.Message(b"committed"), queue.name)
            await tx.commit()
            message = await queue.get(timeout=5)
            await message.ack()
            empty = await queue.get(fail=False)
            return message.body, empty

    assert run(conversation()) == (b"committed", None)


def test_aio_pika_rpc_over_a_reply_queue(broker, names):
    async def conversation():
        connection = await aio_pika.connect(broker.url)
        async with connection:
            server_channel = await connection.channel()
            requests = await server_channel.declare_queue(names.queue("rpc"), auto_delete=True)

            async def serve(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    n = int(message.body)
                    await server_channel.default_exchange.publish(
                        aio_pika.Message(str(n * n).encode(), correlation_id=message.correlation_id),
                        message.reply_to)

            await requests.consume(serve)
            client_channel = await connection.channel()
            replies = await client_channel.declare_queue(exclusive=True)
            answers: dict[str, bytes] = {}
            done = asyncio.Event()

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage):
                answers[message.correlation_id] = message.body
                await message.ack()
                if len(answers) == 5:
                    done.set()

            await replies.consume(on_reply)
            for n in range(5):
                await client_channel.default_exchange.publish(
                    aio_pika.Message(str(n).encode(), correlation_id=f"c{n}", reply_to=replies.name),
                    requests.name)
            await done.wait()
            return answers

    assert run(conversation()) == {f"c{n}": str(n * n).encode() for n in range(5)}


# -- kombu ----------------------------------------------------------------------------------

@pytest.fixture
def kombu_conn(broker):
    with kombu.Connection(f"amqp://guest:guest@{broker.host}:{broker.port}//", connect_timeout=5) as c:
        yield c


def test_kombu_simple_queue_put_get(kombu_conn, names):
    q: SimpleQueue = kombu_conn.SimpleQueue(names.queue_and_exchange())
    try:
        q.put({"hello": "world"}, serializer="json")
        message = q.get(block=True, timeout=5)
        message.ack()
        assert message.payload == {"hello": "world"}
        assert message.content_type == "application/json"
        with pytest.raises(q.Empty):
            q.get(block=True, timeout=0.2)
    finally:
        q.close()


def test_kombu_producer_and_consumer_over_a_topic_exchange(kombu_conn, names):
    exchange = Exchange(names.exchange(), type="topic", durable=False, auto_delete=True)
    queue = Queue(names.queue(), exchange, routing_key="tasks.*", auto_delete=True)
    got = []
    with kombu_conn.Consumer(queue, callbacks=[lambda body, m: (got.append(body), m.ack())], accept=["json"]):
        producer = kombu_conn.Producer(serializer="json")
        for i in range(5):
            producer.publish({"n": i}, exchange=exchange, routing_key=f"tasks.{i}", declare=[queue],
                             retry=False)
        producer.publish({"n": "unrouted"}, exchange=exchange, routing_key="other.x", retry=False)
        while len(got) < 5:
            kombu_conn.drain_events(timeout=5)
    assert got == [{"n": i} for i in range(5)]


def test_kombu_reject_requeue_redelivers(kombu_conn, names):
    q = kombu_conn.SimpleQueue(names.queue_and_exchange())
    try:
        q.put("retry me")
        first = q.get(timeout=5)
        first.requeue()
        second = q.get(timeout=5)
        second.ack()
        assert (second.payload, second.delivery_info["redelivered"]) == ("retry me", True)
    finally:
        q.close()


def test_kombu_confirm_publish_through_a_pool(broker, names):
    url = f"amqp://guest:guest@{broker.host}:{broker.port}//"
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
        queue = Queue(names.queue(), routing_key=names.queue(), auto_delete=True)
        with conn.Producer() as producer:
            for i in range(20):
                producer.publish({"i": i}, routing_key=queue.routing_key, declare=[queue], serializer="json")
        with conn.SimpleQueue(queue) as simple:
            assert [simple.get(timeout=5).payload["i"] for _ in range(20)] == list(range(20))


def test_kombu_message_ttl_and_max_priority(kombu_conn, names):
    queue = Queue(names.queue(), routing_key=names.queue(), max_priority=10, message_ttl=60,
                  auto_delete=False)
    queue(kombu_conn.default_channel).declare()
    producer = kombu_conn.Producer(serializer="json")
    for p in (1, 9, 5):
        producer.publish({"p": p}, routing_key=queue.name, priority=p)
    with kombu_conn.SimpleQueue(queue) as simple:
        got = [simple.get(timeout=5) for _ in range(3)]
        for m in got:
            m.ack()
    assert [m.payload["p"] for m in got] == [9, 5, 1]


# -- py-amqp ---------------------------------------------------------------------------------

def test_py_amqp_publish_get_and_header_types(broker):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest", confirm_publish=True)
    conn.connect()
    try:
        ch = conn.channel()
        q, _, _ = ch.queue_declare("", exclusive=True)
        headers = {"int": 1, "str": "s", "bool": True, "list": [1, "a"], "nested": {"k": "v"}}
        ch.basic_publish(amqp.Message(b"body", application_headers=headers, content_type="text/plain"),
                         routing_key=q)
        message = ch.basic_get(q, no_ack=True)
        assert message.body == b"body"
        assert message.headers == headers
        assert message.content_type == "text/plain"
        assert message.delivery_info["message_count"] == 0
        assert ch.basic_get(q) is None
    finally:
        conn.close()


def test_py_amqp_immediate_publish_raises_not_implemented(broker):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest")
    conn.connect()
    ch = conn.channel()
    q, _, _ = ch.queue_declare("", exclusive=True)
    try:
        with pytest.raises(amqp.exceptions.AMQPNotImplementedError) as info:
            ch.basic_publish(amqp.Message(b"x"), routing_key=q, immediate=True)
            ch.basic_get(q)  # the close arrives on the next read
        assert info.value.reply_text == "NOT_IMPLEMENTED - immediate=true"
        assert info.value.code == 540
    finally:
        conn.collect()
