"""A disk that fails under a running node: the node stops instead of running on.

After an fsync error the page cache cannot be trusted to hold what was written (PostgreSQL's
"fsyncgate"), so a node whose message store or Raft log cannot sync stops with exit status 74
(EX_IOERR) and a critical log line, as a Ra server crashes on a failed write; its clients see
their connections close and can fail over. Nothing unconfirmed is ever confirmed, and what was
confirmed before the failure is still there after a restart on a healthy disk.

The failure is injected with the node's fault switch (`HUTCH_FAULT_FSYNC_FILE`, see
hutch.server.faults): every fsync fails while the named file exists.
"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from hutch.store import format as fmt
from tests.support.brokers import HutchNode, wait_until

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def node(tmp_path):
    switch = tmp_path / "fail-fsync"
    n = HutchNode(env={"HUTCH_FAULT_FSYNC_FILE": str(switch)})
    n.switch = switch
    n.start()
    yield n
    n.cleanup()


def test_a_failed_message_store_fsync_stops_the_node_and_confirms_nothing_more(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("fsync-q", durable=True)
    ch.basic_publish("", "fsync-q", b"before", properties=PERSISTENT)  # confirmed: on disk

    node.switch.touch()
    with pytest.raises((pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError,
                        pika.exceptions.NackError, pika.exceptions.StreamLostError)):
        ch.basic_publish("", "fsync-q", b"after", properties=PERSISTENT)  # never confirmed
    assert node.proc.wait(30) == 74
    log = node.log()
    assert "message store fsync failed" in log and "fault injected" in log
    assert "stopping node hutch@localhost" in log

    node.switch.unlink()
    node.start()
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        bodies = []
        while (got := ch.basic_get("fsync-q", auto_ack=True))[0] is not None:
            bodies.append(got[2])
    finally:
        conn.close()
    assert bodies[0] == b"before"  # what was confirmed survived
    assert len(bodies) <= 2  # "after" may or may not have reached the disk; it was never confirmed


def test_a_failed_raft_log_fsync_stops_the_node(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    node.switch.touch()
    with pytest.raises((pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError,
                        pika.exceptions.StreamLostError)):
        ch.exchange_declare("raft-fsync-x", "direct")  # a catalogue change: a Raft log write
    wait_until(lambda: node.proc.poll() is not None, 30, "the node to stop")
    assert node.proc.returncode == 74
    assert "Raft log fsync failed" in node.log()


def test_a_node_whose_raft_log_is_corrupt_refuses_to_start(node):
    """A damaged record in the Raft log (not a torn tail) may have held the newest term and
    vote: the node will not serve from what is left, and says so."""
    node.stop()
    segments = sorted(p for p in (node.data_dir / "raft").iterdir() if p.is_file() and p.stat().st_size > 64)
    data = bytearray(segments[0].read_bytes())
    found, damage = fmt.scan_segment(bytes(data), fmt.SEGMENT_HEADER_BYTES, 1 << 24, 0, 1 << 64)
    assert not damage and len(found) >= 2
    first = found[0]
    data[first.offset + fmt.RECORD_HEADER_BYTES] ^= 0xFF  # the first record's payload, records after it intact
    segments[0].write_bytes(bytes(data))
    node.start(wait=False)
    assert node.proc.wait(30) == 74
    log = node.log()
    assert "has corrupt data" in log and "will not serve its Raft groups" in log
    assert "boot failed: its Raft log cannot be trusted" in log
