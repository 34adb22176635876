"""Mirrors that remember, measured: how long a restarted mirror takes to be synchronised again.

A 3-node hutch cluster, a durable queue led by node 1 under `ha-mode: all` and
`ha-sync-mode: automatic`, `--messages` (200,000) persistent 1 KiB messages in it. Node 3 is
stopped gracefully; while it is down nobody publishes; it is started again and, from the
moment its process starts, `--more` (10,000) messages are published to node 1. Measured: the
time from node 3's start until the queue lists it as a synchronised mirror again, and what the
leader's log says it synchronised, and the CPU seconds node 3's process had used when it logged
its copy read back (a figure the other work on a shared machine does not stretch) and its RSS
then. Run once with `mirroring_recover_from_disk = true` (the
mirror comes back with its copy and gets the delta) and once with `false` (it starts empty
and gets the whole queue, as in RabbitMQ).

`python bench/mirror_recovery.py [--messages 200000] [--more 10000] [--size 1024]
[--modes true,false] [--timeout 300]`. It
starts and stops every node it uses; it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import calendar
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.hutch_cluster import HutchCluster  # noqa: E402

QUEUE = "mr.bench"
SYNC_LINE = re.compile(r"Synchronising: (\d+) messages to synchronise(?: \(([^)]*)\))?")


def publish(port: int, count: int, body: bytes) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0,
                                                             blocked_connection_timeout=300))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", QUEUE, body, props)
    conn.close()


def queue(cluster: HutchCluster, via: int = 0) -> dict:
    try:
        return cluster.api(via, f"/api/queues/%2F/{QUEUE}")
    except OSError:
        return {}


def wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)")
MILESTONES = [(2, "Server startup complete", "node 3 ready"),
              (2, "of the mirror's copy from disk", "node 3 copy read back"),
              (0, "Adding mirror on node hutch-3", "leader: mirror joined"),
              (0, "messages to synchronise", "leader: sync started"),
              (0, "Synchronising: complete", "leader: sync complete")]


def events(cluster: HutchCluster, since: float) -> dict:
    """Seconds from node 3's start to the last of each milestone in the logs."""
    out = {}
    for i, text, name in MILESTONES:
        for line in cluster.nodes[i].log().splitlines():
            m = STAMP.match(line)
            if m and text in line:
                t = calendar.timegm(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + float("0" + m.group(1)[19:])
                if t >= since - 1:
                    out[name] = round(t - since, 2)
    return out


def boot_cpu_s(cluster: HutchCluster, timeout_s: float) -> tuple[float | None, int | None]:
    """CPU seconds (user + system) and RSS (MiB) of node 3's process when its copy-read-back
    line appears (None: it never does, e.g. with recovery from disk off)."""
    node = cluster.nodes[2]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "of the mirror's copy from disk" in node.log():
            try:
                p = psutil.Process(node.proc.pid)
                t, rss = p.cpu_times(), p.memory_info().rss
            except psutil.Error:
                return None, None
            return round(t.user + t.system, 2), rss >> 20
        time.sleep(0.02)
    return None, None


def run(recover: bool, messages: int, more: int, size: int, timeout_s: float) -> dict:
    conf = Path(tempfile.mkdtemp(prefix="mr-bench-")) / "hutch.conf"
    conf.write_text(f"mirroring_recover_from_disk = {'true' if recover else 'false'}\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url",
                        f"http://127.0.0.1:{cluster.nodes[0].mgmt_port}", "set_policy", "ha-mr", "^mr\\.",
                        '{"ha-mode":"all","ha-sync-mode":"automatic"}'], check=True, capture_output=True)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[0].amqp_port))
        conn.channel().queue_declare(QUEUE, durable=True)
        conn.close()
        body = b"x" * size
        publish(cluster.nodes[0].amqp_port, messages, body)
        third = cluster.names[2]
        wait(lambda: queue(cluster).get("messages") == messages
             and third in (queue(cluster).get("synchronised_slave_nodes") or []), 300, "filled and synchronised")
        cluster.stop(2)
        wait(lambda: third not in (queue(cluster).get("slave_nodes") or []), 120, "mirror gone")
        log_before = len(SYNC_LINE.findall(cluster.nodes[0].log()))
        t0 = time.monotonic()
        started = time.time()
        publisher = threading.Thread(target=publish, args=(cluster.nodes[0].amqp_port, more, body))
        cluster.nodes[2].start(wait=False)
        publisher.start()
        cpu_s, rss_mib = boot_cpu_s(cluster, 120) if recover else (None, None)
        try:
            wait(lambda: third in (queue(cluster).get("synchronised_slave_nodes") or []), timeout_s, "resynchronised")
            synced_s: float | None = round(time.monotonic() - t0, 2)
        except TimeoutError:
            synced_s = None  # not synchronised within timeout_s
        publisher.join()
        lines = SYNC_LINE.findall(cluster.nodes[0].log())[log_before:]
        return {"recover_from_disk": recover, "synchronised_after_s": synced_s, "sync_lines": lines,
                "events": events(cluster, started), "node3_cpu_s_at_copy_read_back": cpu_s,
                "node3_rss_mib_at_copy_read_back": rss_mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--more", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the mirror to be synchronised")
    ap.add_argument("--modes", default="true,false", help="mirroring_recover_from_disk values to run")
    a = ap.parse_args()
    for mode in a.modes.split(","):
        r = run(mode.strip() == "true", a.messages, a.more, a.size, a.timeout)
        print(r, flush=True)


if __name__ == "__main__":
    main()
