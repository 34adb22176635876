"""The history format and its writer (no Spark): what `hutch perf` records through."""

from __future__ import annotations

import multiprocessing
import os

import pyarrow.parquet as pq
import pytest

from hutch.pipeline.history import (
    SCHEMA,
    HistoryWriter,
    fault_end,
    fault_start,
    history_files,
    message_id,
    parse_fault,
    publisher_of,
    read_history,
    seq_of,
)


def test_message_id_encodes_publisher_and_sequence():
    m = message_id(7, 123_456)
    assert (publisher_of(m), seq_of(m)) == (7, 123_456)
    assert message_id(1, 0) > message_id(0, 2**32 - 1)
    with pytest.raises(AssertionError):
        message_id(0, 2**32)


def test_writer_round_trips_every_column(tmp_path):
    with HistoryWriter(tmp_path, "run-1", "consumer-a", "hutch@node1") as w:
        w.record("deliver", "q1", msg_id=message_id(2, 5), redelivered=True, ts_ns=100)
        w.record("ack", "q1", msg_id=message_id(2, 5), ts_ns=101)
        w.record("disconnect", None, ts_ns=102, detail="connection reset")
    t = read_history(tmp_path)
    assert t.schema == SCHEMA
    rows = t.to_pylist()
    assert [r["op"] for r in rows] == ["deliver", "ack", "disconnect"]
    assert rows[0] == {"run_id": "run-1", "client_id": "consumer-a", "node": "hutch@node1", "queue": "q1",
                       "op": "deliver", "msg_id": message_id(2, 5), "redelivered": True, "ts_ns": 100, "detail": "",
                       "client_seq": 0}
    assert rows[1]["redelivered"] is None
    assert rows[2]["msg_id"] is None and rows[2]["queue"] is None
    assert [r["client_seq"] for r in rows] == [0, 1, 2]


def test_writer_starts_a_new_file_every_rows_per_file_rows_and_keeps_client_seq_counting(tmp_path):
    w = HistoryWriter(tmp_path, "r", "pub-0", "n", rows_per_file=10)
    for i in range(25):
        w.record("publish", "q", msg_id=i)
    assert len(w.files_written) == 2 and w.pending_rows == 5
    w.close()
    assert [pq.read_metadata(f).num_rows for f in w.files_written] == [10, 10, 5]
    seqs = sorted(read_history(tmp_path).column("client_seq").to_pylist())
    assert seqs == list(range(25))
    with pytest.raises(ValueError):
        w.record("publish", "q")


def test_record_fills_in_the_time_and_rejects_unknown_ops(tmp_path):
    w = HistoryWriter(tmp_path, "r", "c", "n")
    before = __import__("time").time_ns()
    w.record("publish", "q", msg_id=1)
    with pytest.raises(ValueError, match="unknown op"):
        w.record("publsh", "q")
    w.close()
    (ts,) = read_history(tmp_path).column("ts_ns").to_pylist()
    assert ts >= before


def test_fault_rows_name_their_window(tmp_path):
    with HistoryWriter(tmp_path, "r", "lab", None) as w:
        w.fault_start("partition", "hutch@a | hutch@b hutch@c")
        w.fault_end("partition")
        w.record("fault", "", detail="kill hutch@b")
    details = read_history(tmp_path).column("detail").to_pylist()
    assert [parse_fault(d) for d in details] == [("start", "partition"), ("end", "partition"), ("point", "kill")]
    assert fault_start("x") == "start x" and fault_end("x", "healed") == "end x healed"
    with pytest.raises(ValueError):
        fault_start("two words")


def _write_from_process(directory, client_id, n):
    with HistoryWriter(directory, "r", client_id, "n", rows_per_file=7) as w:
        for i in range(n):
            w.record("publish", "q", msg_id=i)


def test_writers_in_several_processes_share_one_directory_without_clashes(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_from_process, args=(str(tmp_path), "same-client", 50)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    # two writers in one process, same client id
    _write_from_process(str(tmp_path), "same-client", 20)
    _write_from_process(str(tmp_path), "same-client", 20)
    assert read_history(tmp_path).num_rows == 3 * 50 + 2 * 20
    assert len(history_files(tmp_path)) == 3 * 8 + 2 * 3


def test_readers_never_see_a_file_being_written(tmp_path):
    (tmp_path / ".pub.1.abcd.00000.parquet.tmp").write_bytes(b"PAR1 half a file")
    (tmp_path / "_check").mkdir()
    (tmp_path / "_check" / "part-0.parquet").write_bytes(b"not history")
    w = HistoryWriter(tmp_path, "r", "c", "n")
    w.record("publish", "q", msg_id=1)
    w.flush()
    assert history_files(tmp_path) == w.files_written
    assert read_history(tmp_path).num_rows == 1


def test_an_empty_directory_is_an_empty_history(tmp_path):
    assert read_history(tmp_path).num_rows == 0


def test_record_is_fast_enough_for_the_load_tool(tmp_path):
    import time

    w = HistoryWriter(tmp_path, "r", "c", "n", rows_per_file=100_000)
    n = 200_000
    t0 = time.perf_counter()
    for i in range(n):
        w.record("publish", "q", msg_id=i)
    w.close()
    rate = n / (time.perf_counter() - t0)
    assert rate > 100_000, f"{rate:.0f} records/s"
    assert os.path.getsize(w.files_written[0]) < 40 * 100_000  # a few bytes a row
