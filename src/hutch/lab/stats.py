"""Counters and latency histograms for `hutch perf`, mergeable across worker processes.

A worker counts what its clients did (sent, confirmed, nacked, returned, received) and
collects raw latencies (ns) between reports; each report turns them into a `Histogram`
of microseconds whose buckets are at most 1/64 of their value wide (about 1.6 %), so a
report stays a few hundred entries whatever the rate, and histograms from several
processes add up exactly. Percentiles are read from the merged histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUB_BUCKET_BITS = 7  # values below 2**7 µs are exact; above, 64..128 buckets per power of two
PERCENTILES = (0.0, 0.5, 0.75, 0.95, 0.99, 0.999, 1.0)
PERCENTILE_NAMES = ("min", "p50", "p75", "p95", "p99", "p99.9", "max")


def bucket_of(value_us: int) -> int:
    """The lower bound of the bucket holding value_us."""
    if value_us < 128:
        return value_us if value_us > 0 else 0
    shift = value_us.bit_length() - SUB_BUCKET_BITS
    return (value_us >> shift) << shift


@dataclass
class Histogram:
    counts: dict[int, int] = field(default_factory=dict)

    def add_ns(self, values_ns: list[int]) -> None:
        counts = self.counts
        get = counts.get
        for v in values_ns:
            v //= 1000
            if v < 128:
                k = v if v > 0 else 0
            else:
                s = v.bit_length() - SUB_BUCKET_BITS
                k = (v >> s) << s
            counts[k] = get(k, 0) + 1

    def merge(self, other: Histogram | dict) -> None:
        counts = self.counts
        src = other.counts if isinstance(other, Histogram) else other
        for k, c in src.items():
            k = int(k)
            counts[k] = counts.get(k, 0) + c

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> int | None:
        """The bucket (µs, lower bound) holding the q-quantile; None when empty."""
        n = self.total
        if n == 0:
            return None
        rank = max(1, min(n, int(q * n + 0.999999)))  # ceil, at least the first value
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return k
        return max(self.counts)

    def summary(self) -> dict[str, int | None]:
        return {name: self.percentile(q) for name, q in zip(PERCENTILE_NAMES, PERCENTILES, strict=True)}


COUNTERS = ("sent", "confirmed", "nacked", "returned", "received")


@dataclass
class Counters:
    """What one worker's clients did so far (cumulative) plus the latencies since the last report."""

    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    returned: int = 0
    received: int = 0
    consumer_latencies_ns: list[int] = field(default_factory=list)
    confirm_latencies_ns: list[int] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in COUNTERS}

    def take_latencies(self) -> tuple[dict[int, int], dict[int, int]]:
        """Histograms of the latencies collected since the last call, which are then forgotten."""
        c, p = Histogram(), Histogram()
        c.add_ns(self.consumer_latencies_ns)
        p.add_ns(self.confirm_latencies_ns)
        # cleared in place: clients keep references to these lists on their hot path
        self.consumer_latencies_ns.clear()
        self.confirm_latencies_ns.clear()
        return c.counts, p.counts
