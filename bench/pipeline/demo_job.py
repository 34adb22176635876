"""The Structured Streaming job of `make pipeline-demo`, in a driver process of its own.

    python bench/pipeline/demo_job.py --uri hutch-stream://guest:guest@127.0.0.1:5552 \
        --source demo-in --sink demo-out --work DIR [--master local[*]] [--drain-file F]

Two queries read the input stream through the hutch connector (format "hutch"), each with
its checkpoint under DIR/checkpoints and its consumer name, so each resumes where its last
committed micro-batch ended:

- "aggregate": per micro-batch, messages and id sums per bucket (`exactly_once.aggregate`),
  written to DIR/parquet/batch_id=N with mode overwrite. A batch that is run again after a
  crash reads the same offsets (Spark's offset log) and writes the same directory again;
- "forward": one message per input message into the output stream (the connector's sink,
  whose publishing ids come from the batch id, so a batch run again is deduplicated).

It runs micro-batches every `--trigger-s` until the drain file appears, then stops both
queries and runs them once more with `availableNow`, which ends when everything the input
held at that moment is processed, and exits 0. Progress (one JSON line per micro-batch) goes
to DIR/progress.jsonl; a query that fails makes the process exit 3 (the demo starts it again).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exactly_once  # noqa: E402

POLL_S = 0.5
EXIT_QUERY_FAILED = 3


def source(spark, args, consumer: str):
    return (spark.readStream.format("hutch").option("uri", args.uri).option("stream", args.source)
            .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", args.max_per_trigger)
            .option("consumerName", consumer).load())


def start_queries(spark, args, available_now: bool) -> dict:
    work = Path(args.work)
    parquet = str(work / "parquet")

    def write_aggregate(batch, batch_id: int) -> None:
        exactly_once.aggregate(batch).coalesce(1).write.mode("overwrite") \
            .parquet(f"{parquet}/batch_id={batch_id}")

    def trigger(w):
        return w.trigger(availableNow=True) if available_now else w.trigger(processingTime=f"{args.trigger_s} seconds")

    agg = trigger(exactly_once.input_ids(source(spark, args, "demo-aggregate")).writeStream
                  .queryName("aggregate").foreachBatch(write_aggregate)
                  .option("checkpointLocation", str(work / "checkpoints" / "aggregate"))).start()
    fwd = trigger(exactly_once.forward(exactly_once.input_ids(source(spark, args, "demo-forward"))).writeStream
                  .queryName("forward").format("hutch").option("uri", args.uri).option("stream", args.sink)
                  .option("checkpointLocation", str(work / "checkpoints" / "forward"))).start()
    return {"aggregate": agg, "forward": fwd}


def report(queries: dict, seen: dict, out) -> None:
    for name, q in queries.items():
        for p in q.recentProgress:
            key = (name, p.batchId, p.timestamp)
            if key in seen or p.numInputRows is None:
                continue
            seen[key] = True
            out.write(json.dumps({"query": name, "batch": p.batchId, "rows": p.numInputRows,
                                  "pid": os.getpid(), "time": time.time()}) + "\n")
            out.flush()


def run(args) -> int:
    import hutch.spark
    from hutch.pipeline.spark import session

    # Spark's scratch space in the demo's directory: a driver killed with kill -9 leaves it behind
    spark = session(master=args.master, app_name="hutch-pipeline-demo", shuffle_partitions=2, driver_memory="1g",
                    quick_jvm=True, extra_conf={"spark.local.dir": str(Path(args.work) / "spark-local")})
    hutch.spark.register(spark)
    seen: dict = {}
    drain = Path(args.drain_file) if args.drain_file else None
    with open(Path(args.work) / "progress.jsonl", "a") as out:
        available_now = drain is not None and drain.exists()
        queries = start_queries(spark, args, available_now)
        while True:
            report(queries, seen, out)
            failed = [(n, q.exception()) for n, q in queries.items() if not q.isActive and q.exception()]
            if failed:
                for n, e in failed:
                    print(f"query {n} failed: {e}", file=sys.stderr, flush=True)
                os._exit(EXIT_QUERY_FAILED)  # at once: stopping the other query and the session can take a minute
            if available_now and not any(q.isActive for q in queries.values()):
                report(queries, seen, out)
                return 0
            if not available_now and drain is not None and drain.exists():
                for q in queries.values():
                    q.stop()
                report(queries, seen, out)
                available_now = True
                queries = start_queries(spark, args, available_now)
                continue
            time.sleep(POLL_S)  # the driver's own poll of its queries' progress


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--trigger-s", type=float, default=2.0)
    ap.add_argument("--max-per-trigger", type=int, default=10000)
    ap.add_argument("--drain-file")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
