"""`hutch check`: the history checker, a PySpark job.

It reads a history written by `hutch.pipeline.history` (any number of files, any size)
and says, per run and per queue, whether the broker kept its promises: confirmed messages
lost, duplicates with and without the redelivered flag, deliveries nobody published,
reorders within one publisher's messages as one consumer saw them, what became of
publishes that were nacked, returned or never confirmed, how long deliveries and confirms
stalled and which fault caused it, and confirm and end-to-end latency per second. The
definitions are those of docs/lab-and-checker.md and `hutch.pipeline.model`; the reference
checker (`hutch.pipeline.reference`) computes the same answers in plain Python and the
tests hold the two against each other.

How the job stays fast and never brings the history to the driver: it reads the events
three times, each time only the columns it needs —

1. one aggregation by (run, queue, op, gap bin, second) gives the throughput per second,
   the end of each run, and the binned event series the gaps are found in (a gap longer
   than a bin lies between two non-empty bins, so bins `--gap-ms` wide find every gap
   exactly); fault rows are read with a filter;
2. one aggregation by (run, queue, msg_id) gives each message's facts — first publish,
   first confirm, nack, return, deliveries, unflagged deliveries, first delivery — kept in
   memory for the per-queue counts, the lost/duplicate/unexpected tables and the latencies;
3. one window over the unflagged deliveries of each (run, queue, consumer, publisher), in
   the consumer's record order, finds the reorders.

Only aggregates and the small decisions (fault windows, gap causes) reach the driver.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from hutch.pipeline.history import SEQ_MAX, history_files
from hutch.pipeline.model import (
    GAP_KINDS,
    HEALTHY,
    NS_PER_MS,
    NS_PER_S,
    PERCENTILES,
    SUMMARY_INT_FIELDS,
    UNKNOWN_WINDOW,
    Bin,
    Expectation,
    FaultWindow,
    Findings,
    by_queue_name,
    drained_queues,
    empty_summary,
    fault_events,
    fault_windows,
    gap_fields,
    gaps_from_bins,
)

MSG_OPS = ("publish", "confirm", "nack", "return", "deliver")
THROUGHPUT_OPS = ("publish", "confirm", "nack", "deliver", "ack")
PERCENTILE_ACCURACY = 10_000  # percentile_approx: rank error at most 1/10000 of the count
EXAMPLES_DEFAULT = 50
QUICK_JVM_BYTES_MAX = 256 * 1024 * 1024  # smaller histories start a JVM tuned for start-up


def spark_schema():
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("run_id", T.StringType(), False),
            T.StructField("client_id", T.StringType(), False),
            T.StructField("node", T.StringType(), True),
            T.StructField("queue", T.StringType(), True),
            T.StructField("op", T.StringType(), False),
            T.StructField("msg_id", T.LongType(), True),
            T.StructField("redelivered", T.BooleanType(), True),
            T.StructField("ts_ns", T.LongType(), False),
            T.StructField("detail", T.StringType(), True),
            T.StructField("client_seq", T.LongType(), False),
        ]
    )


def read_events(spark, history_dir: str | Path):
    """The history under `history_dir` as a DataFrame (hidden and `_`-prefixed paths left out)."""
    return (
        spark.read.schema(spark_schema())
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.parquet")
        .parquet(str(history_dir))
    )


class SparkCheck:
    """One check of one history: `run()` computes, `write(out)` leaves the tables behind."""

    def __init__(self, spark, history_dir: str | Path, gap_ms: float = 1000.0, examples_max: int = EXAMPLES_DEFAULT):
        if gap_ms <= 0:
            raise ValueError("gap_ms must be positive")
        self.spark = spark
        self.history_dir = Path(history_dir)
        self.gap_ns = int(gap_ms * NS_PER_MS)
        self.gap_ms = gap_ms
        self.examples_max = examples_max
        self._frames: dict[str, object] = {}
        self._persisted: list = []
        self.timings_s: dict[str, float] = {}  # seconds spent in each step of the last run
        self._t = time.monotonic()

    def _lap(self, step: str) -> None:
        now = time.monotonic()
        self.timings_s[step] = round(now - self._t, 2)
        self._t = now

    # -- the job ---------------------------------------------------------------------------

    def run(self) -> Findings:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        self.timings_s.clear()
        self._t = time.monotonic()
        ev = read_events(self.spark, self.history_dir)
        ts = F.col("ts_ns")
        has_queue = F.col("queue").isNotNull() & (F.col("queue") != "")

        # 1. bins: throughput, run ends, gap series
        bins = (
            ev.select(
                "run_id",
                F.coalesce(F.col("queue"), F.lit("")).alias("queue"),
                "op",
                F.expr(f"ts_ns div {self.gap_ns}").alias("bin"),
                F.expr(f"ts_ns div {NS_PER_S}").alias("second"),
                "ts_ns",
            )
            .groupBy("run_id", "queue", "op", "bin", "second")
            .agg(F.count(F.lit(1)).alias("count"), F.min(ts).alias("min_ns"), F.max(ts).alias("max_ns"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self._persisted.append(bins)
        per_second = (
            bins.groupBy("run_id", "queue", "op", "second")
            .agg(F.sum("count").alias("count"), F.max("max_ns").alias("max_ns"))
            .collect()
        )
        run_end: dict[str, int] = {}
        for r in per_second:
            run_end[r.run_id] = max(run_end.get(r.run_id, r.max_ns), r.max_ns)
        throughput = sorted(
            ({"run_id": r.run_id, "queue": r.queue, "second": r.second, "op": r.op, "count": r["count"]}
             for r in per_second if r.queue and r.op in THROUGHPUT_OPS),
            key=lambda x: (x["run_id"], x["queue"], x["second"], x["op"]),
        )
        queues = sorted({(r.run_id, r.queue) for r in per_second if r.queue})
        series: dict[tuple[str, str, str], list[Bin]] = {}
        for r in (
            bins.where((F.col("queue") != "") & F.col("op").isin("publish", *GAP_KINDS))
            .groupBy("run_id", "queue", "op", "bin")
            .agg(F.sum("count").alias("count"), F.min("min_ns").alias("min_ns"), F.max("max_ns").alias("max_ns"))
            .collect()
        ):
            series.setdefault((r.run_id, r.queue, r.op), []).append(Bin(r.bin, r["count"], r.min_ns, r.max_ns))
        events = fault_events(
            (r.run_id, r.ts_ns, r.detail) for r in ev.where(F.col("op") == "fault").select("run_id", "ts_ns", "detail").collect()
        )
        windows = fault_windows(events, run_end)
        drained = drained_queues(
            (r.run_id, r.queue, r.detail)
            for r in ev.where(F.col("op") == "drain").select("run_id", "queue", "detail").collect()
        )
        self._lap("bins_and_faults")

        # 2. per message
        red = F.coalesce(F.col("redelivered"), F.lit(False))
        op = F.col("op")

        def flag(o):
            return F.max(F.when(op == o, 1).otherwise(0)) == 1

        msgs = (
            ev.where(F.col("msg_id").isNotNull() & has_queue & op.isin(*MSG_OPS))
            .groupBy("run_id", "queue", "msg_id")
            .agg(
                F.min(F.when(op == "publish", ts)).alias("pub_ts"),
                F.count(F.when(op == "publish", 1)).alias("n_publish"),
                F.min(F.when(op == "confirm", ts)).alias("confirm_ts"),
                flag("nack").alias("nack"),
                flag("return").alias("returned"),
                F.count(F.when(op == "deliver", 1)).alias("n_deliver"),
                F.count(F.when((op == "deliver") & ~red, 1)).alias("n_unflagged"),
                F.min(F.when(op == "deliver", ts)).alias("first_ts"),
                F.min(F.when((op == "deliver") & ~red, ts)).alias("first_unflagged_ts"),
            )
        )
        published = F.col("pub_ts").isNotNull()
        confirmed = F.col("confirm_ts").isNotNull()
        nd = F.col("n_deliver")
        drained_keys = sorted(f"{run}\x00{queue}" for run, queue in drained)
        in_drained = (F.concat_ws("\x00", "run_id", "queue").isin(drained_keys) if drained_keys
                      else F.lit(False))
        undelivered = confirmed & ~F.col("returned") & (nd == 0)
        msgs = (
            msgs.withColumn("published", published)
            .withColumn("confirmed", confirmed)
            .withColumn("nacked", F.col("nack") & ~confirmed)
            .withColumn("unconfirmed", published & ~confirmed & ~F.col("nack") & ~F.col("returned"))
            .withColumn("lost", undelivered & in_drained)
            .withColumn("unread", undelivered & ~in_drained)
            .withColumn("unexpected", (nd > 0) & ~published)
            .withColumn(
                "repeats_without_redelivered",
                # the first delivery (earliest; unflagged before flagged at the same time) is no repeat
                F.when(nd > 1, F.col("n_unflagged") - F.when(F.col("first_unflagged_ts") == F.col("first_ts"), 1)
                       .otherwise(0)).otherwise(0),
            )
            # each publish may give one unflagged delivery: a republished message (its confirm lost) is
            # rightly delivered again without the flag; any more than that is a broker's duplicate
            .withColumn("unexplained", F.when(nd > 1, F.greatest(
                F.col("n_unflagged") - F.greatest(F.col("n_publish"), F.lit(1)), F.lit(0))).otherwise(0))
            .withColumn("confirm_lat", F.col("confirm_ts") - F.col("pub_ts"))
            .withColumn("e2e_lat", F.col("first_ts") - F.col("pub_ts"))
        )
        msgs = _with_window(self.spark, msgs, windows).persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(msgs)

        def n(c):
            return F.sum(F.when(c, 1).otherwise(0))

        pcts = F.array(*[F.lit(p) for p in PERCENTILES])
        agg_rows = (
            msgs.groupBy("run_id", "queue")
            .agg(
                n(published).alias("published"),
                n(confirmed).alias("confirmed"),
                n(F.col("nacked")).alias("nacked"),
                n(F.col("returned")).alias("returned"),
                n(F.col("unconfirmed")).alias("unconfirmed"),
                n(nd > 0).alias("delivered"),
                F.sum(nd).alias("deliveries"),
                n(F.col("lost")).alias("lost"),
                n(F.col("unread")).alias("unread"),
                F.sum(F.greatest(nd - 1, F.lit(0))).alias("duplicates"),
                F.sum("repeats_without_redelivered").alias("duplicates_without_redelivered"),
                F.sum("unexplained").alias("duplicates_unexplained"),
                n(F.col("unexpected")).alias("unexpected"),
                n(F.col("nacked") & (nd > 0)).alias("nacked_delivered"),
                n(F.col("returned") & (nd > 0)).alias("returned_delivered"),
                n(F.col("unconfirmed") & (nd > 0)).alias("unconfirmed_delivered"),
                F.percentile_approx("confirm_lat", pcts, PERCENTILE_ACCURACY).alias("confirm_pct"),
                F.max("confirm_lat").alias("confirm_max"),
                F.count("confirm_lat").alias("confirm_count"),
                F.percentile_approx("e2e_lat", pcts, PERCENTILE_ACCURACY).alias("e2e_pct"),
                F.max("e2e_lat").alias("e2e_max"),
                F.count("e2e_lat").alias("e2e_count"),
            )
            .collect()
        )
        self._lap("messages")
        self._frames["lost"] = msgs.where("lost").select(
            "run_id", "queue", "msg_id", F.shiftright("msg_id", 32).alias("publisher"),
            F.col("msg_id").bitwiseAND(SEQ_MAX).alias("seq"), F.col("pub_ts").alias("pub_ts_ns"),
            F.col("confirm_ts").alias("confirm_ts_ns"), "window",
        ).persist(StorageLevel.MEMORY_AND_DISK)
        self._frames["duplicates"] = msgs.where(nd > 1).select(
            "run_id", "queue", "msg_id", F.col("n_deliver").alias("deliveries"), "repeats_without_redelivered",
            "unexplained", F.col("first_ts").alias("first_ts_ns"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        self._frames["unexpected"] = msgs.where("unexpected").select(
            "run_id", "queue", "msg_id", F.col("n_deliver").alias("deliveries"), F.col("first_ts").alias("first_ts_ns"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        # offenders are few: kept apart, they are counted, listed and written without rescanning the messages
        self._persisted += [self._frames[k] for k in ("lost", "duplicates", "unexpected")]

        lost_by_window: dict[tuple[str, str], dict[str, int]] = {}
        for r in self._frames["lost"].groupBy("run_id", "queue", "window").count().collect():
            lost_by_window.setdefault((r.run_id, r.queue), {})[r.window] = r["count"]
        latency = []
        for r in (
            msgs.where(published)
            .groupBy("run_id", "queue", F.expr(f"pub_ts div {NS_PER_S}").alias("second"))
            .agg(
                F.count("confirm_lat").alias("confirm_count"),
                F.percentile_approx("confirm_lat", pcts, PERCENTILE_ACCURACY).alias("confirm_pct"),
                F.max("confirm_lat").alias("confirm_max"),
                F.count("e2e_lat").alias("e2e_count"),
                F.percentile_approx("e2e_lat", pcts, PERCENTILE_ACCURACY).alias("e2e_pct"),
                F.max("e2e_lat").alias("e2e_max"),
            )
            .orderBy("run_id", "queue", "second")
            .collect()
        ):
            for kind, prefix in (("confirm", "confirm"), ("e2e", "e2e")):
                if r[f"{prefix}_count"]:
                    p = r[f"{prefix}_pct"]
                    latency.append({"run_id": r.run_id, "queue": r.queue, "second": r.second, "kind": kind,
                                    "count": r[f"{prefix}_count"], "p50_ns": p[0], "p95_ns": p[1], "p99_ns": p[2],
                                    "max_ns": r[f"{prefix}_max"]})

        self._lap("lost_and_latency")
        # 3. reorders in each consumer's stream of one publisher's messages
        from pyspark.sql.window import Window

        deliveries = ev.where((op == "deliver") & ~red & F.col("msg_id").isNotNull() & has_queue).select(
            "run_id", "queue", "client_id", "client_seq", "msg_id",
            F.shiftright("msg_id", 32).alias("publisher"), F.col("msg_id").bitwiseAND(SEQ_MAX).alias("seq"),
        )
        stream = Window.partitionBy("run_id", "queue", "client_id", "publisher").orderBy("client_seq")
        # a message that comes back behind later ones because it was published again is explained
        republished = msgs.where(F.col("n_publish") > 1).select("run_id", "queue", "msg_id", F.lit(True).alias("rp"))
        reorders = (
            deliveries.withColumn("prev_seq", F.lag("seq").over(stream))
            .withColumn("prev_msg_id", F.lag("msg_id").over(stream))
            .where(F.col("seq") < F.col("prev_seq"))
            .join(republished, ["run_id", "queue", "msg_id"], "left")
            .select("run_id", "queue", "client_id", "publisher", "client_seq", "msg_id", "seq", "prev_msg_id", "prev_seq",
                    F.coalesce(F.col("rp"), F.lit(False)).alias("republished"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self._persisted.append(reorders)
        self._frames["reorders"] = reorders
        reordered = {(r.run_id, r.queue): (r["count"], r["unexplained"]) for r in reorders.groupBy("run_id", "queue").agg(
            F.count(F.lit(1)).alias("count"), F.sum(F.when(F.col("republished"), 0).otherwise(1)).alias("unexplained"),
        ).collect()}
        self._lap("reorders")

        # the summary, per run and queue
        f = Findings(summary={"runs": {}}, faults=events, windows=windows, throughput=throughput, latency=latency)
        per_queue = {k: empty_summary() for k in queues}
        for r in agg_rows:
            s = per_queue.setdefault((r.run_id, r.queue), empty_summary())
            for k in SUMMARY_INT_FIELDS:
                if k in r.asDict():
                    s[k] = int(r[k] or 0)
            s["confirm_latency_ms"] = _latency(r.confirm_pct, r.confirm_max, r.confirm_count)
            s["e2e_latency_ms"] = _latency(r.e2e_pct, r.e2e_max, r.e2e_count)
        for (run, queue), s in per_queue.items():
            s["drained"] = int((run, queue) in drained)
            s["reordered"], s["reordered_unexplained"] = (int(x) for x in reordered.get((run, queue), (0, 0)))
            s["lost_by_window"] = lost_by_window.get((run, queue), {})
            s.setdefault("confirm_latency_ms", _latency(None, None, 0))
            s.setdefault("e2e_latency_ms", _latency(None, None, 0))
            gaps = []
            for kind in GAP_KINDS:
                gaps += gaps_from_bins(run, queue, kind, series.get((run, queue, kind), []),
                                       series.get((run, queue, "publish"), []), run_end[run], self.gap_ns, events)
            f.gaps += gaps
            s.update(gap_fields(gaps))
            f.summary["runs"].setdefault(run, {"queues": {}})["queues"][queue] = s
        for run in f.summary["runs"]:
            f.summary["runs"][run]["faults"] = [w.__dict__ for w in windows if w.run_id == run]
        f.summary["queues"] = by_queue_name(f.summary)
        for name in ("lost", "duplicates", "unexpected", "reorders"):
            rows = self._frames[name].orderBy("run_id", "queue", "msg_id").limit(self.examples_max).collect()
            setattr(f, name, [r.asDict() for r in rows])
        self._lap("examples")
        return f

    def write_tables(self, out: Path) -> None:
        """The potentially large tables, written by the executors as Parquet directories."""
        self._t = time.monotonic()
        for name, df in self._frames.items():
            df.write.mode("overwrite").parquet(str(out / f"{name}.parquet"))
        self._lap("write_tables")

    def close(self) -> None:
        for df in self._persisted:
            df.unpersist()
        self._persisted.clear()


def _with_window(spark, msgs, windows: list[FaultWindow]):
    """`msgs` with the fault window each message was published in (`window`): of the windows
    open at its publish, the latest opened; a range join with the windows as a broadcast table
    (one CASE expression over every window of every run outgrew what Spark compiles once a
    hundred runs were checked together)."""
    from pyspark.sql import functions as F

    outside = F.when(F.col("pub_ts").isNull(), F.lit(UNKNOWN_WINDOW)).otherwise(F.lit(HEALTHY))
    if not windows:
        return msgs.withColumn("window", outside)
    ranked = sorted(windows, key=lambda w: w.start_ns, reverse=True)  # stable: ties keep their order
    wdf = spark.createDataFrame([(w.run_id, w.start_ns, w.end_ns, w.name, i) for i, w in enumerate(ranked)],
                                "w_run string, w_start long, w_end long, w_name string, w_rank int")
    key = ["run_id", "queue", "msg_id"]
    m = msgs.select(*key, "pub_ts").where(F.col("pub_ts").isNotNull())
    hit = (m.join(F.broadcast(wdf), (m.run_id == wdf.w_run) & (m.pub_ts >= wdf.w_start) & (m.pub_ts < wdf.w_end))
           .groupBy(*key).agg(F.min_by("w_name", "w_rank").alias("w_name")))
    return (msgs.join(hit, key, "left")
            .withColumn("window", F.coalesce(F.col("w_name"), outside)).drop("w_name"))


def _latency(pct, max_ns, count) -> dict:
    out = {}
    for i, p in enumerate(PERCENTILES):
        out[f"p{round(p * 100)}"] = None if not count or pct is None else pct[i] / NS_PER_MS
    out["max"] = None if not count or max_ns is None else max_ns / NS_PER_MS
    out["count"] = int(count or 0)
    return out


# -- writing the results -------------------------------------------------------------------


def write_small_tables(findings: Findings, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([g.as_row() for g in findings.gaps] or [], schema=_GAP_SCHEMA()), out / "gaps.parquet")
    pq.write_table(pa.Table.from_pylist(findings.throughput, schema=_THROUGHPUT_SCHEMA()), out / "throughput.parquet")
    pq.write_table(pa.Table.from_pylist(findings.latency, schema=_LATENCY_SCHEMA()), out / "latency.parquet")
    outcome_rows = []
    for run, r in findings.summary["runs"].items():
        for queue, s in r["queues"].items():
            for outcome in ("confirmed", "nacked", "returned", "unconfirmed"):
                delivered = (s["confirmed"] - s["lost"] - s["unread"] - s["returned"] if outcome == "confirmed"
                             else s[f"{outcome}_delivered"])
                total = s[outcome]
                outcome_rows.append({"run_id": run, "queue": queue, "outcome": outcome, "messages": total,
                                     "delivered": delivered, "not_delivered": total - delivered})
    pq.write_table(pa.Table.from_pylist(outcome_rows, schema=_OUTCOME_SCHEMA()), out / "outcomes.parquet")


def _GAP_SCHEMA():
    import pyarrow as pa

    return pa.schema([("run_id", pa.string()), ("queue", pa.string()), ("kind", pa.string()), ("start_ns", pa.int64()),
                      ("end_ns", pa.int64()), ("gap_ms", pa.float64()), ("recovered", pa.bool_()), ("cause", pa.string()),
                      ("fault_ts_ns", pa.int64()), ("recovery_ms", pa.float64())])


def _THROUGHPUT_SCHEMA():
    import pyarrow as pa

    return pa.schema([("run_id", pa.string()), ("queue", pa.string()), ("second", pa.int64()), ("op", pa.string()),
                      ("count", pa.int64())])


def _LATENCY_SCHEMA():
    import pyarrow as pa

    return pa.schema([("run_id", pa.string()), ("queue", pa.string()), ("second", pa.int64()), ("kind", pa.string()),
                      ("count", pa.int64()), ("p50_ns", pa.int64()), ("p95_ns", pa.int64()), ("p99_ns", pa.int64()),
                      ("max_ns", pa.int64())])


def _OUTCOME_SCHEMA():
    import pyarrow as pa

    return pa.schema([("run_id", pa.string()), ("queue", pa.string()), ("outcome", pa.string()), ("messages", pa.int64()),
                      ("delivered", pa.int64()), ("not_delivered", pa.int64())])


def history_bytes(history_dir: Path) -> int:
    return sum(p.stat().st_size for p in history_files(history_dir))


def format_summary(summary: dict) -> str:
    cols = ("published", "confirmed", "delivered", "lost", "unread", "drained", "duplicates", "duplicates_without_redelivered",
            "duplicates_unexplained", "unexpected", "reordered", "reordered_unexplained", "unconfirmed", "nacked", "gaps",
            "max_gap_ms")
    short = {"duplicates_without_redelivered": "dup_no_flag", "duplicates_unexplained": "dup_unexpl",
             "reordered_unexplained": "reord_unexpl"}
    header = ["run", "queue"] + [short.get(c, c) for c in cols]
    rows = [header]
    for run, r in sorted(summary["runs"].items()):
        for queue, s in sorted(r["queues"].items()):
            rows.append([run, queue] + [str(s[c]) for c in cols])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True)))
                     for row in rows)


@click.command(name="check", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("history_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where summary.json, the tables and report.html go [default: HISTORY_DIR/_check].")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--expect", "expects", multiple=True, metavar="FIELD OP N",
              help="A promise every queue of every run must keep, e.g. lost=0, max_gap_ms<=5000. Repeatable.")
@click.option("--gap-ms", type=float, default=1000.0, show_default=True,
              help="Report stalls of deliveries or confirms longer than this.")
@click.option("--shuffle-partitions", type=int, default=None, help="spark.sql.shuffle.partitions [default: by history size].")
@click.option("--driver-memory", default="2g", show_default=True)
@click.option("--examples", type=int, default=EXAMPLES_DEFAULT, show_default=True,
              help="How many lost/duplicate/unexpected/reordered messages the report lists.")
@click.option("--report/--no-report", default=True, show_default=True, help="Render report.html with plots.")
def cli(history_dir: Path, out_dir: Path | None, master: str, expects: tuple[str, ...], gap_ms: float,
        shuffle_partitions: int | None, driver_memory: str, examples: int, report: bool) -> None:
    """Check the history under HISTORY_DIR: losses, duplicates, reorders, stalls, latency."""
    try:
        expectations = [Expectation.parse(e) for e in expects]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--expect") from e
    if not history_files(history_dir):
        raise click.ClickException(f"no history files (*.parquet) under {history_dir}")
    out = out_dir or history_dir / "_check"
    out.mkdir(parents=True, exist_ok=True)
    size = history_bytes(history_dir)
    if shuffle_partitions is None:
        shuffle_partitions = max(4, min(200, size // (32 * 1024 * 1024)))

    from hutch.pipeline.spark import session

    t0 = time.monotonic()
    spark = session(master=master, shuffle_partitions=shuffle_partitions, driver_memory=driver_memory,
                    quick_jvm=size < QUICK_JVM_BYTES_MAX)
    t_session = time.monotonic() - t0
    job = SparkCheck(spark, history_dir, gap_ms=gap_ms, examples_max=examples)
    try:
        findings = job.run()
        job.write_tables(out)
    finally:
        job.close()
    t_job = time.monotonic() - t0 - t_session
    summary = findings.summary
    summary["history"] = str(history_dir)
    summary["gap_ms"] = gap_ms
    summary["master"] = master
    summary["timing_s"] = {"session": round(t_session, 2), "job": round(t_job, 2), "steps": job.timings_s}
    broken = [line for e in expectations for line in e.broken_by(summary)]
    summary["expectations"] = {"checked": [str(e) for e in expectations], "broken": broken}
    write_small_tables(findings, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False, default=str))
    if report:
        from hutch.pipeline.report import write_report

        write_report(findings, out / "report.html", title=f"hutch check: {history_dir}", gap_ms=gap_ms)
    spark.stop()
    click.echo(format_summary(summary))
    click.echo(f"results in {out} (Spark session {t_session:.1f} s, job {t_job:.1f} s)")
    if broken:
        for line in broken:
            click.echo(f"BROKEN: {line}", err=True)
        sys.exit(1)
    if expectations:
        click.echo(f"all {len(expectations)} expectations hold")
