"""The leader of a mirrored classic queue is disk-first too: past its memory window it keeps
only the location of each persistent message's body, tells its mirrors every message all the
same, a sync reads the paged bodies from disk without taking them out of the queue, and a
mirror promoted after the leader's node dies pages what it holds past the window in turn.

Real 3-node clusters with a window of 50 messages (`classic_queue.memory_window_messages`), pika
clients."""

from __future__ import annotations

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
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)

WINDOW = 50
BEFORE = 1_000  # published before the queue is mirrored: the mirrors lack them until a sync
AFTER = 500  # published once it is mirrored: each goes to the mirrors as it arrives
QUEUE = "pg.q"


def test_a_paged_mirrored_leader_syncs_its_mirrors_from_disk_and_a_promoted_mirror_pages_too(tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text(f"classic_queue.memory_window_messages = {WINDOW}\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        c = connect(cluster, 0)
        c.channel().queue_declare(QUEUE, durable=True)
        publish_confirmed(c, QUEUE, [b"%05d" % i for i in range(BEFORE)])
        assert info(cluster, QUEUE)["messages_paged_out"] == BEFORE - WINDOW
        assert ctl(cluster, 0, "set_policy", "ha-pg", "^pg\\.", '{"ha-mode":"all"}').returncode == 0
        wait_mirrors(cluster, QUEUE, 2, synced=0)
        shown = info(cluster, QUEUE)
        assert (shown["messages_paged_out"], shown["messages_ram"]) == (BEFORE - WINDOW, WINDOW), \
            "becoming a mirrored leader read nothing back"
        publish_confirmed(c, QUEUE, [b"%05d" % i for i in range(BEFORE, BEFORE + AFTER)])
        assert info(cluster, QUEUE)["messages_paged_out"] == BEFORE + AFTER - WINDOW
        assert ctl(cluster, 0, "sync_queue", QUEUE).returncode == 0
        wait_mirrors(cluster, QUEUE, 2, synced=2, timeout_s=60)
        lines = [ln for ln in log_of(cluster, 0).splitlines() if f"'{QUEUE}'" in ln and "Synchronising" in ln]
        assert any(ln.endswith(f"Synchronising: {BEFORE + AFTER} messages to synchronise") for ln in lines), lines
        assert info(cluster, QUEUE)["messages_paged_out"] == BEFORE + AFTER - WINDOW, \
            "the sync read the paged bodies without taking them out of the tail"
        c.close()

        cluster.kill(0)
        wait_until(lambda: _leader(cluster) not in (None, cluster.names[0]), 30, "a mirror promoted")
        via = cluster.names.index(_leader(cluster))
        shown = info(cluster, QUEUE, via)
        assert shown["messages"] == BEFORE + AFTER
        assert shown["messages_paged_out"] == BEFORE + AFTER - WINDOW, "the promoted mirror pages past its window"
        left = drain_when_served(cluster, via, QUEUE, timeout_s=30)
        assert [b for b, _r in left] == [b"%05d" % i for i in range(BEFORE + AFTER)], "all of them, in order"
        assert all(r for _b, r in left), "after a failed leader every message comes back redelivered"


def _leader(cluster: HutchCluster) -> str | None:
    for i in (1, 2):
        try:
            return info(cluster, QUEUE, i)["node"]
        except (OSError, KeyError, ValueError):
            continue
    return None
