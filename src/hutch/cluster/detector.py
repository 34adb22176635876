"""An adaptive (phi-accrual) failure detector for one peer, sans-I/O.

RabbitMQ's Raft features use an adaptive failure detector (Aten) besides the node-level
``net_ticktime`` so that a hung peer — a SIGSTOPped process, a suspended VM — is suspected
within seconds while a slow but alive one is not (seed 003, "Partition Effects on Replicated
Features" and "Partitions Caused by Suspend and Resume"). This is the phi-accrual detector of
Hayashibara et al.: peers heartbeat every ~100 ms; the detector keeps a bounded window of the
observed inter-arrival times and, given the time since the last heartbeat, reports
``phi = -log10(P(a heartbeat arrives even later))`` under a normal model of those intervals.
Suspicion is ``phi >= threshold``. Because the model learns the intervals, jitter widens the
distribution and raises the bar, while silence drives phi up without bound.

The detector only suspects; it never declares a node down. ``net_ticktime`` stays the hard
limit (the transport's job). Time is always passed in (seconds, any monotonic origin), so the
detector runs unchanged under a simulated clock.
"""

from __future__ import annotations

import math
from collections import deque

PHI_INFINITE = math.inf


class FailureDetector:
    def __init__(self, *, threshold: float = 8.0, heartbeat_interval_ms: float = 100.0,
                 window_size_max: int = 200, min_std_deviation_ms: float = 100.0,
                 acceptable_pause_ms: float = 1000.0):
        if threshold <= 0 or heartbeat_interval_ms <= 0 or window_size_max < 2:
            raise ValueError("threshold and heartbeat_interval_ms must be positive, window_size_max >= 2")
        self.threshold = threshold
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.window_size_max = window_size_max
        self.min_std_deviation_ms = min_std_deviation_ms
        self.acceptable_pause_ms = acceptable_pause_ms
        self._intervals_ms: deque[float] = deque(maxlen=window_size_max)
        self._sum = 0.0
        self._sum_sq = 0.0
        self._last_s: float | None = None

    def reset(self) -> None:
        """Forget the history (a new connection to the peer starts a new one)."""
        self._intervals_ms.clear()
        self._sum = self._sum_sq = 0.0
        self._last_s = None

    def heartbeat(self, now_s: float) -> None:
        if self._last_s is None:
            # Seed the window with the expected interval so the first seconds are judged
            # against what the peer promised, not against nothing.
            self._add(self.heartbeat_interval_ms)
            self._add(self.heartbeat_interval_ms)
        else:
            interval_ms = (now_s - self._last_s) * 1000.0
            if interval_ms < 0:
                return  # a heartbeat older than the last one tells nothing new
            self._add(interval_ms)
        self._last_s = now_s

    def _add(self, interval_ms: float) -> None:
        if len(self._intervals_ms) == self._intervals_ms.maxlen:
            old = self._intervals_ms[0]
            self._sum -= old
            self._sum_sq -= old * old
        self._intervals_ms.append(interval_ms)
        self._sum += interval_ms
        self._sum_sq += interval_ms * interval_ms

    @property
    def mean_ms(self) -> float:
        return self._sum / len(self._intervals_ms) if self._intervals_ms else self.heartbeat_interval_ms

    @property
    def std_deviation_ms(self) -> float:
        n = len(self._intervals_ms)
        var = self._sum_sq / n - self.mean_ms ** 2 if n else 0.0
        return max(math.sqrt(max(var, 0.0)), self.min_std_deviation_ms)

    def phi(self, now_s: float) -> float:
        """Suspicion level now: 0 while heartbeats arrive as expected, growing with silence."""
        if self._last_s is None:
            return 0.0
        elapsed_ms = (now_s - self._last_s) * 1000.0
        mean = self.mean_ms + self.acceptable_pause_ms
        std = self.std_deviation_ms
        # P(next heartbeat later than elapsed) for a normal(mean, std) interval.
        p_later = 0.5 * math.erfc((elapsed_ms - mean) / (std * math.sqrt(2.0)))
        if p_later <= 0.0:
            return PHI_INFINITE
        return max(0.0, -math.log10(p_later))

    def is_suspected(self, now_s: float) -> bool:
        return self.phi(now_s) >= self.threshold

    def suspicion_bound_s(self) -> float:
        """An upper bound on how long silence takes to be suspected, given the history so far.

        phi >= 8 needs the elapsed time to exceed the mean by ~5.6 standard deviations; the
        bound uses 6 per 8 of threshold, scaled, which is above that for any threshold.
        """
        sigmas = 6.0 * max(1.0, self.threshold / 8.0)
        return (self.mean_ms + self.acceptable_pause_ms + sigmas * self.std_deviation_ms) / 1000.0
