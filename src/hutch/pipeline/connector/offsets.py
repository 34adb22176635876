"""Offsets of the stream source, as pure functions: what a starting or ending option means for
each partition stream, how a micro-batch's read limit is shared among partitions, and how
ranges are cut into Spark partitions. An offset (what Spark's checkpoint records) maps each
partition stream to the next offset to read.
"""

from __future__ import annotations

from dataclasses import dataclass

from hutch.pipeline.connector.options import ConnectorError, Start


@dataclass(frozen=True)
class Partition:
    """One stream a source reads: a plain stream (index 0) or a super stream's partition."""

    stream: str
    index: int


def resolve_offsets(spec: Start | dict[str, Start], parts: list[Partition], bounds: dict[str, tuple[int, int]],
                    option: str, at_timestamp: dict[str, int] | None = None) -> dict[str, int]:
    """The offset each partition stream starts (or ends) at for an option's value; an error for
    an offset past a stream's end or a partition the option names that the source does not read."""
    names = {p.stream for p in parts}
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - names)
        if unknown:
            raise ConnectorError(f"option {option}: {', '.join(unknown)} is not a stream this source reads "
                                 f"({', '.join(sorted(names))})")
    out = {}
    for p in parts:
        first, end = bounds[p.stream]
        s = spec.get(p.stream, Start("earliest" if option == "startingOffsets" else "latest")) \
            if isinstance(spec, dict) else spec
        if s.kind == "earliest":
            out[p.stream] = first
        elif s.kind == "latest":
            out[p.stream] = end
        elif s.kind == "timestamp":
            out[p.stream] = (at_timestamp or {})[p.stream]
        else:
            if s.value > end:
                raise ConnectorError(f"option {option}: offset {s.value} of stream '{p.stream}' is past its end "
                                     f"({end}: the next offset to be written)")
            out[p.stream] = max(s.value, first)
    return out


def split_ranges(parts: list[Partition], starts: dict[str, int], ends: dict[str, int],
                 min_partitions: int) -> list[tuple[str, int, int, int]]:
    """(stream, partition index, start, end): one range per partition stream with records to
    read, cut into pieces so that there are at least `min_partitions` (as evenly as the records
    allow)."""
    live = [p for p in parts if ends.get(p.stream, 0) > starts.get(p.stream, 0)]
    if not live:
        return []
    pieces = -(-min_partitions // len(live))
    out = []
    for p in live:
        a, b = starts[p.stream], ends[p.stream]
        k = max(1, min(pieces, b - a))
        for i in range(k):
            lo, hi = a + (b - a) * i // k, a + (b - a) * (i + 1) // k
            if hi > lo:
                out.append((p.stream, p.index, lo, hi))
    return out


def limit_ends(starts: dict[str, int], latest: dict[str, int], budget: int | None) -> dict[str, int]:
    """The ends of a micro-batch of at most `budget` records, shared fairly among the partition
    streams that have records (None: everything there is)."""
    ends = {s: max(latest.get(s, a), a) for s, a in starts.items()}
    if budget is None:
        return ends
    out = dict(starts)
    avail = {s: ends[s] - starts[s] for s in sorted(starts) if ends[s] > starts[s]}
    while budget > 0 and avail:
        share = max(1, budget // len(avail))
        for s in list(avail):
            take = min(share, avail[s], budget)
            out[s] += take
            avail[s] -= take
            budget -= take
            if not avail[s]:
                del avail[s]
            if not budget:
                break
    return out
