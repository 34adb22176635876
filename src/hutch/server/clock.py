"""The node's clock: time that means the same on every node, and never runs backwards.

Time leaves a node inside replicated state: a quorum queue's commands carry the proposing
node's time and its state machine computes message expiry and `x-expires` from the largest
value seen; a mirrored queue's leader gives each message its expiry time and its mirrors keep
it through a promotion; persistent messages keep theirs across a restart. So a node's time
must mean the same as its peers' and as its own before a restart. A monotonic clock does not:
its epoch is the host's boot, unrelated between hosts and between boots. The wall clock does,
but it jumps when it is set.

This clock reads the wall clock once, at start, and runs on the monotonic clock from there:
`now = wall_at_start + (monotonic - monotonic_at_start)`. It agrees with the peers' clocks to
within the hosts' skew at their starts (NTP keeps that to milliseconds) and is immune to later
jumps of the wall clock. A wall clock that is later corrected leaves the node running on its
old time until it restarts; RabbitMQ's quorum queues, which read the leader's system time,
would follow the jump instead.

Two fault switches, read once at start, let tests and the lab give a node another host's
clock: `HUTCH_FAULT_BOOT_OFFSET_S` adds seconds to the monotonic clock (a host that booted
that much earlier), `HUTCH_FAULT_WALL_OFFSET_MS` to the wall clock (a host whose clock is
that far ahead).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def _float_env(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {raw!r}") from None


class NodeClock:
    """Milliseconds since the Unix epoch, as the node has counted them since it started."""

    __slots__ = ("_monotonic", "_epoch_s")

    def __init__(self, monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        boot_offset = _float_env("HUTCH_FAULT_BOOT_OFFSET_S")
        wall_offset = _float_env("HUTCH_FAULT_WALL_OFFSET_MS") / 1000
        self._monotonic = (lambda: monotonic() + boot_offset) if boot_offset else monotonic
        # the wall clock's reading less the monotonic one's, fixed once
        self._epoch_s = wall() + wall_offset - self._monotonic()

    def now_ms(self) -> int:
        return int((self._epoch_s + self._monotonic()) * 1000)

    def now_s(self) -> float:
        return self._epoch_s + self._monotonic()
