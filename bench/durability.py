"""Durability benchmark: hutch against RabbitMQ 3.10, in one run on the same machine.

1. Throughput: one producer publishes persistent 1 KiB messages to a durable queue in confirm
   mode (1,000 unconfirmed at most) while one consumer consumes them with manual acks under
   prefetch 100 — `hutch perf --persistent --durable --confirm 1000 --qos 100 --size 1024`,
   PerfTest's options. Each broker runs `--rounds` times, alternating, and the median rates
   are compared; on a shared machine only the ratio measured in the same run means much.
2. Recovery: a node with `--recovery-messages` (1,000,000) persistent 1 KiB messages queued
   is stopped gracefully and started again; the time from start until the AMQP port answers
   is measured, next to the time an empty node of the same kind takes, and the restarted
   node's queue is checked to hold every message. With --recovery-crash the node is killed
   with SIGKILL instead of stopped.

`python bench/durability.py [--duration 20] [--rounds 2] [--recovery-messages 1000000]
[--recovery-crash] [--skip-recovery | --skip-rabbitmq-recovery] [--no-rabbitmq] [--json-out FILE]`. It starts and stops every node it uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.brokers import HutchNode, RabbitMQNode  # noqa: E402

QUEUE_THROUGHPUT = "bench-durable"
QUEUE_RECOVERY = "bench-recovery"
BODY_BYTES = 1024
PERF_OPTIONS = ["--persistent", "--durable", "--confirm", "1000", "--qos", "100", "--size", str(BODY_BYTES)]


def perf(url: str, workdir: Path, *args: str) -> dict:
    out = workdir / f"perf-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "hutch", "perf", "--uri", url, "--quiet", "--json-out", str(out), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"hutch perf failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(out.read_text())


def delete_queue(url: str, queue: str) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    try:
        c.channel().queue_delete(queue)
    finally:
        c.close()


def queue_depth(url: str, queue: str) -> int:
    c = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return c.channel().queue_declare(queue, durable=True, passive=True).method.message_count
    finally:
        c.close()


def throughput(nodes: dict, rounds: int, duration_s: float, workdir: Path) -> dict:
    runs: dict[str, list[dict]] = {k: [] for k in nodes}
    for r in range(rounds):
        for kind, node in nodes.items():
            s = perf(node.url, workdir, *PERF_OPTIONS, "--queue", QUEUE_THROUGHPUT, "--duration", str(duration_s))
            delete_queue(node.url, QUEUE_THROUGHPUT)
            runs[kind].append(s)
            print(f"  round {r + 1} {kind:8s}: sent {s['sent_rate']:8.0f} msg/s, confirmed "
                  f"{s['confirmed_rate']:8.0f} msg/s, received {s['received_rate']:8.0f} msg/s", flush=True)
    out = {}
    for kind, ss in runs.items():
        out[kind] = {k: statistics.median(s[k] for s in ss) for k in ("sent_rate", "confirmed_rate",
                                                                        "received_rate")}
    if "rabbitmq" in out:
        out["ratio_hutch_to_rabbitmq"] = {k: round(out["hutch"][k] / out["rabbitmq"][k], 3)
                                          for k in out["hutch"] if out["rabbitmq"][k]}
    return out


def kill_node(node) -> None:
    if isinstance(node, HutchNode):
        node.kill()
        return
    if node.proc is not None and node.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)


def timed_start(node) -> float:
    t0 = time.monotonic()
    node.start(timeout_s=900)
    return time.monotonic() - t0


def recovery(node, messages: int, crash: bool, workdir: Path) -> dict:
    """Restart times of `node`: empty, then with `messages` persistent messages queued."""
    node.stop() if not crash else kill_node(node)
    empty_s = timed_start(node)
    t0 = time.monotonic()
    perf(node.url, workdir, "--producers", "1", "--consumers", "0", "--pmessages", str(messages),
         "--queue", QUEUE_RECOVERY, *PERF_OPTIONS)
    publish_s = time.monotonic() - t0
    depth = queue_depth(node.url, QUEUE_RECOVERY)
    kill_node(node) if crash else node.stop()
    loaded_s = timed_start(node)
    recovered = queue_depth(node.url, QUEUE_RECOVERY)
    delete_queue(node.url, QUEUE_RECOVERY)
    return {"messages": messages, "queued_before": depth, "recovered": recovered, "publish_s": round(publish_s, 1),
            "restart_empty_s": round(empty_s, 2), "restart_loaded_s": round(loaded_s, 2),
            "recovery_s": round(loaded_s - empty_s, 2), "crash": crash}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per throughput run")
    ap.add_argument("--rounds", type=int, default=2, help="throughput runs per broker (alternating)")
    ap.add_argument("--recovery-messages", type=int, default=1_000_000)
    ap.add_argument("--recovery-crash", action="store_true", help="kill -9 instead of a graceful stop")
    ap.add_argument("--skip-rabbitmq-recovery", action="store_true")
    ap.add_argument("--skip-recovery", action="store_true", help="throughput only")
    ap.add_argument("--no-rabbitmq", action="store_true", help="hutch only")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    result: dict = {"body_bytes": BODY_BYTES, "options": PERF_OPTIONS, "machine_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="hutch-bench-dur-") as d:
        workdir = Path(d)
        nodes = {"hutch": HutchNode(data_dir=workdir / "hutch", log_level="warning")}
        if not a.no_rabbitmq:
            nodes["rabbitmq"] = RabbitMQNode(management=False)
        try:
            for n in nodes.values():
                n.start()
            print(f"throughput: persistent, confirms (window 1000), manual acks (qos 100), {BODY_BYTES} B, "
                  f"{a.duration:.0f} s x {a.rounds} per broker", flush=True)
            result["throughput"] = throughput(nodes, a.rounds, a.duration, workdir)
            for kind in nodes:
                t = result["throughput"][kind]
                print(f"  median {kind:8s}: confirmed {t['confirmed_rate']:8.0f} msg/s, received "
                      f"{t['received_rate']:8.0f} msg/s")
            if "ratio_hutch_to_rabbitmq" in result["throughput"]:
                print(f"  hutch / RabbitMQ: {result['throughput']['ratio_hutch_to_rabbitmq']}", flush=True)
            result["recovery"] = {}
            for kind, node in nodes.items():
                if a.skip_recovery or (kind == "rabbitmq" and a.skip_rabbitmq_recovery):
                    continue
                print(f"recovery: {kind} with {a.recovery_messages} persistent messages queued", flush=True)
                r = recovery(node, a.recovery_messages, a.recovery_crash, workdir)
                result["recovery"][kind] = r
                print(f"  {kind:8s}: restart empty {r['restart_empty_s']} s, with {r['queued_before']} messages "
                      f"{r['restart_loaded_s']} s (recovered {r['recovered']}); publishing took "
                      f"{r['publish_s']} s", flush=True)
        finally:
            for n in nodes.values():
                n.cleanup()
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
