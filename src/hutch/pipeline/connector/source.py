"""Reading hutch streams into Spark: a batch reader (`spark.read`) and a micro-batch stream
reader (`spark.readStream`) over the stream protocol.

A source reads one stream, or a super stream whose partition streams become Spark partitions
(more with `minPartitions`, which cuts each range in pieces). An offset, in Spark's checkpoint,
maps each partition stream to the next offset to read, so a restarted query reads exactly what
it had not committed, and a replayed micro-batch reads exactly the same records (a range of a
stream never changes once committed). The end of a stream is found from the stream statistics
(the last committed chunk's id) and that chunk's header. `commit(end)` stores `end - 1` on the
server under the consumer name (RabbitMQ's store_offset), which operators see with
`hutch-streams list_stream_consumers` and clients can resume from; Spark's checkpoint, not the
stored offset, is what a query resumes from.

Where each method runs: the readers' planning methods in Spark's planner process (one
long-lived Python process per streaming query), `read` in Python workers, which get the reader
pickled: nothing that holds a connection lives on a reader.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from hutch.pipeline.connector import streams as st
from hutch.pipeline.connector.offsets import Partition, limit_ends, resolve_offsets, split_ranges
from hutch.pipeline.connector.options import ConnectorError, Options, Start


class StreamRange(InputPartition):
    """Offsets [start, end) of one partition stream: one Spark task."""

    def __init__(self, stream: str, index: int, start: int, end: int):
        super().__init__((stream, index, start, end))
        self.stream = stream
        self.index = index
        self.start = start
        self.end = end


def _read(opts: Options, p: StreamRange) -> Iterator:
    if p.start >= p.end:  # the one empty range of a batch read with nothing to read
        return iter(())
    return st.read_arrow(opts.endpoints, p.stream, p.index, p.start, p.end)


class StreamBatchReader(DataSourceReader):
    """`spark.read`: from startingOffsets (default earliest) to endingOffsets (default latest,
    the end when the read is planned)."""

    def __init__(self, opts: Options):
        self.opts = opts

    def partitions(self) -> list[StreamRange]:
        o = self.opts
        start_spec = o.starting if o.starting is not None else Start("earliest")
        parts, bounds, starts = st.run(st.describe(o.endpoints, o.stream, start_spec))
        ends = resolve_offsets(o.ending, parts, bounds, "endingOffsets")
        for s in starts:
            if starts[s] > ends[s]:
                raise ConnectorError(f"stream '{s}': startingOffsets {starts[s]} is after endingOffsets {ends[s]}")
        return [StreamRange(*r) for r in split_ranges(parts, starts, ends, o.min_partitions)] or [
            StreamRange(parts[0].stream, 0, 0, 0)]

    def read(self, partition: StreamRange) -> Iterator:
        return _read(self.opts, partition)


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: offsets per partition stream in the checkpoint; startingOffsets
    (default latest) applies to a query's first start only."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.parts: list[Partition] | None = None
        self.target: dict[str, int] | None = None  # availableNow: the ends when the run began

    def _parts(self) -> list[Partition]:
        if self.parts is None:
            self.parts, _b, _s = st.run(st.describe(self.opts.endpoints, self.opts.stream))
        return self.parts

    def initialOffset(self) -> dict:
        o = self.opts
        spec = o.starting if o.starting is not None else Start("latest")
        self.parts, _bounds, starts = st.run(st.describe(o.endpoints, o.stream, spec))
        return starts

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = st.run(st.ends(self.opts.endpoints, self._parts()))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        parts = self._parts()
        latest = self.target if self.target is not None else st.run(st.ends(self.opts.endpoints, parts))
        starts = {p.stream: int(start.get(p.stream, latest.get(p.stream, 0))) for p in parts}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return limit_ends(starts, latest, budget)

    def partitions(self, start: dict, end: dict) -> list[StreamRange]:
        parts = self._parts()
        starts = {p.stream: int(start.get(p.stream, end.get(p.stream, 0))) for p in parts}
        ends = {p.stream: int(end.get(p.stream, starts[p.stream])) for p in parts}
        return [StreamRange(*r) for r in split_ranges(parts, starts, ends, self.opts.min_partitions)]

    def read(self, partition: StreamRange) -> Iterator:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        if end:
            st.run(st.store_offsets(self.opts.endpoints, self.opts.consumer_name, {k: int(v) for k, v in end.items()}))

    def stop(self) -> None:
        pass
