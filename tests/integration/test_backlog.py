"""Disk-first classic queues: a backlog larger than the node's memory window lives on disk.

One hutch node of this module's own, configured with a small memory window per queue
(`classic_queue.memory_window_messages = 100`, `classic_queue.memory_window_bytes = 1MiB`) and a
memory high watermark only 16 MiB above its idle footprint, so that the backlogs below (40 MiB)
would raise the memory alarm and block publishers if their bodies stayed in memory, as they did
before disk-first queues (checked by hand on the tree before them: the alarm is up within a
second of the transient backlog). What is checked, as docs/durability.md describes it:

- a transient backlog past the window is accepted without connection.blocked and drained
  complete and in order; its bodies went to the scratch log;
- a persistent backlog on a durable queue survives kill -9 (bodies in the journal only, read
  back at boot a window at a time), in order, with `redelivered` on what had been delivered;
- `x-queue-mode: lazy` (and the policy key `queue-mode`) page every message;
- a corrupt scratch record is detected by its CRC, logged with the queue and the position, and
  that message is dropped: never delivered corrupt, the node keeps running;
- a priority queue pages too, level by level: a backlog past the window drains in priority
  order (FIFO within a priority) without raising the memory alarm;
- a lazy queue with a length limit drops and dead-letters exactly the heads it would drop in
  memory (drop-head), and refuses exactly the publishes past the limit (reject-publish).

Waiting is on conditions (queue counts, log lines), never on sleeps. The tests that restart the
node come last: a node restarted after recovering a backlog starts above the first start's
idle footprint, and so nearer its low memory watermark.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pika
import psutil
import pytest

from tests.integration.helpers import drain
from tests.support.brokers import HutchNode, wait_until
from tests.support.http import Http

MIB = 1 << 20
HEADROOM_BYTES = 16 * MIB  # the memory high watermark sits this far above the node's idle RSS
WINDOW_MESSAGES = 100
BODY_BYTES = 4096
BACKLOG = 10_000  # x 4 KiB = 40 MiB: more than the headroom, far more than the window
MEMORY_CHECK_INTERVAL_S = 1.0  # the node's memory check (Config.memory_check_interval_ms)


def _rss(node: HutchNode) -> int:
    return psutil.Process(node.proc.pid).memory_info().rss


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    conf = tmp_path_factory.mktemp("backlog-conf") / "hutch.conf"
    conf.write_text(f"classic_queue.memory_window_messages = {WINDOW_MESSAGES}\n"
                    "classic_queue.memory_window_bytes = 1MiB\n"
                    "vm_memory_high_watermark_paging_ratio = 0\n")  # disk-first from the start
    with HutchNode() as probe:
        idle = _rss(probe)
    n = HutchNode(extra_args=["--config", str(conf), "--vm-memory-high-watermark-bytes", str(idle + HEADROOM_BYTES)])
    try:
        n.start()
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def conn(node):
    c = pika.BlockingConnection(pika.URLParameters(node.url))
    yield c
    if c.is_open:
        try:
            c.close()
        except pika.exceptions.AMQPError:
            pass  # the node was killed under it


def _name(prefix: str) -> str:
    return f"backlog.{prefix}.{uuid.uuid4().hex[:8]}"


def _body(i: int, size: int = BODY_BYTES) -> bytes:
    return f"{i:08d}|".encode().ljust(size, b"b")


def _count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def _drain_all(conn, queue: str, expected: int, timeout_s: float = 60.0) -> list[tuple[int, bool]]:
    """Consume (manual acks, prefetch 200) until `expected` messages came: (number, redelivered)."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=200)
    got: list[tuple[int, bool]] = []

    def on_message(c, method, _props, body):
        got.append((int(body[:8]), method.redelivered))
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message)
    drain(conn, lambda: len(got) >= expected, timeout_s, f"{expected} messages from {queue}")
    ch.close()
    return got


def _scratch_bytes(node: HutchNode) -> int:
    return sum(p.stat().st_size for p in (node.data_dir / "scratch").glob("*.hseg"))


def test_transient_backlog_past_the_window_is_accepted_without_blocking_and_drained_in_order(node, conn):
    blocked = []
    conn.add_on_connection_blocked_callback(lambda *_a: blocked.append(time.monotonic()))
    ch = conn.channel()
    queue = _name("transient")
    ch.queue_declare(queue)
    started = time.monotonic()
    for i in range(BACKLOG):
        ch.basic_publish("", queue, _body(i))
    drain(conn, lambda: _count(ch, queue) == BACKLOG, 60, f"{BACKLOG} messages accepted (never blocked)")
    print(f"{BACKLOG} x {BODY_BYTES} B accepted in {time.monotonic() - started:.1f}s; node RSS "
          f"{_rss(node) / MIB:.0f} MiB; scratch log {_scratch_bytes(node) / MIB:.0f} MiB")
    assert not blocked
    assert _scratch_bytes(node) >= (BACKLOG - WINDOW_MESSAGES) * BODY_BYTES, "the bodies went to the scratch log"
    # The node checks its memory once a second. With the backlog's bodies in memory (before
    # disk-first queues) the alarm was up within that second; here it must stay down for three
    # checks (a property of a stretch of time: observed, not slept on), and a confirmed publish
    # still goes through.
    api = Http(node.mgmt_port)
    watch_until = time.monotonic() + 3 * MEMORY_CHECK_INTERVAL_S
    while time.monotonic() < watch_until:
        assert api.get("/api/nodes")[0]["mem_alarm"] is False, "memory alarm raised by a paged backlog"
        conn.process_data_events(time_limit=0.1)
    confirm = conn.channel()
    confirm.confirm_delivery()
    confirm.basic_publish("", queue, _body(BACKLOG))
    assert not blocked and "memory resource limit alarm set" not in node.log()
    got = _drain_all(conn, queue, BACKLOG + 1)
    assert [n for n, _r in got] == list(range(BACKLOG + 1))
    assert not any(r for _n, r in got)
    assert _count(ch, queue) == 0


def test_with_memory_to_spare_a_durable_queue_pages_persistent_messages_past_its_window(tmp_path):
    """The default paging ratio (0.5) and a watermark far away: transient messages past the
    window stay in memory (paging them would be a write), persistent messages of a durable queue
    go to disk past it (their bodies are in the journal already) and come back in order."""
    conf = tmp_path / "hutch.conf"
    conf.write_text(f"classic_queue.memory_window_messages = {WINDOW_MESSAGES}\n")
    with HutchNode(extra_args=["--config", str(conf)]) as n:
        c = pika.BlockingConnection(pika.URLParameters(n.url))
        ch = c.channel()
        ch.confirm_delivery()
        api = Http(n.mgmt_port)
        scratch_before = _scratch_bytes(n)
        durable, transient = _name("durable"), _name("transient")
        ch.queue_declare(durable, durable=True)
        ch.queue_declare(transient)
        persistent = pika.BasicProperties(delivery_mode=2)
        count = 5 * WINDOW_MESSAGES
        for i in range(count):
            ch.basic_publish("", durable, _body(i, 1024), persistent)
            ch.basic_publish("", transient, _body(i, 1024))
        shown = api.get(f"/api/queues/%2F/{durable}")
        assert (shown["messages_ready"], shown["messages_ram"], shown["messages_paged_out"]) == \
            (count, WINDOW_MESSAGES, count - WINDOW_MESSAGES)
        shown = api.get(f"/api/queues/%2F/{transient}")
        assert (shown["messages_ready"], shown["messages_ram"], shown["messages_paged_out"]) == (count, count, 0)
        assert _scratch_bytes(n) == scratch_before, "nothing was written to the scratch log"
        assert [i for i, _r in _drain_all(c, durable, count)] == list(range(count))
        c.close()


def test_lazy_queue_pages_every_message_and_delivers_them_in_order(node, conn):
    ch = conn.channel()
    queue = _name("lazy")
    ch.queue_declare(queue, arguments={"x-queue-mode": "lazy"})
    before = _scratch_bytes(node)
    for i in range(50):  # well inside the window: a default queue would keep them in memory
        ch.basic_publish("", queue, _body(i, 1024))
    drain(conn, lambda: _count(ch, queue) == 50, 10, "50 messages in the lazy queue")
    assert _scratch_bytes(node) - before >= 50 * 1024, "a lazy queue keeps no body in memory"
    shown = Http(node.mgmt_port).get(f"/api/queues/%2F/{queue}")
    assert (shown["messages_paged_out"], shown["messages_ram"], shown["messages_ready"]) == (50, 0, 50)
    assert shown["message_bytes_paged_out"] == shown["message_bytes_ready"] and shown["message_bytes_ram"] == 0
    got = _drain_all(conn, queue, 50)
    assert [n for n, _r in got] == list(range(50))


def test_queue_mode_lazy_policy_pages_a_queue(node, conn):
    api = Http(node.mgmt_port)
    pattern = _name("lazypol")
    code, _ = api("PUT", f"/api/policies/%2F/{pattern}",
                  {"pattern": "^" + pattern.replace(".", "\\."), "definition": {"queue-mode": "lazy"},
                   "apply-to": "queues"})
    assert code in (201, 204)
    try:
        ch = conn.channel()
        queue = pattern + ".q"
        ch.queue_declare(queue)
        before = _scratch_bytes(node)
        for i in range(20):
            ch.basic_publish("", queue, _body(i, 1024))
        drain(conn, lambda: _count(ch, queue) == 20, 10, "20 messages in the queue")
        assert _scratch_bytes(node) - before >= 20 * 1024
        assert [n for n, _r in _drain_all(conn, queue, 20)] == list(range(20))
    finally:
        api("DELETE", f"/api/policies/%2F/{pattern}")


def test_unknown_queue_mode_is_refused_with_rabbitmqs_text(conn):
    ch = conn.channel()
    queue = _name("eager")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(queue, arguments={"x-queue-mode": "eager"})
    assert info.value.reply_code == 406
    assert info.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue '{queue}' in "
                                     "vhost '/': \"unsupported queue mode 'eager'\"")


def test_corrupt_scratch_record_is_logged_and_skipped_never_delivered(node, conn):
    ch = conn.channel()
    queue = _name("corrupt")
    ch.queue_declare(queue, arguments={"x-queue-mode": "lazy"})
    marker = uuid.uuid4().hex.encode()
    bodies = [f"{i:08d}|".encode() + marker + b"|" + bytes([65 + i]) * 2000 for i in range(5)]
    for b in bodies:
        ch.basic_publish("", queue, b)
    drain(conn, lambda: _count(ch, queue) == 5, 10, "5 messages in the lazy queue")
    target = b"00000002|" + marker
    wait_until(lambda: any(target in p.read_bytes() for p in (node.data_dir / "scratch").glob("*.hseg")), 10,
               "the third message's record written to the scratch log")
    seg = next(p for p in (node.data_dir / "scratch").glob("*.hseg") if target in p.read_bytes())
    data = bytearray(seg.read_bytes())
    at = data.index(target) + len(target) + 100  # inside its body
    with open(seg, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
    got = _drain_all(conn, queue, 4)
    assert [n for n, _r in got] == [0, 1, 3, 4]
    wait_until(lambda: "cannot be read back" in node.log(), 10, "the corrupt record logged")
    line = next(x for x in node.log().splitlines() if "cannot be read back" in x)
    assert f"queue '{queue}'" in line and "paged message 3" in line and "scratch record" in line
    assert _count(ch, queue) == 0
    ch.queue_declare(_name("alive"), auto_delete=True)  # the node keeps running


def test_priority_backlog_past_the_window_drains_in_priority_order_without_the_alarm(node, conn):
    blocked = []
    conn.add_on_connection_blocked_callback(lambda *_a: blocked.append(time.monotonic()))
    ch = conn.channel()
    queue = _name("priority")
    ch.queue_declare(queue, arguments={"x-max-priority": 9})
    before = _scratch_bytes(node)
    props = [pika.BasicProperties(priority=p) for p in range(10)]
    prio = [(i * 7) % 10 for i in range(BACKLOG)]  # every priority, interleaved
    for i in range(BACKLOG):
        ch.basic_publish("", queue, _body(i), props[prio[i]])
    drain(conn, lambda: _count(ch, queue) == BACKLOG, 60, f"{BACKLOG} messages accepted (never blocked)")
    rss = _rss(node)
    shown = Http(node.mgmt_port).get(f"/api/queues/%2F/{queue}")
    print(f"priority backlog {BACKLOG} x {BODY_BYTES} B: node RSS {rss / MIB:.0f} MiB, "
          f"{shown['messages_paged_out']} paged out, {shown['messages_ram']} in memory")
    assert not blocked and "memory resource limit alarm set" not in node.log()
    assert shown["messages_paged_out"] >= BACKLOG - WINDOW_MESSAGES
    assert _scratch_bytes(node) - before >= (BACKLOG - WINDOW_MESSAGES) * BODY_BYTES
    got = _drain_all(conn, queue, BACKLOG)
    assert [n for n, _r in got] == sorted(range(BACKLOG), key=lambda i: (-prio[i], i))
    assert _count(ch, queue) == 0


def test_length_limited_lazy_queue_drops_and_dead_letters_the_oldest(node, conn):
    ch = conn.channel()
    queue = _name("maxlen")
    dlx, dlq = queue + ".dlx", queue + ".dead"
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    ch.queue_declare(queue, arguments={"x-queue-mode": "lazy", "x-max-length": 100, "x-dead-letter-exchange": dlx})
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", queue, _body(i, 1024))
    assert _count(ch, queue) == 100 and _count(ch, dlq) == 200
    shown = Http(node.mgmt_port).get(f"/api/queues/%2F/{queue}")
    assert (shown["messages_paged_out"], shown["messages_ram"]) == (100, 0)
    dead = []

    def on_dead(c, method, props, body):
        dead.append((int(body[:8]), props.headers["x-death"][0]["reason"]))
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(dlq, on_dead)
    drain(conn, lambda: len(dead) == 200, 20, "200 dead letters")
    assert dead == [(i, "maxlen") for i in range(200)]
    assert [n for n, _r in _drain_all(conn, queue, 100)] == list(range(200, 300))


def test_length_limited_lazy_queue_refuses_publishes_past_the_limit(node, conn):
    ch = conn.channel()
    queue = _name("reject")
    ch.queue_declare(queue, durable=True, arguments={"x-queue-mode": "lazy", "x-max-length": 50,
                                                     "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    nacked = []
    for i in range(80):
        try:
            ch.basic_publish("", queue, _body(i, 1024), persistent)
        except pika.exceptions.NackError:
            nacked.append(i)
    assert nacked == list(range(50, 80))
    assert _count(ch, queue) == 50
    assert [n for n, _r in _drain_all(conn, queue, 50)] == list(range(50))
    ch.basic_publish("", queue, _body(80, 1024), persistent)  # room again
    assert [n for n, _r in _drain_all(conn, queue, 1)] == [80]
    ch.queue_delete(queue)


def test_persistent_backlog_on_a_durable_queue_survives_kill_9_in_order(node, conn):
    ch = conn.channel()
    queue = _name("durable")
    ch.queue_declare(queue, durable=True)
    n = 5_000
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.tx_select()
    for i in range(n):
        ch.basic_publish("", queue, _body(i), persistent)
        if i % 500 == 499:
            ch.tx_commit()  # commit-ok: on disk
    ch.tx_commit()
    assert _count(ch, queue) == n
    # the first ten go to a consumer and stay unacknowledged
    held = conn.channel()
    held.basic_qos(prefetch_count=10)
    seen = []
    held.basic_consume(queue, lambda _c, m, _p, b: seen.append(int(b[:8])))
    drain(conn, lambda: len(seen) == 10, 10, "ten deliveries")
    assert seen == list(range(10))
    node.kill()
    node.start()
    wait_until(lambda: f"queue '{queue}' in vhost '/': recovered {n} persistent message(s)" in node.log(), 10,
               "recovery logged")
    line = next(x for x in node.log().splitlines() if f"queue '{queue}' in vhost '/': recovered" in x)
    assert "paged" in line, line
    conn2 = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        got = _drain_all(conn2, queue, n)
        assert [i for i, _r in got] == list(range(n))
        # after a kill -9 every recovered message comes back redelivered, paged ones too
        # (docs/durability.md, "The `redelivered` flag")
        assert all(r for _i, r in got)
        ch2 = conn2.channel()
        assert _count(ch2, queue) == 0
        ch2.queue_delete(queue)
    finally:
        conn2.close()


def test_scratch_log_is_wiped_at_boot(node):
    scratch = Path(node.data_dir) / "scratch"
    node.stop()
    scratch.mkdir(exist_ok=True)  # a graceful stop removes it; a kill -9 leaves it behind
    (scratch / "00000000000000000099.hseg").write_bytes(b"left over")
    node.start()
    assert not (scratch / "00000000000000000099.hseg").exists()
