"""`hutch lab campaign-long` (hutch.lab.campaign_long): run i's configuration and campaign are a
pure function of i and the first seed, the configurations take turns, a series resumes where
runs.jsonl ends, and the table sums runs.jsonl up per configuration between its markers."""

from __future__ import annotations

import json

from hutch.lab.campaign import ALL_FAULT_KINDS
from hutch.lab.campaign_long import (
    CONFIGURATIONS,
    RUNS_JSONL,
    TABLE_END,
    TABLE_START,
    campaign_long,
    run_config,
    table_lines,
)


def row(index: int, ok: bool = True, lost: int = 0) -> dict:
    conf, cfg = run_config(index, 1, 60.0)
    return {"index": index, "configuration": conf.name, "seed": cfg.seed, "ok": ok, "duration_s": 60.0,
            "faults": {"kill": 2, "fsync-error": 1}, "confirmed": 1000, "lost": lost, "duplicates": 3,
            "duplicates_unexplained": 0, "reordered_unexplained": 1, "copies_compared": 3, "copies_disagree": 0, "unavailable_windows": 2,
            "unavailable_s": 7.5, "longest_unavailable_s": 4.5}


def test_runs_take_the_configurations_in_turn_with_every_fault_kind():
    confs = [run_config(i, 1, 60.0) for i in range(10)]
    assert [c.name for c, _ in confs] == [c.name for c in CONFIGURATIONS] * 2
    assert [cfg.seed for _, cfg in confs] == list(range(1, 11))
    assert all(cfg.faults == ALL_FAULT_KINDS and cfg.duration_s == 60.0 for _, cfg in confs)
    assert run_config(5, 1, 60.0) == run_config(5, 1, 60.0)
    assert confs[2][1].ha_mode == "exactly" and confs[3][1].queue_type == "stream"
    assert confs[4][1].queue_type == "classic"


def test_the_table_sums_runs_up_per_configuration():
    lines = table_lines([row(0), row(1, ok=False, lost=2), row(len(CONFIGURATIONS))])
    quorum = next(line for line in lines if line.startswith("| quorum |"))
    assert "| 2 (2) | 6 | 2000 | 0 | 6 (0) | 2 | 6 (0) | 4, 15 s in all | 4.5 s |" in quorum
    total = next(line for line in lines if line.startswith("| **all** |"))
    assert "| 3 (2) | 9 | 3000 | 2 |" in total


def test_a_series_resumes_after_the_runs_it_has_and_writes_the_table(tmp_path):
    out = tmp_path / "long"
    out.mkdir()
    (out / RUNS_JSONL).write_text("".join(json.dumps(row(i)) + "\n" for i in range(3)))
    doc = tmp_path / "reliability.md"
    doc.write_text(f"# Reliability\n\n{TABLE_START}\nold\n{TABLE_END}\n\nAfter.\n")
    rows = campaign_long(out, 3, 60.0, table=doc, echo=lambda _line: None)  # nothing left to run
    assert len(rows) == 3
    text = doc.read_text()
    assert "old" not in text and "3 runs, 3 minutes of faults" in text and text.endswith("\n\nAfter.\n")
