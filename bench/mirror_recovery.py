"""Mirrors that remember, measured: how long a restarted mirror takes to be synchronised again.

A 3-node cluster, a durable queue led by node 1 under `ha-mode: all` and
`ha-sync-mode: automatic`, `--messages` (200,000) persistent 1 KiB messages in it. Node 3 is
stopped gracefully; while it is down nobody publishes; it is started again and, from the
moment its process starts, `--more` (10,000) messages are published to node 1. Measured, from
node 3's start: when it serves again (an AMQP connection to it opens; tried every 0.05 s), when
the queue lists it as a mirror, and when it lists it as a synchronised mirror; what the
leader's log says it synchronised; when the milestones in the node logs were written; and the
CPU seconds node 3's process had used when it logged its copy read back (a figure the other
work on a shared machine does not stretch) and its RSS then; and the RSS of each node's process
tree once the queue is filled and synchronised (`rss_mib_filled`, nodes 1-3: the leader first).

Modes (`--modes`, every one in the same run):

  true      hutch with `mirroring_recover_from_disk = true`: the mirror comes back with its
            copy and gets the delta. Queue state from node 1's HTTP API
            (`slave_nodes`, `synchronised_slave_nodes`), polled every 0.05 s.
  false     hutch with `mirroring_recover_from_disk = false`: it starts empty and gets the
            whole queue, as in RabbitMQ.
  background  hutch as `false` (the mirror starts empty and is sent the whole queue), with
            `ha-sync-background: true` in the policy: hutch's non-blocking synchronisation, the
            queue serving meanwhile.
  rabbitmq  the reference: 3 private RabbitMQ 3.10 nodes (Debian's package,
            tests.support.rabbitmq_cluster), the policy set with `rabbitmqctl set_policy
            --apply-to queues`, the queue declared through node 1 (client-local master
            locator; checked). A restarted classic mirror always starts empty and is
            synchronised from the master. Queue state from `rabbitmqctl list_queues name
            messages pid slave_pids synchronised_slave_pids` on node 1, polled every 0.5 s
            (a call takes about 0.5 s and 0.6 CPU seconds, so these times are good to about a
            second); the node logs' milestones (node 3's `Adding mirror on node`, the
            master's `Synchronising: N messages to synchronise` and `Synchronising: complete`)
            are exact. `n/a`: what does not apply (the copy read back, its CPU and RSS; the
            sync lines if the master logged none).

In every mode a consumer on node 1 (prefetch 10, manual acks, paced at `--consume-rate`
messages a second, 100 by default) takes messages from the queue from just before node 3's
start until the mirror is synchronised: `consumer_longest_gap_s` is the longest time between
two of its deliveries in that span (a sync that blocks the queue shows as a gap as long as the
sync), `consumed` how many it took. `--consume-rate 0`: no consumer.

`python bench/mirror_recovery.py [--messages 200000] [--more 10000] [--size 1024]
[--modes true,false,background,rabbitmq] [--consume-rate 100] [--timeout 300]`. It
starts and stops every node it uses, also on an error or Ctrl-C; it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pika
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.hutch_cluster import HutchCluster  # noqa: E402
from tests.support.rabbitmq_cluster import RabbitMQCluster  # noqa: E402

QUEUE = "mr.bench"
POLICY = '{"ha-mode":"all","ha-sync-mode":"automatic"}'
BACKGROUND_POLICY = '{"ha-mode":"all","ha-sync-mode":"automatic","ha-sync-background":true}'
MODES = ("true", "false", "background", "rabbitmq")
NA = "n/a"
SYNC_LINE = re.compile(r"Synchronising: (\d+) messages to synchronise(?: \(([^)]*)\))?")


def publish(port: int, count: int, body: bytes) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0,
                                                             blocked_connection_timeout=300))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", QUEUE, body, props)
    conn.close()


class Consumer:
    """A paced consumer on one node (a thread): prefetch 10, manual acks, `rate` a second; the
    time of each delivery, until `stop()`."""

    def __init__(self, port: int, rate: float) -> None:
        self.port, self.rate = port, rate
        self.times: list[float] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def _run(self) -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        pace = 1.0 / self.rate
        self._ready.set()
        for method, _props, _body in ch.consume(QUEUE, inactivity_timeout=0.05):
            if self._stop.is_set():
                break
            if method is None:
                continue
            self.times.append(time.monotonic())
            ch.basic_ack(method.delivery_tag)
            time.sleep(pace)
        ch.cancel()
        conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def longest_gap(self, since: float, until: float) -> float | None:
        """The longest time between deliveries in [since, until] (its ends count as deliveries)."""
        ts = [since, *(t for t in self.times if since <= t <= until), until]
        return round(max(b - a for a, b in zip(ts, ts[1:], strict=False)), 2) if until > since else None


def consuming(port: int, rate: float) -> Consumer | None:
    if rate <= 0:
        return None
    c = Consumer(port, rate)
    c.start()
    return c


def consumer_figures(c: Consumer | None, t0: float, synced_s: float | None) -> dict:
    if c is None:
        return {"consumer_longest_gap_s": NA, "consumed": NA}
    c.stop()
    until = t0 + synced_s if synced_s is not None else time.monotonic()
    return {"consumer_longest_gap_s": c.longest_gap(t0, until), "consumed": len(c.times)}


def serves(port: int) -> bool:
    """An AMQP connection to 127.0.0.1:port opens (guest/guest, vhost /)."""
    try:
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1,
                                                          socket_timeout=2, blocked_connection_timeout=5)).close()
        return True
    except Exception:  # refused, reset, not yet booted: not serving
        return False


def queue(cluster: HutchCluster, via: int = 0) -> dict:
    try:
        return cluster.api(via, f"/api/queues/%2F/{QUEUE}")
    except OSError:
        return {}


PID_NODE = re.compile(r"<([\w-]+@[\w-]+)\.")


def rabbit_queue(cluster: RabbitMQCluster, via: int = 0) -> dict:
    """The queue as `rabbitmqctl list_queues` on node `via` shows it, pids as node names
    (`node`, `slave_nodes`, `synchronised_slave_nodes`, like hutch's HTTP API); {} if it cannot say.
    Its table output, not `--formatter json`: JSON writes pids without their node (`#PID<11017.942.0>`)."""
    try:
        r = cluster.nodes[via].ctl("list_queues", "-q", "--no-table-headers", "name", "messages", "pid",
                                   "slave_pids", "synchronised_slave_pids", check=False)
    except subprocess.TimeoutExpired:
        return {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        cols = line.split("\t")
        if len(cols) == 5 and cols[0] == QUEUE and cols[1].isdigit():
            return {"messages": int(cols[1]), "node": (PID_NODE.findall(cols[2]) or [None])[0],
                    "slave_nodes": PID_NODE.findall(cols[3]), "synchronised_slave_nodes": PID_NODE.findall(cols[4])}
    return {}


def wait(cond, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(interval_s)


def watch(t0: float, node3_serves: Callable[[], bool], state: Callable[[], dict], third: str,
          timeout_s: float, state_interval_s: float) -> tuple[float | None, float | None, float | None]:
    """Seconds from t0 until node 3 serves (tried every 0.05 s), is listed among the queue's mirrors,
    is listed among its synchronised mirrors (`state`, asked every `state_interval_s`); each the end
    of the first try that saw it; None: not within timeout_s."""
    served = listed = synced = None
    deadline = t0 + timeout_s
    next_state = t0
    while (served is None or synced is None) and time.monotonic() < deadline:
        if served is None and node3_serves():
            served = round(time.monotonic() - t0, 2)
        if synced is None and time.monotonic() >= next_state:
            q = state()
            now = time.monotonic()
            next_state = now + state_interval_s
            in_sync = third in (q.get("synchronised_slave_nodes") or [])
            if listed is None and (in_sync or third in (q.get("slave_nodes") or [])):
                listed = round(now - t0, 2)
            if in_sync:
                synced = round(now - t0, 2)
        if served is None or synced is None:
            time.sleep(0.05)
    return served, listed, synced


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?([+-]\d\d:\d\d|Z)?")
MILESTONES = [(2, "Server startup complete", "node 3 ready"),
              (2, "of the mirror's copy from disk", "node 3 copy read back"),
              (0, "Adding mirror on node hutch-3", "leader: mirror joined"),
              (0, "messages to synchronise", "leader: sync started"),
              (0, "Synchronising: complete", "leader: sync complete")]
# RabbitMQ 3.10: the restarted node starts its mirror itself and logs that it added it
RABBIT_MILESTONES = [(2, "Server startup complete", "node 3 ready"),
                     (2, "Adding mirror on node '{third}'", "node 3: mirror joined"),
                     (0, "messages to synchronise", "leader: sync started"),
                     (0, "Synchronising: complete", "leader: sync complete")]


def stamp(line: str) -> float | None:
    """The POSIX time a log line starts with (hutch: UTC `+00:00`; RabbitMQ: local time with its offset)."""
    m = STAMP.match(line)
    if not m:
        return None
    t = calendar.timegm(time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")) + float("0" + (m.group(2) or ""))
    off = m.group(3)
    if off and off != "Z":
        t -= (1 if off[0] == "+" else -1) * (int(off[1:3]) * 3600 + int(off[4:6]) * 60)
    return t


def events(logs: list[str], milestones: list, since: float) -> dict:
    """Seconds from node 3's start to the last of each milestone in the logs (logs[i]: node i+1's)."""
    out = {}
    for i, text, name in milestones:
        for line in logs[i].splitlines():
            t = stamp(line) if text in line else None
            if t is not None and t >= since - 1:
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


def tree_rss_mib(node) -> int | None:
    """RSS (MiB) of a node's process tree now: hutch's python, RabbitMQ's beam.smp and helpers."""
    if node.proc is None or node.proc.poll() is not None:
        return None
    try:
        root = psutil.Process(node.proc.pid)
        total = root.memory_info().rss
        for c in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss
        return total >> 20
    except psutil.Error:
        return None


def run(mode: str, messages: int, more: int, size: int, timeout_s: float, rate: float) -> dict:
    conf_dir = Path(tempfile.mkdtemp(prefix="mr-bench-"))
    try:
        return run_hutch(mode, conf_dir / "hutch.conf", messages, more, size, timeout_s, rate)
    finally:
        shutil.rmtree(conf_dir, ignore_errors=True)


def run_hutch(mode: str, conf: Path, messages: int, more: int, size: int, timeout_s: float, rate: float) -> dict:
    recover = mode == "true"
    conf.write_text(f"mirroring_recover_from_disk = {'true' if recover else 'false'}\n")
    with HutchCluster(n=3, extra_args=["--config", str(conf)]) as cluster:
        subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--url",
                        f"http://127.0.0.1:{cluster.nodes[0].mgmt_port}", "set_policy", "ha-mr", "^mr\\.",
                        BACKGROUND_POLICY if mode == "background" else POLICY], check=True, capture_output=True)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[0].amqp_port))
        conn.channel().queue_declare(QUEUE, durable=True)
        conn.close()
        body = b"x" * size
        publish(cluster.nodes[0].amqp_port, messages, body)
        third = cluster.names[2]
        wait(lambda: queue(cluster).get("messages") == messages
             and third in (queue(cluster).get("synchronised_slave_nodes") or []), 300, "filled and synchronised")
        rss = [tree_rss_mib(n) for n in cluster.nodes]
        cluster.stop(2)
        wait(lambda: third not in (queue(cluster).get("slave_nodes") or []), 120, "mirror gone")
        log_before = len(SYNC_LINE.findall(cluster.nodes[0].log()))
        consumer = consuming(cluster.nodes[0].amqp_port, rate)
        t0 = time.monotonic()
        started = time.time()
        publisher = threading.Thread(target=publish, args=(cluster.nodes[0].amqp_port, more, body), daemon=True)
        cluster.nodes[2].start(wait=False)  # from this thread: a node dies with the thread that started it
        publisher.start()
        boot: list = [None, None]  # node 3's CPU seconds and RSS at its copy read back, taken meanwhile
        sampler = threading.Thread(target=lambda: boot.__setitem__(slice(None), boot_cpu_s(cluster, 120)),
                                   daemon=True)
        if recover:
            sampler.start()
        served_s, listed_s, synced_s = watch(t0, lambda: serves(cluster.nodes[2].amqp_port), lambda: queue(cluster),
                                             third, timeout_s, 0.0)
        figures = consumer_figures(consumer, t0, synced_s)
        if recover:
            sampler.join()
        publisher.join()
        lines = SYNC_LINE.findall(cluster.nodes[0].log())[log_before:]
        return {"mode": mode, "recover_from_disk": recover,
                "serving_after_s": served_s, "mirror_listed_after_s": listed_s,
                "synchronised_after_s": synced_s, **figures, "sync_lines": lines,
                "events": events([n.log() for n in cluster.nodes], MILESTONES, started),
                "node3_cpu_s_at_copy_read_back": boot[0], "node3_rss_mib_at_copy_read_back": boot[1],
                "rss_mib_filled": rss}


def rabbit_log(cluster: RabbitMQCluster, i: int) -> str:
    node = cluster.nodes[i]
    try:
        return (node.dir / "log" / f"{node.nodename}.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def filled(q: dict, messages: int, mirrors: list[str]) -> bool:
    return q.get("messages") == messages and set(mirrors) <= set(q.get("synchronised_slave_nodes") or [])


def run_rabbitmq(messages: int, more: int, size: int, timeout_s: float, rate: float) -> dict:
    with RabbitMQCluster(n=3) as cluster:
        cluster.nodes[0].ctl("set_policy", "ha-mr", "^mr\\.", POLICY, "--apply-to", "queues")
        cluster.declare_queue(QUEUE, node=0, durable=True)
        leader, third = cluster.names[0], cluster.names[2]
        home = rabbit_queue(cluster).get("node")
        if home != leader:
            raise RuntimeError(f"{QUEUE}'s master is on {home}, not on {leader}")
        body = b"x" * size
        publish(cluster.nodes[0].amqp_port, messages, body)
        wait(lambda: filled(rabbit_queue(cluster), messages, cluster.names[1:]), 300, "filled and synchronised", 0.5)
        rss = [tree_rss_mib(n) for n in cluster.nodes]
        cluster.stop(2)
        wait(lambda: third not in rabbit_queue(cluster).get("slave_nodes", [third]), 120, "mirror gone", 0.5)
        log_before = len(SYNC_LINE.findall(rabbit_log(cluster, 0)))
        consumer = consuming(cluster.nodes[0].amqp_port, rate)
        t0 = time.monotonic()
        started = time.time()
        publisher = threading.Thread(target=publish, args=(cluster.nodes[0].amqp_port, more, body), daemon=True)
        cluster.nodes[2].start(wait=False)  # from this thread: a node dies with the thread that started it
        publisher.start()
        served_s, listed_s, synced_s = watch(t0, lambda: serves(cluster.nodes[2].amqp_port),
                                             lambda: rabbit_queue(cluster), third, timeout_s, 0.5)
        figures = consumer_figures(consumer, t0, synced_s)
        publisher.join()
        lines = SYNC_LINE.findall(rabbit_log(cluster, 0))[log_before:]
        return {"mode": "rabbitmq", "recover_from_disk": NA,
                "serving_after_s": served_s, "mirror_listed_after_s": listed_s,
                "synchronised_after_s": synced_s, **figures, "sync_lines": lines or NA,
                "events": events([rabbit_log(cluster, i) for i in range(3)],
                                 [(i, text.format(third=third), name) for i, text, name in RABBIT_MILESTONES], started),
                "node3_cpu_s_at_copy_read_back": NA, "node3_rss_mib_at_copy_read_back": NA,
                "rss_mib_filled": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--more", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the mirror to be synchronised")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="mirroring_recover_from_disk values to run (true, false), background (false with "
                         "non-blocking sync), and rabbitmq for RabbitMQ 3.10")
    ap.add_argument("--consume-rate", type=float, default=100.0,
                    help="messages a second the consumer on node 1 takes during the restart (0: no consumer)")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    for mode in modes:
        if mode == "rabbitmq":
            r = run_rabbitmq(a.messages, a.more, a.size, a.timeout, a.consume_rate)
        else:
            r = run(mode, a.messages, a.more, a.size, a.timeout, a.consume_rate)
        print(r, flush=True)


if __name__ == "__main__":
    main()
