"""hutch.store: the node's append-only segment log (opaque records, group commit,
compaction of settled segments, recovery after any stop). It imports no other hutch
layer; durable classic queues and the Raft WAL build on it. See docs/design/store.md."""

from .segment_log import (
    CompactionReport,
    CorruptRegion,
    Record,
    RecordTooLarge,
    RecoveryReport,
    SegmentLog,
    StoreClosed,
    StoreError,
    StoreFailed,
    UnknownRecord,
)

__all__ = [
    "CompactionReport",
    "CorruptRegion",
    "Record",
    "RecordTooLarge",
    "RecoveryReport",
    "SegmentLog",
    "StoreClosed",
    "StoreError",
    "StoreFailed",
    "UnknownRecord",
]
