"""Micro-benchmark of the stream log (`hutch.store.stream_log`): append+sync and sequential read.

    python bench/stream_log.py [--total-mib 256] [--record-bytes 1024] [--records-per-chunk 100]
                               [--sync-mib 1] [--index-chunks 100000] [--dir PATH]

Runs, each on a fresh log in a temporary directory under --dir (default: the system temp
directory; put it on the disk a broker would use, since fsync costs what the disk costs):

  append+sync    chunks of `--records-per-chunk` records of `--record-bytes` (100 x 1 KiB),
                 one sync() per `--sync-mib` MiB appended (group commit), `--total-mib` in all
  no fsync       the same with fsync=False: the log's own CPU cost (two writes per chunk)
  sync/chunk     the same with one sync() after every chunk (`--per-chunk-mib` in all)
  read           read() of the whole log from offset 0, 1 MiB at a time (one pread per
                 segment range), touching every chunk: from the page cache
  read cold      the same after posix_fadvise(DONTNEED) dropped the log's files (only
                 theirs) from the page cache: from the disk
  open           reopen of a log of `--index-chunks` small chunks (10,000,000 messages in chunks
                 of 100 is 100,000 chunks): once reading the index files only
                 (tail_check_bytes=0), once with the default tail check, which reads back and
                 CRC-checks the chunks in the last 16 MiB (here: all of them); and the in-memory
                 index's size per chunk

It prints MB/s (10^6 bytes) and chunks/s per run, reads and writes only its own temporary
directory and removes it afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hutch.store.stream_log import StreamLog  # noqa: E402

MiB = 1 << 20


def _chunk(records: int, record_bytes: int) -> bytes:
    return os.urandom(record_bytes) * records


def append_sync(directory: str, total_bytes: int, chunk: bytes, records: int, sync_bytes: int,
                fsync: bool = True) -> dict:
    with StreamLog(directory, fsync=fsync) as log:
        n_chunks = total_bytes // len(chunk)
        pending = 0
        started = time.perf_counter()
        for k in range(n_chunks):
            log.append(chunk, log.next_offset, records, k, 1)
            pending += len(chunk)
            if pending >= sync_bytes:
                log.sync()
                pending = 0
        log.sync()
        elapsed = time.perf_counter() - started
        fsyncs = log.fsync_count
    written = n_chunks * len(chunk)
    return {"mb_s": written / elapsed / 1e6, "chunks_s": n_chunks / elapsed, "fsyncs_s": fsyncs / elapsed,
            "elapsed_s": elapsed, "bytes": written}


def read_all(directory: str, read_bytes: int) -> dict:
    with StreamLog(directory) as log:
        offset, total, chunks = 0, 0, 0
        started = time.perf_counter()
        while True:
            got = log.read(offset, read_bytes)
            if not got:
                break
            for _info, data in got:
                total += len(data)
                chunks += 1
            offset = got[-1][0].next_offset
        elapsed = time.perf_counter() - started
    return {"mb_s": total / elapsed / 1e6, "chunks_s": chunks / elapsed, "elapsed_s": elapsed, "bytes": total}


def drop_from_page_cache(directory: str) -> None:
    """Evict this log's (synced, clean) pages only: nothing else on the machine is touched."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def open_index(directory: str, chunks: int) -> dict:
    with StreamLog(directory, max_segment_bytes=8 * MiB, fsync=False) as log:
        body = b"x" * 64
        for k in range(chunks):
            log.append(body, log.next_offset, 100, k, 1)
    started = time.perf_counter()
    StreamLog(directory, max_segment_bytes=8 * MiB, fsync=False, tail_check_bytes=0).close()
    index_only = time.perf_counter() - started
    started = time.perf_counter()
    log = StreamLog(directory, max_segment_bytes=8 * MiB, fsync=False)
    elapsed = time.perf_counter() - started
    index_bytes = sum(col.itemsize * len(col) for seg in log._segments
                      for col in (seg.ids, seg.timestamps, seg.epochs, seg.positions, seg.sizes, seg.nums,
                                  seg.crcs))
    index_bytes += sum(len(seg.types) + len(seg.filter_sizes) for seg in log._segments)
    assert log.next_offset == chunks * 100
    log.close()
    return {"elapsed_s": elapsed, "index_only_s": index_only, "chunks_s": chunks / elapsed,
            "index_bytes_per_chunk": index_bytes / chunks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--records-per-chunk", type=int, default=100)
    ap.add_argument("--sync-mib", type=float, default=1.0)
    ap.add_argument("--per-chunk-mib", type=int, default=64, help="total for the sync-per-chunk run")
    ap.add_argument("--index-chunks", type=int, default=100_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    chunk = _chunk(args.records_per_chunk, args.record_bytes)
    root = tempfile.mkdtemp(prefix="hutch-stream-bench-", dir=args.dir)
    try:
        print(f"chunks of {args.records_per_chunk} records x {args.record_bytes} B = {len(chunk)} B")
        r = append_sync(os.path.join(root, "a"), args.total_mib * MiB, chunk, args.records_per_chunk,
                        int(args.sync_mib * MiB))
        print(f"append+sync    {r['bytes'] / MiB:7.0f} MiB  {r['mb_s']:8.1f} MB/s  {r['chunks_s']:9.0f} chunks/s  "
              f"{r['chunks_s'] * args.records_per_chunk:10.0f} records/s  {r['fsyncs_s']:6.1f} syncs/s "
              f"(one per {args.sync_mib} MiB)")
        r = read_all(os.path.join(root, "a"), MiB)
        print(f"read           {r['bytes'] / MiB:7.0f} MiB  {r['mb_s']:8.1f} MB/s  {r['chunks_s']:9.0f} chunks/s  "
              f"{r['chunks_s'] * args.records_per_chunk:10.0f} records/s")
        drop_from_page_cache(os.path.join(root, "a"))
        r = read_all(os.path.join(root, "a"), MiB)
        print(f"read cold      {r['bytes'] / MiB:7.0f} MiB  {r['mb_s']:8.1f} MB/s  {r['chunks_s']:9.0f} chunks/s  "
              f"{r['chunks_s'] * args.records_per_chunk:10.0f} records/s")
        shutil.rmtree(os.path.join(root, "a"))
        r = append_sync(os.path.join(root, "n"), args.total_mib * MiB, chunk, args.records_per_chunk,
                        int(args.sync_mib * MiB), fsync=False)
        print(f"no fsync       {r['bytes'] / MiB:7.0f} MiB  {r['mb_s']:8.1f} MB/s  {r['chunks_s']:9.0f} chunks/s  "
              f"{r['chunks_s'] * args.records_per_chunk:10.0f} records/s")
        shutil.rmtree(os.path.join(root, "n"))
        r = append_sync(os.path.join(root, "b"), args.per_chunk_mib * MiB, chunk, args.records_per_chunk, 1)
        print(f"sync/chunk     {r['bytes'] / MiB:7.0f} MiB  {r['mb_s']:8.1f} MB/s  {r['chunks_s']:9.0f} chunks/s  "
              f"{r['chunks_s'] * args.records_per_chunk:10.0f} records/s  {r['fsyncs_s']:6.1f} syncs/s")
        shutil.rmtree(os.path.join(root, "b"))
        r = open_index(os.path.join(root, "c"), args.index_chunks)
        print(f"open           {args.index_chunks} chunks: {r['index_only_s'] * 1000:.0f} ms reading the indexes, "
              f"{r['elapsed_s'] * 1000:.0f} ms with the default tail check (which here covers every chunk); "
              f"index {r['index_bytes_per_chunk']:.0f} B/chunk in memory")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
