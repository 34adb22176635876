"""Stream filtering over AMQP 0-9-1 (RabbitMQ 3.13's): a publisher sets the header
`x-stream-filter-value`, a consumer asks with `x-stream-filter` (a value or a list) and
`x-stream-match-unfiltered`. hutch delivers exactly the matching messages (RabbitMQ skips whole
chunks by their bloom filter and leaves the rest to the client), and the values go into the
chunks' bloom filters, so that a filtering stream-protocol subscriber finds those chunks."""

from __future__ import annotations

import time

import pika
import pytest

from hutch.streamproto import frames as f
from tests.support.brokers import HutchNode
from tests.support.stream_client import chunk_bodies, raw

pytestmark = pytest.mark.timeout(120)
STREAM = {"x-queue-type": "stream"}
PUBLISHED = [("red", "r1"), ("blue", "b1"), (None, "plain"), ("red", "r2"), ("green", "g1")]


@pytest.fixture(scope="module")
def node():
    with HutchNode() as n:
        conn = pika.BlockingConnection(pika.URLParameters(n.url))
        ch = conn.channel()
        ch.queue_declare("filtered", durable=True, arguments=STREAM)
        ch.confirm_delivery()
        for value, body in PUBLISHED:
            headers = {"x-stream-filter-value": value} if value else None
            ch.basic_publish("", "filtered", body.encode(), pika.BasicProperties(headers=headers))
        conn.close()
        yield n


def consume(node: HutchNode, **arguments) -> list[bytes]:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume("filtered", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "first", **arguments})
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # all that will come comes at once; wait a little for more
        conn.process_data_events(0.1)
    conn.close()
    return got


def test_a_consumer_gets_the_messages_with_its_filter_values(node):
    assert consume(node, **{"x-stream-filter": "red"}) == [b"r1", b"r2"]
    assert consume(node, **{"x-stream-filter": ["blue", "green"]}) == [b"b1", b"g1"]


def test_match_unfiltered_adds_the_messages_without_a_filter_value(node):
    assert consume(node, **{"x-stream-filter": "red", "x-stream-match-unfiltered": True}) == [b"r1", b"plain", b"r2"]


def test_without_a_filter_a_consumer_gets_everything_with_the_header(node):
    assert consume(node) == [body.encode() for _v, body in PUBLISHED]


def test_a_filtering_stream_protocol_subscriber_finds_the_chunks_of_its_value(node):
    with raw(node) as c:
        c.send(f.ExchangeCommandVersions(c.cid(), [(f.KEY_PUBLISH, 1, 2), (f.KEY_DELIVER, 1, 2)]))
        c.recv(f.ExchangeCommandVersionsResponse)
        assert c.call(f.Subscribe(c.cid(), 1, "filtered", f.OFFSET_TYPE_FIRST, None, 10,
                                  {"filter.0": "green"})).code == f.OK
        d = c.recv(f.Deliver, f.DeliverV2)
        assert chunk_bodies(d.chunk) == [b"g1"]  # each confirmed publish was a chunk of its own
        assert c.sync() == []  # the other chunks have no green


def test_a_filter_that_matches_little_reads_on_through_reads_it_empties(node):
    """About 90 reads of 1 MiB whose messages the filter drops, one after the other on the
    replica here, then the one message that matches."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("sparse", durable=True, arguments=STREAM)
    ch.confirm_delivery()
    body = b"x" * 60_000  # a read takes 1 MiB: about 17 messages
    for _ in range(1_500):  # about 90 reads of nothing but unmatched messages
        ch.basic_publish("", "sparse", body, pika.BasicProperties(headers={"x-stream-filter-value": "blue"}))
    ch.basic_publish("", "sparse", b"the one", pika.BasicProperties(headers={"x-stream-filter-value": "red"}))
    got: list[bytes] = []
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("sparse", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "first", "x-stream-filter": "red"})
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.close()
    assert got == [b"the one"]
