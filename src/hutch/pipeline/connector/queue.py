"""A classic or quorum queue as a Spark streaming source: at-least-once, never exactly-once.

A queue forgets what it delivered once it is acknowledged, so it cannot replay a micro-batch
the way a stream can. The planner process (one per query, long-lived) holds one AMQP 0-9-1
connection with manual acknowledgements: `latestOffset` takes up to maxMessagesPerTrigger
messages with basic.get and numbers them on (the offset is that count), `partitions` puts the
messages of the micro-batch into the InputPartitions themselves (that is how they reach the
workers), and every message up to a batch's end is acknowledged, with one multiple ack, once
Spark has written and recorded the batch's output: at `commit(end)`, or at the next
`latestOffset(start)`, whichever comes first (Spark commits a source only when a new batch has
data, and plans the next batch only after the last one is recorded). A crash, a stop before the last commit, or a replayed
batch whose messages this planner never took all end the same way: the connection goes, the
broker requeues what was not acknowledged and delivers it again (redelivered), and the output
may hold those messages twice. Nothing is lost; deduplicate downstream if it matters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from hutch.pipeline.connector.options import QUEUE_MESSAGES_PER_TRIGGER_DEFAULT, ConnectorError, Options
from hutch.pipeline.connector.streams import SCHEMA

CONNECT_TIMEOUT_S = 10.0
ROWS_PER_PARTITION = 50_000


class QueueMessages(InputPartition):
    """The messages of one micro-batch's slice, carried to the worker as they are."""

    def __init__(self, rows: list[tuple]):
        super().__init__(len(rows))
        self.rows = rows


def _connect(opts: Options):
    import pika
    import pika.exceptions as pe

    errors = []
    for uri in opts.amqp_uris:
        params = pika.URLParameters(uri)
        params.heartbeat = 0  # the planner sleeps between triggers: no heartbeats to miss
        params.socket_timeout = CONNECT_TIMEOUT_S
        params.blocked_connection_timeout = CONNECT_TIMEOUT_S
        params.connection_attempts = 1
        params.client_properties = {"connection_name": f"spark-queue-source-{opts.queue}"}
        try:
            return pika.BlockingConnection(params)
        except pe.ProbableAuthenticationError as e:
            raise ConnectorError(f"authentication failed for user '{params.credentials.username}' at "
                                 f"{params.host}:{params.port}: {e}") from None
        except pe.ProbableAccessDeniedError as e:
            raise ConnectorError(f"access to virtual host '{params.virtual_host}' refused at "
                                 f"{params.host}:{params.port}: {e}") from None
        except pe.AMQPConnectionError as e:
            errors.append(f"cannot reach hutch's AMQP port at {params.host}:{params.port}: {e!r}")
    raise ConnectorError("; ".join(errors))


def _row(queue: str, seq: int, method, props, body: bytes) -> tuple:
    ts = props.timestamp * 1_000_000 if props.timestamp else time.time_ns() // 1000
    headers = [(str(k), v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
               for k, v in (props.headers or {}).items()]
    return (queue, 0, seq, ts, method.routing_key, headers, bytes(body))


class QueueMicroBatchReader(DataSourceStreamReader):
    def __init__(self, opts: Options):
        self.opts = opts
        self.conn = None
        self.channel = None
        self.seq = 0
        self.held: dict[int, tuple[int, tuple]] = {}  # offset -> (delivery tag, row), until committed

    def __getstate__(self):  # a reader goes to the workers pickled: without its connection
        return {"opts": self.opts, "conn": None, "channel": None, "seq": 0, "held": {}}

    def _channel(self):
        if self.channel is None or not self.channel.is_open:
            import pika.exceptions as pe

            self.conn = _connect(self.opts)
            self.channel = self.conn.channel()
            self.held.clear()  # a new channel: the old one's deliveries are back in the queue
            try:
                self.channel.queue_declare(self.opts.queue, passive=True)
            except pe.ChannelClosedByBroker as e:
                self.conn.close()
                self.conn = self.channel = None
                raise ConnectorError(f"queue '{self.opts.queue}': {e.reply_code} {e.reply_text}") from None
        return self.channel

    def initialOffset(self) -> dict:
        self._channel()
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_per_trigger or QUEUE_MESSAGES_PER_TRIGGER_DEFAULT)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ch = self._channel()
        # Spark plans the next micro-batch only once the one that ended at `start` is written and
        # recorded in its commit log, and calls commit(start) only when that next batch has data:
        # the messages up to `start` are acknowledged here, so that an idle query holds none
        self.commit(start)
        self.seq = max(self.seq, int(start.get("seq", 0)))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else \
            (self.opts.max_per_trigger or QUEUE_MESSAGES_PER_TRIGGER_DEFAULT)
        for _ in range(budget):
            method, props, body = ch.basic_get(self.opts.queue, auto_ack=False)
            if method is None:
                break
            self.seq += 1
            self.held[self.seq] = (method.delivery_tag, _row(self.opts.queue, self.seq, method, props, body))
        return {"seq": self.seq}

    def partitions(self, start: dict, end: dict) -> list[QueueMessages]:
        a, b = int(start.get("seq", 0)), int(end.get("seq", 0))
        rows = [self.held[s][1] for s in range(a + 1, b + 1) if s in self.held]
        # a batch planned before this planner started has no messages here: they come again
        return [QueueMessages(rows[i:i + ROWS_PER_PARTITION]) for i in range(0, len(rows), ROWS_PER_PARTITION)]

    def read(self, partition: QueueMessages) -> Iterator[pa.RecordBatch]:
        rows = partition.rows
        if rows:
            cols = list(zip(*rows, strict=True))
            yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, SCHEMA.types, strict=True)],
                                             schema=SCHEMA)

    def commit(self, end: dict) -> None:
        b = int(end.get("seq", 0))
        ch = self._channel()  # a channel opened again holds none of the messages of `end`
        done = [s for s in self.held if s <= b]
        if not done:
            return
        ch.basic_ack(max(self.held[s][0] for s in done), multiple=True)
        for s in done:
            del self.held[s]

    def stop(self) -> None:
        if self.conn is not None and self.conn.is_open:
            self.conn.close()
        self.conn = self.channel = None
