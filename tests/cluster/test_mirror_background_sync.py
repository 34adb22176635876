"""hutch's own background synchronisation (`ha-sync-background`): a mirror is brought up to date
while the queue goes on delivering and answering basic.get, and it is a faithful copy after:
a promotion right after the sync loses nothing that was not acknowledged and flags every
message that was delivered."""

from __future__ import annotations

import time

import pytest

from tests.cluster.test_mirroring import (
    connect,
    ctl,
    drain_when_served,
    info,
    log_of,
    publish_confirmed,
    wait_mirrors,
)
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(240)
MESSAGES = 120  # of about 1 KiB: at 40 kB/s a sync takes about three seconds
ACKED = 40  # acknowledged while the sync runs
HELD = 10  # delivered and not acknowledged when the leader dies


@pytest.mark.parametrize("window", [None, 20], ids=["in-memory", "paged"])
def test_a_background_sync_keeps_the_queue_serving_and_leaves_a_faithful_mirror(tmp_path, window):
    """`paged`: the leader holds 20 messages in memory and the rest on disk; the sync reads the
    paged ones without taking them, and those the consumer has the queue read back meanwhile
    go from memory."""
    conf = tmp_path / "hutch.conf"
    conf.write_text("mirroring_sync_max_throughput = 40kb\n"
                    + (f"classic_queue.memory_window_messages = {window}\n" if window else ""))
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        c = connect(cluster, 0)
        c.channel().queue_declare("bg.q", durable=True)
        publish_confirmed(c, "bg.q", [b"%04d" % i + b"x" * 1020 for i in range(MESSAGES)])
        c.close()
        assert ctl(cluster, 0, "set_policy", "ha-bg", "^bg\\.",
                   '{"ha-mode":"all","ha-sync-batch-size":10,"ha-sync-background":true}').returncode == 0
        wait_mirrors(cluster, "bg.q", 2, synced=0)
        if window:
            assert info(cluster, "bg.q")["messages_paged_out"] == MESSAGES - window
        started = time.monotonic()
        assert ctl(cluster, 0, "sync_queue", "bg.q").returncode == 0

        # while it runs: a consumer on another node gets and acknowledges messages, then holds some
        consumer = connect(cluster, 1)
        ch = consumer.channel()
        ch.basic_qos(prefetch_count=HELD)  # after ACKED acks, HELD more and then no more
        got: list[tuple[int, float]] = []

        def on_message(chan, method, _props, body):
            got.append((method.delivery_tag, time.monotonic() - started))
            if len(got) <= ACKED:
                chan.basic_ack(method.delivery_tag)

        tag = ch.basic_consume("bg.q", on_message)
        deadline = time.monotonic() + 30
        while len(got) < ACKED + HELD and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.1)
        assert len(got) == ACKED + HELD, got
        lines = [ln for ln in log_of(cluster, 0).splitlines() if "'bg.q'" in ln and "Synchronising" in ln]
        assert not any(ln.endswith("Synchronising: complete") for ln in lines), \
            f"the sync ended before the consumer was served ({got[-1][1]:.1f} s): nothing shows it ran alongside"
        assert any(ln.endswith("in the background, the queue goes on serving") for ln in lines)

        wait_mirrors(cluster, "bg.q", 2, synced=2, timeout_s=60)
        assert time.monotonic() - started > 2.0  # paced: it did run for seconds, beside the consumer
        assert any(ln.endswith("Synchronising: complete")
                   for ln in log_of(cluster, 0).splitlines() if "'bg.q'" in ln)

        # the synchronised mirrors are faithful copies: promote one and read what it has (the
        # consumer is cancelled first, so it takes nothing more; its HELD messages stay unacked)
        ch.basic_cancel(tag)
        cluster.kill(0)
        left = drain_when_served(cluster, 2, "bg.q", timeout_s=30)
        consumer.close()
        numbers = sorted(int(b[:4]) for b, _r in left)
        assert numbers == list(range(ACKED, MESSAGES)), numbers
        # after a failed leader every message comes back redelivered (it may have delivered any
        # of them just before it died)
        assert all(r for _b, r in left), left
