"""Quorum-queue messages near the Raft log's record limit, on a single node.

A message under max_message_size but too large for one Raft entry (`ENTRY_BYTES_MAX`, 16 MiB
less 64 KiB) is never proposed: its publish is nacked, the node logs a warning naming the
queue, and the queue goes on taking and delivering messages. Large messages under the limit
that arrive together (several in one loop iteration) are each their own entry, and are all
confirmed.
"""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq.exceptions
import pika
import pika.exceptions
import pytest

from hutch.quorum.host import ENTRY_BYTES_MAX
from tests.support.brokers import HutchNode

QUORUM = {"x-queue-type": "quorum"}
MiB = 1 << 20
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def node():
    with HutchNode() as n:
        yield n


def unique() -> str:
    return f"qq-large-{uuid.uuid4().hex[:8]}"


def test_a_message_too_large_for_an_entry_is_nacked_and_the_queue_goes_on(node):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=TIMEOUT_S))
    try:
        ch = conn.channel()
        name = unique()
        ch.queue_declare(name, durable=True, arguments=QUORUM)
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", name, b"x" * (20 * MiB))
        ch.basic_publish("", name, b"small")
        method, _props, body = ch.basic_get(name, auto_ack=True)
        assert (method is not None, body) == (True, b"small")
        assert ch.queue_declare(name, passive=True).method.message_count == 0
    finally:
        conn.close()
    assert f"queue '{name}' in vhost '/': refused a message of" in node.log()


def test_large_messages_published_together_are_all_confirmed(node):
    """Five 4 MiB messages and one over the entry limit, published without waiting: the five
    are confirmed and kept, in order; only the one too large is nacked."""
    sizes = [4 * MiB, 4 * MiB, ENTRY_BYTES_MAX + 1, 4 * MiB, 4 * MiB, 4 * MiB]

    async def run() -> tuple[list[bool], list[tuple[int, int]]]:
        connection = await aio_pika.connect(node.url, timeout=TIMEOUT_S)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(unique(), durable=True, arguments=QUORUM)

            async def publish(i: int, size: int) -> bool:
                try:
                    await channel.default_exchange.publish(aio_pika.Message(bytes([i]) * size), queue.name,
                                                           timeout=TIMEOUT_S)
                except aiormq.exceptions.DeliveryError:
                    return False
                return True

            confirmed = await asyncio.gather(*(publish(i, n) for i, n in enumerate(sizes)))
            got = []
            while (m := await queue.get(no_ack=True, fail=False, timeout=TIMEOUT_S)) is not None:
                got.append((m.body[0], len(m.body)))
            return list(confirmed), got

    async def bounded():
        async with asyncio.timeout(TIMEOUT_S * 2):
            return await run()

    confirmed, got = asyncio.run(bounded())
    assert confirmed == [n <= 4 * MiB for n in sizes]
    assert got == [(i, n) for i, n in enumerate(sizes) if n <= 4 * MiB]
