"""Streams over AMQP 0-9-1 on one node (`x-queue-type: stream`), side by side with RabbitMQ.

A stream is an append-only log that consumers read from any offset (`x-stream-offset`); their
acknowledgements only give credit back. Every behaviour RabbitMQ 3.10.8 with the
rabbitmq_stream plugin shows is checked on both brokers in the same test (the `node` fixture
runs each test once per broker): the declare rules and their texts, the consume rules (a
prefetch is required; automatic acknowledgement, basic.get, queue.purge, nack and reject are
540s), the offset specifications, the `x-stream-offset` header, and the message properties a
consumer gets back. The rest concerns hutch's own log: retention by size removes whole old
segments, a restart keeps the stream, a delete removes its files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import channel_error, connection_error, drain, wait_until
from tests.support.brokers import HutchNode, RabbitMQNode, free_port

pytestmark = pytest.mark.timeout(300)

STREAM = {"x-queue-type": "stream"}
RABBITMQ_PLUGINS = "/usr/lib/rabbitmq/bin/rabbitmq-plugins"
RABBITMQ_START_S = 180.0


@pytest.fixture(scope="module")
def hutch():
    with HutchNode() as node:
        yield node


@pytest.fixture(scope="module")
def rabbitmq():
    """One RabbitMQ node with the rabbitmq_stream plugin for the module."""
    # its stream listener on a free port: the default 5552 may be taken by another node
    node = RabbitMQNode(management=False, config_extra=f"stream.listeners.tcp.default = {free_port()}")
    try:
        node.start(timeout_s=RABBITMQ_START_S)  # a loaded machine can take a while
        enabled = subprocess.run([RABBITMQ_PLUGINS, "-n", node.nodename, "enable", "rabbitmq_stream"],
                                 env=node._env(), capture_output=True, text=True, timeout=RABBITMQ_START_S)
        assert enabled.returncode == 0, f"rabbitmq_stream not enabled: {enabled.stdout}{enabled.stderr}"
        yield node
    finally:
        node.cleanup()


@pytest.fixture(params=["hutch", "rabbitmq"])
def node(request):
    return request.getfixturevalue(request.param)


def connect(node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, heartbeat=0,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


@pytest.fixture
def conn(node):
    c = connect(node)
    yield c
    if c.is_open:
        c.close()


def unique(prefix: str = "s") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stream(node):
    """A fresh stream's name on `node`, deleted after the test."""
    name = unique()
    yield name
    with contextlib.closing(connect(node)) as c:
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
            c.channel().queue_delete(name)


def declare(ch, name: str, **args):
    return ch.queue_declare(name, durable=True, arguments={**STREAM, **args}).method


def publish_five(conn, name: str) -> None:
    """RabbitMQ's measured case: five messages, each its own confirmed publish (its own chunk)."""
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, name)
    for i in range(5):
        ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(headers={"h": i}, content_type="text/plain"))


class Consumer:
    """A consumer on its own channel that records what it gets (and acks it when told to)."""

    def __init__(self, conn, name: str, prefetch: int = 10, ack: bool = True, **args):
        self.conn = conn
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.ack = ack
        self.got: list[tuple[int, bytes, pika.BasicProperties]] = []
        self.tag = self.ch.basic_consume(name, self._on, arguments=args or None)

    def _on(self, ch, method, props, body) -> None:
        self.got.append((method.delivery_tag, body, props))
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    @property
    def bodies(self) -> list[bytes]:
        return [b for _t, b, _p in self.got]

    @property
    def offsets(self) -> list[int]:
        return [p.headers["x-stream-offset"] for _t, _b, p in self.got]

    def wait(self, n: int, timeout_s: float = 10.0) -> Consumer:
        drain(self.conn, lambda: len(self.got) >= n, timeout_s, f"{n} deliveries (have {len(self.got)})")
        return self


# ----------------------------------------------------------------------------- declaring


@pytest.mark.parametrize("flags,prop", [
    ({"exclusive": True}, "exclusive-owner"),
    ({"auto_delete": True}, "auto-delete"),
    ({"durable": False}, "non-durable"),
], ids=["exclusive", "auto-delete", "non-durable"])
def test_a_stream_is_durable_and_shared(conn, stream, flags, prop):
    flags = {"durable": True, **flags}
    code, text = channel_error(conn.channel().queue_declare, stream, arguments=STREAM, **flags)
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{stream}' in vhost '/'")


@pytest.mark.parametrize("args,reason", [
    ({"x-max-age": "7X"}, "invalid_max_age"),
    ({"x-max-age": 5}, "{unacceptable_type,signedint}"),
], ids=["bad-unit", "not-a-string"])
def test_x_max_age_must_be_an_age(conn, stream, args, reason):
    code, text = channel_error(declare, conn.channel(), stream, **args)
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '{stream}' in vhost '/': "
                                 f"{reason}")


@pytest.mark.parametrize("arg,value", [
    ("x-max-length", 5), ("x-message-ttl", 1000), ("x-max-priority", 5), ("x-dead-letter-exchange", "dlx"),
    ("x-single-active-consumer", True),
])
def test_arguments_of_other_queue_types_are_refused(conn, stream, arg, value):
    code, text = channel_error(declare, conn.channel(), stream, **{arg: value})
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{stream}' in vhost '/' "
                                 "of queue type rabbit_stream_queue")


def test_segment_size_has_a_maximum(conn, stream):
    code, text = channel_error(declare, conn.channel(), stream, **{"x-stream-max-segment-size-bytes": 10**12})
    assert (code, text) == (406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes")


@pytest.mark.parametrize("args,reason", [
    ({"x-max-length-bytes": "10"}, "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': "
                                   "\"expected integer, got longstr\""),
    ({"x-max-length-bytes": True}, "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': "
                                   "\"expected integer, got bool\""),
    ({"x-stream-max-segment-size-bytes": -5}, "invalid arg 'x-stream-max-segment-size-bytes' for queue '{q}' in "
                                              "vhost '/': {{value_negative,-5}}"),
    ({"x-initial-cluster-size": 0}, "invalid arg 'x-initial-cluster-size' for queue '{q}' in vhost '/': "
                                    "{{value_zero,0}}"),
    ({"x-max-age": "0D"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
    ({"x-queue-leader-locator": "nope"}, "invalid arg 'x-queue-leader-locator' for queue '{q}' in vhost '/': "
                                         "invalid_queue_locator_arg"),
    ({"x-overflow": "drop-head"}, "invalid arg 'x-overflow' for queue '{q}' in vhost '/' of queue type "
                                  "rabbit_stream_queue"),
], ids=["bytes-text", "bytes-bool", "segment-negative", "cluster-size-zero", "age-zero", "locator", "overflow"])
def test_stream_arguments_are_checked_as_rabbitmq_checks_them(conn, stream, args, reason):
    code, text = channel_error(declare, conn.channel(), stream, **args)
    assert (code, text) == (406, "PRECONDITION_FAILED - " + reason.format(q=stream))


def counts(conn, name: str) -> tuple[int, int]:
    ok = conn.channel().queue_declare(name, passive=True).method
    return ok.message_count, ok.consumer_count


def test_a_transaction_publishes_to_a_stream_on_commit(conn, stream):
    declare(conn.channel(), stream)
    ch = conn.channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", stream, f"t{i}".encode())
    ch.tx_commit()
    c = Consumer(conn, stream, **{"x-stream-offset": "first"}).wait(3)
    assert c.bodies == [b"t0", b"t1", b"t2"]


def test_declare_ok_counts_the_messages(conn, stream):
    """RabbitMQ's counts come from the stream's statistics, a moment behind: wait for them."""
    publish_five(conn, stream)
    wait_until(lambda: counts(conn, stream) == (5, 0), 15, "declare-ok's counts")
    assert declare(conn.channel(), stream).queue == stream


# ----------------------------------------------------------------------------- what a stream refuses


def test_a_consumer_needs_a_prefetch(conn, stream):
    publish_five(conn, stream)
    ch = conn.channel()
    code, text = channel_error(ch.basic_consume, stream, lambda *a: None)
    assert (code, text) == (406, f"PRECONDITION_FAILED - consumer prefetch count is not set for "
                                 f"'queue '{stream}' in vhost '/''")


def test_automatic_acknowledgement_is_not_implemented(conn, stream):
    publish_five(conn, stream)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    code, text = connection_error(ch.basic_consume, stream, lambda *a: None, auto_ack=True)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues "
                                 f"queue '{stream}' in vhost '/'")


def test_basic_get_is_not_implemented(conn, stream):
    publish_five(conn, stream)
    code, text = connection_error(conn.channel().basic_get, stream)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{stream}' "
                                 "in vhost '/'")


def test_purge_is_not_implemented(conn, stream):
    publish_five(conn, stream)
    code, text = connection_error(conn.channel().queue_purge, stream)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{stream}' "
                                 "in vhost '/'")


@pytest.mark.parametrize("how", ["nack", "reject"])
def test_nack_and_reject_are_not_implemented(conn, stream, how):
    publish_five(conn, stream)
    c = Consumer(conn, stream, ack=False, **{"x-stream-offset": "first"}).wait(1)
    tag = c.got[0][0]
    settle = c.ch.basic_nack if how == "nack" else c.ch.basic_reject
    settle(tag)
    code, text = connection_error(drain, conn, lambda: False, 5)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues "
                                 f"queue '{stream}' in vhost '/'")


def test_recover_is_refused_by_hutch_as_a_requeue(hutch):
    """RabbitMQ 3.10.8 closes the connection with 541 INTERNAL_ERROR on basic.recover with a
    stream's deliveries unacknowledged; hutch refuses it as the requeue it is, with the 540 of
    nack and reject."""
    name = unique()
    conn = connect(hutch)
    publish_five(conn, name)
    c = Consumer(conn, name, ack=False, **{"x-stream-offset": "first"}).wait(5)
    code, text = connection_error(c.ch.basic_recover, requeue=True)
    assert (code, text) == (540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream "
                                 f"queues queue '{name}' in vhost '/'")
    with contextlib.closing(connect(hutch)) as conn:
        conn.channel().queue_delete(name)


def test_closing_a_channel_with_unacknowledged_deliveries_is_quiet(conn, stream):
    """Deliveries of a stream only took credit: closing their channel returns nothing and the
    connection stays open."""
    publish_five(conn, stream)
    c = Consumer(conn, stream, ack=False, **{"x-stream-offset": "first"}).wait(5)
    c.ch.close()
    assert conn.is_open
    wait_until(lambda: counts(conn, stream) == (5, 0), 15, "declare-ok's counts")


# ----------------------------------------------------------------------------- reading from an offset


def test_first_reads_everything_with_the_offset_header(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": "first"}).wait(5)
    assert [t for t, _b, _p in c.got] == [1, 2, 3, 4, 5]
    assert c.bodies == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [p.headers for _t, _b, p in c.got] == [{"h": i, "x-stream-offset": i} for i in range(5)]
    assert {p.content_type for _t, _b, p in c.got} == {"text/plain"}


def test_next_is_the_default_and_reads_only_what_comes_after(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", stream, b"later")
    c.wait(1)
    assert c.bodies == [b"later"] and c.offsets == [5]


def test_last_reads_from_the_last_chunk(conn, stream):
    publish_five(conn, stream)  # each confirmed publish was its own chunk
    c = Consumer(conn, stream, **{"x-stream-offset": "last"}).wait(1)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", stream, b"m5")
    c.wait(2)
    assert c.bodies == [b"m4", b"m5"] and c.offsets == [4, 5]


def test_a_numeric_offset_reads_from_there(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": 2}).wait(3)
    assert c.bodies == [b"m2", b"m3", b"m4"] and c.offsets == [2, 3, 4]


def test_an_offset_below_the_first_reads_from_the_first(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": -1}).wait(5)
    assert c.offsets == [0, 1, 2, 3, 4]


def test_an_offset_beyond_the_end_waits_for_it(conn, stream):
    publish_five(conn, stream)
    far = Consumer(conn, stream, **{"x-stream-offset": 7})
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(5, 9):
        ch.basic_publish("", stream, f"m{i}".encode())
    far.wait(2)
    assert far.offsets == [7, 8]


def test_an_interval_reads_what_is_younger(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": "10m"}).wait(5)
    assert c.offsets == [0, 1, 2, 3, 4]


def test_a_timestamp_reads_the_chunks_written_from_then(conn, stream):
    """AMQP 0-9-1 timestamps have whole seconds: the second batch is published after a second
    boundary, and the consumer starts at that boundary."""
    publish_five(conn, stream)
    boundary = int(time.time()) + 1
    wait_until(lambda: time.time() >= boundary + 0.05, 3, "the next second")
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(5, 8):
        ch.basic_publish("", stream, f"m{i}".encode())
    start = dt.datetime.fromtimestamp(boundary, tz=dt.UTC)
    c = Consumer(conn, stream, **{"x-stream-offset": start}).wait(3)
    assert c.bodies == [b"m5", b"m6", b"m7"] and c.offsets == [5, 6, 7]


def test_an_invalid_offset_is_refused_by_hutch_with_a_406_naming_it(hutch):
    """RabbitMQ 3.10.8 closes the connection with 541 INTERNAL_ERROR for an `x-stream-offset` it
    cannot read; hutch's 406 names the value, the better answer for a client's mistake."""
    name = unique()
    with contextlib.closing(connect(hutch)) as conn:
        declare(conn.channel(), name)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        code, text = channel_error(ch.basic_consume, name, lambda *a: None, arguments={"x-stream-offset": "soon"})
        assert code == 406
        assert text == f"PRECONDITION_FAILED - invalid x-stream-offset for queue '{name}' in vhost '/': soon"
        conn.channel().queue_delete(name)


def test_a_delivery_carries_the_exchange_and_routing_key_it_was_published_with(conn, stream):
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, stream)
    ch.queue_bind(stream, "amq.direct", "rk")
    ch.basic_publish("amq.direct", "rk", b"routed")
    ch.basic_publish("", stream, b"direct")
    got: list[tuple[str, str, bool, bytes]] = []
    c = conn.channel()
    c.basic_qos(prefetch_count=10)
    c.basic_consume(stream, lambda ch_, m, _p, b: (got.append((m.exchange, m.routing_key, m.redelivered, b)),
                                                   ch_.basic_ack(m.delivery_tag)), arguments={"x-stream-offset": "first"})
    drain(conn, lambda: len(got) == 2, 10, "two deliveries")
    assert got == [("amq.direct", "rk", False, b"routed"), ("", stream, False, b"direct")]


def test_consuming_again_on_the_channel_starts_where_asked(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": "first"}).wait(5)
    c.ch.basic_cancel(c.tag)
    c.got.clear()
    c.tag = c.ch.basic_consume(stream, c._on, arguments={"x-stream-offset": 3})
    c.wait(2)
    assert [t for t, _b, _p in c.got] == [6, 7] and c.offsets == [3, 4]


def test_deleting_a_stream_cancels_its_consumers(conn, stream):
    publish_five(conn, stream)
    c = Consumer(conn, stream, **{"x-stream-offset": "first"}).wait(5)
    cancelled: list[str] = []
    c.ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    conn.channel().queue_delete(stream)
    drain(conn, lambda: cancelled, 10, "basic.cancel")
    assert cancelled == [c.tag]


# ----------------------------------------------------------------------------- consumers and credit


def test_consumers_read_independently(conn, stream):
    publish_five(conn, stream)
    a = Consumer(conn, stream, **{"x-stream-offset": "first"})
    b = Consumer(conn, stream, **{"x-stream-offset": 3})
    c = Consumer(conn, stream, prefetch=1, **{"x-stream-offset": "first"})
    for consumer, n in ((a, 5), (b, 2), (c, 5)):
        consumer.wait(n)
    assert a.offsets == [0, 1, 2, 3, 4] and b.offsets == [3, 4] and c.offsets == [0, 1, 2, 3, 4]
    # (RabbitMQ 3.10.8's declare-ok counts no stream consumers; hutch's counts its three)
    wait_until(lambda: counts(conn, stream)[0] == 5, 15, "declare-ok's message count")


def test_acks_give_credit_and_a_consumer_that_does_not_ack_stops_at_its_prefetch(conn, stream):
    ch = conn.channel()
    ch.confirm_delivery()
    declare(ch, stream)
    for i in range(30):
        ch.basic_publish("", stream, f"m{i}".encode())
    acking = Consumer(conn, stream, prefetch=3, **{"x-stream-offset": "first"})
    holding = Consumer(conn, stream, prefetch=3, ack=False, **{"x-stream-offset": "first"})
    acking.wait(30)
    holding.wait(3)
    holding.ch.basic_qos(prefetch_count=3)  # a round trip: whatever the broker sent is here now
    assert acking.offsets == list(range(30))
    assert holding.offsets == [0, 1, 2]
    holding.ch.basic_ack(holding.got[-1][0], multiple=True)
    holding.wait(6)
    holding.ch.basic_qos(prefetch_count=3)
    assert holding.offsets == list(range(6))


# ----------------------------------------------------------------------------- message properties


PROPERTIES = dict(message_id="mid-1", correlation_id="cid-1", reply_to="replies", expiration="60000", priority=3,
                  delivery_mode=2, timestamp=1_700_000_000, type="order.created", app_id="shop", user_id="guest",
                  content_type="application/json", content_encoding="gzip")
HEADERS = {"int": 1, "long": 2**40, "negative": -5, "bool": True, "text": "str", "none": None,
           "time": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "table": {"x": "y", "deeper": {"z": 3}},
           "array": [1, "two", {"z": 3}]}
# What differs from RabbitMQ 3.10.8 (hutch maps 0-9-1 to AMQP 1.0 and back as RabbitMQ 3.13 does):
# RabbitMQ 3.10.8 gives a byte-array header back as a byte array; hutch gives a long string.
DIFFERENT_FROM_3_10 = {"bytes-header": ("bytes", b"raw")}


def _read_back(node) -> list[tuple[bytes, dict]]:
    name = unique()
    with contextlib.closing(connect(node)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        declare(ch, name)
        ch.basic_publish("", name, b"all", pika.BasicProperties(**PROPERTIES, headers=HEADERS))
        for k, v in HEADERS.items():
            ch.basic_publish("", name, k.encode(), pika.BasicProperties(delivery_mode=2, headers={k: v}))
        ch.basic_publish("", name, b"bytes-header", pika.BasicProperties(headers={"bytes": b"raw"}))
        ch.basic_publish("", name, b"bare", pika.BasicProperties())
        c = Consumer(conn, name, prefetch=100, **{"x-stream-offset": "first"}).wait(len(HEADERS) + 3)
        conn.channel().queue_delete(name)
        return [(b, {k: v for k, v in vars(p).items() if v is not None}) for _t, b, p in c.got]


def test_properties_come_back_as_rabbitmq_gives_them(hutch, rabbitmq):
    ours, theirs = _read_back(hutch), _read_back(rabbitmq)
    assert [b for b, _p in ours] == [b for b, _p in theirs]
    for (body, got), (_body, expected) in zip(ours, theirs, strict=True):
        if body.decode() in DIFFERENT_FROM_3_10:
            continue
        assert got == expected, body
    first = dict(ours)[b"all"]
    assert {k: first[k] for k in PROPERTIES} == PROPERTIES
    # nested tables and arrays do not survive the AMQP 1.0 application properties, on either broker
    assert "table" not in first["headers"] and "array" not in first["headers"]
    assert first["headers"]["x-stream-offset"] == 0
    by_body = dict(ours)
    assert by_body[b"bytes-header"]["headers"]["bytes"] in (b"raw", "raw")
    assert dict(theirs)[b"bare"].get("delivery_mode") is None
    assert by_body[b"bare"].get("delivery_mode") is None


# ----------------------------------------------------------------------------- hutch's own log


def _stream_dirs(node: HutchNode) -> list:
    d = node.data_dir / "streams"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


N_RETAINED = 100


def test_retention_by_size_removes_whole_old_segments(hutch):
    name = unique()
    with contextlib.closing(connect(hutch)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        declare(ch, name, **{"x-max-length-bytes": 3000, "x-stream-max-segment-size-bytes": 1000})
        body = b"x" * 200
        # the host runs retention every few seconds
        for i in range(N_RETAINED):
            ch.basic_publish("", name, body, pika.BasicProperties(headers={"i": i}))
        wait_until(lambda: conn.channel().queue_declare(name, passive=True).method.message_count < N_RETAINED, 20,
                   "old segments removed")
        c = Consumer(conn, name, prefetch=100, **{"x-stream-offset": "first"})
        left = conn.channel().queue_declare(name, passive=True).method.message_count
        c.wait(left)
        first = c.offsets[0]
        assert first > 0
        assert c.offsets == list(range(first, N_RETAINED))  # whole chunks went from the old end, nothing else
        assert [p.headers["i"] for _t, _b, p in c.got] == list(range(first, N_RETAINED))
        conn.channel().queue_delete(name)


def test_a_restart_keeps_the_stream_and_its_messages():
    with HutchNode() as node:
        name = unique()
        with contextlib.closing(connect(node)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            declare(ch, name)
            for i in range(20):
                ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(headers={"i": i}))
        node.restart()
        with contextlib.closing(connect(node)) as conn:
            assert declare(conn.channel(), name).message_count == 20
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", name, b"m20")
            c = Consumer(conn, name, prefetch=50, **{"x-stream-offset": "first"}).wait(21)
            assert c.bodies == [f"m{i}".encode() for i in range(21)]
            assert c.offsets == list(range(21))


def test_delete_removes_the_streams_files(hutch):
    name = unique()
    with contextlib.closing(connect(hutch)) as conn:
        before = _stream_dirs(hutch)
        ch = conn.channel()
        ch.confirm_delivery()
        declare(ch, name)
        ch.basic_publish("", name, b"m0")
        new = wait_until(lambda: sorted(set(_stream_dirs(hutch)) - set(before)), 5, "the stream's directory")
        assert len(new) == 1
        assert any((hutch.data_dir / "streams" / new[0]).iterdir())
        conn.channel().queue_delete(name)
        wait_until(lambda: new[0] not in _stream_dirs(hutch), 5, "the stream's directory gone")
