"""Backlog benchmark: a queue far larger than memory, hutch against RabbitMQ 3.10, in one run.

For each broker in `--brokers` (hutch and RabbitMQ, each in its default mode and with
`x-queue-mode: lazy`; `hutch-quorum` and `rabbitmq-quorum` run the same on a quorum queue of
one member), on a fresh node of its own and its default configuration:

1. Publish `--messages` (default 20,000,000, the issue's figure) persistent 1 KiB messages to
   one durable queue with no consumer, one producer in confirm mode with 1,000 unconfirmed at
   most (`hutch perf --producers 1 --consumers 0 --pmessages N --persistent --durable
   --confirm 1000 --size 1024`). Measured: the confirmed rate, and whether the broker blocked
   the publisher's connection (`connection.blocked`: the memory or disk alarm).
2. The bytes of the node's data directory, with the queue full.
3. kill -9 with the queue full, start again, and time until the node serves again: a passive
   `queue.declare` succeeds and reports every message.
4. Drain the queue with one consumer, manual acks, prefetch 1,000 (`hutch perf --producers 0
   --consumers 1 --cmessages N --qos 1000`). Measured: the received rate, and the CPU seconds
   the node's process tree and the load tool spent on it (per message: on a machine shared
   with other work the rates move with the load, the CPU a message much less; and a client
   that used a core would say the bench, not the broker, set the rate).

Peak RSS is polled (every 0.2 s) over the node's process tree from its start to the end of the
drain, across the restart (for RabbitMQ that is beam.smp and its helpers); the main process's
VmHWM (the kernel's high-water mark) is reported too, for the last incarnation. Each broker's
data is deleted before the next starts. The disk needed is checked first (about 1.1 KiB a
message per broker); `--data-dir` puts the nodes' data elsewhere.

`python bench/backlog.py [--messages 20000000] [--brokers hutch,hutch-lazy,rabbitmq,rabbitmq-lazy]
[--data-dir DIR] [--json-out FILE]`, or `make bench-backlog` (BENCH_BACKLOG_ARGS). It starts and
stops every node it uses; it prints, it asserts nothing.

`python bench/backlog.py --count [--messages 100000]` instead drains a lazy queue inside this
process (a node on its storage, AMQP bytes fed to its sessions, as bench/hotpath.py does) and
counts the Python bytecodes and calls the node executes per message drained, over 10,000 messages
well into the drain (read back, deliver, ack, journal): figures that do not move with the
machine's load, so two trees compare to the bytecode (`PYTHONPATH=/other/tree/src python
bench/backlog.py --count`). The fsync runs inline there, where a node runs it in a worker thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from durability import kill_node, perf  # noqa: E402  (bench/durability.py: the same load tool and kill)
from tests.support.brokers import HutchNode, RabbitMQNode  # noqa: E402

QUEUE = "bench-backlog"
BODY_BYTES = 1024
DISK_BYTES_PER_MESSAGE = 1150  # body, properties and framing of a record, on either broker
BROKERS = {"hutch": {}, "hutch-lazy": {"x-queue-mode": "lazy"}, "rabbitmq": {}, "rabbitmq-lazy": {"x-queue-mode": "lazy"},
           "hutch-quorum": {"x-queue-type": "quorum"}, "rabbitmq-quorum": {"x-queue-type": "quorum"}}
DEFAULT_BROKERS = ("hutch", "hutch-lazy", "rabbitmq", "rabbitmq-lazy")


class RssPeak:
    """Polls the RSS of a node's process tree (the root process and its descendants) until
    stopped; `peak` is the largest sum seen. The node may be killed and started again: `pid`
    is read from the node each time."""

    def __init__(self, node, interval_s: float = 0.2):
        self.node = node
        self.interval_s = interval_s
        self.peak = 0
        self.phase_peak = 0  # since the last `phase()`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        proc = self.node.proc
        if proc is None or proc.poll() is not None:
            return 0
        try:
            root = psutil.Process(proc.pid)
            total = root.memory_info().rss
            for c in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += c.memory_info().rss
            return total
        except psutil.Error:
            return 0

    def phase(self) -> int:
        """The peak since the last call (or the start), in MiB; a new phase begins."""
        peak, self.phase_peak = self.phase_peak, 0
        return round(peak / 2**20)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self.sample()
            self.peak = max(self.peak, rss)
            self.phase_peak = max(self.phase_peak, rss)


def tree_cpu_s(node) -> float:
    """CPU seconds (user + system) of a node's process tree so far."""
    proc = node.proc
    if proc is None or proc.poll() is not None:
        return 0.0
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
    return total


def main_pid(node) -> int | None:
    """The broker's own process: hutch's python, RabbitMQ's beam.smp (below its start script)."""
    if node.proc is None:
        return None
    try:
        root = psutil.Process(node.proc.pid)
        for p in [root, *root.children(recursive=True)]:
            if isinstance(node, HutchNode) or p.name().startswith("beam"):
                return p.pid
    except psutil.Error:
        pass
    return None


def vm_hwm(pid: int | None) -> int:
    if pid is None:
        return 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def depth(node) -> int | None:
    """A passive declare's message count; None while the node does not serve the queue."""
    try:
        c = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port, socket_timeout=5,
                                                              blocked_connection_timeout=5))
    except (pika.exceptions.AMQPError, OSError):
        return None
    try:
        return c.channel().queue_declare(QUEUE, durable=True, passive=True).method.message_count
    except (pika.exceptions.AMQPError, OSError):
        return None
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            c.close()


def serves_again_s(node, expected: int, timeout_s: float) -> tuple[float | None, int | None]:
    """kill -9, start, and the seconds until a passive declare reports `expected` messages."""
    kill_node(node)
    t0 = time.monotonic()
    node.start(timeout_s=timeout_s, wait=False)
    last = None
    while time.monotonic() - t0 < timeout_s:
        last = depth(node)
        if last == expected:
            return round(time.monotonic() - t0, 2), last
        time.sleep(0.1)
    return None, last


def watch_blocked(node, stop: threading.Event, seen: list) -> None:
    """A connection of its own that records connection.blocked (the broker's alarms block every
    publishing connection; this one publishes nothing, so it sees the alarm without taking part)."""
    try:
        c = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port, heartbeat=0))
    except (pika.exceptions.AMQPError, OSError):
        return
    c.add_on_connection_blocked_callback(lambda *_a: seen.append(time.monotonic()))
    ch = c.channel()
    try:
        while not stop.is_set():
            ch.basic_publish("", "bench-backlog-probe", b"")  # unroutable: only makes the alarm visible here
            c.process_data_events(time_limit=0.5)
    except (pika.exceptions.AMQPError, OSError):
        pass
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            c.close()


def run_one(kind: str, messages: int, base: Path, workdir: Path, timeout_s: float) -> dict:
    args = BROKERS[kind]
    if kind.startswith("hutch"):
        node = HutchNode(data_dir=base / kind, log_level="warning")
        data = base / kind
    else:
        node = RabbitMQNode(management=False)
        data = node.dir / "mnesia"
    queue_args = ["--queue-args", json.dumps(args)] if args else []
    out: dict = {"broker": kind, "messages": messages, "queue_arguments": args}
    try:
        node.start(timeout_s=300)
        with RssPeak(node) as rss:
            stop = threading.Event()
            blocked: list = []
            watcher = threading.Thread(target=watch_blocked, args=(node, stop, blocked), daemon=True)
            watcher.start()
            t0 = time.monotonic()
            pub = perf(node.url, workdir, "--producers", "1", "--consumers", "0", "--pmessages", str(messages),
                       "--queue", QUEUE, "--persistent", "--durable", "--confirm", "1000",
                       "--size", str(BODY_BYTES), *queue_args)
            out["publish_s"] = round(time.monotonic() - t0, 1)
            stop.set()
            watcher.join()
            out["publish_rate"] = round(pub["confirmed_rate"])
            out["publisher_blocked"] = bool(blocked)
            out["queued"] = depth(node)
            out["peak_rss_publish_mib"] = rss.phase()
            out["disk_bytes"] = dir_bytes(data)
            print(f"  {kind}: published {out['queued']} in {out['publish_s']} s ({out['publish_rate']} msg/s), "
                  f"blocked {out['publisher_blocked']}, peak RSS {out['peak_rss_publish_mib']} MiB, "
                  f"disk {out['disk_bytes'] / 2**20:.0f} MiB", flush=True)
            out["serves_again_after_kill_s"], out["count_after_kill"] = serves_again_s(node, out["queued"], timeout_s)
            out["peak_rss_restart_mib"] = rss.phase()
            print(f"  {kind}: kill -9 with the queue full: serving again (passive declare reports "
                  f"{out['count_after_kill']}) after {out['serves_again_after_kill_s']} s; peak RSS of the "
                  f"restart {out['peak_rss_restart_mib']} MiB", flush=True)
            t0 = time.monotonic()
            cpu0 = tree_cpu_s(node)
            drained = perf(node.url, workdir, "--producers", "0", "--consumers", "1", "--cmessages",
                           str(out["count_after_kill"] or messages), "--qos", "1000", "--queue", QUEUE,
                           "--predeclared")
            out["drain_s"] = round(time.monotonic() - t0, 1)
            out["drain_rate"] = round(drained["received_rate"])
            received = max(drained["received"], 1)
            out["drain_node_cpu_us_per_msg"] = round((tree_cpu_s(node) - cpu0) / received * 1e6, 1)
            out["drain_client_cpu_us_per_msg"] = round(drained["client_cpu_s"] / received * 1e6, 1)
            out["load_average"] = os.getloadavg()[0]
            out["peak_rss_drain_mib"] = rss.phase()
            out["peak_rss_mib"] = round(rss.peak / 2**20)
        out["vm_hwm_last_incarnation_mib"] = round(vm_hwm(main_pid(node)) / 2**20)
        print(f"  {kind}: drained in {out['drain_s']} s ({out['drain_rate']} msg/s; CPU a message: node "
              f"{out['drain_node_cpu_us_per_msg']} us, load tool {out['drain_client_cpu_us_per_msg']} us); peak RSS "
              f"of the drain {out['peak_rss_drain_mib']} MiB, over the run {out['peak_rss_mib']} MiB", flush=True)
    finally:
        node.cleanup()
        shutil.rmtree(data, ignore_errors=True)
    return out


COUNTED_MESSAGES = 10_000  # --count follows these bytecode by bytecode
COUNT_QOS = 1000


async def count_drain(messages: int) -> None:
    """--count: publish `messages` persistent 1 KiB messages to a lazy durable queue of an
    in-process node, then drain it with manual acks (prefetch COUNT_QOS, one multiple ack per
    broker run, as a consumer that keeps up sends them) and count what the node executes per
    message over COUNTED_MESSAGES of the drain, past its start."""
    from hotpath import count, free_port, in_process_node, open_session, wait_for  # bench/hotpath.py
    from pamqp import body, commands, frame, header

    async with in_process_node("backlog-count", stream_port=free_port()) as node:
        b = node.broker
        b.request_sync = lambda: b.durable_done(b.journal.sync())  # the worker thread's fsync, inline
        pub = open_session(node, "127.0.0.1:1")
        con = open_session(node, "127.0.0.1:2")
        pub.receive(frame.marshal(commands.Queue.Declare(queue=QUEUE, durable=True,
                                                         arguments={"x-queue-mode": "lazy"}), 1))
        await wait_for(lambda: QUEUE in b.vhosts["/"].queues, "queue.declare")
        q = b.vhosts["/"].queues[QUEUE]
        one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE), 1)
               + frame.marshal(header.ContentHeader(0, BODY_BYTES, commands.Basic.Properties(delivery_mode=2)), 1)
               + frame.marshal(body.ContentBody(b"x" * BODY_BYTES), 1))
        for _ in range(messages // 1000):
            pub.receive(one * 1000)
            b.run()
        total = q.message_count
        con.receive(frame.marshal(commands.Basic.Qos(prefetch_count=COUNT_QOS), 1))
        con.receive(frame.marshal(commands.Basic.Consume(queue=QUEUE, no_ack=False), 1))

        def drain(n: int) -> None:
            target = total - q.message_count - q.unacked_count + n  # settled so far, and n more
            while True:
                b.run()
                delivered = total - q.message_count
                if delivered - q.unacked_count >= target or not delivered:
                    return
                con.receive(frame.marshal(commands.Basic.Ack(delivery_tag=min(delivered, target),
                                                             multiple=True), 1))

        drain(max(messages - COUNTED_MESSAGES - 2 * COUNT_QOS, COUNT_QOS))  # well into the drain
        print(f"draining a lazy queue of {total:,} persistent {BODY_BYTES} B messages (paged: "
              f"{q.paged_count:,} left), prefetch {COUNT_QOS}, one multiple ack a broker run:")
        count(lambda: drain(COUNTED_MESSAGES), COUNTED_MESSAGES)


def table(results: list[dict]) -> str:
    rows = ["| broker | publish msg/s | blocked | drain msg/s | drain CPU µs/msg (node / load tool) | peak RSS MiB "
            "| disk MiB | serves again after kill -9 |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(f"| {r['broker']} | {r['publish_rate']:,} | {'yes' if r['publisher_blocked'] else 'no'} | "
                    f"{r['drain_rate']:,} | {r['drain_node_cpu_us_per_msg']} / {r['drain_client_cpu_us_per_msg']} | "
                    f"{r['peak_rss_mib']:,} | {r['disk_bytes'] / 2**20:,.0f} | {r['serves_again_after_kill_s']} s |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000_000)
    ap.add_argument("--brokers", default=",".join(DEFAULT_BROKERS), help="any of " + ", ".join(BROKERS))
    ap.add_argument("--data-dir", type=Path, default=None, help="where the nodes' data goes (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for a node to serve again")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--count", action="store_true",
                    help="bytecodes and calls a message of a lazy queue's drain, in process (deterministic: for "
                         "comparing trees); --messages defaults to 100,000 then")
    a = ap.parse_args()
    if a.count:
        import asyncio

        asyncio.run(count_drain(a.messages if a.messages != ap.get_default("messages") else 100_000))
        return 0
    kinds = [k.strip() for k in a.brokers.split(",") if k.strip()]
    for k in kinds:
        if k not in BROKERS:
            ap.error(f"unknown broker {k!r}")
    base_parent = a.data_dir or Path(tempfile.gettempdir())
    base_parent.mkdir(parents=True, exist_ok=True)
    need = a.messages * DISK_BYTES_PER_MESSAGE
    free = shutil.disk_usage(base_parent).free
    rabbit_free = shutil.disk_usage(tempfile.gettempdir()).free
    print(f"backlog: {a.messages:,} persistent {BODY_BYTES} B messages per broker; needs about "
          f"{need / 2**30:.1f} GiB at a time; free {free / 2**30:.1f} GiB", flush=True)
    if need * 1.2 > min(free, rabbit_free):
        print("not enough free disk for one broker's backlog (with 20 % to spare): choose fewer --messages",
              file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="hutch-bench-backlog-", dir=base_parent) as d:
        base = Path(d)
        workdir = base / "perf"
        workdir.mkdir()
        for kind in kinds:
            print(f"{kind}:", flush=True)
            results.append(run_one(kind, a.messages, base, workdir, a.timeout))
    print(table(results))
    if a.json_out:
        a.json_out.write_text(json.dumps({"machine_cpus": os.cpu_count(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
