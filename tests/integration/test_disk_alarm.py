"""The disk alarm: free space below disk_free_limit blocks publishers until it is back."""

from __future__ import annotations

import os
import shutil

import pika

from tests.integration.helpers import drain
from tests.support.brokers import HutchNode

MB = 1000 * 1000
BALLAST = 1000 * MB  # freed during the test; the limit sits half-way
MARGIN = 500 * MB


def test_free_disk_below_the_limit_blocks_publishers_until_space_comes_back(tmp_path):
    data = tmp_path / "node"
    data.mkdir()
    ballast = tmp_path / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, BALLAST)
    finally:
        os.close(fd)
    limit = shutil.disk_usage(tmp_path).free + MARGIN  # below the limit now, above it without ballast
    with HutchNode(data_dir=data, extra_args=["--disk-free-limit", str(limit)], mgmt_port=0) as node:
        assert "disk resource limit alarm set" in node.log()
        events: list[str] = []
        pub = pika.BlockingConnection(pika.URLParameters(node.url))
        pub.add_on_connection_blocked_callback(lambda _c, _f: events.append("blocked"))
        pub.add_on_connection_unblocked_callback(lambda _c, _f: events.append("unblocked"))
        ch = pub.channel()
        ch.queue_declare("disk.q")
        ch.basic_publish("", "disk.q", b"first")  # the publish that gets the connection blocked
        drain(pub, lambda: "blocked" in events, timeout_s=10, what="connection.blocked")
        ch.basic_publish("", "disk.q", b"held back")
        other = pika.BlockingConnection(pika.URLParameters(node.url))
        held = other.channel().queue_declare("disk.q", passive=True).method.message_count
        assert held <= 1
        ballast.unlink()  # space comes back: the alarm clears within a check interval
        drain(pub, lambda: "unblocked" in events, timeout_s=15, what="connection.unblocked")
        drain(pub, lambda: other.channel().queue_declare("disk.q", passive=True).method.message_count == 2,
              timeout_s=10, what="the held-back publish")
        assert events == ["blocked", "unblocked"]
        assert "disk resource limit alarm cleared" in node.log()
        other.close()
        pub.close()
