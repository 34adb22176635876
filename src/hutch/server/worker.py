"""A thread of its own for the Raft host's fsync.

The Raft host hands each group commit's fsync to another thread so that its event loop goes on
serving clients meanwhile (`hutch.server.raft_host`), and that thread hands the outcome back
with `loop.call_soon_threadsafe`. `loop.run_in_executor` did the hand-off before. It costs more
on every commit's path: the executor wraps each call in a `concurrent.futures.Future` (a lock and
a condition of its own), and when that future is done it wakes the loop a second time, through
another `call_soon_threadsafe`, to settle the asyncio future chained to it. Each step needs the
GIL, which the busy loop holds. `WorkerThread` is a queue (`queue.SimpleQueue`, in C) and a
thread that calls what it takes from it. On a 3-node cluster taking 1,000 quorum-queue publishes
a second, the round trip from handing an fsync over to the loop holding its result went from
0.63-0.77 to 0.41-0.50 ms at the median, and from 2.4-3.6 to 1.5-2.2 ms at the 99th
percentile (docs/performance.md).

A simulated node (`hutch.sim`) has no such thread: its loop's `run_in_executor` runs the
function inline, so the Raft host uses that when it is given no worker.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hutch.cluster")

JOIN_TIMEOUT_S = 5.0  # how long `close` waits for the call under way (an fsync) to return


class WorkerThread:
    """Calls the functions handed to `submit`, one at a time and in order, in one daemon thread
    started on the first `submit`. A function that raises is logged and the thread goes on: the
    functions handed here catch what they must report themselves (`RaftHost._sync_in_worker`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._closed:
            raise RuntimeError(f"worker thread {self.name} is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put((fn, args))

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - one failed call must not end the thread
                log.exception("worker thread %s: %r failed", self.name, fn)

    def close(self) -> None:
        """No more calls; wait (up to JOIN_TIMEOUT_S) for those handed over to return."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(JOIN_TIMEOUT_S)
