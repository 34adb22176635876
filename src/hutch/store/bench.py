"""Micro-benchmark of the segment log: appends/s and fsyncs/s for fixed-size records.

    python -m hutch.store.bench [--records 200000] [--record-bytes 1024] [--dir PATH]

Three runs, each on a fresh log in a temporary directory under --dir (default: the
system temp directory; put it on the disk the broker will use, fsync cost is the disk's):

  append only      append() with no sync: the CPU cost of encoding and buffering
  group commit     one thread appends `--batch` records then calls sync(), like a loop
                   iteration that syncs inline
  sync thread      the loop thread appends while a worker thread calls sync() back to
                   back, as the asyncio runtime does; every record is durable at the end
  recovery         reopen the group-commit run's log (scan, CRC check) and replay it all

It reads and writes only its own temporary directory and removes it afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

from .segment_log import SegmentLog


def _append_only(directory: str, records: int, payload: bytes) -> dict:
    with SegmentLog(directory) as log:
        started = time.perf_counter()
        for _ in range(records):
            log.append(payload)
        log.flush()
        elapsed = time.perf_counter() - started
    return {"appends_per_s": records / elapsed, "fsyncs_per_s": 0.0, "elapsed_s": elapsed}


def _group_commit(directory: str, records: int, payload: bytes, batch: int) -> dict:
    with SegmentLog(directory) as log:
        started = time.perf_counter()
        for i in range(1, records + 1):
            log.append(payload)
            if i % batch == 0:
                log.sync()
        log.sync()
        elapsed = time.perf_counter() - started
        syncs = log.fsync_count
    return {"appends_per_s": records / elapsed, "fsyncs_per_s": syncs / elapsed, "elapsed_s": elapsed}


def _sync_thread(directory: str, records: int, payload: bytes) -> dict:
    done = threading.Event()
    errors: list[BaseException] = []
    with SegmentLog(directory) as log:

        def syncer() -> None:
            try:
                while not done.is_set():
                    log.sync()
            except BaseException as e:  # reported below, never lost
                errors.append(e)

        worker = threading.Thread(target=syncer, name="store-bench-sync")
        started = time.perf_counter()
        worker.start()
        try:
            for _ in range(records):
                log.append(payload)
            last = log.last_seq
            while log.durable_seq < last and worker.is_alive():
                time.sleep(0.0005)
        finally:
            done.set()
            worker.join()
        elapsed = time.perf_counter() - started
        syncs = log.fsync_count
        if errors:
            raise errors[0]
    return {"appends_per_s": records / elapsed, "fsyncs_per_s": syncs / elapsed, "elapsed_s": elapsed}


def _recovery(directory: str, records: int) -> dict:
    started = time.perf_counter()
    with SegmentLog(directory) as log:
        replayed = sum(1 for _ in log.replay())
    elapsed = time.perf_counter() - started
    if replayed != records:
        raise AssertionError(f"replayed {replayed} records, expected {records}")
    return {"appends_per_s": records / elapsed, "fsyncs_per_s": 0.0, "elapsed_s": elapsed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hutch.store.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=500, help="records per sync in the group-commit run")
    parser.add_argument("--dir", default=None, help="parent directory for the temporary logs")
    args = parser.parse_args(argv)
    payload = os.urandom(args.record_bytes)
    root = tempfile.mkdtemp(prefix="hutch-store-bench-", dir=args.dir)
    try:
        runs = [
            ("append only", lambda d: _append_only(d, args.records, payload)),
            (f"group commit, sync every {args.batch}", lambda d: _group_commit(d, args.records, payload, args.batch)),
            ("sync thread, appends meanwhile", lambda d: _sync_thread(d, args.records, payload)),
            ("recovery: reopen + replay (rec/s)", lambda d: _recovery(os.path.join(root, "run1"), args.records)),
        ]
        print(f"{args.records} records of {args.record_bytes} bytes, logs under {root}")
        print(f"{'run':<36} {'appends/s':>12} {'fsyncs/s':>10} {'MB/s':>8} {'elapsed s':>10}")
        for i, (name, run) in enumerate(runs):
            result = run(os.path.join(root, f"run{i}"))
            mb_s = result["appends_per_s"] * args.record_bytes / 1e6
            print(f"{name:<36} {result['appends_per_s']:>12,.0f} {result['fsyncs_per_s']:>10,.0f} "
                  f"{mb_s:>8.1f} {result['elapsed_s']:>10.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
