"""`make pipeline-demo`: exactly once from a hutch stream through Spark and back, under faults.

1. a 3-node lab on free ports in a temporary directory; an input stream and an output stream of
   3 replicas each, their leaders on different nodes;
2. the Structured Streaming job (`demo_job.py`) starts in a driver process of its own: it reads
   the input stream, aggregates per micro-batch and bucket into Parquet, and forwards every
   message into the output stream;
3. once its first micro-batches ran, `hutch perf --protocol stream` publishes `--messages`
   numbered messages into the input stream at `--rate` msg/s, on the input stream's leader;
4. a fifth of the way in, the output stream's leader's node is killed (kill -9); it is started
   again once the job has forwarded two micro-batches without it. Half way, the Spark driver's
   process group is killed (kill -9), and the job is started again from its checkpoints. A job
   that fails on its own (a task that met the dead node) is started again the same way;
5. once the publisher is done, the job drains the input (`availableNow`) and exits;
6. Spark reads the input stream and the output stream through the connector and the Parquet
   output, and counts what is missing and what is there twice (`exactly_once.tally`).

Exits 1 on any loss or duplicate, 2 when a step did not finish. `--master spark` runs the job on
a Spark standalone cluster (one master, one worker) started on loopback from the installed
PySpark; any other value is a Spark master URL (`local[*]` by default).
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
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import exactly_once  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.support.lab import free_base_port  # noqa: E402

from hutch.lab.cluster import Lab, http_get_json  # noqa: E402
from hutch.streamclient import create_streams  # noqa: E402

SOURCE, SINK = "demo-in", "demo-out"
NODES = 3
POLL_S = 0.2
DRIVER_RESTARTS_MAX = 6
NODE_KILL_AT = 0.2  # of the messages forwarded
DRIVER_KILL_AT = 0.5
NODE_DOWN_BATCHES = 2  # micro-batches the job commits with the node down before it is started again
NODE_DOWN_S_MAX = 30.0

console = Console(highlight=False, soft_wrap=True)


@dataclass
class JobProgress:
    """Rows per query and micro-batch from the job's progress lines (a batch run again counts once)."""

    batches: dict[str, dict[int, int]] = field(default_factory=lambda: {"aggregate": {}, "forward": {}})
    read_at: int = 0

    def feed(self, path: Path) -> None:
        try:
            with open(path) as f:
                f.seek(self.read_at)
                data = f.read()
        except FileNotFoundError:
            return
        done = data.rfind("\n") + 1
        self.read_at += len(data[:done].encode())
        for line in data[:done].splitlines():
            p = json.loads(line)
            self.batches[p["query"]][p["batch"]] = p["rows"]

    def rows(self, query: str) -> int:
        return sum(self.batches[query].values())

    def count(self, query: str) -> int:
        return len(self.batches[query])

    def last(self, query: str) -> int:
        return max(self.batches[query], default=-1)


def uncommitted(checkpoints: Path) -> dict[str, list[int]]:
    """Per query, the micro-batches its offset log holds and its commit log does not."""
    def ids(d: Path) -> set[int]:
        return {int(p.name) for p in d.glob("*") if p.name.isdigit()}

    out = {}
    for q in sorted(p for p in checkpoints.glob("*") if p.is_dir()):
        pending = sorted(ids(q / "offsets") - ids(q / "commits"))
        if pending:
            out[q.name] = pending
    return out


def stream_uri(port: int, scheme: str = "hutch-stream") -> str:
    return f"{scheme}://guest:guest@127.0.0.1:{port}" + ("/%2F" if scheme == "rabbitmq-stream" else "")


def leader_of(lab: Lab, stream: str) -> str:
    for spec in lab.nodes:
        with contextlib.suppress(OSError, ValueError):
            return http_get_json(f"{spec.http_url}/api/queues/%2F/{stream}", timeout_s=5)["leader"]
    raise RuntimeError(f"no node answers for stream {stream}")


class Demo:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hutch-pipeline-demo-"))
        self.work = self.dir / "job"
        self.lab: Lab | None = None
        self.standalone = None
        self.driver: subprocess.Popen | None = None
        self.driver_runs = 0
        self.driver_failures = 0
        self.perf: subprocess.Popen | None = None
        self.published: int | None = None
        self.events: list[tuple[float, str]] = []
        self.progress = JobProgress()

    def say(self, text: str) -> None:
        t = time.monotonic() - self.t0
        self.events.append((round(t, 1), text))
        console.print(f"[dim]{t:7.1f}s[/dim] {text}")

    # -- the pieces

    def start_lab(self) -> None:
        base = free_base_port(NODES)
        self.say(f"starting a {NODES}-node lab in {self.dir / 'lab'} (AMQP ports {base}..{base + NODES - 1})")
        self.lab = Lab.up(NODES, self.dir / "lab", base_port=base, log_level="warning", tied_to_caller=True)
        nodes = self.lab.nodes
        args = {"initial-cluster-size": str(NODES), "queue-leader-locator": "client-local"}
        asyncio.run(create_streams(stream_uri(nodes[0].stream_port, "rabbitmq-stream"), [SOURCE], args,
                                              "pipeline-demo"))
        asyncio.run(create_streams(stream_uri(nodes[1].stream_port, "rabbitmq-stream"), [SINK], args,
                                              "pipeline-demo"))
        self.source_leader, self.sink_leader = leader_of(self.lab, SOURCE), leader_of(self.lab, SINK)
        self.say(f"streams {SOURCE} (leader {self.source_leader}) and {SINK} (leader {self.sink_leader}), "
                 f"{NODES} replicas each")
        candidates = [n.name for n in nodes if n.name != self.source_leader]
        self.victim = self.sink_leader if self.sink_leader in candidates else candidates[-1]
        # every node, the input's leader first: the connector tries them in turn
        ordered = sorted(nodes, key=lambda n: n.name != self.source_leader)
        self.uri = ",".join(stream_uri(n.stream_port) for n in ordered)

    def master(self) -> str:
        if self.args.master != "spark":
            return self.args.master
        if self.standalone is None:
            from tests.pipeline.standalone import SparkStandalone

            self.say("starting a Spark standalone cluster on loopback (1 master, 1 worker of 2 cores)")
            self.standalone = SparkStandalone(worker_cores=2, worker_memory="2g").start()
            self.say(f"Spark standalone master {self.standalone.master_url}")
        return self.standalone.master_url

    def start_perf(self) -> None:
        spec = self.lab.node(self.source_leader)
        cmd = [sys.executable, "-m", "hutch", "perf", "--protocol", "stream", "--uri",
               stream_uri(spec.stream_port, "rabbitmq-stream"), "--producers", "1", "--consumers", "0",
               "--pmessages", str(self.args.messages), "--rate", str(self.args.rate), "--size", "32",
               "--predeclared", "--queue", SOURCE, "--id", "pipeline-demo", "--quiet",
               "--json-out", str(self.dir / "perf.json")]
        self.say(f"hutch perf --protocol stream: publishing {self.args.messages:,} messages at "
                 f"{self.args.rate:,} msg/s into {SOURCE}")
        self.perf = subprocess.Popen(cmd, cwd=ROOT, stdout=open(self.dir / "perf.log", "wb"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT)

    def start_driver(self) -> None:
        self.driver_runs += 1
        log = open(self.dir / f"driver-{self.driver_runs}.log", "wb")  # noqa: SIM115 - closed by the process end
        cmd = [sys.executable, str(HERE / "demo_job.py"), "--uri", self.uri, "--source", SOURCE, "--sink", SINK,
               "--work", str(self.work), "--master", self.master(), "--drain-file", str(self.dir / "drain"),
               "--trigger-s", str(self.args.trigger_s), "--max-per-trigger", str(self.args.max_per_trigger)]
        self.driver = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        how = "started" if self.driver_runs == 1 else "started again from its checkpoints"
        self.say(f"Spark driver {how} (pid {self.driver.pid}, run {self.driver_runs}, master {self.master()})")

    def kill_driver(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.driver.pid, signal.SIGKILL)
        self.driver.wait()
        self.say(f"[yellow]killed the Spark driver[/yellow] (kill -9 of its process group, pid {self.driver.pid}) "
                 f"after {self.progress.rows('forward'):,} messages forwarded")
        for query, pending in uncommitted(self.work / "checkpoints").items():
            self.say(f"query {query}: micro-batch {', '.join(map(str, pending))} planned and not committed; "
                     f"the next run replays it with the same offsets")

    # -- the run

    def run(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        self.start_lab()
        self.master()
        self.start_driver()
        n = self.args.messages
        node_killed_at: tuple[float, int] | None = None
        node_back = driver_killed = drained = False
        node_back_batches = 0
        deadline = time.monotonic() + self.args.timeout_s
        while True:
            if time.monotonic() > deadline:
                self.say(f"[red]the job did not finish in {self.args.timeout_s:g} s[/red]")
                return 2
            self.progress.feed(self.work / "progress.jsonl")
            forwarded = self.progress.rows("forward")
            if self.perf is None:
                if self.progress.count("aggregate") and self.progress.count("forward"):
                    self.say("the job ran its first micro-batches (the JVM and the Python workers are up)")
                    self.start_perf()  # publishing starts once the job keeps up, so the faults come mid-stream
            elif node_killed_at is None and forwarded >= NODE_KILL_AT * n:
                self.lab.kill(self.victim)
                node_killed_at = (time.monotonic(), self.progress.count("forward"))
                self.say(f"[yellow]kill -9 {self.victim}[/yellow] (leader of {SINK}, replica of {SOURCE}) "
                         f"after {forwarded:,} messages forwarded")
            elif node_killed_at and not node_back and (
                    self.progress.count("forward") >= node_killed_at[1] + NODE_DOWN_BATCHES
                    or time.monotonic() - node_killed_at[0] > NODE_DOWN_S_MAX):
                self.lab.start(self.victim)
                node_back = True
                node_back_batches = self.progress.count("forward")
                self.say(f"started {self.victim} again ({time.monotonic() - node_killed_at[0]:.1f} s down, "
                         f"{self.progress.count('forward') - node_killed_at[1]} micro-batches forwarded meanwhile)")
            elif node_back and not driver_killed and forwarded >= DRIVER_KILL_AT * n \
                    and self.progress.count("forward") >= node_back_batches + NODE_DOWN_BATCHES:
                self.kill_driver()
                driver_killed = True
                self.start_driver()
            if self.perf is not None and self.perf.poll() is not None and not drained and driver_killed:
                if self.perf.returncode != 0:
                    self.say(f"[red]hutch perf failed ({self.perf.returncode}); see {self.dir / 'perf.log'}[/red]")
                    return 2
                perf = json.loads((self.dir / "perf.json").read_text())
                self.published = perf["confirmed"]
                (self.dir / "drain").touch()
                drained = True
                self.say(f"hutch perf done: {self.published:,} messages confirmed; the job drains the input")
            rc = self.driver.poll()
            if rc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.driver.pid, signal.SIGKILL)  # a JVM the driver left behind
            if rc == 0 and drained:
                self.say(f"the job is done: micro-batches 0..{self.progress.last('aggregate')} of the aggregation "
                         f"and 0..{self.progress.last('forward')} of the forwarding")
                break
            if rc is not None:
                self.driver_failures += 1
                self.say(f"[yellow]the Spark driver exited with {rc}[/yellow] (see "
                         f"{self.dir / f'driver-{self.driver_runs}.log'})")
                if self.driver_failures > DRIVER_RESTARTS_MAX:
                    return 2
                self.start_driver()
            time.sleep(POLL_S)  # the demo's own schedule: it polls the job's progress file
        return self.check()

    def check(self) -> int:
        import hutch.spark
        from hutch.pipeline.spark import session

        self.say("checking with Spark: the input stream, the Parquet output and the output stream")
        spark = session(master=self.master(), app_name="hutch-pipeline-demo-check", shuffle_partitions=4,
                        driver_memory="1g", quick_jvm=True)
        try:
            hutch.spark.register(spark)

            def read(stream: str):
                return (spark.read.format("hutch").option("uri", self.uri).option("stream", stream)
                        .option("startingOffsets", "earliest").load())

            t = exactly_once.tally(exactly_once.input_ids(read(SOURCE)),
                                   spark.read.parquet(str(self.work / "parquet")),
                                   exactly_once.output_ids(read(SINK)))
        finally:
            spark.stop()
        self.tally = t
        found = exactly_once.problems(t, self.published)
        self.summary(t, found)
        return 1 if found else 0

    def summary(self, t: dict, found: list[str]) -> None:
        table = Table(title="exactly once through Spark, under faults")
        for col in ("", "messages", "distinct", "lost", "duplicates"):
            table.add_column(col, justify="right" if col else "left")
        table.add_row("published (confirmed)", f"{self.published:,}", "", "", "")
        table.add_row(f"input stream {SOURCE}", f"{t['input']['messages']:,}", f"{t['input']['distinct']:,}", "", "")
        p = t["parquet"]
        table.add_row(f"Parquet, {p['batches']} batches", f"{p['messages']:,}", "",
                      f"{p['lost']:,}", f"{p['duplicates']:,}")
        s = t["stream"]
        table.add_row(f"output stream {SINK}", f"{s['messages']:,}", f"{s['distinct']:,}", f"{s['lost']:,}",
                      f"{s['duplicates']:,}")
        console.print(table)
        console.print(f"faults: kill -9 of {self.victim}; kill -9 of the Spark driver; driver runs: "
                      f"{self.driver_runs} ({self.driver_failures} after a failure of its own); "
                      f"{time.monotonic() - self.t0:.0f} s in all")
        for line in found:
            console.print(f"[red]{line}[/red]")
        if not found:
            console.print("[green]every input message is in the Parquet output and in the output stream "
                          "exactly once[/green]")
        (self.dir / "summary.json").write_text(json.dumps(
            {"master": self.args.master, "messages": self.args.messages, "published": self.published,
             "tally": t, "problems": found, "driver_runs": self.driver_runs,
             "driver_failures": self.driver_failures, "events": self.events}, indent=2) + "\n")

    def close(self, keep: bool) -> None:
        for p in (self.driver, self.perf):
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL) if p is self.driver else p.kill()
                p.wait()
        if self.lab is not None:
            self.lab.down()
        if self.standalone is not None:
            self.standalone.stop()
        if not keep and not self.args.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=90_000)
    ap.add_argument("--rate", type=int, default=1500, help="msg/s the publisher sends")
    ap.add_argument("--master", default="local[*]",
                    help="a Spark master URL, or 'spark' for a standalone cluster started on loopback")
    ap.add_argument("--trigger-s", type=float, default=2.0)
    ap.add_argument("--max-per-trigger", type=int, default=10_000)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--dir", help="work here (kept) instead of a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, Parquet, checkpoints)")
    args = ap.parse_args(argv)
    from hutch.pipeline.spark import prepare_environment

    prepare_environment()
    demo = Demo(args)
    rc = 2
    try:
        rc = demo.run()
    except KeyboardInterrupt:
        rc = 130
    finally:
        demo.close(keep=args.keep or rc != 0)
    if rc != 0:
        console.print(f"[red]the demo {'found a problem' if rc == 1 else 'did not finish'}; "
                      f"its files (logs, checkpoints, output): {demo.dir}[/red]")
    return rc


if __name__ == "__main__":
    sys.exit(main())
