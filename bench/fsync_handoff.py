#!/usr/bin/env python3
"""What handing an fsync to another thread costs an asyncio (uvloop) loop.

A quorum queue's follower answers an AppendEntries once its Raft log is fsynced, and the Raft
host runs that fsync in the loop's default executor so the loop goes on meanwhile. This times
one small write and its `fdatasync`, `--count` times, three ways: on the loop itself, through
`loop.run_in_executor`, and through a dedicated thread that answers with
`loop.call_soon_threadsafe`. Each sample runs from the request to the loop holding the result.
`--busy N` starts N CPU-bound processes beside it for the run, as the other nodes and the load
client are on a small machine.

    .venv/bin/python bench/fsync_handoff.py
    .venv/bin/python bench/fsync_handoff.py --busy 2 --dir /var/tmp
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import tempfile
import threading
import time

import uvloop

RECORD = b"x" * 1100  # about one AppendEntries of a 1 KiB message, as a follower's log takes it


def _spin() -> None:
    while True:
        pass


def _pct(xs: list[int], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] / 1000


async def measure(path: str, count: int) -> dict[str, list[int]]:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_APPEND, 0o644)
    out: dict[str, list[int]] = {}
    try:
        ts = []
        for _ in range(count):
            os.write(fd, RECORD)
            t = time.perf_counter_ns()
            os.fdatasync(fd)
            ts.append(time.perf_counter_ns() - t)
        out["fdatasync on the loop"] = ts

        ts = []
        for _ in range(count):
            os.write(fd, RECORD)
            t = time.perf_counter_ns()
            await loop.run_in_executor(None, os.fdatasync, fd)
            ts.append(time.perf_counter_ns() - t)
        out["loop.run_in_executor"] = ts

        requests: queue.SimpleQueue[asyncio.Future | None] = queue.SimpleQueue()

        def worker() -> None:
            while (fut := requests.get()) is not None:
                os.fdatasync(fd)
                loop.call_soon_threadsafe(fut.set_result, None)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        ts = []
        for _ in range(count):
            os.write(fd, RECORD)
            fut = loop.create_future()
            t = time.perf_counter_ns()
            requests.put(fut)
            await fut
            ts.append(time.perf_counter_ns() - t)
        requests.put(None)
        thread.join()
        out["own thread, call_soon_threadsafe"] = ts
    finally:
        os.close(fd)
        os.unlink(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes to run beside it")
    ap.add_argument("--dir", default=None, help="where the file goes (default: the temporary directory)")
    a = ap.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for p in spinners:
        p.start()
    try:
        path = os.path.join(a.dir or tempfile.gettempdir(), f"fsync-handoff-{os.getpid()}.dat")
        results = uvloop.run(measure(path, a.count))
    finally:
        for p in spinners:
            p.terminate()
            p.join()
    print(f"{a.count} samples, {a.busy} busy process(es) beside; µs from the request to the result on the loop")
    for name, ts in results.items():
        print(f"  {name:34} p50 {_pct(ts, .5):7.0f}  p90 {_pct(ts, .9):7.0f}  p99 {_pct(ts, .99):7.0f}")


if __name__ == "__main__":
    main()
