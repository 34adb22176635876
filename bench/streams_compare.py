#!/usr/bin/env python3
"""Streams side by side: RabbitMQ 3.10 (rabbitmq_stream) and hutch, one run on this machine.

For 1 replica (a single node) and 3 replicas (3-node clusters), each broker in turn, RabbitMQ
first (one broker runs at a time, so they never compete for the two cores):

  throughput  one producer publishing 1 KiB messages with confirms (at most `--confirm` in
              flight) and one consumer reading along, for `--duration` s, over AMQP 0-9-1
              (`hutch perf`: a durable `x-queue-type: stream` queue, prefetch 1000, manual acks)
              and over the stream protocol (`hutch perf --protocol stream`: 100 messages per
              Publish frame, credit 10). Rates are the mean of the per-second samples after the
              first `WARMUP_S`. Clients connect to the node the stream was created through
              (its leader). The stream run also gives what the disk holding the brokers' data
              took during it (/sys/dev/block/M:m/stat), per confirmed message: a broker whose
              writes wait for an fsync puts its copies on the disk during the run, one that never
              fsyncs may leave some in the page cache until after it.
  catch-up    a stream filled with `--catchup` messages (default 1,000,000 so a run fits in
              minutes; 10,000,000 is the goal's figure, about 10 GiB per replica), then one
              stream-protocol consumer reads them all from `first`: the time it takes.
              `--cold` drops the page cache between the two (root only), so the read comes
              from the disk, as it does for a stream larger than the memory.
  failover    (3 replicas) a producer at `--failover-rate` msg/s on the leader's node with a
              publisher reference (deduplication), a consumer on another node reading from
              `first`; the leader's node is killed (kill -9). Measured: time from the kill until
              the consumer receives a message published after it, and until the first confirm
              after it. The producer finds the new leader (Metadata), declares itself again,
              asks for its last stored publishing id and republishes what was unconfirmed. At
              the end every confirmed message must have reached the consumer exactly once:
              lost = confirmed and never delivered, duplicates = delivered more than once.

Brokers (`--brokers`): `rabbitmq`; `hutch` as it comes (`stream.fsync = before_confirm`: a confirm
waits for a majority of the stream's members to fsync the batch); `hutch-bg` with `stream.fsync =
background` (a confirm once a majority wrote it, each member fsyncing within 0.1 s: closer to
RabbitMQ's streams, which never fsync). Run as root, the bench writes back and drops the page
cache before each broker starts, so that none inherits another's dirty pages or a memory already
full of cache (on a virtual machine, pages the guest has never touched cost far more to fill).

The table gives each figure for RabbitMQ and each hutch configuration, with the ratio
hutch/RabbitMQ (higher is better for rates, lower for times).

    bench/streams_compare.py                     # about 10 minutes
    bench/streams_compare.py --catchup 10000000  # the goal's catch-up size (disk: ~10 GiB a replica)
    bench/streams_compare.py --parts catchup --catchup 3000000 --cold   # the read from the disk
    bench/streams_compare.py --replicas 1 --brokers hutch --parts throughput

Results go to bench/results/streams-compare-<time>.json (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.support.brokers import HutchNode, RabbitMQNode, free_port, port_open, wait_until  # noqa: E402
from tests.support.hutch_cluster import HutchCluster  # noqa: E402
from tests.support.rabbitmq_cluster import RabbitMQCluster  # noqa: E402

from hutch.lab.client import new_event_loop  # noqa: E402
from hutch.lab.streamperf import (  # noqa: E402
    MessageTemplate,
    StreamClient,
    StreamEndpoint,
    StreamError,
    create_streams,
    delete_streams,
    record_stamps,
)
from hutch.streamproto import chunk as chunks  # noqa: E402
from hutch.streamproto import frames as f  # noqa: E402

BROKERS = ("rabbitmq", "hutch", "hutch-bg")
HUTCH_KINDS = {"hutch": "", "hutch-bg": "stream.fsync = background\n"}  # kind -> its configuration file
PARTS = ("throughput", "catchup", "failover")
RABBITMQ_PLUGINS = "/usr/lib/rabbitmq/bin/rabbitmq-plugins"
BODY_SIZE = 1024
DURATION_S = 10.0
WARMUP_S = 2.0
CONFIRM_WINDOW = 1000  # AMQP; the stream protocol runs with hutch perf's default window
QOS = 1000
CATCHUP_DEFAULT = 1_000_000
FAILOVER_RATE = 1000.0
FAULT_LEAD_S = 5.0
RECOVERY_MAX_S = 60.0
AFTER_RECOVERY_S = 3.0
SETTLE_MAX_S = 20.0
DRAIN_IDLE_S = 10.0
PERF_TIMEOUT_S = 900.0
RECONNECT_DELAY_S = 0.2
INCIDENTS_MAX = 50
PUBLISHER_REFERENCE = "streams-bench"
RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable


# -- brokers ---------------------------------------------------------------------------------


class Broker:
    """One broker of either kind: 1 node or a 3-node cluster, each node with a stream listener."""

    def __init__(self, kind: str, n: int):
        self.kind = kind
        self.n = n
        self.cluster = None
        self.nodes: list = []
        self.conf_dir: str | None = None

    def start(self) -> Broker:
        if self.kind in HUTCH_KINDS:
            args = []
            if HUTCH_KINDS[self.kind]:
                self.conf_dir = tempfile.mkdtemp(prefix="streams-compare-")
                conf = Path(self.conf_dir) / "hutch.conf"
                conf.write_text(HUTCH_KINDS[self.kind])
                args = ["--config", str(conf)]
            if self.n == 1:
                node = HutchNode(log_level="warning", extra_args=args)
                self.nodes = [node]
                node.start()
            else:
                self.cluster = HutchCluster(n=self.n, log_level="warning", extra_args=args)
                self.nodes = self.cluster.nodes
                self.cluster.start()
            self.stream_ports = [node.stream_port for node in self.nodes]
            return self
        if self.n == 1:
            self.nodes = [RabbitMQNode(management=False)]
        else:
            self.cluster = RabbitMQCluster(n=self.n)
            self.nodes = self.cluster.nodes
        self.stream_ports = []
        for node in self.nodes:
            port = free_port()
            self.stream_ports.append(port)
            conf = (f"stream.listeners.tcp.default = {port}\nstream.advertised_host = 127.0.0.1\n"
                    f"stream.advertised_port = {port}")
            node.config_extra = f"{node.config_extra}\n{conf}" if node.config_extra else conf
        try:
            if self.cluster is not None:
                self.cluster.start()
            else:
                self.nodes[0].start()
            for node, port in zip(self.nodes, self.stream_ports, strict=True):
                subprocess.run([RABBITMQ_PLUGINS, "-n", node.nodename, "enable", "rabbitmq_stream"],
                               env=node._env(), check=True, capture_output=True, timeout=120)
                wait_until(lambda p=port: port_open("127.0.0.1", p), 60, f"RabbitMQ stream port {port}")
        except BaseException:
            self.cleanup()
            raise
        return self

    def amqp_url(self, i: int = 0) -> str:
        return self.nodes[i].url

    def stream_url(self, i: int = 0) -> str:
        return f"rabbitmq-stream://guest:guest@127.0.0.1:{self.stream_ports[i]}/%2F"

    def index_of_port(self, port: int) -> int:
        return self.stream_ports.index(port)

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if self.kind in HUTCH_KINDS:
            node.kill()
            return
        with contextlib.suppress(ProcessLookupError):  # the script and beam.smp: its process group
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)

    def peak_rss_mb(self) -> list[int | None]:
        """Each node's peak resident memory so far (VmHWM of the largest process in its process
        group: hutch's server, RabbitMQ's beam.smp)."""
        return [_group_peak_rss_kb(node.proc.pid) // 1024 if node.proc is not None else None for node in self.nodes]

    def version(self) -> str:
        if self.kind in HUTCH_KINDS:
            return self.kind
        r = self.nodes[0].ctl("version", check=False)
        return f"RabbitMQ {r.stdout.strip()}"

    def cleanup(self) -> None:
        if self.cluster is not None:
            self.cluster.cleanup()
        else:
            for node in self.nodes:
                node.cleanup()
        if self.conf_dir is not None:
            shutil.rmtree(self.conf_dir, ignore_errors=True)


def _group_peak_rss_kb(pgid: int) -> int:
    peak = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                stat = fh.read()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:  # the fields after the name: state, ppid, pgrp
                continue
            with open(f"/proc/{d}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            continue
    return peak


# -- throughput and catch-up through hutch perf ----------------------------------------------------


def perf(args: list[str]) -> dict:
    """Run `hutch perf` with these arguments; its JSON summary."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "summary.json"
        r = subprocess.run([PYTHON, "-m", "hutch", "perf", "--quiet", "--json-out", str(out), *args],
                           capture_output=True, text=True, timeout=PERF_TIMEOUT_S, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"hutch perf {' '.join(args)} failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
        return json.loads(out.read_text())


def steady(summary: dict, key: str) -> float:
    """The mean of the per-second samples after the warm-up (the whole run's average if short)."""
    samples = [s[key] for s in summary["samples"] if s["time_s"] > WARMUP_S + 0.5]
    return sum(samples) / len(samples) if samples else summary[f"{key}_rate"]


def disk_sectors_written(path: str) -> int | None:
    """512-byte sectors written so far to the block device that holds `path` (Linux's
    /sys/dev/block/M:m/stat), or None where that cannot be read."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as fh:
            return int(fh.read().split()[6])
    except (OSError, ValueError, IndexError):
        return None


def measure_throughput(b: Broker, protocol: str, duration_s: float) -> dict:
    name = f"bench-{protocol}-{uuid.uuid4().hex[:8]}"
    common = ["--size", str(BODY_SIZE), "--duration", str(duration_s), "--queue", name]
    if protocol == "amqp":
        args = ["--uri", b.amqp_url(0), "--durable", "--confirm", str(CONFIRM_WINDOW), "--qos", str(QOS),
                "--queue-args", json.dumps({"x-queue-type": "stream", "x-initial-cluster-size": b.n})]
    else:
        args = ["--protocol", "stream", "--uri", b.stream_url(0),
                "--queue-args", json.dumps({"initial-cluster-size": b.n})]
    disk0 = disk_sectors_written(tempfile.gettempdir())  # where the brokers keep their data
    s = perf(args + common)
    disk1 = disk_sectors_written(tempfile.gettempdir())
    _delete(b, name)
    # what the disk took during the run, per confirmed message: a broker that fsyncs writes its
    # copies during the run; dirty pages that are never fsynced may be written after it
    disk_kib = (disk1 - disk0) * 512 / 1024 / s["confirmed"] if disk0 is not None and s["confirmed"] else None
    return {"publish_rate": steady(s, "confirmed"), "consume_rate": steady(s, "received"),
            "disk_kib_per_msg": None if disk_kib is None else round(disk_kib, 2),
            "confirm_p50_us": s["confirm_latency_us"]["p50"], "consumer_p50_us": s["consumer_latency_us"]["p50"],
            "nacked": s["nacked"], "client_cpu_us_per_msg": s["client_cpu_us_per_msg"]}


def drop_page_cache() -> None:
    """Write what is dirty and drop the kernel's page cache, so that what is read next comes
    from the disk (root only: /proc/sys/vm/drop_caches)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError as e:
        raise SystemExit(f"--cold needs to drop the page cache, which needs root: {e}") from None


def measure_catchup(b: Broker, n: int, cold: bool = False) -> dict:
    name = f"bench-catchup-{uuid.uuid4().hex[:8]}"
    base = ["--protocol", "stream", "--uri", b.stream_url(0), "--size", str(BODY_SIZE), "--queue", name]
    fill = perf(base + ["--queue-args", json.dumps({"initial-cluster-size": b.n}), "--producers", "1",
                        "--consumers", "0", "--pmessages", str(n)])
    if fill["confirmed"] < n:
        raise RuntimeError(f"catch-up fill: {fill['confirmed']} of {n} confirmed")
    if cold:
        drop_page_cache()
    read = perf(base + ["--predeclared", "--producers", "0", "--consumers", "1", "--offset", "first",
                        "--cmessages", str(n)])
    out = {"messages": n, "fill_s": fill["duration_s"], "read_s": read["duration_s"],
           "read_rate": n / read["duration_s"] if read["received"] >= n else None,
           "received": read["received"]}
    started = time.monotonic()
    try:
        _delete(b, name)
    except (OSError, TimeoutError, StreamError) as e:  # measured already: say so, keep the figures
        out["delete_error"] = f"{type(e).__name__}: {e}"
    out["delete_s"] = round(time.monotonic() - started, 2)
    return out


def _delete(b: Broker, name: str) -> None:
    _run(delete_streams(b.stream_url(0), [name], "streams-bench-setup"))


def _run(coro):
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


# -- failover: kill -9 the leader's node -------------------------------------------------------------


class Failover:
    """A producer with a publisher reference on the leader's node and a consumer on another node;
    the leader's node is killed while both run. Per message id: publish time, confirmed, deliveries."""

    def __init__(self, b: Broker, rate: float):
        self.b = b
        self.rate = rate
        self.stream = f"bench-failover-{uuid.uuid4().hex[:8]}"
        self.template = MessageTemplate(BODY_SIZE)
        self.pub_ts: dict[int, int] = {}  # publishing id (= message id) -> publish time ns
        self.outstanding: dict[int, int] = {}  # pid -> publish time, unconfirmed
        self.confirmed: set[int] = set()
        self.deliveries: dict[int, int] = {}
        self.next_pid = 1
        self.dead: set[int] = set()  # killed node indexes
        self.t_kill_ns = 0
        self.first_confirm_after_ns = 0
        self.first_delivery_after_ns = 0
        self.incidents: list[list] = []  # [what, times in a row]
        self.consumer_offset = 0  # the next offset the consumer wants
        self.last_delivery_ns = 0
        self.room: asyncio.Future | None = None

    def incident(self, what: str) -> None:
        """Noted once; a repeat of the last one only counts (a consumer refused while no leader is known)."""
        if self.incidents and self.incidents[-1][0] == what:
            self.incidents[-1][1] += 1
        elif len(self.incidents) < INCIDENTS_MAX:
            self.incidents.append([what, 1])

    def ep(self, i: int) -> StreamEndpoint:
        return StreamEndpoint.from_uri(self.b.stream_url(i))

    def live(self) -> list[int]:
        return [i for i in range(self.b.n) if i not in self.dead]

    # -- producer

    def on_confirm(self, _pub: int, ids: list[int]) -> None:
        now = time.time_ns()
        for pid in ids:
            self.settle(pid, now)
        if self.room is not None and not self.room.done():
            self.room.set_result(None)

    def settle(self, pid: int, now: int) -> None:
        ts = self.outstanding.pop(pid, None)
        if ts is None:
            return
        self.confirmed.add(pid)
        if self.t_kill_ns and ts > self.t_kill_ns and not self.first_confirm_after_ns:
            self.first_confirm_after_ns = now

    async def leader(self) -> StreamEndpoint:
        """Ask the live nodes in turn for the stream's leader, until one names a live node."""
        dead = {self.b.stream_ports[i] for i in self.dead}
        while True:
            for i in self.live():
                try:
                    c = await StreamClient.connect(self.ep(i), "streams-bench-metadata", timeout_s=5.0)
                except (OSError, TimeoutError, StreamError):
                    continue
                try:
                    ep = await c.leader_of(self.ep(i), self.stream, timeout_s=2.0)
                    if ep.port not in dead:
                        return ep
                except (OSError, TimeoutError, StreamError):
                    pass
                finally:
                    await c.close()
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def producer(self, go: asyncio.Future, stop: asyncio.Future, final: asyncio.Future) -> None:
        """Publish until `stop`, then wait for the outstanding confirms until `final`; after a lost
        connection, find the leader again and republish what is unconfirmed."""
        t0 = None
        while not final.done():
            try:
                ep = await self.leader()
                client = await StreamClient.connect(ep, "streams-bench-producer", timeout_s=5.0)
            except (OSError, TimeoutError, StreamError) as e:
                self.incident(f"producer connect: {e}")
                await asyncio.sleep(RECONNECT_DELAY_S)
                continue
            try:
                client.on_confirm = self.on_confirm
                await client.request(f.DeclarePublisher(0, 0, PUBLISHER_REFERENCE, self.stream))
                seq = (await client.request(f.QueryPublisherSequence(0, PUBLISHER_REFERENCE, self.stream))).sequence
                now = time.time_ns()
                for pid in sorted(self.outstanding):
                    if pid <= seq:  # stored before the connection was lost: confirmed by the sequence
                        self.settle(pid, now)
                again = sorted(self.outstanding)
                if again:
                    self.incident(f"producer republishes {len(again)} unconfirmed messages to {ep}")
                    for k in range(0, len(again), 100):
                        pids = again[k:k + 100]
                        client.send(f.encode(f.Publish(0, self.template.batch_ids(time.time_ns(), pids, pids))))
                await go
                if t0 is None:
                    t0 = time.monotonic()
                await self.publish(client, t0, stop)
                await asyncio.wait([client.closed, final], return_when=asyncio.FIRST_COMPLETED)
                if client.closed.done() and not final.done():
                    raise client.close_error()
            except (OSError, TimeoutError, StreamError, ConnectionError) as e:
                self.incident(f"producer lost its connection: {e}")
            finally:
                client.abort()

    async def publish(self, client: StreamClient, t0: float, stop: asyncio.Future) -> None:
        while not stop.done():
            if client.closed.done():
                raise client.close_error()
            due = int(self.rate * (time.monotonic() - t0)) + 1 - self.next_pid + 1
            room = CONFIRM_WINDOW - len(self.outstanding)
            k = min(due, room, 100)
            if k <= 0:
                self.room = asyncio.get_running_loop().create_future()
                await asyncio.wait([self.room, client.closed, stop], timeout=0.002 if room > 0 else None,
                                   return_when=asyncio.FIRST_COMPLETED)
                continue
            ts = time.time_ns()
            pids = list(range(self.next_pid, self.next_pid + k))
            client.send(f.encode(f.Publish(0, self.template.batch_ids(ts, pids, pids))))
            for pid in pids:
                self.outstanding[pid] = ts
                self.pub_ts[pid] = ts
            self.next_pid += k
            await client.drain()

    # -- consumer

    def on_deliver(self, client: StreamClient, sid: int, chunk) -> None:
        client.grant_credit(sid)
        h = chunks.read_header(chunk)
        now = time.time_ns()
        skip = self.consumer_offset - h.first_offset
        stamps = record_stamps(chunk)
        for j, (ts, msg_id) in enumerate(stamps):
            if j < skip:
                continue
            self.deliveries[msg_id] = self.deliveries.get(msg_id, 0) + 1
            if self.t_kill_ns and ts > self.t_kill_ns and not self.first_delivery_after_ns:
                self.first_delivery_after_ns = now
        self.consumer_offset = max(self.consumer_offset, h.next_offset)
        self.last_delivery_ns = now

    async def consumer(self, node: int, ready: asyncio.Future, stop: asyncio.Future) -> None:
        while not stop.done():
            nodes = [node] + [i for i in self.live() if i != node]
            i = next((i for i in nodes if i not in self.dead), None)
            try:
                client = await StreamClient.connect(self.ep(i), "streams-bench-consumer", timeout_s=5.0)
            except (OSError, TimeoutError, StreamError) as e:
                self.incident(f"consumer connect: {e}")
                await asyncio.sleep(RECONNECT_DELAY_S)
                continue
            try:
                client.on_deliver = partial(self.on_deliver, client)
                await client.request(f.Subscribe(0, 0, self.stream, f.OFFSET_TYPE_OFFSET, self.consumer_offset, 10, {}))
                if not ready.done():
                    ready.set_result(None)
                await asyncio.wait([stop, client.closed], return_when=asyncio.FIRST_COMPLETED)
                if client.closed.done() and not stop.done():
                    self.incident(f"consumer lost its connection: {client.close_error()}")
            except (OSError, TimeoutError, StreamError, ConnectionError) as e:
                self.incident(f"consumer: {e}")
            finally:
                if stop.done():
                    await client.close()
                client.abort()
            node = i

    # -- the run

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        b = self.b
        await create_streams(b.stream_url(0), [self.stream], {"initial-cluster-size": str(b.n)}, "streams-bench-setup")
        c = await StreamClient.connect(self.ep(0), "streams-bench-metadata")
        leader_ep = await c.leader_of(self.ep(0), self.stream)
        await c.close()
        leader = b.index_of_port(leader_ep.port)
        consumer_node = (leader + 1) % b.n
        go, ready = loop.create_future(), loop.create_future()
        stop_publishing, stop_consuming = loop.create_future(), loop.create_future()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.consumer(consumer_node, ready, stop_consuming))
            tg.create_task(self.producer(go, stop_publishing, stop_consuming))
            await asyncio.wait_for(ready, 30)
            go.set_result(None)
            await asyncio.sleep(FAULT_LEAD_S)
            confirmed_before = len(self.confirmed)
            self.t_kill_ns = time.time_ns()
            self.dead.add(leader)
            await loop.run_in_executor(None, b.kill, leader)
            deadline = time.monotonic() + RECOVERY_MAX_S
            while not (self.first_delivery_after_ns and self.first_confirm_after_ns) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(AFTER_RECOVERY_S)
            stop_publishing.set_result(None)
            deadline = time.monotonic() + SETTLE_MAX_S
            while self.outstanding and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            # drain: until every confirmed message arrived, or nothing arrived for DRAIN_IDLE_S
            while any(pid not in self.deliveries for pid in self.confirmed):
                if time.time_ns() - self.last_delivery_ns > DRAIN_IDLE_S * 1e9:
                    break
                await asyncio.sleep(0.05)
            stop_consuming.set_result(None)
        lost = sorted(pid for pid in self.confirmed if pid not in self.deliveries)
        dups = sum(1 for n in self.deliveries.values() if n > 1)
        ms = lambda t: round((t - self.t_kill_ns) / 1e6) if t else None  # noqa: E731
        return {"killed": b.nodes[leader].name if b.kind in HUTCH_KINDS else b.nodes[leader].nodename,
                "consumer_node": consumer_node, "confirmed_before_kill": confirmed_before,
                "resume_ms": ms(self.first_delivery_after_ns), "first_confirm_ms": ms(self.first_confirm_after_ns),
                "published": self.next_pid - 1, "confirmed": len(self.confirmed),
                "unconfirmed": len(self.outstanding), "delivered": len(self.deliveries), "lost": len(lost),
                "lost_ids": lost[:20], "duplicates": dups,
                "incidents": [w if n == 1 else f"{w} (x{n})" for w, n in self.incidents]}


# -- the run -----------------------------------------------------------------------------------------------


def ratio(h, r, digits: int = 2) -> str:
    if h is None or r is None or not r:
        return "-"
    return f"{h / r:.{digits}f}"


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


ROWS = [  # (label, path in a config's results, kind): a rate is better higher, a time lower
    ("AMQP 0-9-1 publish, confirmed msg/s", ("throughput_amqp", "publish_rate"), "rate"),
    ("AMQP 0-9-1 consume msg/s", ("throughput_amqp", "consume_rate"), "rate"),
    ("stream publish, confirmed msg/s", ("throughput_stream", "publish_rate"), "rate"),
    ("stream consume msg/s", ("throughput_stream", "consume_rate"), "rate"),
    ("stream publish: disk written, KiB/msg (lower)", ("throughput_stream", "disk_kib_per_msg"), "size"),
    ("catch-up from first, s (lower is better)", ("catchup", "read_s"), "time"),
    ("catch-up msg/s", ("catchup", "read_rate"), "rate"),
    ("failover: kill -9 to delivery, ms (lower)", ("failover", "resume_ms"), "time"),
    ("failover: kill -9 to confirm, ms (lower)", ("failover", "first_confirm_ms"), "time"),
    ("failover: confirmed", ("failover", "confirmed"), "count"),
    ("failover: lost / duplicates", ("failover", "lost"), "loss"),
    ("peak RSS of a node, MB (lower)", ("peak_rss_mb", None), "time"),
]


def _get(res: dict, path: tuple[str, str | None]):
    part = res.get(path[0])
    if path[1] is None:
        return part
    return part.get(path[1]) if isinstance(part, dict) else None


def print_table(results: dict, replicas: list[int]) -> None:
    """RabbitMQ, then each hutch configuration measured with its ratio to RabbitMQ ("hutch-bg":
    `stream.fsync = background`, RabbitMQ's streams' own promise)."""
    kinds = [k for k in HUTCH_KINDS if k in results]
    for n in replicas:
        r = results.get("rabbitmq", {}).get(str(n), {})
        hs = [results[k].get(str(n), {}) for k in kinds]
        print(f"\n{n} replica{'s' if n > 1 else ''} ({'single node' if n == 1 else f'{n}-node clusters'})")
        print(f"  {'':44} {'RabbitMQ':>12}" + "".join(f" {k:>12} {k + '/RabbitMQ':>18}" for k in kinds))
        for label, path, kind in ROWS:
            rv, hvs = _get(r, path), [_get(h, path) for h in hs]
            if rv is None and all(hv is None for hv in hvs):
                continue
            if kind == "loss":
                cells = ["-" if v is None else f"{v} / {res['failover']['duplicates']}"
                         for v, res in [(rv, r), *zip(hvs, hs, strict=True)]]
                print(f"  {label:44} {cells[0]:>12}" + "".join(f" {c:>12} {'':>18}" for c in cells[1:]))
                continue
            digits = 2 if (kind == "time" and ", s " in label) or kind == "size" else 0
            print(f"  {label:44} {fmt(rv, digits):>12}" + "".join(
                f" {fmt(hv, digits):>12} {ratio(hv, rv) if kind != 'count' else '':>18}" for hv in hvs))


def measure_broker(b: Broker, res: dict, parts: list[str], a: argparse.Namespace) -> None:
    res["version"] = b.version()
    if "throughput" in parts:
        for protocol in ("amqp", "stream"):
            res[f"throughput_{protocol}"] = _attempt(lambda p=protocol: measure_throughput(b, p, a.duration))
            print(f"   throughput {protocol}: {res[f'throughput_{protocol}']}", flush=True)
    if "catchup" in parts:
        res["catchup"] = _attempt(lambda: measure_catchup(b, a.catchup, a.cold))
        print(f"   catch-up: {res['catchup']}", flush=True)
    res["peak_rss_mb"] = max(x for x in b.peak_rss_mb() if x is not None)  # before a node is killed
    if "failover" in parts and b.n > 1:
        res["failover"] = _attempt(lambda: _run(Failover(b, a.failover_rate).run()))
        print(f"   failover: {res['failover']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default=",".join(BROKERS))
    ap.add_argument("--replicas", default="1,3")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--duration", type=float, default=DURATION_S, help="seconds per throughput run")
    ap.add_argument("--catchup", type=int, default=CATCHUP_DEFAULT, help="messages the catch-up consumer reads")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache between the catch-up's fill and its read, so the read comes "
                         "from the disk (needs root)")
    ap.add_argument("--failover-rate", type=float, default=FAILOVER_RATE)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    brokers = [x for x in a.brokers.split(",") if x]
    replicas = [int(x) for x in a.replicas.split(",") if x]
    parts = [x for x in a.parts.split(",") if x]
    if set(brokers) - set(BROKERS) or set(parts) - set(PARTS):
        ap.error(f"--brokers from {BROKERS}, --parts from {PARTS}")
    results: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "body_size": BODY_SIZE,
                     "duration_s": a.duration, "catchup": a.catchup, "load_before": os.getloadavg()}
    for n in replicas:
        for kind in brokers:
            res = results.setdefault(kind, {}).setdefault(str(n), {})
            print(f"== {kind}, {n} replica(s): starting", flush=True)
            if os.geteuid() == 0:
                drop_page_cache()
            b = Broker(kind, n).start()
            try:
                measure_broker(b, res, parts, a)
            finally:
                b.cleanup()
    results["load_after"] = os.getloadavg()
    print_table(results, replicas)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = a.json_out or RESULTS / f"streams-compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {out}")
    failed = [(k, n, part) for k in brokers for n, res in results.get(k, {}).items()
              for part, v in res.items() if isinstance(v, dict) and "error" in v]
    for k, n, part in failed:
        print(f"FAILED {k} {n} replica(s) {part}: {results[k][n][part]['error']}", file=sys.stderr)
    lost = [(k, n) for k in brokers for n, res in results.get(k, {}).items()
            if isinstance(res.get("failover"), dict) and res["failover"].get("lost")]
    for k, n in lost:
        print(f"LOST confirmed messages: {k}, {n} replicas: {results[k][n]['failover']['lost']}", file=sys.stderr)
    return 1 if failed or lost else 0


def _attempt(fn) -> dict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded in the results, the run goes on
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


if __name__ == "__main__":
    sys.exit(main())
