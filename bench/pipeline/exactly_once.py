"""What the exactly-once demo computes and checks, as Spark expressions (`make pipeline-demo`).

Every input message is one `hutch perf --protocol stream` wrote: its body starts with the
publish time (ns) and the message id, two big-endian 64-bit integers (`hutch.lab.streamperf`'s
stamp). The job puts each message in one of `BUCKETS` buckets by its id and writes

- to Parquet, per micro-batch and bucket: the number of messages and the sum of their ids
  (`aggregate`), one directory per batch id, overwritten when a batch is run again;
- back to a hutch stream, one message per input message: its id as text for a body, its
  bucket for a routing key (`forward`).

The check (`tally`) reads the input stream, the Parquet output (through Spark, which skips the
files of an attempt that was killed) and the output stream, and counts per output what was
lost and what came twice. An aggregate cannot name a message, so for Parquet a bucket holding
fewer messages than the input counts the difference as lost, one holding more as duplicates,
and a bucket whose id sum differs while its count agrees counts as both (a message replaced
by another). `problems` turns the counts into the lines the demo fails with.
"""

from __future__ import annotations

from typing import Any

BUCKETS = 64
ID_OFFSET = 8  # the message id follows the publish time in the stamp


def message_id(body):
    """The message id of a `hutch perf` body (a binary column), as a long."""
    from pyspark.sql import functions as F

    return F.conv(F.hex(F.substring(body, ID_OFFSET + 1, 8)), 16, 10).cast("long")


def bucket(msg_id):
    from pyspark.sql import functions as F

    return F.pmod(msg_id, F.lit(BUCKETS)).cast("int")


def input_ids(df):
    """(msg_id, bucket) of every row of a hutch source's DataFrame."""
    from pyspark.sql import functions as F

    ids = df.select(message_id(F.col("body")).alias("msg_id"))
    return ids.select("msg_id", bucket(F.col("msg_id")).alias("bucket"))


def aggregate(ids):
    """Per bucket: messages and the sum of their ids (the Parquet output of one micro-batch)."""
    from pyspark.sql import functions as F

    return ids.groupBy("bucket").agg(F.count(F.lit(1)).alias("messages"), F.sum("msg_id").alias("id_sum"))


def forward(ids):
    """The rows written back to a hutch stream: the id as the body, the bucket as routing key."""
    from pyspark.sql import functions as F

    return ids.select(F.col("msg_id").cast("string").cast("binary").alias("body"),
                      F.col("bucket").cast("string").alias("routing_key"))


def output_ids(df):
    """The message ids of the stream `forward` wrote (a hutch source's DataFrame over it)."""
    from pyspark.sql import functions as F

    return df.select(F.col("body").cast("string").cast("long").alias("msg_id"))


def tally(inputs, parquet, outputs) -> dict[str, Any]:
    """Counts of the input (`input_ids` rows), of the Parquet aggregates (rows of `aggregate` from
    every batch) and of the output stream (`output_ids` rows)."""
    from pyspark.sql import functions as F

    inputs = inputs.cache()
    try:
        row = inputs.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("msg_id").alias("d")).first()
        t: dict[str, Any] = {"input": {"messages": row["n"], "distinct": row["d"]}}

        expected = aggregate(inputs).withColumnRenamed("messages", "in_messages").withColumnRenamed("id_sum", "in_sum")
        got = parquet.groupBy("bucket").agg(F.sum("messages").alias("out_messages"), F.sum("id_sum").alias("out_sum"))
        diff = (expected.join(got, "bucket", "full_outer").na.fill(0)
                .select((F.col("out_messages") - F.col("in_messages")).alias("d"),
                        ((F.col("out_messages") == F.col("in_messages"))
                         & (F.col("out_sum") != F.col("in_sum"))).cast("int").alias("swapped"),
                        F.col("out_messages")))
        row = diff.agg(F.sum("out_messages").alias("messages"),
                       F.sum(F.when(F.col("d") < 0, -F.col("d")).otherwise(0)).alias("lost"),
                       F.sum(F.when(F.col("d") > 0, F.col("d")).otherwise(0)).alias("duplicates"),
                       F.sum("swapped").alias("swapped"),
                       F.sum((F.col("d") != 0).cast("int")).alias("buckets_off")).first()
        t["parquet"] = {"messages": row["messages"] or 0, "lost": (row["lost"] or 0) + (row["swapped"] or 0),
                        "duplicates": (row["duplicates"] or 0) + (row["swapped"] or 0),
                        "buckets_off": (row["buckets_off"] or 0) + (row["swapped"] or 0),
                        "batches": parquet.select("batch_id").distinct().count() if "batch_id" in parquet.columns
                        else None}

        outputs = outputs.cache()
        try:
            row = outputs.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("msg_id").alias("d")).first()
            lost = inputs.select("msg_id").distinct().join(outputs, "msg_id", "left_anti").count()
            unexpected = outputs.join(inputs.select("msg_id"), "msg_id", "left_anti").count()
            t["stream"] = {"messages": row["n"], "distinct": row["d"], "lost": lost,
                           "duplicates": row["n"] - row["d"], "unexpected": unexpected}
        finally:
            outputs.unpersist()
    finally:
        inputs.unpersist()
    return t


def problems(t: dict[str, Any], published: int | None = None) -> list[str]:
    """What is wrong in a `tally`, one line each; empty when every input message is in each output once."""
    out = []
    inp = t["input"]
    if inp["messages"] != inp["distinct"]:
        out.append(f"the input stream holds {inp['messages'] - inp['distinct']:,} messages twice")
    if published is not None and inp["distinct"] != published:
        out.append(f"the input stream holds {inp['distinct']:,} messages, {published:,} were confirmed")
    for name, label in (("parquet", "Parquet"), ("stream", "output stream")):
        o = t[name]
        if o["lost"]:
            out.append(f"{label}: {o['lost']:,} input messages missing")
        if o["duplicates"]:
            out.append(f"{label}: {o['duplicates']:,} duplicates")
        if o.get("unexpected"):
            out.append(f"{label}: {o['unexpected']:,} messages that are not in the input")
    return out
