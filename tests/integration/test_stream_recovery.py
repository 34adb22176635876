"""A stream's replica across a node restart: the offsets go on where they stopped and no message
is written twice, whether the stream's Raft log was compacted behind a snapshot before the
restart (the replica keeps its chunk log) or not (the Raft log replays every batch)."""

from __future__ import annotations

import time

import pika
import pytest

from hutch.store.stream_log import StreamLog
from tests.support.brokers import HutchNode

pytestmark = pytest.mark.timeout(300)
STREAM = {"x-queue-type": "stream"}


def publish(node: HutchNode, first: int, count: int, per_batch: int = 1) -> None:
    """`count` messages with confirms; `per_batch` of them are confirmed together (one batch)."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", "s", f"m{i}".encode())
    conn.close()


def read_all(node: HutchNode, expected: int) -> list[tuple[int, bytes]]:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    got: list[tuple[int, bytes]] = []
    ch.basic_qos(prefetch_count=500)

    def on(c, m, p, body):
        got.append((p.headers["x-stream-offset"], body))
        c.basic_ack(m.delivery_tag)
    ch.basic_consume("s", on, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.process_data_events(0.3)  # nothing more may come
    conn.close()
    return got


@pytest.mark.parametrize("before", [10, 300], ids=["raft-log-only", "after-snapshots"])
def test_a_restarted_replica_goes_on_numbering_where_it_stopped(before):
    with HutchNode() as node:
        publish(node, 0, before)
        node.stop()
        node.start()
        publish(node, before, 10)
        got = read_all(node, before + 10)
        assert [o for o, _b in got] == list(range(before + 10))
        assert [b for _o, b in got] == [f"m{i}".encode() for i in range(before + 10)]
        node.stop()
        (replica,) = (node.data_dir / "streams").iterdir()
        log = StreamLog(replica, fsync=False)
        try:
            # each chunk carries the Raft term of its leader: the restart elected a new one
            epochs = [e for e, _first in log.epochs()]
            assert len(epochs) == 2 and 0 < epochs[0] < epochs[1]
        finally:
            log.close()


def test_files_of_a_replica_the_catalogue_no_longer_has_are_removed_at_boot():
    with HutchNode() as node:
        publish(node, 0, 5)
        streams = node.data_dir / "streams"
        (kept,) = [p.name for p in streams.iterdir()]
        node.stop()
        orphan = streams / "00000000deadbeef"  # a stream deleted while the node was down
        orphan.mkdir()
        (orphan / "00000000000000000000.segment").write_bytes(b"x")
        node.start()
        assert not orphan.exists() and (streams / kept).is_dir()
        assert "removing the files of stream replica 00000000deadbeef" in node.log_path.read_text()
        assert [o for o, _b in read_all(node, 5)] == list(range(5))
