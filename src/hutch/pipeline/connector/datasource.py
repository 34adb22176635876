"""The data source "hutch": the one class Spark sees, which picks the reader or writer the
options ask for and checks them before any task runs. The package docstring (__init__.py) says
what each piece does."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from hutch.pipeline.connector import streams as st
from hutch.pipeline.connector.options import ConnectorError, Options, sink_options, source_options

FORMAT = "hutch"


def _check_exchange(opts: Options) -> None:
    if not opts.exchange:
        return  # the default exchange is always there
    import pika.exceptions as pe

    from hutch.pipeline.connector.queue import _connect

    conn = _connect(opts)
    try:
        conn.channel().exchange_declare(opts.exchange, passive=True)
    except pe.ChannelClosedByBroker as e:
        raise ConnectorError(f"exchange '{opts.exchange}': {e.reply_code} {e.reply_text}") from None
    finally:
        if conn.is_open:
            conn.close()


def _check_stream(opts: Options) -> None:
    parts, _b, _s = st.run(st.describe(opts.endpoints, opts.stream))
    if len(parts) > 1 or parts[0].stream != opts.stream:
        raise ConnectorError(f"'{opts.stream}' is a super stream: the sink writes to one stream (write to "
                             f"its partitions, {', '.join(p.stream for p in parts)}, one by one)")


class HutchDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return st.SPARK_SCHEMA

    def _source(self) -> Options:
        return source_options(self.options)

    def reader(self, schema: StructType):
        from hutch.pipeline.connector.source import StreamBatchReader

        opts = self._source()
        if opts.queue is not None:
            raise ConnectorError("a queue is read with spark.readStream only (its messages are acknowledged "
                                 "when a micro-batch commits)")
        return StreamBatchReader(opts)

    def streamReader(self, schema: StructType):
        opts = self._source()
        if opts.queue is not None:
            from hutch.pipeline.connector.queue import QueueMicroBatchReader

            return QueueMicroBatchReader(opts)
        from hutch.pipeline.connector.source import StreamMicroBatchReader

        return StreamMicroBatchReader(opts)

    def _sink(self, schema: StructType) -> Options:
        from hutch.pipeline.connector.sink import check_schema

        opts = sink_options(self.options)
        check_schema(schema)
        if opts.stream is not None:
            _check_stream(opts)
        else:
            _check_exchange(opts)
        return opts

    def writer(self, schema: StructType, overwrite: bool):
        from hutch.pipeline.connector.sink import ExchangeWriter, StreamWriter

        opts = self._sink(schema)
        return StreamWriter(opts) if opts.stream is not None else ExchangeWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from hutch.pipeline.connector.sink import ExchangeStreamWriter, StreamStreamWriter

        opts = self._sink(schema)
        if opts.stream is not None and not opts.producer_name:
            raise ConnectorError("writing a stream exactly once needs a name for the query's publishers: "
                                 "the option checkpointLocation or producerName")
        return StreamStreamWriter(opts) if opts.stream is not None else ExchangeStreamWriter(opts)


__all__ = ["HutchDataSource", "ConnectorError", "FORMAT"]
