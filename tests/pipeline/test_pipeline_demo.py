"""The exactly-once demo's check (`bench/pipeline/exactly_once.py`) on small hand-made outputs:
it must find a message lost, a message twice, and a batch written twice under another batch id,
in the Parquet aggregates and in the output stream, and nothing in a clean run. The demo itself
(`make pipeline-demo`, minutes of a 3-node lab and a Spark job) runs outside the test suite."""

from __future__ import annotations

import json
import struct

import pytest
from bench.pipeline import exactly_once as eo
from bench.pipeline.demo import JobProgress

pytestmark = pytest.mark.spark

IDS = list(range(1, 201)) + [(1 << 32) + i for i in range(1, 51)]  # two producers' ids


def _body(msg_id: int) -> bytes:
    return struct.pack(">QQ", 1_700_000_000_000_000_000, msg_id) + bytes(16)


def _inputs(spark, ids):
    """`input_ids` of a source whose rows hold these messages."""
    return eo.input_ids(spark.createDataFrame([(_body(i),) for i in ids], "body binary"))


def _parquet(spark, ids, batches):
    """`aggregate` of each batch of ids, with its batch id, as the job writes them."""
    from functools import reduce

    from pyspark.sql import functions as F

    frames = [eo.aggregate(_inputs(spark, b)).withColumn("batch_id", F.lit(n)) for n, b in enumerate(batches)]
    return reduce(lambda a, b: a.unionByName(b), frames)


def _stream(spark, ids):
    rows = eo.forward(_inputs(spark, ids)).collect()
    return eo.output_ids(spark.createDataFrame(rows))


def test_message_id_is_read_from_the_perf_stamp_and_forwarded_as_text(spark):
    ids = _inputs(spark, [7, (3 << 32) + 9]).collect()
    assert [(r.msg_id, r.bucket) for r in ids] == [(7, 7), ((3 << 32) + 9, ((3 << 32) + 9) % eo.BUCKETS)]
    out = eo.forward(spark.createDataFrame([(7, 7)], "msg_id long, bucket int")).first()
    assert (bytes(out.body), out.routing_key) == (b"7", "7")


def test_a_clean_run_has_nothing_to_report(spark):
    inputs = _inputs(spark, IDS)
    t = eo.tally(inputs, _parquet(spark, IDS, [IDS[:120], IDS[120:]]), _stream(spark, IDS))
    assert t["input"] == {"messages": len(IDS), "distinct": len(IDS)}
    assert t["parquet"] == {"messages": len(IDS), "lost": 0, "duplicates": 0, "buckets_off": 0, "batches": 2}
    assert t["stream"] == {"messages": len(IDS), "distinct": len(IDS), "lost": 0, "duplicates": 0, "unexpected": 0}
    assert eo.problems(t, published=len(IDS)) == []


def test_a_batch_run_twice_a_lost_message_and_a_stranger_are_each_found(spark):
    inputs = _inputs(spark, IDS)
    replayed = [IDS[:120], IDS[120:], IDS[120:130]]  # the last ten again, under a batch id of their own
    lost = [i for i in IDS if i != 5]
    t = eo.tally(inputs, _parquet(spark, lost, [lost[:119], lost[119:]] + replayed[2:]),
                 _stream(spark, IDS + [IDS[3], 999_999]))
    assert (t["parquet"]["lost"], t["parquet"]["duplicates"]) == (1, 10)
    assert t["stream"] == {"messages": len(IDS) + 2, "distinct": len(IDS) + 1, "lost": 0, "duplicates": 1,
                           "unexpected": 1}
    assert eo.problems(t, published=len(IDS)) == [
        "Parquet: 1 input messages missing", "Parquet: 10 duplicates",
        "output stream: 1 duplicates", "output stream: 1 messages that are not in the input"]


def test_a_message_swapped_for_another_in_the_same_bucket_counts_as_lost_and_twice(spark):
    inputs = _inputs(spark, IDS)
    swapped = [i for i in IDS if i != 10] + [10 + eo.BUCKETS]  # same bucket, same count, another id
    t = eo.tally(inputs, _parquet(spark, swapped, [swapped]), _stream(spark, IDS))
    assert (t["parquet"]["lost"], t["parquet"]["duplicates"]) == (1, 1)


def test_job_progress_counts_a_batch_run_again_once(tmp_path):
    path = tmp_path / "progress.jsonl"
    lines = [{"query": "forward", "batch": 0, "rows": 0}, {"query": "forward", "batch": 1, "rows": 500},
             {"query": "aggregate", "batch": 1, "rows": 500}, {"query": "forward", "batch": 1, "rows": 500}]
    progress = JobProgress()
    path.write_text("".join(json.dumps(x) + "\n" for x in lines[:2]) + '{"query": "forw')  # a line half written
    progress.feed(path)
    assert (progress.rows("forward"), progress.count("forward")) == (500, 2)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    progress.feed(path)
    assert (progress.rows("forward"), progress.count("forward"), progress.rows("aggregate")) == (500, 2, 500)
