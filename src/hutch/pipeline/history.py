"""The history format: what a client attempted and observed, one row per event, as Parquet.

hutch checks its promises the way Jepsen does: every client (a producer, a consumer, the
lab's fault injector) records each operation it attempts and each outcome it observes,
with the wall-clock time, and a checker reads the whole history afterwards. This module
is the one place that defines the columns and writes them; `hutch perf` and `hutch lab`
record through `HistoryWriter`, and the checker (`hutch.pipeline.check`) and the reference
checker (`hutch.pipeline.reference`) read what it wrote. It depends on pyarrow only: the
load tool must never pay for Spark.

Columns (see `SCHEMA`):

- `run_id`, `client_id`, `node` (the node the client is connected to), `queue`: strings;
- `op`: one of `OPS` — `publish`, `confirm` (the broker's basic.ack), `nack`, `return`,
  `deliver`, `ack`, `reject`, `cancel`, `disconnect`, `reconnect`, `drain` (below), and
  `fault` for lab events;
- `msg_id`: int64, null where no message is concerned. A message id encodes who published
  it and in which order: ``msg_id = publisher << 32 | seq`` with ``0 <= publisher < 2**31``
  unique within a run and ``0 <= seq < 2**32`` counting up from 0 per publisher
  (`message_id`, `publisher_of`, `seq_of`). A consumer reads the id from the message, so
  ordering checks need no other column;
- `redelivered`: the delivery's redelivered flag; null on every other op;
- `ts_ns`: `time.time_ns()` when the event happened;
- `detail`: free text; for `fault` rows it names a fault window (below);
- `client_seq`: int64, the row's position in its writer's stream (0, 1, 2, ...): orders one
  client's events even when two share a timestamp or the clock steps back.

Fault windows. A `fault` row whose detail is ``start NAME ...`` opens the window NAME and
``end NAME ...`` closes it (`fault_start`, `fault_end`); any other fault row is a point
event. A window that is never closed lasts to the end of the run. Fault rows have the
queue ``""``: they concern every queue of the run.

Drains. A workload that ends by reading its queues empty records, per queue, a `drain` row
whose detail is ``complete`` (every queue empty and nothing delivered for a quiet period)
or ``incomplete REASON`` (`drain_detail`, `drain_complete`). Only on a queue whose drain
completed is a confirmed message that was never delivered *lost*; elsewhere the checker
calls it *unread*, since the run ended before anyone could have read it.

Files. Each writer writes complete Parquet files of at most `rows_per_file` rows named
``<client>.<pid>.<token>.<part>.parquet`` (token random per writer), first under a hidden
temporary name and then renamed, so any number of processes can write into one directory
and a reader never sees half a file. Everything flushed survives a crash of the writer.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OPS = frozenset(
    {
        "publish",
        "confirm",
        "nack",
        "return",
        "deliver",
        "ack",
        "reject",
        "cancel",
        "disconnect",
        "reconnect",
        "drain",
        "fault",
    }
)

SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),
        pa.field("node", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("op", pa.string(), nullable=False),
        pa.field("msg_id", pa.int64()),
        pa.field("redelivered", pa.bool_()),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("detail", pa.string()),
        pa.field("client_seq", pa.int64(), nullable=False),
    ]
)

PUBLISHER_MAX = 2**31 - 1
SEQ_MAX = 2**32 - 1
ROWS_PER_FILE_DEFAULT = 200_000
ROWS_PER_FILE_MAX = 5_000_000  # one file's column lists stay well under a gigabyte


def message_id(publisher: int, seq: int) -> int:
    """The msg_id of the `seq`-th message of `publisher` (both counted from 0)."""
    assert 0 <= publisher <= PUBLISHER_MAX, publisher
    assert 0 <= seq <= SEQ_MAX, seq
    return publisher << 32 | seq


def publisher_of(msg_id: int) -> int:
    return msg_id >> 32


def seq_of(msg_id: int) -> int:
    return msg_id & SEQ_MAX


def fault_start(name: str, text: str = "") -> str:
    """The detail of a fault row that opens the window `name` (a single word)."""
    _check_fault_name(name)
    return f"start {name} {text}".rstrip()


def fault_end(name: str, text: str = "") -> str:
    _check_fault_name(name)
    return f"end {name} {text}".rstrip()


def parse_fault(detail: str | None) -> tuple[str, str]:
    """(`start`|`end`|`point`, window name) of a fault row's detail."""
    words = (detail or "").split(maxsplit=2)
    if len(words) >= 2 and words[0] in ("start", "end"):
        return words[0], words[1]
    return "point", (words[0] if words else "fault")


def drain_detail(complete: bool, why: str = "") -> str:
    """The detail of a `drain` row: ``complete``, or ``incomplete`` and the reason."""
    return "complete" if complete else f"incomplete {why}".rstrip()


def drain_complete(detail: str | None) -> bool:
    return (detail or "").split(maxsplit=1)[:1] == ["complete"]


def _check_fault_name(name: str) -> None:
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"a fault window name is one word, not {name!r}")


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class HistoryWriter:
    """Records one client's events and writes them as Parquet files into `directory`.

    `record` only appends to lists (the load tool calls it tens of thousands of times a
    second); every `rows_per_file` rows the lists become one Parquet file. Not thread-safe:
    one writer per client (per thread or task that records).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        run_id: str,
        client_id: str,
        node: str | None,
        rows_per_file: int = ROWS_PER_FILE_DEFAULT,
    ) -> None:
        if not 1 <= rows_per_file <= ROWS_PER_FILE_MAX:
            raise ValueError(f"rows_per_file must be in 1..{ROWS_PER_FILE_MAX}, not {rows_per_file}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.client_id = client_id
        self.node = node
        self.rows_per_file = rows_per_file
        self.files_written: list[Path] = []
        self.rows_written = 0
        self._prefix = f"{_UNSAFE.sub('_', client_id)[:64] or 'client'}.{os.getpid()}.{secrets.token_hex(4)}"
        self._part = 0
        self._seq = 0
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        self._queue: list[str | None] = []
        self._op: list[str] = []
        self._msg_id: list[int | None] = []
        self._redelivered: list[bool | None] = []
        self._ts_ns: list[int] = []
        self._detail: list[str | None] = []

    def record(
        self,
        op: str,
        queue: str | None,
        msg_id: int | None = None,
        redelivered: bool | None = None,
        ts_ns: int | None = None,
        detail: str = "",
    ) -> None:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; one of {sorted(OPS)}")
        if self._closed:
            raise ValueError("record on a closed HistoryWriter")
        self._queue.append(queue)
        self._op.append(op)
        self._msg_id.append(msg_id)
        self._redelivered.append(redelivered)
        self._ts_ns.append(time.time_ns() if ts_ns is None else ts_ns)
        self._detail.append(detail)
        if len(self._op) >= self.rows_per_file:
            self.flush()

    def fault_start(self, name: str, text: str = "", ts_ns: int | None = None) -> None:
        self.record("fault", "", ts_ns=ts_ns, detail=fault_start(name, text))

    def fault_end(self, name: str, text: str = "", ts_ns: int | None = None) -> None:
        self.record("fault", "", ts_ns=ts_ns, detail=fault_end(name, text))

    @property
    def pending_rows(self) -> int:
        return len(self._op)

    def flush(self) -> Path | None:
        """Write the rows recorded since the last flush as one file; returns its path."""
        n = len(self._op)
        if n == 0:
            return None
        table = pa.Table.from_arrays(
            [
                pa.array([self.run_id] * n, pa.string()),
                pa.array([self.client_id] * n, pa.string()),
                pa.array([self.node] * n, pa.string()),
                pa.array(self._queue, pa.string()),
                pa.array(self._op, pa.string()),
                pa.array(self._msg_id, pa.int64()),
                pa.array(self._redelivered, pa.bool_()),
                pa.array(self._ts_ns, pa.int64()),
                pa.array(self._detail, pa.string()),
                pa.array(range(self._seq, self._seq + n), pa.int64()),
            ],
            schema=SCHEMA,
        )
        name = f"{self._prefix}.{self._part:05d}.parquet"
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        pq.write_table(table, tmp, compression="zstd", row_group_size=max(n, 1))
        os.replace(tmp, final)
        self._part += 1
        self._seq += n
        self.rows_written += n
        self.files_written.append(final)
        self._reset()
        return final

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def history_files(directory: str | os.PathLike) -> list[Path]:
    """The complete history files under `directory` (recursively), hidden and temporary ones left out."""
    root = Path(directory)
    return sorted(
        p
        for p in root.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    )


def read_history(directory: str | os.PathLike) -> pa.Table:
    """The whole history under `directory` as one table (for small histories and tools)."""
    files = history_files(directory)
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(f, schema=SCHEMA) for f in files)
