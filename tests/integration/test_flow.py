"""Flow control and memory: a broker under a fast publisher stays within its memory, and
tells publishers to stop (connection.blocked) when it crosses its high watermark.

Each test starts a node of its own, so that its memory is measured alone and an alarm it
raises touches nobody else. The broker's resident memory is read with psutil from the
node's process tree (RabbitMQ: the start script and beam.smp; hutch: its one process).
"""

from __future__ import annotations

import threading
import time

import pika
import psutil
import pytest

from tests.integration.conftest import start_node
from tests.integration.helpers import connect
from tests.support.brokers import HutchNode

MIB = 1 << 20


def broker_rss_bytes(node) -> int:
    root = psutil.Process(node.proc.pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class RssSampler:
    """Samples a node's RSS in a thread until stopped; keeps the peak."""

    def __init__(self, node, interval_s: float = 0.05):
        self.node = node
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, broker_rss_bytes(self.node))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def own_node(kind):
    node = start_node(kind)
    try:
        yield node
    finally:
        node.cleanup()


def test_fast_publisher_and_slow_consumer_keep_broker_memory_bounded(own_node):
    """Publish 80 MiB as fast as possible while a consumer acks slowly: the publisher is
    never disconnected, every message arrives in order, and the broker's RSS grows by no
    more than twice the bytes it holds (plus 64 MiB of slack)."""
    node = own_node
    n, size = 10_000, 8 * 1024
    queue = "flow.slow-consumer"
    setup = connect(node)
    setup.channel().queue_declare(queue)
    setup.close()

    received: list[int] = []
    slow = threading.Event()
    slow.set()
    consumer_error: list[BaseException] = []

    def consume():
        try:
            c = connect(node)
            ch = c.channel()
            ch.basic_qos(prefetch_count=50)

            def on_message(_ch, method, _props, body):
                received.append(int(body[:8]))
                if slow.is_set():
                    time.sleep(0.002)
                _ch.basic_ack(method.delivery_tag)

            ch.basic_consume(queue, on_message)
            deadline = time.monotonic() + 120
            while len(received) < n and time.monotonic() < deadline:
                c.process_data_events(time_limit=0.1)
            c.close()
        except BaseException as e:  # surfaced by the test below
            consumer_error.append(e)

    baseline = broker_rss_bytes(node)
    consumer = threading.Thread(target=consume, daemon=True)
    with RssSampler(node) as rss:
        consumer.start()
        pub = connect(node)
        ch = pub.channel()
        pad = b"x" * (size - 8)
        for i in range(n):
            ch.basic_publish("", queue, b"%08d" % i + pad)
        pub.process_data_events(time_limit=0)
        assert pub.is_open
        slow.clear()  # publishing is over: let the consumer catch up
        consumer.join(120)
        pub.close()
    assert not consumer_error, consumer_error
    assert received == list(range(n))
    growth = rss.peak - baseline
    print(f"broker RSS baseline {baseline / MIB:.0f} MiB, peak {rss.peak / MIB:.0f} MiB, "
          f"growth {growth / MIB:.0f} MiB for {n * size / MIB:.0f} MiB published")
    assert growth <= 2 * n * size + 64 * MIB


def test_a_consumer_at_its_prefetch_limit_does_not_hold_publishers_back(own_node):
    """A backlog, and a consumer that takes messages steadily at its own pace (prefetch 10,
    about 100 a second): a publisher's 1,000 confirms all come while the backlog is still there.
    The consumer's client, not the broker, is what is slow, so the queue just grows, as
    RabbitMQ's does; it is not throttled to the consumer's pace (which would mean waiting
    for it to drain most of the backlog first)."""
    node = own_node
    queue = "flow.paced-consumer"
    pub = connect(node)
    ch = pub.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for _ in range(3_000):
        ch.basic_publish("", queue, b"backlog")
    received: list[float] = []
    stop = threading.Event()

    def consume():
        c = connect(node)
        cch = c.channel()
        cch.basic_qos(prefetch_count=10)
        for method, _props, _body in cch.consume(queue, inactivity_timeout=0.05):
            if stop.is_set():
                break
            if method is not None:
                received.append(time.monotonic())
                cch.basic_ack(method.delivery_tag)
                time.sleep(0.01)
        c.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        deadline = time.monotonic() + 30
        while len(received) < 50 and time.monotonic() < deadline:  # the consumer is going
            time.sleep(0.02)
        assert len(received) >= 50
        taken_before = len(received)
        for _ in range(1_000):
            ch.basic_publish("", queue, b"more")  # each waits for its confirm
        taken_meanwhile = len(received) - taken_before
        depth = ch.queue_declare(queue, passive=True).method.message_count
    finally:
        stop.set()
        consumer.join(30)
        pub.close()
    # throttled to the consumer, the confirms would have waited for it to take some 3,000
    assert taken_meanwhile < 1_000, taken_meanwhile
    assert depth > 2_500, depth


def _node_with_watermark(kind: str, headroom_bytes: int):
    """A fresh node whose memory high watermark sits `headroom_bytes` above its idle RSS
    (RabbitMQ 3.10 measures its memory use as the OS's RSS of beam.smp by default)."""
    if kind == "rabbitmq":
        node = start_node(kind)
        watermark = broker_rss_bytes(node) + headroom_bytes
        node.ctl("set_vm_memory_high_watermark", "absolute", str(watermark))
        return node
    probe = start_node(kind)
    try:
        idle = broker_rss_bytes(probe)
    finally:
        probe.cleanup()
    node = HutchNode(extra_args=["--vm-memory-high-watermark-bytes", str(idle + headroom_bytes)])
    try:
        node.start()
    except BaseException:
        node.cleanup()
        raise
    return node


def test_crossing_the_memory_high_watermark_blocks_publishers_until_memory_is_freed(kind):
    """A publisher filling a queue with no consumer gets connection.blocked once the broker's
    memory crosses the watermark; the broker then takes nothing more from that connection
    (not even other methods: it stops reading it) until memory is freed from another
    connection, when connection.unblocked comes and the held-back publish goes through.

    The publisher uses pika's asynchronous SelectConnection, which never blocks the test on
    a socket the broker has stopped reading; a second (blocking) connection observes."""
    node = _node_with_watermark(kind, headroom_bytes=48 * MIB)
    queue = "flow.watermark"
    body = b"m" * (64 * 1024)
    state = {"events": [], "published": 0, "error": None, "held": None, "after": None}
    observer = connect(node)
    try:
        watch = observer.channel()

        def on_open(conn):
            conn.add_on_connection_blocked_callback(lambda _c, _f: on_blocked(conn))
            conn.add_on_connection_unblocked_callback(lambda _c, _f: on_unblocked(conn))
            conn.channel(on_open_callback=on_channel)

        def on_channel(ch):
            state["ch"] = ch
            ch.add_on_close_callback(lambda _ch, reason: fail(ch.connection, f"channel closed: {reason!r}"))
            ch.queue_declare(queue, callback=lambda _f: publish(ch))

        def publish(ch):
            if state["events"] or not ch.is_open:
                return
            if state["published"] * len(body) > 1024 * MIB:
                fail(ch.connection, "1 GiB published and never blocked")
                return
            for _ in range(16):
                ch.basic_publish("", queue, body)
            state["published"] += 16
            ch.connection.ioloop.call_later(0.002, lambda: publish(ch))

        def count() -> int:
            return watch.queue_declare(queue, passive=True).method.message_count

        def on_blocked(conn):
            state["events"].append("blocked")
            if "ch" not in state or not state["ch"].is_open:
                fail(conn, f"connection.blocked before the publishing channel was open: {state}")
                return
            state["ch"].basic_publish("", queue, b"sent while blocked")
            conn.ioloop.call_later(1.0, lambda: while_blocked(conn, count()))

        def while_blocked(conn, first: int):
            state["held"] = (first, count())  # nothing taken in between
            state["rss_blocked"] = broker_rss_bytes(node)
            watch.queue_purge(queue)          # free the memory from another connection

        def on_unblocked(conn):
            state["events"].append("unblocked")
            conn.ioloop.call_later(0.05, lambda: after_unblocked(conn, time.monotonic() + 10))

        def after_unblocked(conn, deadline):
            if count() >= 1 or time.monotonic() > deadline:
                state["after"] = count()
                conn.close()
            else:
                conn.ioloop.call_later(0.05, lambda: after_unblocked(conn, deadline))

        def fail(conn, why):
            if state["error"] is None and state["after"] is None:
                state["error"] = why
            conn.ioloop.stop()  # a blocked connection cannot even be closed politely

        params = pika.ConnectionParameters(host=node.host, port=node.port,
                                           credentials=pika.PlainCredentials("guest", "guest"))
        conn = pika.SelectConnection(params, on_open_callback=on_open,
                                     on_open_error_callback=lambda c, e: fail(c, repr(e)),
                                     on_close_callback=lambda c, _r: c.ioloop.stop())
        timer = conn.ioloop.call_later(60, lambda: fail(
            conn, f"timed out after {state['events']} with broker RSS {broker_rss_bytes(node) / MIB:.0f} MiB"))
        conn.ioloop.start()
        conn.ioloop.remove_timeout(timer)
        assert state["error"] is None, state["error"]
        assert state["events"] == ["blocked", "unblocked"]
        first, later = state["held"]
        assert later == first, "the broker kept taking publishes while it said blocked"
        assert state["after"] >= 1, "the publish held back while blocked never arrived"
        print(f"blocked after {state['published'] * len(body) / MIB:.0f} MiB published")
    finally:
        if observer.is_open:
            observer.close()
        node.cleanup()
