"""The stream protocol (port 5552) on one node, with the clients people use: rstream 1.1.1,
rbfly 0.10.0 (and 0.11.1, in a Python 3.12 of its own: tests/streamclients), pika for the AMQP 0-9-1 side, and a raw socket client (hutch.streamproto.frames)
where a test needs to see frames as they come.

Where both can be asked, a test runs against hutch and against RabbitMQ 3.10.8 with the
rabbitmq_stream plugin (`server` is each of them in turn) and holds both to the same answers.
RabbitMQ 3.10 lacks what came in 3.11 and 3.13 (stream statistics, publish version 2 and
filtering): those tests run against hutch alone and say so.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pika
import pytest

from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f
from tests.support.brokers import HutchNode, RabbitMQNode, free_port, port_open, wait_until
from tests.support.stream_client import (
    TIMEOUT_S,
    Raw,
    amqp_body,
    chunk_bodies,
    create,
    publish_chunks,
    raw,
    read_all,
    run,
    unique,
)

# ---------------------------------------------------------------- nodes


@pytest.fixture(scope="module")
def hutch_node() -> Iterator[HutchNode]:
    with HutchNode() as node:
        yield node


@pytest.fixture(scope="module")
def rabbit_node() -> Iterator[RabbitMQNode]:
    port = free_port()
    node = RabbitMQNode(management=False, config_extra=f"stream.listeners.tcp.default = {port}\n"
                                                       "stream.advertised_host = localhost")
    node.stream_port = port
    try:
        node.start()
        subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmq-plugins", "-n", node.nodename, "enable", "rabbitmq_stream"],
                       env=node._env(), check=True, capture_output=True, timeout=120)
        wait_until(lambda: port_open("127.0.0.1", port), 60, "RabbitMQ's stream listener", proc=node.proc)
        yield node
    finally:
        node.cleanup()


@pytest.fixture(scope="module", params=["hutch", "rabbitmq"])
def server(request):
    """Each broker in turn: the same test, the same assertions."""
    return request.getfixturevalue("hutch_node" if request.param == "hutch" else "rabbit_node")


# ---------------------------------------------------------------- streams: create and delete


def test_create_then_create_again_is_stream_already_exists_and_delete_of_unknown_is_stream_does_not_exist(server):
    name = unique()
    with raw(server) as c:
        assert c.call(f.Create(c.cid(), name, {})).code == f.OK
        assert c.call(f.Create(c.cid(), name, {})).code == f.STREAM_ALREADY_EXISTS
        assert c.call(f.Delete(c.cid(), name)).code == f.OK
        assert c.call(f.Delete(c.cid(), name)).code == f.STREAM_DOES_NOT_EXIST
        assert c.call(f.Delete(c.cid(), unique())).code == f.STREAM_DOES_NOT_EXIST


@pytest.mark.parametrize("arguments", [{"max-length-bytes": "lots"}, {"max-age": "forever"},
                                       {"initial-cluster-size": "-1x"}])
def test_create_with_bad_argument_values_is_precondition_failed(hutch_node, arguments):
    """RabbitMQ 3.13 validates the arguments and answers PRECONDITION_FAILED; 3.10 fails to
    parse them and its connection closes with no answer: hutch answers as 3.13 does."""
    name = unique()
    with raw(hutch_node) as c:
        assert c.call(f.Create(c.cid(), name, arguments)).code == f.PRECONDITION_FAILED
        # nothing was created, and the connection goes on
        assert c.call(f.Delete(c.cid(), name)).code == f.STREAM_DOES_NOT_EXIST


def test_create_ignores_an_argument_it_does_not_know(server):
    name = unique()
    with raw(server) as c:
        assert c.call(f.Create(c.cid(), name, {"no-such-argument": "1"})).code == f.OK
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_create_with_good_arguments(server):
    name = unique()
    with raw(server) as c:
        create(c, name, **{"max-length-bytes": "1000000", "max-age": "1h",
                           "stream-max-segment-size-bytes": "500000"})
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_rstream_creates_and_deletes_with_its_errors(server):
    from rstream import Producer
    from rstream.exceptions import StreamAlreadyExists, StreamDoesNotExist

    name = unique()

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            with pytest.raises(StreamAlreadyExists):
                await p.create_stream(name)
            await p.create_stream(name, exists_ok=True)
            assert await p.stream_exists(name)
            await p.delete_stream(name)
            assert not await p.stream_exists(name)
            with pytest.raises(StreamDoesNotExist):
                await p.delete_stream(name)
            await p.delete_stream(name, missing_ok=True)
    run(go())


# ---------------------------------------------------------------- publishing


def test_rstream_publishes_with_confirms_and_reads_back_in_order(server):
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, amqp_decoder

    name = unique()
    n = 50

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            for i in range(10):
                await p.send_wait(name, AMQPMessage(body=f"m{i}".encode()))
            await p.send_batch(name, [AMQPMessage(body=f"m{i}".encode()) for i in range(10, n)])
            got: list[bytes] = []
            done = asyncio.Event()

            async def on_message(msg, ctx):
                got.append(b"".join(msg.body) if isinstance(msg.body, list) else msg.body)
                if len(got) == n:
                    done.set()
            async with Consumer("127.0.0.1", server.stream_port, username="guest", password="guest") as c:
                await c.subscribe(name, on_message, decoder=amqp_decoder,
                                  offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
                await asyncio.wait_for(done.wait(), TIMEOUT_S)
            assert got == [f"m{i}".encode() for i in range(n)]
            await p.delete_stream(name)
    run(go())


def test_publish_to_an_unknown_publisher_is_publisher_does_not_exist(server):
    with raw(server) as c:
        c.send(f.Publish(7, [(1, amqp_body("lost"))]))
        err = c.recv(f.PublishError)
        assert (err.publisher_id, err.errors) == (7, [(1, f.PUBLISHER_DOES_NOT_EXIST)])


def test_declare_publisher_on_an_unknown_stream_is_stream_does_not_exist(server):
    with raw(server) as c:
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", unique())).code == f.STREAM_DOES_NOT_EXIST
        assert c.call(f.DeletePublisher(c.cid(), 1)).code == f.PUBLISHER_DOES_NOT_EXIST


def test_deduplication_a_producer_that_reconnects_and_republishes_is_confirmed_and_stored_once(server):
    name = unique()
    ref = "invoices-writer"
    with raw(server) as c:
        create(c, name)
        assert c.call(f.QueryPublisherSequence(c.cid(), ref, name)).sequence == 0
        assert c.call(f.DeclarePublisher(c.cid(), 0, ref, name)).code == f.OK
        c.send(f.Publish(0, [(i, amqp_body(f"m{i}")) for i in range(1, 6)]))
        confirmed: set[int] = set()
        while len(confirmed) < 5:
            confirmed.update(c.recv(f.PublishConfirm).publishing_ids)
    with raw(server) as c:  # the producer comes back, does not know what got through, sends it all again
        seq = c.call(f.QueryPublisherSequence(c.cid(), ref, name))
        assert (seq.code, seq.sequence) == (f.OK, 5)
        assert c.call(f.DeclarePublisher(c.cid(), 3, ref, name)).code == f.OK
        c.send(f.Publish(3, [(i, amqp_body(f"m{i}")) for i in range(1, 9)]))
        confirmed = set()
        while len(confirmed) < 8:
            confirmed.update(c.recv(f.PublishConfirm).publishing_ids)
        assert confirmed == set(range(1, 9))
        assert c.call(f.QueryPublisherSequence(c.cid(), ref, name)).sequence == 8
        assert read_all(c, name, 8) == [f"m{i}".encode() for i in range(1, 9)]
        assert c.sync() == []  # and nothing more
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def _with_id(msg, publishing_id: int):
    msg.publishing_id = publishing_id  # rstream 1.1.1's AMQPMessage takes it as an attribute only
    return msg


def test_rstream_named_producer_resumes_its_sequence_after_a_restart(server):
    from rstream import AMQPMessage, Producer

    name = unique()
    ref = "rstream-writer"

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            for i in range(1, 4):
                await p.send_wait(name, _with_id(AMQPMessage(body=f"m{i}".encode()), i), publisher_name=ref)
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            for i in range(1, 6):  # 1..3 again: confirmed, not stored twice
                await p.send_wait(name, _with_id(AMQPMessage(body=f"m{i}".encode()), i), publisher_name=ref)
    run(go())
    with raw(server) as c:
        assert c.call(f.QueryPublisherSequence(c.cid(), ref, name)).sequence == 5
        assert read_all(c, name, 5) == [f"m{i}".encode() for i in range(1, 6)]
        assert c.sync() == []
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_publisher_id_and_reference_taken_twice(server):
    name = unique()
    with raw(server) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "ref-a", name)).code == f.OK
        assert c.call(f.DeclarePublisher(c.cid(), 1, "ref-b", name)).code == f.PRECONDITION_FAILED
        assert c.call(f.DeclarePublisher(c.cid(), 2, "ref-a", name)).code == f.PRECONDITION_FAILED
        assert c.call(f.DeclarePublisher(c.cid(), 3, "", name)).code == f.OK
        assert c.call(f.DeclarePublisher(c.cid(), 4, "", name)).code == f.OK
        assert c.call(f.QueryPublisherSequence(c.cid(), "never-used", name)).sequence == 0
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


@pytest.mark.parametrize("stream", ["", "amq.stream", "\n"])
def test_create_with_a_name_rabbitmq_refuses_is_precondition_failed(server, stream):
    with raw(server) as c:
        assert c.call(f.Create(c.cid(), stream, {})).code == f.PRECONDITION_FAILED


@pytest.mark.parametrize("stream", ["x" * 200, "a/b", "with space", "ünïcode"])
def test_create_with_names_rabbitmq_takes(server, stream):
    with raw(server) as c:
        assert c.call(f.Create(c.cid(), stream, {})).code == f.OK
        publish_chunks(c, stream, [["in " + stream[:10]]])
        assert c.call(f.Delete(c.cid(), stream)).code == f.OK


def test_query_publisher_sequence_of_an_unknown_stream(server):
    with raw(server) as c:
        assert c.call(f.QueryPublisherSequence(c.cid(), "w", unique())).code == f.STREAM_DOES_NOT_EXIST


# ---------------------------------------------------------------- subscribing


def _subscribe(c: Raw, stream: str, offset_type: int, offset: int | None = None, sub: int = 1,
               credit: int = 10) -> None:
    assert c.call(f.Subscribe(c.cid(), sub, stream, offset_type, offset, credit)).code == f.OK


def _chunks_of(c: Raw, sub: int, count: int) -> list[tuple[int, list[bytes]]]:
    """The next `count` chunks delivered to subscription `sub`: (first offset, bodies) each."""
    out = []
    for _ in range(count):
        d = c.recv(f.Deliver, f.DeliverV2)
        assert d.subscription_id == sub
        out.append((chunks.read_header(d.chunk).first_offset, chunk_bodies(d.chunk)))
    return out


def test_subscribe_from_first_last_next_offset_and_timestamp(server):
    name = unique()
    with raw(server) as c:
        create(c, name)
        publish_chunks(c, name, [["a0", "a1"], ["b2", "b3"]])
        # a timestamp between the chunks: wait for the clock to move on, then take it
        t0 = time.time_ns() // 1_000_000
        wait_until(lambda: time.time_ns() // 1_000_000 > t0 + 1, 5, "the clock")
        ts = time.time_ns() // 1_000_000
        wait_until(lambda: time.time_ns() // 1_000_000 > ts + 1, 5, "the clock")
        publish_chunks(c, name, [["c4", "c5", "c6"]])

        # from the first: every message, in order. How a publish frame's messages fall into
        # chunks is the broker's: hutch keeps a frame in one chunk (test_stream_batching.py),
        # RabbitMQ's writer sometimes splits one (c4 alone, then c5 and c6). What follows reads
        # the layout from here.
        _subscribe(c, name, f.OFFSET_TYPE_FIRST, sub=1)
        layout: list[tuple[int, list[bytes]]] = []
        while sum(len(bodies) for _, bodies in layout) < 7:
            layout += _chunks_of(c, 1, 1)
        assert [b for _, bodies in layout for b in bodies] == [b"a0", b"a1", b"b2", b"b3", b"c4", b"c5", b"c6"]
        firsts = [first for first, _ in layout]
        # each chunk starts where the ones before it end
        assert firsts == [sum(len(bodies) for _, bodies in layout[:i]) for i in range(len(layout))]
        assert 4 in firsts  # c4 was published after b3 was confirmed: it starts a chunk

        def from_chunk_holding(offset: int) -> list[tuple[int, list[bytes]]]:
            i = max(i for i, first in enumerate(firsts) if first <= offset)
            return layout[i:]

        # from the last: the last chunk only
        _subscribe(c, name, f.OFFSET_TYPE_LAST, sub=2)
        assert _chunks_of(c, 2, 1) == layout[-1:]

        # an offset inside a chunk: the whole chunk comes, the client skips what is before
        _subscribe(c, name, f.OFFSET_TYPE_OFFSET, 3, sub=3)
        want = from_chunk_holding(3)
        assert _chunks_of(c, 3, len(want)) == want

        # a timestamp: from the first chunk written at or after it, c4's
        _subscribe(c, name, f.OFFSET_TYPE_TIMESTAMP, ts, sub=4)
        want = from_chunk_holding(4)
        assert want[0][0] == 4 and _chunks_of(c, 4, len(want)) == want

        _subscribe(c, name, f.OFFSET_TYPE_NEXT, sub=5)
        assert c.sync() == []  # nothing for "next" (nor more for the others) until something is published
        publish_chunks(c, name, [["d7"]])
        seen = {}
        while len(seen) < 5:
            d = c.recv(f.Deliver, f.DeliverV2)
            seen[d.subscription_id] = chunk_bodies(d.chunk)
        assert seen == {i: [b"d7"] for i in range(1, 6)}
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_subscribe_errors(server):
    name = unique()
    with raw(server) as c:
        assert c.call(f.Subscribe(c.cid(), 1, unique(), f.OFFSET_TYPE_FIRST, None, 1)).code == f.STREAM_DOES_NOT_EXIST
        create(c, name)
        _subscribe(c, name, f.OFFSET_TYPE_FIRST, sub=1)
        assert c.call(f.Subscribe(c.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 1)).code == \
            f.SUBSCRIPTION_ID_ALREADY_EXISTS
        assert c.call(f.Unsubscribe(c.cid(), 1)).code == f.OK
        assert c.call(f.Unsubscribe(c.cid(), 1)).code == f.SUBSCRIPTION_ID_DOES_NOT_EXIST
        c.send(f.Credit(42, 1))
        assert c.recv(f.CreditResponse) == f.CreditResponse(f.SUBSCRIPTION_ID_DOES_NOT_EXIST, 42)
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_credit_a_consumer_gets_as_many_chunks_as_it_grants(server):
    name = unique()
    with raw(server) as c:
        create(c, name)
        publish_chunks(c, name, [[f"m{i}"] for i in range(6)])
        _subscribe(c, name, f.OFFSET_TYPE_FIRST, sub=1, credit=1)
        first = c.recv(f.Deliver, f.DeliverV2)
        assert chunk_bodies(first.chunk) == [b"m0"]
        assert c.sync() == []  # no credit, no chunk
        c.send(f.Credit(1, 2))
        got = [chunk_bodies(c.recv(f.Deliver, f.DeliverV2).chunk) for _ in range(2)]
        assert got == [[b"m1"], [b"m2"]]
        assert c.sync() == []
        c.send(f.Credit(1, 100))
        got = [chunk_bodies(c.recv(f.Deliver, f.DeliverV2).chunk) for _ in range(3)]
        assert got == [[b"m3"], [b"m4"], [b"m5"]]
        # credit left over is used by chunks written later
        publish_chunks(c, name, [["late"]])
        assert chunk_bodies(c.recv(f.Deliver, f.DeliverV2).chunk) == [b"late"]
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_rstream_consumer_with_little_credit_gets_everything(server):
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, amqp_decoder

    name = unique()
    n = 30

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            for i in range(n):
                await p.send_wait(name, AMQPMessage(body=f"m{i}".encode()))
            got: list[int] = []
            done = asyncio.Event()

            def on_message(msg, ctx):
                got.append(ctx.offset)
                if len(got) == n:
                    done.set()
            async with Consumer("127.0.0.1", server.stream_port, username="guest", password="guest") as c:
                await c.subscribe(name, on_message, decoder=amqp_decoder, initial_credit=1,
                                  offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
                await asyncio.wait_for(done.wait(), TIMEOUT_S)
            assert got == list(range(n))
            await p.delete_stream(name)
    run(go())


def test_rstream_sub_entry_batches_plain_and_gzip_are_read_as_single_messages_at_their_offsets(server):
    from rstream import (
        AMQPMessage,
        CompressionType,
        Consumer,
        ConsumerOffsetSpecification,
        OffsetType,
        Producer,
        amqp_decoder,
    )

    name = unique()

    async def go():
        confirmed = asyncio.Event()
        count = 0

        def on_confirm(status):
            nonlocal count
            count += 1
            if count == 2:
                confirmed.set()
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            await p.send_sub_entry(name, [AMQPMessage(body=f"plain{i}".encode()) for i in range(4)],
                                   compression_type=CompressionType.No, on_publish_confirm=on_confirm)
            await p.send_sub_entry(name, [AMQPMessage(body=f"gzip{i}".encode()) for i in range(5)],
                                   compression_type=CompressionType.Gzip, on_publish_confirm=on_confirm)
            await asyncio.wait_for(confirmed.wait(), TIMEOUT_S)
            got = []
            done = asyncio.Event()

            def on_message(msg, ctx):
                got.append((ctx.offset, b"".join(msg.body) if isinstance(msg.body, list) else msg.body))
                if len(got) == 9:
                    done.set()
            async with Consumer("127.0.0.1", server.stream_port, username="guest", password="guest") as c:
                await c.subscribe(name, on_message, decoder=amqp_decoder,
                                  offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
                await asyncio.wait_for(done.wait(), TIMEOUT_S)
            assert got == list(enumerate([f"plain{i}".encode() for i in range(4)] +
                                         [f"gzip{i}".encode() for i in range(5)]))
            await p.delete_stream(name)
    run(go())


def test_an_offset_past_the_end_waits_for_it_and_unsubscribe_stops_deliveries(server):
    name = unique()
    with raw(server) as c:
        create(c, name)
        publish_chunks(c, name, [["a0", "a1"]])
        _subscribe(c, name, f.OFFSET_TYPE_OFFSET, 3, sub=1)
        _subscribe(c, name, f.OFFSET_TYPE_TIMESTAMP, int(time.time() * 1000) + 3_600_000, sub=2)
        _subscribe(c, name, f.OFFSET_TYPE_FIRST, sub=3)
        assert chunk_bodies(c.recv(f.Deliver, f.DeliverV2).chunk) == [b"a0", b"a1"]
        assert c.sync() == []
        assert c.call(f.Unsubscribe(c.cid(), 3)).code == f.OK
        publish_chunks(c, name, [["b2", "b3"]])  # offset 3 is in it: subscription 1 gets the chunk
        seen = {}
        while len(seen) < 2:
            d = c.recv(f.Deliver, f.DeliverV2)
            seen[d.subscription_id] = chunk_bodies(d.chunk)
        assert seen == {1: [b"b2", b"b3"], 2: [b"b2", b"b3"]}
        assert c.sync() == []  # and nothing for the subscription that went
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_a_consumer_that_does_not_read_its_socket_does_not_fill_the_nodes_memory(hutch_node):
    """Credit for every chunk of 64 MB and a client that reads nothing: the node sends as the
    socket drains, so its memory stays put (without that it would hold the whole backlog)."""
    import psutil

    name = unique()
    body = amqp_body("x" * 100_000)
    with raw(hutch_node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        for batch in range(64):
            c.send(f.Publish(1, [(batch * 10 + i, body) for i in range(10)]))  # a chunk of 1 MB
            c.recv(f.PublishConfirm)
        node = psutil.Process(hutch_node.proc.pid)
        before = node.memory_info().rss
        slow = Raw(hutch_node.stream_port)
        try:
            slow.handshake()
            slow.send(f.Subscribe(slow.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 65535))
            c.sync()  # the node has taken the subscription and done what it does with it
            c.sync()
            grown = node.memory_info().rss - before
            assert grown < 24 << 20, f"the node grew by {grown >> 20} MB"
            got = 0
            while got < 640:  # and everything comes once the client reads
                got += len(chunk_bodies(slow.recv(f.Deliver, f.DeliverV2).chunk))
        finally:
            slow.close()
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


# ---------------------------------------------------------------- offsets kept by the server


def test_store_and_query_offset_server_side_tracking(server):
    from rstream import Consumer, Producer
    from rstream.exceptions import OffsetNotFound

    name = unique()

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
        async with Consumer("127.0.0.1", server.stream_port, username="guest", password="guest") as c:
            with pytest.raises(OffsetNotFound):
                await c.query_offset(name, "tracker")
            await c.store_offset(name, "tracker", 41)
            # a store has no answer: wait until a query sees it
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                with contextlib.suppress(OffsetNotFound):
                    if await c.query_offset(name, "tracker") == 41:
                        break
                assert time.monotonic() < deadline, "the stored offset never showed"
                await asyncio.sleep(0.02)
            await c.store_offset(name, "tracker", 42)
            await c.store_offset(name, "other", 7)
        async with Consumer("127.0.0.1", server.stream_port, username="guest", password="guest") as c:
            deadline = time.monotonic() + TIMEOUT_S
            while await c.query_offset(name, "tracker") != 42:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert await c.query_offset(name, "other") == 7
            await c.delete_stream(name)
    run(go())


def test_query_offset_codes(server):
    with raw(server) as c:
        r = c.call(f.QueryOffset(c.cid(), "nobody", unique()))
        assert r.code == f.STREAM_DOES_NOT_EXIST
        name = unique()
        create(c, name)
        assert c.call(f.QueryOffset(c.cid(), "nobody", name)).code == f.NO_OFFSET
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def _ctl(node, *args: str) -> None:
    """rabbitmqctl on RabbitMQ, hutchctl (over the HTTP API) on hutch: the same command."""
    if isinstance(node, HutchNode):
        p = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url", node.mgmt_url, *args],
                           capture_output=True, text=True, timeout=60)
    else:
        p = node.ctl(*args, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def reader_only(server):
    """A user that may read every stream and neither write nor configure any."""
    user = f"reader-{uuid.uuid4().hex[:6]}"
    _ctl(server, "add_user", user, "secret")
    _ctl(server, "set_permissions", "-p", "/", user, "^$", "^$", ".*")
    yield user
    _ctl(server, "delete_user", user)


def test_permissions_a_reader_may_subscribe_and_not_create_delete_or_publish(server, reader_only):
    name = unique()
    with raw(server) as admin:
        create(admin, name)
        publish_chunks(admin, name, [["for readers"]])
        c = Raw(server.stream_port)
        try:
            c.handshake(user=reader_only, password="secret")
            assert c.call(f.Create(c.cid(), unique(), {})).code == f.ACCESS_REFUSED
            assert c.call(f.Delete(c.cid(), name)).code == f.ACCESS_REFUSED
            assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.ACCESS_REFUSED
            assert read_all(c, name, 1) == [b"for readers"]
            assert c.call(f.QueryOffset(c.cid(), "nobody", name)).code == f.NO_OFFSET
        finally:
            c.close()
        assert admin.call(f.Delete(admin.cid(), name)).code == f.OK


# ---------------------------------------------------------------- metadata and stats


def test_metadata_names_the_leader_at_its_advertised_address(server):
    name = unique()
    missing = unique()
    with raw(server) as c:
        assert c.open_properties["advertised_host"] == "localhost"
        assert c.open_properties["advertised_port"] == str(server.stream_port)
        create(c, name)
        md = c.call(f.Metadata(c.cid(), [name, missing]))
        assert md.brokers == [(0, "localhost", server.stream_port)]
        assert sorted(md.streams) == sorted([(name, f.OK, 0, []), (missing, f.STREAM_DOES_NOT_EXIST, 0xFFFF, [])])
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_advertised_address_frame_max_and_heartbeat_from_the_configuration(tmp_path):
    """rabbitmq.conf's stream.* keys, as the stream plugin reads them."""
    conf = tmp_path / "hutch.conf"
    conf.write_text("stream.advertised_host = streams.example.com\nstream.advertised_port = 5999\n"
                    "stream.frame_max = 65536\nstream.heartbeat = 7\n")
    with HutchNode(extra_args=["--config", str(conf)]) as node:
        c = Raw(node.stream_port)
        try:
            c.call(f.PeerProperties(c.cid(), {}))
            c.call(f.SaslHandshake(c.cid()))
            assert c.call(f.SaslAuthenticate(c.cid(), "PLAIN", b"\0guest\0guest")).code == f.OK
            assert c.recv(f.Tune) == f.Tune(65536, 7)
            c.send(f.Tune(65536, 7))
            opened = c.call(f.Open(c.cid(), "/"))
            assert opened.properties == {"advertised_host": "streams.example.com", "advertised_port": "5999"}
            name = unique()
            create(c, name)
            md = c.call(f.Metadata(c.cid(), [name]))
            assert md.brokers == [(0, "streams.example.com", 5999)]
        finally:
            c.close()


def test_deleting_a_stream_tells_its_subscribers_with_a_metadata_update(server):
    name = unique()
    with raw(server) as c, raw(server) as other:
        create(c, name)
        _subscribe(c, name, f.OFFSET_TYPE_FIRST)
        assert other.call(f.Delete(other.cid(), name)).code == f.OK
        assert c.recv(f.MetadataUpdate) == f.MetadataUpdate(f.STREAM_NOT_AVAILABLE, name)


def test_deleting_a_stream_tells_its_publishers_and_their_ids_go(server):
    name = unique()
    with raw(server) as c, raw(server) as other:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 4, "", name)).code == f.OK
        assert other.call(f.Delete(other.cid(), name)).code == f.OK
        assert c.recv(f.MetadataUpdate) == f.MetadataUpdate(f.STREAM_NOT_AVAILABLE, name)
        c.send(f.Publish(4, [(1, amqp_body("too late"))]))
        assert c.recv(f.PublishError).errors == [(1, f.PUBLISHER_DOES_NOT_EXIST)]


def test_stream_stats_first_and_committed_chunk_ids(hutch_node):
    """StreamStats came with RabbitMQ 3.11: hutch only."""
    name = unique()
    with raw(hutch_node) as c:
        assert c.call(f.StreamStats(c.cid(), unique())).code == f.STREAM_DOES_NOT_EXIST
        create(c, name)
        publish_chunks(c, name, [["a", "b"], ["c"], ["d", "e", "f"]])
        stats = c.call(f.StreamStats(c.cid(), name))
        assert stats.code == f.OK
        assert stats.stats == {"first_chunk_id": 0, "committed_chunk_id": 3}
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def _rstream_super_stream_producer_spreads_by_hash(node, name: str, parts: list[str]) -> None:
    """rstream's super stream producer with hash routing (partitions); its key routing is not
    usable in rstream 1.1.1, which keeps the first key's route for every key."""
    from rstream import AMQPMessage, RouteType, SuperStreamProducer

    async def key_of(msg):
        return msg.application_properties["key"]

    async def go():
        confirmed = asyncio.Event()
        n = 0

        def on_confirm(_status):
            nonlocal n
            n += 1
            if n == 30:
                confirmed.set()
        async with SuperStreamProducer("127.0.0.1", node.stream_port, username="guest", password="guest",
                                       super_stream=name, routing=RouteType.Hash, routing_extractor=key_of) as p:
            for i in range(30):
                await p.send(AMQPMessage(body=f"inv{i}".encode(), application_properties={"key": f"customer-{i}"}),
                             on_publish_confirm=on_confirm)
            await asyncio.wait_for(confirmed.wait(), TIMEOUT_S)
    run(go())
    seen: list[bytes] = []
    per_partition: set[int] = set()
    with raw(node) as c:
        for k, part in enumerate(parts):
            assert c.call(f.Subscribe(c.cid(), k, part, f.OFFSET_TYPE_FIRST, None, 100)).code == f.OK
        while len(seen) < 30:
            d = c.recv(f.Deliver, f.DeliverV2)
            seen.extend(chunk_bodies(d.chunk))
            per_partition.add(d.subscription_id)
        assert c.sync() == []
    assert sorted(seen) == sorted(f"inv{i}".encode() for i in range(30))
    assert per_partition == {0, 1, 2}  # thirty keys hash to every partition


def test_super_stream_partitions_and_routes_of_one_declared_over_amqp(hutch_node):
    """A super stream as RabbitMQ lays it out (a direct exchange with x-super-stream, its
    partitions bound with x-stream-partition-order), declared with pika. RabbitMQ 3.10.8 gives
    the same codes and lists (partitions in binding order, OK with none for a key that routes
    nowhere, STREAM_DOES_NOT_EXIST for no such exchange) but under the request's key, without
    the response bit (fixed in 3.11): hutch answers as 3.11 and later, so rstream can read it."""
    server = hutch_node
    name = unique("invoices")
    parts = [f"{name}-{k}" for k in range(3)]
    conn = _pika(server)
    try:
        ch = conn.channel()
        ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
        for order, part in reversed(list(enumerate(parts))):  # bound out of order on purpose
            ch.queue_declare(part, durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(part, name, routing_key=f"key-{order}", arguments={"x-stream-partition-order": order})
        ch.queue_bind(parts[0], name, routing_key="also-0", arguments={"x-stream-partition-order": 0})
        with raw(server) as c:
            got = c.call(f.Partitions(c.cid(), name))
            assert (got.code, got.streams) == (f.OK, parts)
            got = c.call(f.Route(c.cid(), "key-1", name))
            assert (got.code, got.streams) == (f.OK, [parts[1]])
            assert c.call(f.Route(c.cid(), "also-0", name)).streams == [parts[0]]
            got = c.call(f.Route(c.cid(), "no-such-key", name))
            assert (got.code, got.streams) == (f.OK, [])
            assert c.call(f.Partitions(c.cid(), unique())).code == f.STREAM_DOES_NOT_EXIST
            assert c.call(f.Route(c.cid(), "key-1", unique())).code == f.STREAM_DOES_NOT_EXIST
        _rstream_super_stream_producer_spreads_by_hash(server, name, parts)
        for part in parts:
            ch.queue_delete(part)
        ch.exchange_delete(name)
    finally:
        conn.close()


def test_a_super_stream_created_and_deleted_over_the_protocol(hutch_node):
    """CreateSuperStream and DeleteSuperStream (RabbitMQ 3.13; 3.10 has neither): the exchange,
    its partitions bound in order, and all of them gone again; the codes for what exists or
    does not. The same layout as hutch-streams add_super_stream (hutch.broker.superstreams)."""
    name = unique("orders")
    parts = [f"{name}-{k}" for k in ("amer", "emea", "apac")]
    with raw(hutch_node) as c:
        got = c.call(f.CreateSuperStream(c.cid(), name, parts, ["amer", "emea", "apac"], {"max-age": "1h"}))
        assert got.code == f.OK
        assert c.call(f.Partitions(c.cid(), name)).streams == parts
        assert c.call(f.Route(c.cid(), "emea", name)).streams == [parts[1]]
        assert c.call(f.CreateSuperStream(c.cid(), name, parts, ["amer", "emea", "apac"], {})).code == \
            f.STREAM_ALREADY_EXISTS
        bad = c.call(f.CreateSuperStream(c.cid(), unique("bad"), ["x-0"], ["0"], {"max-age": "7X"}))
        assert bad.code == f.PRECONDITION_FAILED
        wait_until(lambda: all(st[1] == f.OK for st in c.call(f.Metadata(c.cid(), parts)).streams), 20,
                   "the partitions' leaders")
        assert c.call(f.DeleteSuperStream(c.cid(), name)).code == f.OK
        assert c.call(f.Partitions(c.cid(), name)).code == f.STREAM_DOES_NOT_EXIST
        assert c.call(f.Metadata(c.cid(), parts)).streams == [(p, f.STREAM_DOES_NOT_EXIST, 0xFFFF, []) for p in parts]
        assert c.call(f.DeleteSuperStream(c.cid(), name)).code == f.STREAM_DOES_NOT_EXIST


# ---------------------------------------------------------------- filtering (RabbitMQ 3.13)


def test_filtering_only_chunks_with_a_matching_value_come_and_the_client_filters_the_rest(hutch_node):
    """Publish version 2 with filter values, a subscription with filter.N properties: hutch only
    (RabbitMQ 3.10 has no filtering)."""
    name = unique()
    with raw(hutch_node) as c:
        c.send(f.ExchangeCommandVersions(c.cid(), [(f.KEY_PUBLISH, 1, 2), (f.KEY_DELIVER, 1, 2)]))
        c.recv(f.ExchangeCommandVersionsResponse)
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        batches = [[("red", "r1"), ("red", "r2")], [("blue", "b1")], [("red", "r3"), ("green", "g1")]]
        pid = 0
        for batch in batches:
            msgs = []
            for fv, text in batch:
                pid += 1
                msgs.append((pid, fv, amqp_body(text)))
            c.send(f.PublishV2(1, msgs))
            c.recv(f.PublishConfirm)
        c.send(f.Publish(1, [(pid + 1, amqp_body("plain"))]))  # version 1: a chunk with no filter
        c.recv(f.PublishConfirm)
        _subscribe(c, name, f.OFFSET_TYPE_FIRST, sub=1, credit=100)
        c.send(f.Subscribe(c.cid(), 2, name, f.OFFSET_TYPE_FIRST, None, 100,
                           {"filter.0": "red", "match-unfiltered": "false"}))
        c.send(f.Subscribe(c.cid(), 3, name, f.OFFSET_TYPE_FIRST, None, 100,
                           {"filter.0": "green", "match-unfiltered": "true"}))
        seen = collections.defaultdict(list)
        while len(seen[1]) < 4:
            d = c.recv(f.Deliver, f.DeliverV2)
            seen[d.subscription_id].append(chunk_bodies(d.chunk))
        seen_after = c.sync()
        for d in seen_after:
            if type(d) in (f.Deliver, f.DeliverV2):
                seen[d.subscription_id].append(chunk_bodies(d.chunk))
        assert seen[2] == [[b"r1", b"r2"], [b"r3", b"g1"]]  # whole chunks: the client drops g1
        assert seen[3] == [[b"r3", b"g1"], [b"plain"]]
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_a_filter_reads_past_megabytes_of_chunks_it_skips(hutch_node):
    name = unique()
    with raw(hutch_node) as c:
        c.send(f.ExchangeCommandVersions(c.cid(), [(f.KEY_PUBLISH, 1, 2), (f.KEY_DELIVER, 1, 2)]))
        c.recv(f.ExchangeCommandVersionsResponse)
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        filler = "x" * 60_000
        for i in range(40):  # 2.4 MB the subscription does not want, one chunk each
            c.send(f.PublishV2(1, [(i + 1, "blue", amqp_body(f"{i}{filler}"))]))
            c.recv(f.PublishConfirm)
        c.send(f.PublishV2(1, [(41, "red", amqp_body("wanted"))]))
        c.recv(f.PublishConfirm)
        c.send(f.Subscribe(c.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 10, {"filter.0": "red"}))
        d = c.recv(f.Deliver, f.DeliverV2)
        assert chunk_bodies(d.chunk) == [b"wanted"]
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_rstream_filter_api(hutch_node):
    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        FilterConfiguration,
        OffsetType,
        Producer,
        amqp_decoder,
    )

    name = unique()

    async def region_of(m):
        return m.application_properties["region"]

    async def go():
        async with Producer("127.0.0.1", hutch_node.stream_port, username="guest", password="guest",
                            filter_value_extractor=region_of) as p:
            await p.create_stream(name)
            for region in ("emea", "apac", "emea", "amer"):
                await p.send_batch(name, [AMQPMessage(body=f"{region}-{i}".encode(),
                                                      application_properties={"region": region})
                                          for i in range(3)])
            # a batch of two regions: one chunk, both values in its filter
            await p.send_wait(name, AMQPMessage(body=b"mixed-apac", application_properties={"region": "apac"}))
        got: list[bytes] = []
        done = asyncio.Event()

        def on_message(msg, ctx):
            got.append(b"".join(msg.body) if isinstance(msg.body, list) else msg.body)
            if len(got) == 6:
                done.set()
        async with Consumer("127.0.0.1", hutch_node.stream_port, username="guest", password="guest") as c:
            await c.subscribe(name, on_message, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                              filter_input=FilterConfiguration(
                                  values_to_filter=["emea"],
                                  predicate=lambda m: m.application_properties[b"region"] == b"emea"))
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
            await c.delete_stream(name)
        assert got == [f"emea-{i}".encode() for i in range(3)] * 2
    run(go())


# ---------------------------------------------------------------- AMQP 0-9-1 and the stream protocol


def _pika(node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=node.amqp_port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


def _rstream_read(node, name: str, n: int):
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    async def go():
        got = []
        done = asyncio.Event()

        def on_message(msg, ctx):
            got.append(msg)
            if len(got) == n:
                done.set()
        async with Consumer("127.0.0.1", node.stream_port, username="guest", password="guest") as c:
            await c.subscribe(name, on_message, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
        return got
    return run(go())


def _as_plain(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, dict):
        return {_as_plain(k): _as_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_as_plain(x) for x in v]
    return v


def _seen_by_rstream(msg) -> dict:
    props = msg.properties
    return {
        "body": b"".join(msg.body) if isinstance(msg.body, list) else msg.body,
        "properties": {k: _as_plain(getattr(props, k)) for k in (
            "message_id", "correlation_id", "content_type", "content_encoding", "reply_to", "subject",
            "user_id") if props is not None and getattr(props, k) is not None},
        "application_properties": _as_plain(msg.application_properties or {}),
        "message_annotations": _as_plain(msg.message_annotations or {}),
        "durable": bool(msg.header.durable) if msg.header is not None else None,
        "priority": msg.header.priority if msg.header is not None else None,
    }


def test_pika_publishes_rstream_reads_amqp_1_0_as_rabbitmq_maps_it(hutch_node, rabbit_node):
    """The same publish on both brokers, read back by rstream: the same AMQP 1.0 message."""
    seen = {}
    for label, node in (("hutch", hutch_node), ("rabbitmq", rabbit_node)):
        name = unique()
        conn = _pika(node)
        try:
            ch = conn.channel()
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            ch.confirm_delivery()
            ch.basic_publish("", name, b"hello streams", pika.BasicProperties(
                content_type="text/plain", content_encoding="utf-8", message_id="m-1", correlation_id="c-1",
                reply_to="replies", delivery_mode=2, priority=3, user_id="guest",
                headers={"region": "emea", "count": 7, "flag": True, "nested": {"a": 1}}))
            ch.basic_publish("", name, b"bare")
        finally:
            conn.close()
        msgs = _rstream_read(node, name, 2)
        seen[label] = [_seen_by_rstream(m) for m in msgs]
        with raw(node) as c:
            c.call(f.Delete(c.cid(), name))
    hutch, rabbit = seen["hutch"], seen["rabbitmq"]
    assert hutch[0]["body"] == b"hello streams"
    assert hutch[0]["application_properties"] == {"region": "emea", "count": 7, "flag": True}  # no nested table
    # delivery mode and priority: RabbitMQ 3.10 keeps them as message annotations, 3.13 (and
    # hutch) puts them in the header section; everything else is the same
    assert [(bool(m["durable"]), m["priority"]) for m in hutch] == [(True, 3), (False, None)]  # no header: not durable
    assert [(m["durable"], m["priority"]) for m in rabbit] == [(None, None), (None, None)]
    assert rabbit[0]["message_annotations"].pop("x-basic-delivery-mode") == 2
    assert rabbit[0]["message_annotations"].pop("x-basic-priority") == 3
    for m in hutch + rabbit:
        del m["durable"], m["priority"]
        assert m["message_annotations"].pop("x-routing-key").startswith("s-")
    assert hutch == rabbit


def test_rstream_publishes_with_application_properties_pika_reads_headers(server):
    from rstream import AMQPMessage, Producer

    name = unique()

    async def go():
        async with Producer("127.0.0.1", server.stream_port, username="guest", password="guest") as p:
            await p.create_stream(name)
            await p.send_wait(name, AMQPMessage(body=b"from rstream",
                                                application_properties={"region": "apac", "n": 5}))
    run(go())
    conn = _pika(server)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        got = []
        ch.basic_consume(name, lambda ch_, m, props, body: got.append((props, body)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + TIMEOUT_S
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        [(props, body)] = got
        assert body == b"from rstream"
        assert props.headers["region"] == "apac"
        assert props.headers["n"] == 5
        assert props.headers["x-stream-offset"] == 0
        ch.queue_delete(name)
    finally:
        conn.close()


def test_rstream_publishes_amqp_1_0_properties_pika_reads_them_as_rabbitmq_maps_them(hutch_node, rabbit_node):
    from rstream import AMQPMessage, Producer, Properties

    seen = {}
    for label, node in (("hutch", hutch_node), ("rabbitmq", rabbit_node)):
        name = unique()

        async def go(node=node, name=name):
            async with Producer("127.0.0.1", node.stream_port, username="guest", password="guest") as p:
                await p.create_stream(name)
                await p.send_wait(name, AMQPMessage(
                    body=b"typed", application_properties={"region": "apac", "n": 5, "ok": True},
                    properties=Properties(message_id="m-9", correlation_id="c-9", content_type="application/json",
                                          content_encoding="gzip", reply_to="back", subject="s",
                                          creation_time=1700000000000)))
        run(go())
        conn = _pika(node)
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=10)
            got = []
            ch.basic_consume(name, lambda ch_, m, props, body, got=got: got.append((props, body)),
                             arguments={"x-stream-offset": "first"})
            deadline = time.monotonic() + TIMEOUT_S
            while not got and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
            [(props, body)] = got
            seen[label] = (body, {k: v for k, v in vars(props).items() if v is not None})
            ch.queue_delete(name)
        finally:
            conn.close()
    assert seen["hutch"][0] == b"typed"
    hutch, rabbit = seen["hutch"][1], seen["rabbitmq"][1]
    assert hutch["message_id"] == "m-9" and hutch["content_type"] == "application/json"
    assert hutch["headers"]["region"] == "apac"
    assert hutch == rabbit


# ---------------------------------------------------------------- rbfly


def test_rbfly_creates_publishes_reads_and_keeps_an_offset(server):
    from rbfly.streams import Offset, PublisherBatchFast, streams_client

    name = unique()

    async def go():
        client = streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{server.stream_port}/")
        try:
            await client.create_stream(name)
            async with client.publisher(name) as publisher:
                for i in range(5):
                    await publisher.send(f"rb{i}".encode())
            async with client.publisher(name, cls=PublisherBatchFast) as batch:
                for i in range(5, 10):
                    batch.batch(f"rb{i}".encode())
                await batch.flush()
            got = []
            async with contextlib.aclosing(client.subscribe(name, offset=Offset.FIRST)) as sub:
                async for msg in sub:
                    got.append(msg)
                    if len(got) == 10:
                        break
            assert got == [f"rb{i}".encode() for i in range(10)]
            got = []
            async with contextlib.aclosing(client.subscribe(name, offset=Offset.offset(7))) as sub:
                async for msg in sub:
                    got.append(msg)
                    if len(got) == 3:
                        break
            assert got == [b"rb7", b"rb8", b"rb9"]
            # server-side tracking: a stored offset, and a subscription that starts after it
            await client.write_offset(name, "rb-ref", 4)
            with raw(server) as c:
                wait_until(lambda: c.call(f.QueryOffset(c.cid(), "rb-ref", name)).offset == 4, TIMEOUT_S,
                           "rbfly's stored offset")
            async with contextlib.aclosing(client.subscribe(name, offset=Offset.reference("rb-ref"))) as sub:
                async for msg in sub:
                    assert msg == b"rb5"
                    break
            await client.delete_stream(name)
        finally:
            await client.disconnect()
    run(go())


# rbfly's newest release (0.11.1) needs Python 3.12, so its scenarios run in an interpreter of
# their own (tests/streamclients), the library unchanged; filtering came with RabbitMQ 3.13
RBFLY_NOT_IN_RABBITMQ_310 = {"filtered_subscription"}


def test_rbfly_0_11_runs_every_scenario(server, tmp_path):
    from tests.streamclients.toolchain import SCENARIOS, ensure_rbfly

    python = ensure_rbfly()
    out = tmp_path / "rbfly.json"
    proc = subprocess.run([str(python), str(SCENARIOS), f"rabbitmq-stream://guest:guest@127.0.0.1:{server.stream_port}/",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())
    print("\n".join(line for line in proc.stderr.splitlines() if line.endswith(" s")))  # each scenario's time
    assert len(results) == 7, proc.stderr[-3000:]
    expected_failures = RBFLY_NOT_IN_RABBITMQ_310 if isinstance(server, RabbitMQNode) else set()
    failed = {k for k, v in results.items() if v != "passed"}
    assert failed == expected_failures, (results, proc.stderr[-3000:])


# ---------------------------------------------------------------- malformed input


def _still_serves(node) -> None:
    with raw(node) as c:
        name = unique()
        create(c, name)
        publish_chunks(c, name, [["alive"]])
        assert read_all(c, name, 1) == [b"alive"]
        assert c.call(f.Delete(c.cid(), name)).code == f.OK


def test_garbage_before_the_handshake_closes_the_socket_with_nothing_sent(server):
    with raw(server, handshake=False) as c:
        c.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.until_closed() == []
    _still_serves(server)


def test_a_command_before_open_closes_the_socket_with_nothing_sent(server):
    with raw(server, handshake=False) as c:
        c.send(f.Create(1, unique(), {}))
        assert c.until_closed() == []
    with raw(server, handshake=False) as c:  # authenticated, not yet open
        c.call(f.PeerProperties(c.cid(), {}))
        c.call(f.SaslHandshake(c.cid()))
        assert c.call(f.SaslAuthenticate(c.cid(), "PLAIN", b"\0guest\0guest")).code == f.OK
        c.recv(f.Tune)
        c.send(f.Metadata(c.cid(), ["x"]))
        assert c.until_closed() == []
    _still_serves(server)


def test_a_truncated_frame_then_the_client_goes(server):
    with raw(server) as c:
        frame = f.encode(f.Create(c.cid(), unique(), {}))
        c.send_bytes(frame[:len(frame) - 3])
        c.sock.shutdown(socket.SHUT_WR)
        assert c.until_closed() == []
    _still_serves(server)


def test_an_unknown_command_after_open_is_closed_with_unknown_frame(server):
    with raw(server) as c:
        c.send_bytes(struct.pack(">IHHI", 8, 0x0077, 1, 1))
        close = c.recv(f.Close)
        assert close.code == f.UNKNOWN_FRAME
        c.send(f.CloseResponse(close.correlation_id, f.OK))
        assert c.until_closed() == []
    _still_serves(server)


def test_a_malformed_command_after_open_is_closed_with_unknown_frame(server):
    with raw(server) as c:
        c.send_bytes(struct.pack(">IHHI", 9, f.KEY_CREATE, 1, 1) + b"\xff")  # a string cut short
        close = c.recv(f.Close)
        assert close.code == f.UNKNOWN_FRAME
    _still_serves(server)


def test_a_frame_over_frame_max_is_closed_with_frame_too_large(hutch_node):
    """As RabbitMQ 3.13 closes it; 3.10 takes a frame of any size (2 MB over a frame_max of
    64 KiB are answered)."""
    server = hutch_node
    with raw(server, handshake=False) as c:
        c.call(f.PeerProperties(c.cid(), {}))
        c.call(f.SaslHandshake(c.cid()))
        assert c.call(f.SaslAuthenticate(c.cid(), "PLAIN", b"\0guest\0guest")).code == f.OK
        c.recv(f.Tune)
        c.send(f.Tune(65536, 0))
        assert c.call(f.Open(c.cid(), "/")).code == f.OK
        c.send(f.Create(c.cid(), unique(), {f"padding-{i}": "x" * 1000 for i in range(80)}))
        close = c.recv(f.Close)
        assert close.code == f.FRAME_TOO_LARGE
    _still_serves(server)


def test_a_frame_over_8192_bytes_before_open_closes_the_socket(hutch_node):
    """hutch bounds frames before open by 8192 bytes (RabbitMQ 3.13's initial frame_max);
    RabbitMQ 3.10 takes a 9000-byte peer properties frame."""
    with raw(hutch_node, handshake=False) as c:
        c.send_bytes(f.encode(f.PeerProperties(1, {"big": "x" * 9000})))
        assert c.until_closed() == []
    _still_serves(hutch_node)


def test_heartbeats_come_and_a_silent_client_is_closed(server):
    c = Raw(server.stream_port)
    try:
        c.handshake(heartbeat_s=1)
        t0 = time.monotonic()
        c.recv(f.Heartbeat)  # the server's, as nothing else goes out
        rest = c.until_closed()  # the client sends nothing: the server gives up on it
        assert all(type(cmd) is f.Heartbeat for cmd in rest)
        assert 1.5 < time.monotonic() - t0 < 10
    finally:
        c.close()
    _still_serves(server)


def test_wrong_password_and_unknown_vhost(server):
    with raw(server, handshake=False) as c:
        c.call(f.PeerProperties(c.cid(), {}))
        c.call(f.SaslHandshake(c.cid()))
        assert c.call(f.SaslAuthenticate(c.cid(), "PLAIN", b"\0guest\0wrong")).code == f.AUTHENTICATION_FAILURE
        assert c.until_closed() == []
    with raw(server, handshake=False) as c:
        c.call(f.PeerProperties(c.cid(), {}))
        c.call(f.SaslHandshake(c.cid()))
        assert c.call(f.SaslAuthenticate(c.cid(), "PLAIN", b"\0guest\0guest")).code == f.OK
        c.recv(f.Tune)
        c.send(f.Tune(65536, 0))
        assert c.call(f.Open(c.cid(), "no-such-vhost")).code == f.VIRTUAL_HOST_ACCESS_FAILURE
        assert c.until_closed() == []
    _still_serves(server)


def test_many_clients_sending_garbage_do_not_take_the_node_down(server):
    socks = []
    try:
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", server.stream_port), timeout=TIMEOUT_S)
            s.sendall(bytes((i * 37 + k) % 256 for k in range(64 + i * 50)))
            socks.append(s)
        for s in socks:
            with contextlib.suppress(OSError):
                while s.recv(65536):
                    pass
    finally:
        for s in socks:
            s.close()
    _still_serves(server)
