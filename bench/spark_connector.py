#!/usr/bin/env python3
"""The Spark connector's throughput: a stream into Spark and Spark into a stream (`make bench-spark`).

On one hutch node (data in a temporary directory, free ports) and Spark on `--master`
(`local[2]` by default), for each `--partitions` P (1, 2, 4):

  fill   a super stream `bench-P` of P partitions is filled with `--messages` messages by
         `hutch perf --protocol stream` (P producers, one per partition, `--size`-byte bodies);
  count  `spark.read.format("hutch")` of the super stream, `count()`: every message is read
         and turned into a row (one Spark task per partition);
  group  the same read, grouped by a key taken from each body (the message id modulo 16,
         `bench/pipeline/exactly_once.message_id`), `count()` per key: the body column is used;
  write  `--messages` rows from `spark.range` in P Spark partitions written with
         `df.write.format("hutch")` into a stream of its own, `bench-out-P` (every message
         confirmed before the write returns); the stream's end offset is checked afterwards.

Each figure is rows / wall seconds of that Spark action (a fresh DataFrame each time, so no
shuffle files are reused). `--profile DIR` records the Spark Python workers with py-spy during
the count and the write of the first P, and prints where their time goes (self and total
shares by function); the raw stacks stay in DIR.

    bench/spark_connector.py                                  # 10,000,000 messages: 10-15 minutes
    bench/spark_connector.py --messages 1000000 --partitions 1,2 --profile var/spark-profile

Results: a table, and bench/results/spark-connector-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "pipeline"))

import exactly_once  # noqa: E402
from tests.support.brokers import HutchNode  # noqa: E402

from hutch.streamclient import StreamClient, StreamEndpoint  # noqa: E402
from hutch.streamproto import frames as f  # noqa: E402

RESULTS = ROOT / "bench" / "results"
GOAL_READ, GOAL_WRITE = 200_000, 100_000  # msg/s on a 2-core machine
PROFILE_RATE_HZ = 97
GROUP_KEYS = 16
WARM_UP_MESSAGES = 50_000


# -- the broker side


async def _create(uri: str, super_stream: str, partitions: int, out_stream: str) -> None:
    client = await StreamClient.connect(StreamEndpoint.from_uri(uri), "bench-spark")
    try:
        keys = [str(i) for i in range(1, partitions + 1)]
        await client.request(f.CreateSuperStream(0, super_stream, [f"{super_stream}-{k}" for k in keys], keys, {}),
                             ok=(f.OK, f.STREAM_ALREADY_EXISTS))
        await client.request(f.Create(0, out_stream, {}), ok=(f.OK, f.STREAM_ALREADY_EXISTS))
    finally:
        await client.close()


async def _end_offsets(uri: str, streams: list[str]) -> dict[str, int]:
    client = await StreamClient.connect(StreamEndpoint.from_uri(uri), "bench-spark")
    try:
        return {s: (await client.end_of(s))[1] for s in streams}
    finally:
        await client.close()


def fill(uri: str, super_stream: str, partitions: int, messages: int, size: int, work: Path) -> dict:
    out = work / f"fill-{super_stream}.json"
    per = -(-messages // partitions)
    cmd = [sys.executable, "-m", "hutch", "perf", "--protocol", "stream", "--uri", uri, "--predeclared",
           "--queue", f"{super_stream}-%d", "--queues", str(partitions), "--producers", str(partitions),
           "--consumers", "0", "--pmessages", str(per), "--size", str(size), "--processes", str(min(partitions, 2)),
           "--quiet", "--json-out", str(out)]
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    s = json.loads(out.read_text())
    return {"messages": s["confirmed"], "s": round(time.monotonic() - t0, 2), "msg_s": round(s["confirmed_rate"])}


# -- CPU time of process trees (the machine is shared: wall time alone says little)


def _tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of `root` and every live descendant (with their reaped children)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = sum(int(x) for x in fields[11:15]) / tick
    total, todo = 0.0, [root]
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


class CpuMeter:
    """CPU seconds Spark (this process, its JVM and Python workers) and the hutch node spend in a span."""

    def __init__(self, node_pid: int):
        self.node_pid = node_pid

    def __enter__(self) -> CpuMeter:
        self.t0 = time.monotonic()
        self.all0, self.node0 = _tree_cpu_s(os.getpid()), _tree_cpu_s(self.node_pid)
        return self

    def __exit__(self, *exc) -> None:
        self.s = round(time.monotonic() - self.t0, 2)
        node = _tree_cpu_s(self.node_pid) - self.node0
        self.node_cpu_s = round(node, 2)
        self.spark_cpu_s = round(_tree_cpu_s(os.getpid()) - self.all0 - node, 2)

    def figures(self, rows: int) -> dict:
        return {"rows": rows, "s": self.s, "msg_s": round(rows / max(self.s, 1e-6)),
                "spark_cpu_s": self.spark_cpu_s, "node_cpu_s": self.node_cpu_s,
                "spark_cpu_us_per_msg": round(self.spark_cpu_s * 1e6 / max(rows, 1), 2)}


# -- profiling the Spark Python workers


class Profile:
    """py-spy over this process and its descendants (the JVM's Python workers), raw stacks to a file."""

    def __init__(self, directory: Path, name: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.txt"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(os.getpid()), "--subprocesses",
             "--rate", str(PROFILE_RATE_HZ), "--format", "raw", "--output", str(self.path), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> Path:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        return self.path


def summarize(path: Path, top: int = 18) -> dict:
    """Self and total sample shares by function over the Spark Python workers' stacks (py-spy
    leaves idle threads out; the driver's own process, waiting on the JVM, is left out here)."""
    self_n: collections.Counter = collections.Counter()
    total_n: collections.Counter = collections.Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "worker.py" not in stack and "daemon.py" not in stack:
            continue
        frames = [re.sub(r"\((?:.*/)?([^/]+?):\d+\)$", r"(\1)", fr) for fr in stack.split(";")[1:]]
        n = int(count)
        samples += n
        self_n[frames[-1]] += n
        for fr in set(frames):
            total_n[fr] += n

    def share(n: int) -> float:
        return round(100 * n / max(samples, 1), 1)

    return {"samples": samples,
            "self": [(fr, share(n), share(total_n[fr])) for fr, n in self_n.most_common(top)],
            "total": [(fr, share(n)) for fr, n in total_n.most_common(top)]}


# -- the Spark side


def measure(spark, uri: str, p: int, messages: int, size: int, node_pid: int, profile_dir: Path | None,
            min_partitions: int | None = None) -> dict:
    from pyspark.sql import functions as F

    name, out = f"bench-{p}", f"bench-out-{p}"
    r: dict = {"partitions": p}

    def source():
        reader = spark.read.format("hutch").option("uri", uri).option("stream", name)
        if min_partitions:
            reader = reader.option("minPartitions", min_partitions)
        return reader.load()

    prof = Profile(profile_dir, f"read-{p}") if profile_dir else None
    with CpuMeter(node_pid) as m:
        n = source().count()
    r["count"] = m.figures(n)
    if prof:
        r["profile_read"] = summarize(prof.stop())
    with CpuMeter(node_pid) as m:
        groups = (source().select(F.pmod(exactly_once.message_id(F.col("body")), F.lit(GROUP_KEYS)).alias("k"))
                  .groupBy("k").count().collect())
    r["group"] = m.figures(sum(g["count"] for g in groups))

    rows = spark.range(0, messages, numPartitions=p).select(
        F.concat(F.lpad(F.col("id").cast("string"), 16, "0"), F.lit("x" * max(size - 16, 0))).cast("binary")
        .alias("body"), (F.col("id") % p).cast("string").alias("routing_key"))
    prof = Profile(profile_dir, f"write-{p}") if profile_dir else None
    with CpuMeter(node_pid) as m:
        rows.write.format("hutch").option("uri", uri).option("stream", out).mode("append").save()
    r["write"] = m.figures(messages)
    if prof:
        r["profile_write"] = summarize(prof.stop())
    return r


def warm_up(spark, uri: str, work: Path, size: int) -> None:
    """One small read and write first, so that no figure pays for starting the Python workers
    or for the JVM's first compilations."""
    asyncio.run(_create(uri, "bench-warmup", 1, "bench-warmup-out"))
    fill(uri, "bench-warmup", 1, WARM_UP_MESSAGES, size, work)
    df = spark.read.format("hutch").option("uri", uri).option("stream", "bench-warmup").load()
    df.count()
    df.select("body", "routing_key").write.format("hutch").option("uri", uri).option("stream", "bench-warmup-out") \
        .mode("append").save()


def print_table(res: dict) -> None:
    print(f"\nSpark connector, {res['messages']:,} messages of {res['size']} bytes, master {res['master']}")
    print(f"{'partitions':>10} | {'fill msg/s':>10} | {'count msg/s':>11} | {'group-by msg/s':>14} | "
          f"{'write msg/s':>11} | {'Spark CPU µs/msg: count':>23} | {'group':>5} | {'write':>5}")
    for r in res["runs"]:
        print(f"{r['partitions']:>10} | {r['fill']['msg_s']:>10,} | {r['count']['msg_s']:>11,} | "
              f"{r['group']['msg_s']:>14,} | {r['write']['msg_s']:>11,} | {r['count']['spark_cpu_us_per_msg']:>23} | "
              f"{r['group']['spark_cpu_us_per_msg']:>5} | {r['write']['spark_cpu_us_per_msg']:>5}")
    print(f"goal: read >= {GOAL_READ:,} msg/s, write >= {GOAL_WRITE:,} msg/s")
    for r in res["runs"]:
        for k in ("profile_read", "profile_write"):
            if k in r:
                prof = r[k]
                print(f"\n{k.split('_')[1]} of {r['partitions']} partition(s), Spark Python workers, "
                      f"{prof['samples']} samples: self / total %")
                for fr, own, total in prof["self"]:
                    print(f"  {own:5.1f} / {total:5.1f}  {fr}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--partitions", default="1,2,4", help="super stream partitions to measure, comma-separated")
    ap.add_argument("--min-partitions", type=int, help="the source's minPartitions (Spark tasks at least)")
    ap.add_argument("--size", type=int, default=32, help="message body bytes (>= 16)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--profile", type=Path, help="py-spy the Spark Python workers; raw stacks into this directory")
    args = ap.parse_args(argv)
    parts = [int(x) for x in args.partitions.split(",")]

    import hutch.spark
    from hutch.pipeline.spark import session

    work = Path(tempfile.mkdtemp(prefix="hutch-bench-spark-"))
    node = HutchNode(data_dir=work / "node", log_level="warning")
    node.start()
    spark = None
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "messages": args.messages,
           "size": args.size, "master": args.master, "min_partitions": args.min_partitions, "runs": []}
    try:
        uri = f"hutch-stream://guest:guest@127.0.0.1:{node.stream_port}"
        spark = session(master=args.master, app_name="hutch-bench-spark", shuffle_partitions=4, driver_memory="2g")
        hutch.spark.register(spark)
        warm_up(spark, uri, work, args.size)
        for p in parts:
            asyncio.run(_create(uri, f"bench-{p}", p, f"bench-out-{p}"))
            print(f"filling bench-{p} ({p} partitions) with {args.messages:,} messages ...", flush=True)
            filled = fill(uri, f"bench-{p}", p, args.messages, args.size, work)
            print(f"  {filled['messages']:,} in {filled['s']} s; reading and writing with Spark ...", flush=True)
            r = measure(spark, uri, p, filled["messages"], args.size, node.proc.pid,
                        args.profile if args.profile and p == parts[0] else None, args.min_partitions)
            r["fill"] = filled
            written = asyncio.run(_end_offsets(uri, [f"bench-out-{p}"]))[f"bench-out-{p}"]
            r["write"]["stream_end_offset"] = written
            if r["count"]["rows"] != filled["messages"] or r["group"]["rows"] != filled["messages"] \
                    or written != filled["messages"]:
                r["mismatch"] = True
                print(f"  rows read {r['count']['rows']:,} / {r['group']['rows']:,}, written {written:,}: "
                      f"not the {filled['messages']:,} expected", flush=True)
            res["runs"].append(r)
            print(f"  count {r['count']['msg_s']:,} msg/s, group-by {r['group']['msg_s']:,} msg/s, "
                  f"write {r['write']['msg_s']:,} msg/s", flush=True)
    finally:
        if spark is not None:
            spark.stop()
        node.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    print_table(res)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"spark-connector-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nresults: {path}")
    return 1 if any(r.get("mismatch") for r in res["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
