"""`hutch perf` and its client against a real broker: counts add up, limits stop exactly, histories record.

The broker is chosen by HUTCH_TEST_BROKER: `hutch` (a hutch node, the default) or
`rabbitmq` (a private RabbitMQ node: the reference behaviour). Faults are real: a TCP proxy between
the clients and the broker cuts every connection at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import pyarrow.compute as pc
import pytest
from tests.support.brokers import ROOT, HutchNode, RabbitMQNode, wait_until

from hutch.lab.client import ChannelClosed, Connection, Publisher, run
from hutch.lab.perf import PerfConfig, run_perf
from hutch.pipeline.history import SCHEMA, publisher_of, read_history, seq_of

TEST_BROKER = os.environ.get("HUTCH_TEST_BROKER", "hutch")


@pytest.fixture(scope="module")
def broker():
    if TEST_BROKER == "rabbitmq":
        node = RabbitMQNode(management=False)
    elif TEST_BROKER == "hutch":
        node = HutchNode(log_level="warning")
    else:
        raise ValueError(f"HUTCH_TEST_BROKER must be hutch or rabbitmq, not {TEST_BROKER!r}")
    with node:
        yield node


@pytest.fixture
def queue(broker):
    name = f"perf-test-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(Exception):
        run(_delete(broker.url, [name] + [f"{name}-{i}" for i in range(1, 4)]))


async def _delete(url: str, names: list[str]) -> None:
    conn = await Connection.connect(url)
    try:
        ch = await conn.channel()
        for n in names:
            await ch.delete_queue(n)
    finally:
        await conn.close()


async def _depth(url: str, name: str) -> int:
    conn = await Connection.connect(url)
    try:
        ch = await conn.channel()
        return (await ch.declare_queue(name, passive=True))[1]
    finally:
        await conn.close()


async def _drain_ids(url: str, name: str) -> list[int]:
    """Consume everything left in the queue; the message ids found in the bodies."""
    conn = await Connection.connect(url)
    try:
        ch = await conn.channel()
        _, depth, _ = await ch.declare_queue(name, passive=True)
        ids: list[int] = []
        done = asyncio.get_running_loop().create_future()

        def on_message(tag, redelivered, body):
            ids.append(int.from_bytes(body[8:16], "big"))
            ch.ack_upto(tag)
            if len(ids) >= depth and not done.done():
                done.set_result(None)

        if depth:
            await ch.consume(name, on_message)
            async with asyncio.timeout(30):
                await done
        return ids
    finally:
        await conn.close()


# -- the client ---------------------------------------------------------------------------------


def test_client_confirms_every_publish_and_consumes_them_all_with_batched_acks(broker, queue):
    count = 5000

    async def go():
        conn = await Connection.connect(broker.url)
        try:
            ch = await conn.channel()
            await ch.declare_queue(queue)
            await ch.confirm_select()
            acked: set[int] = set()
            floor = 0
            all_confirmed = asyncio.get_running_loop().create_future()

            def on_confirm(tag, multiple, ack):
                nonlocal floor
                assert ack
                if multiple:
                    acked.update(range(floor + 1, tag + 1))
                    floor = max(floor, tag)
                else:
                    acked.add(tag)
                if len(acked) == count and not all_confirmed.done():
                    all_confirmed.set_result(None)

            ch.on_confirm = on_confirm
            pub = Publisher(ch, "", queue, 24)
            for first in range(0, count, 250):
                assert ch.publish_frames(pub.batch_stamped(250, time.time_ns(), first), 250) == first + 250
                await conn.drain()
            async with asyncio.timeout(30):
                await all_confirmed
            assert acked == set(range(1, count + 1))

            cch = await conn.channel()
            await cch.qos(100)
            ids: list[int] = []
            got_all = asyncio.get_running_loop().create_future()

            def on_message(tag, redelivered, body):
                assert len(body) == 24 and not redelivered
                ids.append(int.from_bytes(body[8:16], "big"))
                cch.ack_upto(tag)
                if len(ids) == count:
                    got_all.set_result(None)

            await cch.consume(queue, on_message)
            async with asyncio.timeout(30):
                await got_all
            assert ids == list(range(count))  # one publisher, one queue: in order
            await cch.close()
        finally:
            await conn.close()
        assert await _depth(broker.url, queue) == 0  # every ack reached the broker

    run(go())


def test_client_message_larger_than_frame_max_round_trips(broker, queue):
    body = os.urandom(1_000_000)

    async def go():
        conn = await Connection.connect(broker.url, frame_max=16384)
        try:
            assert conn.frame_max <= 16384
            ch = await conn.channel()
            await ch.declare_queue(queue)
            got = asyncio.get_running_loop().create_future()
            await ch.consume(queue, lambda tag, red, b: got.set_result(b), no_ack=True)
            ch.publish(Publisher(ch, "", queue, len(body)), body)
            async with asyncio.timeout(30):
                assert await got == body
        finally:
            await conn.close()

    run(go())


def test_channel_error_carries_the_brokers_reply_and_the_connection_survives(broker, queue):
    async def go():
        conn = await Connection.connect(broker.url)
        try:
            ch = await conn.channel()
            await ch.declare_queue(queue, durable=False)
            with pytest.raises(ChannelClosed) as e:
                await ch.declare_queue(queue, durable=True)
            assert e.value.reply_code == 406  # PRECONDITION_FAILED: inequivalent arg 'durable'
            assert not ch.is_open
            ch2 = await conn.channel()
            assert (await ch2.declare_queue(queue, passive=True))[0] == queue
        finally:
            await conn.close()

    run(go())


def test_heartbeats_keep_an_idle_connection_open(broker):
    async def go():
        conn = await Connection.connect(broker.url, heartbeat_s=1)
        try:
            assert conn.heartbeat_s == 1
            rx0 = conn._rx_count
            async with asyncio.timeout(10):
                # idle: the only traffic is heartbeats, both ways, over 3+ intervals
                while conn._tx_count < 4 or conn._rx_count < rx0 + 3:
                    await asyncio.wait([conn.closed], timeout=0.1)
                    assert not conn.closed.done()
            ch = await conn.channel()
            assert ch.is_open
        finally:
            await conn.close()

    run(go())


# -- the tool -----------------------------------------------------------------------------------


def test_pmessages_stops_each_producer_exactly_and_every_message_is_confirmed_and_received(broker, queue):
    cfg = PerfConfig(uris=[broker.url], producers=2, consumers=1, pmessages=3000, confirm=200, qos=50,
                     queue=queue, duration_s=60, quiet=True)
    s = run_perf(cfg)
    assert s["sent"] == s["confirmed"] == s["received"] == 6000
    assert s["nacked"] == s["returned"] == 0 and not s["errors"]
    assert s["duration_s"] < 60
    assert s["consumer_latency_us"]["p50"] is not None
    assert s["confirm_latency_us"]["max"] is not None
    assert run(_depth(broker.url, queue)) == 0


def test_worker_processes_add_up_their_counts(broker, queue):
    cfg = PerfConfig(uris=[broker.url], producers=2, consumers=2, pmessages=2000, queue=queue + "-%d",
                     queues=2, autoack=True, processes=2, duration_s=60, quiet=True)
    s = run_perf(cfg)
    assert s["sent"] == 4000 and s["received"] == 4000
    assert s["client_cpu_s"] > 0


def test_cli_prints_perftest_progress_lines_and_writes_the_summary(broker, queue, tmp_path):
    out = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run([sys.executable, "-m", "hutch", "perf", "--uri", broker.url, "--queue", queue,
                        "--rate", "500", "--confirm", "50", "--duration", "2.5", "--json-out", str(out)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    progress = re.compile(r"^id: test-\d{6}-\d{3}, time: \d+\.\ds, sent: \d+ msg/s, confirmed: \d+ msg/s, "
                          r"received: \d+ msg/s, min/median/75th/95th/99th confirm latency: (\d+/){4}\d+ µs, "
                          r"min/median/75th/95th/99th consumer latency: (\d+/){4}\d+ µs$")
    assert len(lines) >= 3 and all(progress.match(line) for line in lines[:2]), p.stdout
    assert lines[-1].startswith("id: ") and "sending rate avg" in lines[-1]
    s = json.loads(out.read_text())
    assert 900 <= s["sent"] <= 1400  # 500 msg/s for 2.5 s
    assert s["sent"] - 50 <= s["confirmed"] <= s["sent"]  # at most the window still in flight at the end
    assert 0 < s["received"] <= s["sent"]


def test_recording_writes_one_row_per_event_in_the_history_schema(broker, queue, tmp_path):
    cfg = PerfConfig(uris=[broker.url], producers=2, consumers=1, pmessages=500, confirm=100, qos=20,
                     queue=queue, duration_s=60, record_dir=str(tmp_path), quiet=True)
    s = run_perf(cfg)
    assert s["received"] == 1000
    t = read_history(tmp_path)
    assert t.schema.names == SCHEMA.names
    ops = t.column("op").to_pylist()
    for op in ("publish", "confirm", "deliver", "ack"):
        assert ops.count(op) == 1000, op
    assert set(t.column("run_id").to_pylist()) == {cfg.run_id}
    published = t.filter(pc.equal(t.column("op"), "publish")).column("msg_id").to_pylist()
    assert sorted(publisher_of(m) for m in published) == [0] * 500 + [1] * 500
    assert sorted(seq_of(m) for m in published if publisher_of(m) == 1) == list(range(500))
    delivered = t.filter(pc.equal(t.column("op"), "deliver"))
    assert sorted(delivered.column("msg_id").to_pylist()) == sorted(published)
    assert delivered.column("redelivered").to_pylist() == [False] * 1000
    assert set(t.column("node").to_pylist()) == {f"127.0.0.1:{broker.port}"}


class CuttableProxy:
    """A loopback TCP proxy whose connections can all be cut at once, like a network fault."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.transports: list = []
        self.bytes_down = 0
        self.connections = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader, writer) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self.transports += [writer.transport, up_w.transport]

        async def pipe(r, w, down: bool):
            with contextlib.suppress(OSError, ConnectionError):
                while data := await r.read(65536):
                    if down:
                        self.bytes_down += len(data)
                    w.write(data)
                    await w.drain()
            w.transport.abort()

        await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))

    def cut(self) -> None:
        def abort_all():
            for t in self.transports:
                t.abort()
            self.transports.clear()

        self.loop.call_soon_threadsafe(abort_all)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_recording_clients_reconnect_after_a_cut_and_lose_no_confirmed_message(broker, queue, tmp_path):
    proxy = CuttableProxy(broker.port)
    try:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"
        cfg = PerfConfig(uris=[url], producers=1, consumers=1, rate=1000, pmessages=2500, confirm=50, qos=20,
                         queue=queue, duration_s=40, record_dir=str(tmp_path), quiet=True)
        result: dict = {}
        runner = threading.Thread(target=lambda: result.update(run_perf(cfg)), daemon=True)
        runner.start()
        wait_until(lambda: proxy.bytes_down > 40_000, 20, "deliveries flowing through the proxy")
        before = proxy.connections
        proxy.cut()
        wait_until(lambda: proxy.connections >= before + 2, 20, "producer and consumer reconnected")
        runner.join(60)
        assert not runner.is_alive() and result and not result["errors"]
    finally:
        proxy.close()

    t = read_history(tmp_path)
    rows = list(zip(t.column("client_id").to_pylist(), t.column("op").to_pylist(), strict=True))
    for client in ("producer-0", "consumer-0"):
        assert (client, "disconnect") in rows and (client, "reconnect") in rows, client

    def ids(op):
        return set(t.filter(pc.equal(t.column("op"), op)).column("msg_id").to_pylist())

    assert {seq_of(m) for m in ids("publish")} == set(range(2500))  # pmessages, republishes included
    left = set(run(_drain_ids(broker.url, queue)))
    lost = ids("confirm") - ids("deliver") - left
    assert not lost, f"{len(lost)} confirmed messages neither delivered nor in the queue"


def test_consumer_rate_holds_consumers_to_their_rate(broker, queue):
    cfg = PerfConfig(uris=[broker.url], producers=1, consumers=1, rate=1000, consumer_rate=200, qos=50,
                     queue=queue, duration_s=3, quiet=True)
    s = run_perf(cfg)
    assert 2700 <= s["sent"] <= 3300
    # 200 msg/s for 3 s, give or take what one read holds: the rate is kept by pausing the
    # socket, and up to a prefetch (50) of messages is already buffered when it pauses
    assert 450 <= s["received"] <= 800


def test_clients_are_spread_over_every_uri(broker, queue, tmp_path):
    proxy = CuttableProxy(broker.port)  # a second address for the same broker
    try:
        uris = [broker.url, f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"]
        cfg = PerfConfig(uris=uris, producers=2, consumers=2, pmessages=200, confirm=50, queue=queue,
                         duration_s=30, record_dir=str(tmp_path), quiet=True)
        s = run_perf(cfg)
    finally:
        proxy.close()
    assert s["received"] == 400
    t = read_history(tmp_path)
    nodes = dict(zip(t.column("client_id").to_pylist(), t.column("node").to_pylist(), strict=True))
    direct, proxied = f"127.0.0.1:{broker.port}", f"127.0.0.1:{proxy.port}"
    assert nodes == {"producer-0": direct, "producer-1": proxied, "consumer-0": direct, "consumer-1": proxied}
