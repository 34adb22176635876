"""The Spark connector (format "hutch", docs/spark.md) against a real hutch node.

One node and the session-wide SparkSession serve every test: batch and streaming reads of a
stream and of a super stream's partitions, a query resumed from its checkpoint reading exactly
the new messages (Trigger.AvailableNow, maxMessagesPerTrigger) and the stream sink's
deduplication of the micro-batch it replays, the offsets a commit stores on the server, the
exchange sink, the queue source's acknowledgements after commit, and the errors bad input
gives at query start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pika
import pytest

from hutch.streamclient import StreamClient, StreamEndpoint
from hutch.streamproto import frames as f
from tests.support.brokers import HutchNode, free_port, wait_until
from tests.support.stream_client import chunk_bodies, create, publish_chunks, raw, run, unique

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

QUERY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def node():
    with HutchNode() as n:
        yield n


@pytest.fixture(scope="module")
def hspark(spark):
    import hutch.spark

    hutch.spark.register(spark)
    return spark


def uri(node) -> str:
    return f"hutch-stream://guest:guest@127.0.0.1:{node.stream_port}"


def new_stream(node, batches: list[list[str]]) -> str:
    name = unique("spark")
    with raw(node) as c:
        create(c, name)
        if batches:
            publish_chunks(c, name, batches)
    return name


def append(node, stream: str, texts: list[str]) -> None:
    with raw(node) as c:
        publish_chunks(c, stream, [texts])


def stream_bodies(node, stream: str) -> list[bytes]:
    """Every body the stream holds, in order."""
    async def read():
        c = await StreamClient.connect(StreamEndpoint("127.0.0.1", node.stream_port), "test-reader")
        try:
            _first, end, _ts = await c.end_of(stream)
            out = []
            async for _h, chunk in c.read_range(stream, 0, end):
                out.extend(chunk_bodies(bytes(chunk)))
            return out
        finally:
            await c.close()
    return run(read())


def stored_offset(node, consumer: str, stream: str):
    async def query():
        c = await StreamClient.connect(StreamEndpoint("127.0.0.1", node.stream_port), "test-offsets")
        try:
            return await c.query_offset(consumer, stream)
        finally:
            await c.close()
    return run(query())


def reader(hspark, node, stream: str, streaming: bool = False, **options):
    r = (hspark.readStream if streaming else hspark.read).format("hutch").option("uri", uri(node)).option("stream", stream)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df, out: Path, cp: Path):
    """One availableNow run into Parquet; its progress records."""
    q = (df.selectExpr("stream", "partition", "offset", "CAST(body AS STRING) AS body").writeStream
         .format("parquet").option("path", str(out)).option("checkpointLocation", str(cp))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not end"
    return q.recentProgress


# ---------------------------------------------------------------- source


def test_batch_read_gives_every_column_of_every_message(hspark, node):
    name = unique("spark")
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(headers={"n": i}))
    finally:
        conn.close()
    df = reader(hspark, node, name)
    assert [(fd.name, fd.dataType.simpleString()) for fd in df.schema.fields] == [
        ("stream", "string"), ("partition", "int"), ("offset", "bigint"), ("timestamp", "timestamp"),
        ("routing_key", "string"), ("properties", "map<string,string>"), ("body", "binary")]
    rows = df.orderBy("offset").collect()
    assert [(r.stream, r.partition, r.offset, r.routing_key, r.properties, bytes(r.body)) for r in rows] == [
        (name, 0, i, name, {"n": str(i)}, f"m{i}".encode()) for i in range(5)]
    assert all(r.timestamp is not None for r in rows)
    # a range of it
    part = reader(hspark, node, name, startingOffsets=json.dumps({name: 1}), endingOffsets=json.dumps({name: 3}))
    assert sorted(r.offset for r in part.collect()) == [1, 2]
    # from a time: the first chunk written at or after it
    assert reader(hspark, node, name, startingOffsets="2000-01-01T00:00:00Z").count() == 5
    assert reader(hspark, node, name, startingOffsets="2999-01-01T00:00:00Z").count() == 0


def test_a_restarted_query_reads_exactly_the_new_messages_and_writes_a_replayed_batch_once(hspark, node, tmp_path):
    """Stream to stream with Trigger.AvailableNow and maxMessagesPerTrigger; between the two
    runs, the checkpoint loses its last commit, as when the driver dies after the sink published
    a batch and before Spark recorded it: the second run writes that batch again (the same batch
    id, the same rows), then the new messages, and the target holds every message once."""
    name = new_stream(node, [[f"a{i}" for i in range(10)], [f"a{i}" for i in range(10, 20)]])
    target = new_stream(node, [])
    cp = tmp_path / "cp"

    def run_once():
        df = reader(hspark, node, name, streaming=True, startingOffsets="earliest", consumerName="resume-test",
                    maxMessagesPerTrigger=12)
        q = (df.select("body", "routing_key", "properties").writeStream.format("hutch")
             .option("uri", uri(node)).option("stream", target).option("checkpointLocation", str(cp))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not end"
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]], q.lastProgress

    counts, _last = run_once()
    assert counts == [12, 8]  # what was there when it started, in micro-batches of at most 12
    assert sorted(stream_bodies(node, target)) == sorted(f"a{i}".encode() for i in range(20))
    for f_ in ("1", ".1.crc"):  # the commit and its checksum file
        (cp / "commits" / f_).unlink(missing_ok=True)
    append(node, name, [f"b{i}" for i in range(7)])
    counts, last = run_once()
    assert counts == [8, 7]  # batch 1 again, then exactly the new messages
    assert json.loads(last["sources"][0]["endOffset"]) == {name: 27}
    got = stream_bodies(node, target)
    assert sorted(got) == sorted([f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(7)])
    # the commits reached the server (RabbitMQ's meaning: the last offset processed); Spark
    # commits a run's last batch when the query next starts, so the server may be a batch behind
    assert stored_offset(node, "resume-test", name) in (11, 19, 26)
    tracking = subprocess.run([sys.executable, "-c", "from hutch.cli.streams import main; main()",
                               "list_stream_tracking", name, "--offset", "--url", node.mgmt_url,
                               "--formatter", "json"], capture_output=True, text=True, timeout=60)
    assert "resume-test" in tracking.stdout, tracking.stdout + tracking.stderr


def test_super_stream_partitions_become_spark_partitions(hspark, node, tmp_path):
    name = unique("super")
    parts = [f"{name}-{i}" for i in range(3)]
    with raw(node) as c:
        assert c.call(f.CreateSuperStream(c.cid(), name, parts, ["0", "1", "2"], {})).code == f.OK
        for i, p in enumerate(parts):
            publish_chunks(c, p, [[f"{p}-{j}" for j in range(i + 2)]])
    df = reader(hspark, node, name)
    assert df.rdd.getNumPartitions() == 3
    got = sorted((r.stream, r.partition, r.offset) for r in df.collect())
    assert got == sorted((p, i, j) for i, p in enumerate(parts) for j in range(i + 2))
    # streaming, from offsets given per partition
    start = json.dumps({parts[0]: 1, parts[2]: 3})
    sdf = reader(hspark, node, name, streaming=True, startingOffsets=start)
    run_available_now(sdf, tmp_path / "out", tmp_path / "cp")
    rows = hspark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted((r.stream, r.offset) for r in rows) == [(parts[0], 1), (parts[1], 0), (parts[1], 1),
                                                           (parts[1], 2), (parts[2], 3)]


# ---------------------------------------------------------------- sink


def test_exchange_sink_publishes_rows_with_routing_key_and_headers(hspark, node):
    q = unique("sinkq")
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        df = hspark.createDataFrame([(f"e{i}", q, {"k": str(i)}) for i in range(6)],
                                    "body string, routing_key string, properties map<string,string>")
        df.write.format("hutch").option("uri", node.url).option("exchange", "").mode("append").save()
        got = []
        for _ in range(6):
            method, props, body = ch.basic_get(q, auto_ack=True)
            assert method is not None
            got.append((body.decode(), props.headers))
        assert sorted(got) == [(f"e{i}", {"k": str(i)}) for i in range(6)]
    finally:
        conn.close()


# ---------------------------------------------------------------- the queue source


def queue_counts(node, q: str) -> tuple[int, int]:
    with urllib.request.urlopen(urllib.request.Request(
            f"{node.mgmt_url}/api/queues/%2F/{q}",
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}), timeout=10) as r:
        d = json.load(r)
    return d.get("messages_ready", 0), d.get("messages_unacknowledged", 0)


def test_queue_source_acknowledges_after_the_batch_and_a_stopped_query_gives_its_messages_back(hspark, node, tmp_path):
    """At least once: a micro-batch's messages stay unacknowledged until Spark has recorded it;
    a query stopped before then gives them back to the queue, and the next run gets them again."""
    q = unique("srcq")
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(15):
            ch.basic_publish("", q, f"q{i}".encode())
    finally:
        conn.close()

    def start(table: str, every: str):
        df = hspark.readStream.format("hutch").option("uri", node.url).option("queue", q).load()
        return (df.selectExpr("CAST(body AS STRING) AS body").writeStream.format("memory").queryName(table)
                .trigger(processingTime=every).start())

    def rows(table: str) -> list[str]:
        return sorted(r.body for r in hspark.table(table).collect())

    every_message = sorted(f"q{i}" for i in range(15))
    # a first batch, then no next one for an hour: its messages are written and not yet acknowledged
    first = start("first_run", "1 hour")
    try:
        wait_until(lambda: rows("first_run") == every_message, QUERY_TIMEOUT_S, "15 rows from the queue")
        assert queue_counts(node, q) == (0, 15)
    finally:
        first.stop()
    wait_until(lambda: queue_counts(node, q) == (15, 0), QUERY_TIMEOUT_S, "the messages back in the queue")
    # the next run reads them again; its next trigger acknowledges them
    second = start("second_run", "500 milliseconds")
    try:
        wait_until(lambda: rows("second_run") == every_message, QUERY_TIMEOUT_S, "15 rows again")
        wait_until(lambda: queue_counts(node, q) == (0, 0), QUERY_TIMEOUT_S, "the queue emptied by acks")
    finally:
        second.stop()


# ---------------------------------------------------------------- errors at query start


def _error(fn) -> str:
    with pytest.raises(Exception) as e:  # noqa: B017 - Spark wraps the source's error in its own kinds
        fn()
    return str(e.value)


def test_bad_input_fails_at_query_start_with_a_clear_error(hspark, node):
    name = new_stream(node, [["x0", "x1"]])
    good = uri(node)

    def batch(u=good, stream=name, **options):
        r = hspark.read.format("hutch").option("uri", u).option("stream", stream)
        for k, v in options.items():
            r = r.option(k, v)
        return lambda: r.load().collect()

    assert "stream 'nosuch' does not exist" in _error(batch(stream="nosuch"))
    assert "unsupported URI scheme 'http'" in _error(batch(u="http://127.0.0.1:1"))
    assert "authentication failed for user 'guest'" in _error(batch(u=good.replace("guest:guest", "guest:wrong")))
    assert "cannot reach hutch's stream port" in _error(batch(u=f"hutch-stream://guest:guest@127.0.0.1:{free_port()}"))
    assert f"offset 5 of stream '{name}' is past its end (2" in _error(batch(startingOffsets=json.dumps({name: 5})))
    assert "option startingOffsets: 'soonest' is not" in _error(batch(startingOffsets="soonest"))
    assert "option maxMessagesPerTrigger: 'many' is not a whole number" in _error(batch(maxMessagesPerTrigger="many"))
    # a streaming query with an unknown stream ends at once, with the same error
    q = (reader(hspark, node, "nosuch", streaming=True).writeStream.format("memory").queryName("nosuch_q")
         .trigger(availableNow=True).start())
    assert "stream 'nosuch' does not exist" in _error(lambda: q.awaitTermination(QUERY_TIMEOUT_S))
    # a sink to an unknown stream or exchange fails before any task runs
    df = hspark.createDataFrame([("b",)], "body string")
    assert "stream 'nosuch' does not exist" in _error(
        lambda: df.write.format("hutch").option("uri", good).option("stream", "nosuch").mode("append").save())
    assert "exchange 'nosuch': 404 NOT_FOUND" in _error(
        lambda: df.write.format("hutch").option("uri", node.url).option("exchange", "nosuch").mode("append").save())
    assert "column 'body'" in _error(
        lambda: hspark.createDataFrame([(1,)], "n int").write.format("hutch").option("uri", good)
        .option("stream", name).mode("append").save())
