"""Writing Spark rows to hutch: to a stream (stream protocol) or to an exchange (AMQP 0-9-1).

A row is `body` (binary or string), optionally `routing_key` (string) and `properties`
(map<string,string>); other columns are ignored. Every writer waits for the broker's confirm of
every message it sent before its task succeeds, and raises on a publish error, a nack, a lost
connection or a confirm that does not come, so Spark retries the task: a micro-batch counts as
written only when all of it is confirmed.

Into a stream, a streaming query's micro-batches are written exactly once. Each Spark task
publishes under its own publisher reference, `<producerName>-<partition id>` (producerName
defaults to a digest of the checkpoint location: one per query), with publishing ids
`batch id << 32 | row number` (rows counted from 1 within the task). The broker keeps the
highest id it stored per reference and drops, but confirms, any message at or below it, so a
micro-batch replayed after a failure, with the same batch id and, from a replayable source,
the same rows in the same partitions, adds nothing already there. A batch write (`df.write`)
has no batch id to derive ids from and publishes without a reference: at least once. So is
every write to an exchange: AMQP 0-9-1 has no deduplication. An exchange is written over
aiormq, with up to a thousand confirms outstanding per task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from hutch.pipeline.connector import streams as st
from hutch.pipeline.connector.options import ConnectorError, Options

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # the local property Spark sets on a micro-batch's tasks
ROW_BITS = 32
CONFIRM_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0


class Written(WriterCommitMessage):
    def __init__(self, partition: int, messages: int):
        self.partition = partition
        self.messages = messages


def check_schema(schema: StructType) -> None:
    """The columns a sink reads, with the types it takes: an error before any task runs."""
    fields = {fd.name: fd.dataType for fd in schema.fields}
    if "body" not in fields:
        raise ConnectorError(f"the hutch sink writes a column 'body' (binary or string); the rows have "
                             f"{', '.join(fields) or 'no columns'}")
    if not isinstance(fields["body"], (BinaryType, StringType)):
        raise ConnectorError(f"column body: binary or string, not {fields['body'].simpleString()}")
    if "routing_key" in fields and not isinstance(fields["routing_key"], StringType):
        raise ConnectorError(f"column routing_key: string, not {fields['routing_key'].simpleString()}")
    p = fields.get("properties")
    if p is not None and not (isinstance(p, MapType) and isinstance(p.keyType, StringType)):
        raise ConnectorError(f"column properties: map<string,string>, not {p.simpleString()}")


def _rows(batch: pa.RecordBatch) -> Iterator[tuple[bytes, str | None, dict | None]]:
    names = batch.schema.names
    bodies = batch.column(names.index("body")).to_pylist()
    keys = batch.column(names.index("routing_key")).to_pylist() if "routing_key" in names else None
    props = batch.column(names.index("properties")).to_pylist() if "properties" in names else None
    for i, body in enumerate(bodies):
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode()
        p = props[i] if props is not None else None
        if p:
            p = {str(k): "" if v is None else str(v) for k, v in p}
        yield body, keys[i] if keys is not None else None, p or None


def _task() -> tuple[int, int | None]:
    """This task's Spark partition id and its micro-batch's id (None outside a streaming query)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0, None
    batch = tc.getLocalProperty(BATCH_ID_PROPERTY)
    return tc.partitionId(), int(batch) if batch is not None else None


# ---------------------------------------------------------------- into a stream


def _write_stream(opts: Options, batches: Iterator[pa.RecordBatch], streaming: bool) -> Written:
    partition, batch_id = _task()
    reference, base = "", 0
    if streaming and batch_id is not None:
        if not opts.producer_name:
            raise ConnectorError("option producerName (or checkpointLocation) is needed to write a stream "
                                 "exactly once")
        reference, base = f"{opts.producer_name}-{partition}", (batch_id + 1) << ROW_BITS

    def messages() -> Iterator[list[tuple[int, bytes]]]:
        n = 0
        for b in batches:
            out = []
            for body, key, props in _rows(b):
                n += 1
                out.append((base + n, st.message_of(body, key or opts.routing_key or None, props)))
            if out:
                yield out

    n = st.run(st.publish(opts.endpoints, opts.stream, reference, messages()))
    return Written(partition, n)


class StreamWriter(DataSourceArrowWriter):
    """`df.write` to a stream: at least once (a retried task publishes its rows again)."""

    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _write_stream(self.opts, iterator, streaming=False)


class StreamStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream` to a stream: exactly once, by the broker's deduplication."""

    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _write_stream(self.opts, iterator, streaming=True)

    def commit(self, messages: list[Written | None], batchId: int) -> None:
        pass  # every message of the batch was confirmed before its task succeeded

    def abort(self, messages: list[Written | None], batchId: int) -> None:
        pass  # what a failed batch published is deduplicated when it runs again


# ---------------------------------------------------------------- into an exchange


EXCHANGE_WINDOW = 1_000  # messages a task has unconfirmed on its channel


async def _amqp_connect(opts: Options):
    import aiormq
    import aiormq.exceptions as ae

    errors = []
    for uri in opts.amqp_uris:
        where = f"{urlsplit(uri).hostname}:{urlsplit(uri).port or 5672}"
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await aiormq.connect(uri, client_properties={"connection_name": "spark-exchange-sink"})
        except (ae.ProbableAuthenticationError, ae.AuthenticationError) as e:
            raise ConnectorError(f"authentication failed at {where}: {e}") from None
        except (OSError, TimeoutError, ae.AMQPError) as e:
            errors.append(f"cannot reach hutch's AMQP port at {where}: {e!r}")
    raise ConnectorError("; ".join(errors))


async def _publish_exchange(opts: Options, batches: Iterator[pa.RecordBatch]) -> int:
    """Publish every row with confirms, up to EXCHANGE_WINDOW in flight; a nack, an unroutable
    return or a closed channel raises."""
    import aiormq.exceptions as ae
    from pamqp.commands import Basic

    conn = await _amqp_connect(opts)
    n = 0
    try:
        ch = await conn.channel(publisher_confirms=True)
        window: list = []

        async def confirmed() -> None:
            try:
                async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                    results = await asyncio.gather(*window)
            except ae.ChannelClosed as e:
                raise ConnectorError(f"exchange '{opts.exchange}': {e}") from None
            except ae.DeliveryError:
                results = [None]
            window.clear()
            if any(not isinstance(r, Basic.Ack) for r in results):
                raise ConnectorError(f"exchange '{opts.exchange}': the broker refused (nacked) a message")

        for b in batches:
            for body, key, props in _rows(b):
                window.append(ch.basic_publish(body, exchange=opts.exchange, routing_key=key or opts.routing_key,
                                               properties=Basic.Properties(delivery_mode=2, headers=props)))
                n += 1
                if len(window) >= EXCHANGE_WINDOW:
                    await confirmed()
        await confirmed()
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    return n


def _write_exchange(opts: Options, batches: Iterator[pa.RecordBatch]) -> Written:
    partition, _batch = _task()
    return Written(partition, asyncio.run(_publish_exchange(opts, batches)))


class ExchangeWriter(DataSourceArrowWriter):
    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _write_exchange(self.opts, iterator)


class ExchangeStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _write_exchange(self.opts, iterator)

    def commit(self, messages: list[Written | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[Written | None], batchId: int) -> None:
        pass
