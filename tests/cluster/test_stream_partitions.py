"""Streams across a network partition (seed 003, "Partition Effects on Replicated Features"), on a
`hutch lab` whose peer links pass through fault proxies.

A stream of three members; one member's node is cut off alone. Its consumers, over AMQP 0-9-1
(`x-stream-offset`) and over the stream protocol (rstream 1.1.1 and rbfly 0.10.0, on that
node's replica), go on reading what was replicated before the cut. The majority side goes on
taking and confirming publishes; a publish on the cut-off node (over AMQP 0-9-1 or the stream
protocol) is not confirmed while it is alone. After the heal the returning member catches up
from its own log plus what it missed, the consumers there read the rest without a gap, and
every confirmed message is in the stream exactly once on every member.
Both cases are run: the member cut off is a replica, and it is the leader.

On the same lab, retention (by size and by age) trims every member's log from its old end, and
a reader from "first" on any node starts at that member's new first offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import select
import socket
import types
import uuid
from pathlib import Path

import aio_pika
import pika
import pytest

from hutch.lab.cluster import Lab
from hutch.streamproto import frames as f
from tests.support.brokers import wait_until
from tests.support.lab import api, free_base_port, queue_leader
from tests.support.stream_client import Raw, amqp_body

pytestmark = pytest.mark.timeout(300)
STREAM = {"x-queue-type": "stream", "x-initial-cluster-size": 3}
BEFORE = 120  # messages replicated to every member before the cut
DURING = 60  # published on the majority side during the cut
ON_MINORITY = 5  # published on the cut-off node during the cut
HELD = 10  # messages each consumer takes before the cut (the prefetch, the rstream callback's gate)
NOT_CONFIRMED_S = 4.0  # how long the cut-off node's publishes are watched for a confirm
WAIT_S = 60.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab.up(3, tmp_path_factory.mktemp("lab") / "lab", base_port=free_base_port(3), net_ticktime_s=2,
                 metadata_timeout_ms=3000, tied_to_caller=True)
    try:
        yield lab
    finally:
        lab.down(wipe=True)


def member_end(lab: Lab, name: str, i: int) -> int | None:
    """The end of node i's replica as node i reports it (None when it does not answer)."""
    try:
        rows = api(lab, i, f"/api/hutch/streams/%2F/{name}/status")
    except OSError:
        return None
    for row in rows:
        if row["node"] == lab.nodes[i].name and row.get("committed_offset") is not None:
            return row["committed_offset"] + 1
    return None


def healed(lab: Lab) -> bool:
    try:
        return all(len(api(lab, i, "/api/hutch/cluster")["running_nodes"]) == 3 for i in range(3))
    except OSError:
        return False


def publish_confirmed(lab: Lab, i: int, name: str, bodies: list[bytes]) -> None:
    """Each message published on node i and confirmed before the next."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", name, b)
    finally:
        conn.close()


def read_everything(lab: Lab, i: int, name: str, count: int, until_offset: int | None = None
                    ) -> list[tuple[int, bytes]]:
    """(offset, body) of the first `count` messages read on node i (or of those up to
    `until_offset`, when retention may move the first)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[i].amqp_port, heartbeat=0))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        got: list[tuple[int, bytes]] = []

        def on(c, m, p, b):
            got.append((p.headers["x-stream-offset"], b))
            c.basic_ack(m.delivery_tag)

        def done() -> bool:
            conn.process_data_events(0.05)
            return got[-1][0] >= until_offset if until_offset is not None and got else len(got) >= count
        ch.basic_consume(name, on, arguments={"x-stream-offset": "first"})
        wait_until(done, WAIT_S, f"{count} messages")
        return got
    finally:
        conn.close()


def body_of(msg) -> bytes:
    return b"".join(msg.body) if isinstance(msg.body, list) else bytes(msg.body)


async def until(cond, what: str, timeout_s: float = WAIT_S) -> None:
    """Wait on the event loop for a condition on what the consumers received."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s} s")
        await asyncio.sleep(0.02)


async def blocking(fn, *args):
    """A blocking call (the lab's controller, the HTTP API) without stalling the clients' loop."""
    return await asyncio.to_thread(fn, *args)


@pytest.mark.parametrize("cut_off", ["a replica", "the leader"])
def test_a_reader_on_the_node_cut_off_alone_keeps_reading_and_gets_the_rest_after_the_heal(lab, cut_off, monkeypatch):
    import rstream.consumer
    from rbfly.streams import Offset, get_message_ctx, streams_client
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    name = f"sp.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[0].amqp_port, heartbeat=0))
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)  # client-local: node 1 leads
    conn.close()
    wait_until(lambda: queue_leader(lab, name, 1) == lab.nodes[0].name, WAIT_S, "node 1 leading the stream")
    alone = 0 if cut_off == "the leader" else 2
    majority = [i for i in range(3) if i != alone]
    before = [f"a{i}".encode() for i in range(BEFORE)]
    publish_confirmed(lab, 0, name, before)  # one entry, one chunk each
    for i in range(3):
        wait_until(lambda i=i: member_end(lab, name, i) == BEFORE, WAIT_S, f"node {i + 1}'s replica")

    # rstream reads from a replica it picks at random among those the metadata names: this one
    # reads from the cut-off node (the leader's log, when the leader is the node cut off)
    alone_port = lab.nodes[alone].stream_port
    monkeypatch.setattr(rstream.consumer, "random", types.SimpleNamespace(
        choice=lambda brokers: dataclasses.replace(brokers[0], port=alone_port)))

    amqp_got: list[tuple[int, bytes]] = []
    rstream_got: list[tuple[int, bytes]] = []
    rbfly_got: list[tuple[int, bytes]] = []
    minority_confirms: dict[bytes, bool | None] = {}

    async def go() -> None:
        gate = asyncio.Event()

        async def on_stream_message(msg, ctx) -> None:
            rstream_got.append((ctx.offset, body_of(msg)))
            if len(rstream_got) == HELD:
                await gate.wait()  # no more credit until the cut is in place

        async def rbfly_reader() -> None:  # rbfly reads from the node it is connected to
            client = streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{alone_port}/")
            try:
                async with contextlib.aclosing(client.subscribe(name, offset=Offset.FIRST)) as sub:
                    async for body in sub:
                        rbfly_got.append((get_message_ctx().stream_offset, bytes(body)))
                        if len(rbfly_got) == HELD:
                            await gate.wait()
            finally:
                await client.disconnect()

        def readers_have(n: int) -> bool:
            return len(amqp_got) >= n and len(rstream_got) >= n and len(rbfly_got) >= n

        reader = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{lab.nodes[alone].amqp_port}/%2F", timeout=30)
        publisher = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{lab.nodes[alone].amqp_port}/%2F",
                                           timeout=30)
        closed: list[str] = []  # the reasons rstream was given for a connection's end
        consumer = Consumer("127.0.0.1", alone_port, username="guest", password="guest",
                            on_close_handler=lambda info: closed.append(info.reason))
        await consumer.start()
        writer = Raw(alone_port)  # a stream-protocol publisher on the cut-off node
        rbfly_task = asyncio.create_task(rbfly_reader())
        try:
            writer.handshake()
            assert writer.call(f.DeclarePublisher(writer.cid(), 1, "minority-writer", name)).code == f.OK
            ch = await reader.channel()
            await ch.set_qos(prefetch_count=HELD)
            queue = await ch.get_queue(name, ensure=False)
            held: list[aio_pika.abc.AbstractIncomingMessage] = []

            async def on_amqp_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
                amqp_got.append((m.headers["x-stream-offset"], m.body))
                if gate.is_set():
                    await m.ack()  # credit for the next one
                else:
                    held.append(m)
            await queue.consume(on_amqp_message, arguments={"x-stream-offset": "first"})
            await consumer.subscribe(name, on_stream_message, decoder=amqp_decoder, initial_credit=1,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            await until(lambda: len(amqp_got) == HELD and len(rstream_got) == HELD and len(rbfly_got) == HELD,
                        "the first messages")

            await blocking(lab.partition, lab.nodes[alone].name)
            try:
                # the cut-off node's readers go on through what its replica holds
                gate.set()
                for m in held:
                    await m.ack()
                await until(lambda: readers_have(BEFORE), "the cut-off node's readers through its replica")
                assert closed == [] and not reader.is_closed  # on the same connections

                # publishes on the cut-off node, which must not be confirmed while it is alone
                started = asyncio.get_running_loop().time()
                writer.send(f.Publish(1, [(i + 1, amqp_body(f"s{i}")) for i in range(ON_MINORITY)]))
                pch = await publisher.channel(publisher_confirms=True)
                pending = {}
                for i in range(ON_MINORITY):
                    body = f"m{i}".encode()
                    pending[body] = asyncio.ensure_future(
                        pch.default_exchange.publish(aio_pika.Message(body), routing_key=name, timeout=None))

                # meanwhile the majority side elects (or keeps) a leader and confirms publishes
                await blocking(wait_until, lambda: queue_leader(lab, name, majority[0]) in
                               [lab.nodes[i].name for i in majority], WAIT_S, "a leader on the majority side")
                await blocking(publish_confirmed, lab, majority[0], name,
                               [f"b{i}".encode() for i in range(DURING)])
                assert max(len(amqp_got), len(rstream_got), len(rbfly_got)) == BEFORE  # none of it there

                waited_s = asyncio.get_running_loop().time() - started
                done, _ = await asyncio.wait(pending.values(), timeout=max(0.0, NOT_CONFIRMED_S - waited_s))
                assert not [t for t in done if t.exception() is None], "confirmed on the minority side"
                if select.select([writer.sock], [], [], 0)[0]:
                    writer._read()
                assert not [x for x in writer.inbox if type(x) is f.PublishConfirm], "confirmed on the minority side"
            finally:
                await blocking(lab.heal)
            await blocking(wait_until, lambda: healed(lab), WAIT_S, "the partition healed")

            # the publishes made alone are answered now; a confirmed one is in the stream
            await asyncio.wait(pending.values(), timeout=WAIT_S)
            for body, t in pending.items():
                minority_confirms[body] = t.done() and t.exception() is None

            def stream_answers() -> None:
                while sum(1 for b in minority_confirms if b.startswith(b"s")) < ON_MINORITY:
                    x = writer.recv(f.PublishConfirm, f.PublishError)
                    for pid, ok in ([(p, True) for p in x.publishing_ids] if type(x) is f.PublishConfirm
                                    else [(p, False) for p, _code in x.errors]):
                        minority_confirms[f"s{pid - 1}".encode()] = ok
            await blocking(stream_answers)
            total = BEFORE + DURING + sum(minority_confirms.values())
            await blocking(wait_until, lambda: all(member_end(lab, name, i) is not None
                                                   and member_end(lab, name, i) >= total for i in range(3)),
                           WAIT_S, "every replica caught up")
            await until(lambda: readers_have(total), "the cut-off node's readers got the rest")
        finally:
            rbfly_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rbfly_task
            writer.close()
            await consumer.close()
            await publisher.close()
            await reader.close()

    asyncio.run(go())

    end = member_end(lab, name, 0)
    stored = read_everything(lab, majority[0], name, end)
    assert [o for o, _b in stored] == list(range(end)), "a gap in the offsets"
    bodies = [b for _o, b in stored]
    assert len(bodies) == len(set(bodies)), "a message is in the stream twice"
    during = [f"b{i}".encode() for i in range(DURING)]
    assert bodies[:BEFORE] == before
    assert [b for b in bodies if b.startswith(b"b")] == during
    assert {b for b, ok in minority_confirms.items() if ok} <= set(bodies), "confirmed on the minority, then lost"
    assert set(bodies) <= set(before) | set(during) | set(minority_confirms)
    assert amqp_got[:end] == stored
    assert rstream_got[:end] == stored
    assert rbfly_got[:end] == stored
    for i in range(3):
        assert read_everything(lab, i, name, end)[:end] == stored


def member_row(lab: Lab, name: str, i: int) -> dict | None:
    try:
        rows = api(lab, i, f"/api/hutch/streams/%2F/{name}/status")
    except OSError:
        return None
    return next((r for r in rows if r["node"] == lab.nodes[i].name and r.get("first_offset") is not None), None)


def test_retention_by_size_and_by_age_trims_every_members_log_from_the_old_end_and_first_reads_from_there(lab):
    total = 100
    retention = {"by size": {"x-max-length-bytes": 3000}, "by age": {"x-max-age": "1s"}}
    names = {kind: f"sr.{uuid.uuid4().hex[:8]}" for kind in retention}
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[0].amqp_port, heartbeat=0))
    for kind, name in names.items():
        conn.channel().queue_declare(name, durable=True, arguments={
            **STREAM, "x-stream-max-segment-size-bytes": 1000, **retention[kind]})
    conn.close()
    for name in names.values():
        publish_confirmed(lab, 0, name, [f"r{i:03}".encode() + b"x" * 200 for i in range(total)])
    rows: dict[tuple[str, int], dict | None] = {}

    def trimmed() -> bool:  # each member runs retention on its own log, every 5 s
        for name in names.values():
            for i in range(3):
                rows[name, i] = member_row(lab, name, i)
        return all(r is not None and r["first_offset"] > 0 and r["committed_offset"] == total - 1
                   for r in rows.values()) and all(  # up to one segment more than the limit
            rows[names["by size"], i]["bytes"] <= 3000 + 1000 for i in range(3))
    wait_until(trimmed, WAIT_S, "retention on every member")
    for i in range(3):
        for name in names.values():
            got = read_everything(lab, i, name, 0, until_offset=total - 1)
            first = got[0][0]
            assert first >= rows[name, i]["first_offset"]  # (by age, a later pass may take more)
            assert [o for o, _b in got] == list(range(first, total))  # whole chunks went, nothing else
            assert [b[:4] for _o, b in got] == [f"r{o:03}".encode() for o in range(first, total)]


def test_a_stream_protocol_publisher_without_a_majority_is_not_read_from_past_its_window_then_goes_on(lab):
    """A node cut off alone confirms nothing, so a publisher there is held by the connection's
    window, 16 MiB of unconfirmed messages, instead of filling the node's memory; after the heal
    every message it sent is confirmed and stored once."""
    from hutch.broker.streamsession import PUBLISH_WINDOW_BYTES

    name = f"sw.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[0].amqp_port, heartbeat=0))
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    conn.close()
    wait_until(lambda: queue_leader(lab, name, 2) == lab.nodes[0].name, WAIT_S, "node 1 leading the stream")
    frame_bytes = 1000 << 10
    # what the kernel may hold between the two ends: the node's receive buffer, which loopback
    # autotuning grows up to tcp_rmem's maximum (32 MiB on some machines), and the writer's send buffer
    buffers = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2]) + (1 << 20)
    offered = (PUBLISH_WINDOW_BYTES + buffers) // frame_bytes + 8
    writer = Raw(lab.nodes[2].stream_port)
    writer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 19)  # the kernel doubles it: 1 MiB
    try:
        writer.handshake()
        assert writer.call(f.DeclarePublisher(writer.cid(), 1, "held", name)).code == f.OK
        lab.partition(lab.nodes[2].name)
        try:
            pending = b""
            sent = 0
            writer.sock.setblocking(False)
            while sent < offered or pending:
                if not pending:
                    sent += 1
                    pending = f.encode(f.Publish(1, [(sent, amqp_body(f"{sent:04}").ljust(frame_bytes, b"."))]))
                if not select.select([], [writer.sock], [], 2.0)[1]:
                    break  # the node has stopped reading
                pending = pending[writer.sock.send(pending):]
            writer.sock.setblocking(True)
            assert sent < offered, "the node read everything offered"
            assert (sent - 2) * frame_bytes <= PUBLISH_WINDOW_BYTES + buffers  # the window and the sockets' buffers
        finally:
            lab.heal()
        if pending:
            writer.sock.sendall(pending)
        confirmed: set[int] = set()
        while len(confirmed) < sent:
            x = writer.recv(f.PublishConfirm, f.PublishError)
            assert type(x) is f.PublishConfirm, x
            confirmed.update(x.publishing_ids)
        assert confirmed == set(range(1, sent + 1))
    finally:
        writer.close()
    wait_until(lambda: member_end(lab, name, 0) == sent, WAIT_S, "every message stored")
