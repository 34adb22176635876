"""A channel publishing to a quorum queue is a publisher the queue's state machine tracks
(its last sequence number, so that a resend after a leader change is enqueued once). hutch
names each channel by a number from the node's counter, never by the channel's address, and
forgets a channel once it is closed: the queue drops the record (`PublisherGone`) and a new
channel, with an id of its own, has every publish enqueued from its sequence number 1.

The record count is read from the queue's Raft status (`publishers`, hutch's own field).
"""

from __future__ import annotations

import base64
import json
import urllib.parse
import urllib.request

import pika
import pytest

from tests.support.brokers import HutchNode, wait_until

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    try:
        n.start()
        yield n
    finally:
        n.cleanup()


def _publishers(node: HutchNode, queue: str) -> int | None:
    url = f"{node.mgmt_url}/api/hutch/quorum/%2F/{urllib.parse.quote(queue, safe='')}/status"
    req = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        rows = json.loads(resp.read())
    assert len(rows) == 1, rows
    return rows[0].get("publishers")


def _publish_confirmed(conn: pika.BlockingConnection, queue: str, n: int) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode())  # raises when nacked
    ch.close()


def test_closed_channel_publisher_is_forgotten_and_new_channels_publishes_are_enqueued(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        setup = conn.channel()
        queue = "quorum-publishers"
        setup.queue_declare(queue, durable=True, arguments=QUORUM)

        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", queue, f"first-{i}".encode())
        assert _publishers(node, queue) == 1  # the open channel is tracked
        ch.close()
        # closed: its record goes once nothing it sent can still be on its way
        wait_until(lambda: _publishers(node, queue) == 0, 30.0, "closed channel's publisher record dropped")

        # channel after channel, each starting again at sequence number 1 with an id of its own:
        # every publish is a new message (an id reused with a fresh count would be taken for a
        # resend and confirmed without being enqueued)
        for _ in range(40):
            _publish_confirmed(conn, queue, 2)
        ok = setup.queue_declare(queue, passive=True).method
        assert ok.message_count == 3 + 40 * 2
        wait_until(lambda: _publishers(node, queue) == 0, 30.0, "every closed channel's record dropped")
        setup.queue_delete(queue)
    finally:
        conn.close()
