"""The message journal while a recovered backlog is drained: every settle of a message recovered
from an earlier segment leaves guard records (the `V` and `A` records must outlive the `E` record
they settle), released once that segment is deleted. `collect()` looks at a bounded number of
guards per call; a segment's deletion frees far more than one call's bound, so the calls after it
go on until they are caught up. The guards then stay within about a segment's worth of messages
instead of growing with the backlog."""

from __future__ import annotations

from hutch.broker.journal import Journal

SEGMENT_BYTES = 256 * 1024
BODY = b"x" * 200
MESSAGES = 20_000  # about 17 segments; a segment holds some 1,100 of them


def test_draining_a_recovered_backlog_keeps_guards_to_about_a_segments_worth(tmp_path, monkeypatch):
    monkeypatch.setattr("hutch.broker.journal.GUARD_CHECK_MAX", 256)  # a segment frees far more than one call's bound
    j = Journal(str(tmp_path / "msgs"), segment_bytes_max=SEGMENT_BYTES)
    j.recover_refs([])
    for _ in range(MESSAGES):
        j.enqueue(7, "", "q", b"\x00\x00", BODY)
    j.sync()
    j.close()

    j = Journal(str(tmp_path / "msgs"), segment_bytes_max=SEGMENT_BYTES)
    seqs = [s for s, _ref in j.recover_refs([7])[7].items()]
    assert len(seqs) == MESSAGES
    most = 0
    for i, s in enumerate(seqs):
        j.delivered(7, s)
        j.settled(7, s)
        if i % 100 == 99:  # the node syncs and collects once per loop iteration that appended
            j.sync()
            j.collect()
            most = max(most, len(j._guards))
    per_segment = SEGMENT_BYTES // len(BODY)
    print(f"guards at most {most} while draining {MESSAGES} (a segment holds ~{per_segment} messages)")
    assert most < 4 * per_segment  # V and A of one to two segments' messages, not of the whole backlog
    j.close()
