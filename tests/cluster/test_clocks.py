"""Replicated time on nodes whose monotonic clocks have unrelated epochs, as on separate hosts.

Every test cluster shares one host, so its nodes' monotonic clocks agree by accident. Here one
node reads its monotonic clock as a host that booted three days before the others would
(`HUTCH_FAULT_BOOT_OFFSET_S`). Times that travel in replicated state (the time a quorum
command carries, a mirrored message's expiry) must still mean the same on every node: a
message's TTL counts from its publish wherever it was published and whoever leads.
"""

from __future__ import annotations

import pika
import pytest

from tests.cluster.test_mirroring import connect, http, wait_mirrors
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(180)
BOOTED_EARLIER_S = 3 * 24 * 3600
OLD_HOST = 2  # the node whose host booted three days earlier
TTL_MS = 60_000
TTL_HA_MS = 15_000


@pytest.fixture(scope="module")
def cluster():
    c = HutchCluster(n=3)
    c.nodes[OLD_HOST].env = {"HUTCH_FAULT_BOOT_OFFSET_S": str(BOOTED_EARLIER_S)}
    with c:
        yield c


def _publish(conn: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", queue, b, pika.BasicProperties(delivery_mode=2))
    ch.close()


def test_a_quorum_command_from_a_node_with_another_boot_time_expires_nothing(cluster):
    """The quorum state machine's time is the largest any member sent. A member counting from
    another epoch would move it three days on, and every message with a TTL would expire."""
    c1, c3 = connect(cluster, 0), connect(cluster, OLD_HOST)
    try:
        c1.channel().queue_declare("clock.qq", durable=True,
                                   arguments={"x-queue-type": "quorum", "x-message-ttl": TTL_MS})
        _publish(c1, "clock.qq", [f"m{i}".encode() for i in range(5)])
        _publish(c3, "clock.qq", [b"from-the-old-host"])  # carries that node's time
        ch = c1.channel()
        method, _props, body = ch.basic_get("clock.qq", auto_ack=True)  # the get applies the group's time
        assert body == b"m0", f"the first message is gone: basic.get gave {body!r}"
        assert ch.queue_declare("clock.qq", passive=True).method.message_count == 5
    finally:
        c1.close()
        c3.close()


def test_a_mirror_promoted_on_another_host_expires_messages_on_time(cluster):
    """A mirrored queue's leader gives each message its expiry time and the mirrors keep it. Led
    from the old host and then promoted elsewhere, messages with an 15 s TTL must expire about
    15 s after their publish, not three days later (the old host's times read as the future)."""
    assert http(cluster, 0, "PUT", "/api/policies/%2F/clock-ha",
                {"pattern": "^clock\\.ha$", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
                 "apply-to": "queues"}) in (201, 204)
    c3 = connect(cluster, OLD_HOST)
    c3.channel().queue_declare("clock.ha", durable=True, arguments={"x-message-ttl": TTL_HA_MS})
    try:
        leader, _ms, _ss = wait_mirrors(cluster, "clock.ha", 2, synced=2)
        assert leader == cluster.names[OLD_HOST]
        _publish(c3, "clock.ha", [f"m{i}".encode() for i in range(5)])
        wait_mirrors(cluster, "clock.ha", 2, synced=2)
        # still there when their leader dies: the promoted mirror is the one to expire them
        assert c3.channel().queue_declare("clock.ha", passive=True).method.message_count == 5
    finally:
        c3.close()
    cluster.kill(OLD_HOST)
    held_after_promotion = []  # the depths the promoted leader reported, in order

    def expired_by_the_promoted_leader() -> bool:
        try:
            view = cluster.api(0, "/api/queues/%2F/clock.ha")
        except OSError:
            return False
        if view.get("node") in (None, cluster.names[OLD_HOST]):
            return False
        held_after_promotion.append(view.get("messages"))
        # it held the messages (the view may read 0 for a moment while the promotion completes),
        # and then let them expire
        return 5 in held_after_promotion and held_after_promotion[-1] == 0

    try:
        wait_until(expired_by_the_promoted_leader, 40, "the promoted leader to expire the messages")
    except TimeoutError as e:
        raise AssertionError(f"{e}; the depths it reported, the last ones: {held_after_promotion[-5:]}") from None
