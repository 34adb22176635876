"""The Spark job and the reference checker agree on a real history: `hutch perf` recording
against a hutch node that is killed with SIGKILL mid-run and restarted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hutch.pipeline.check import SparkCheck
from hutch.pipeline.reference import check_history

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    spec = importlib.util.spec_from_file_location("check_demo", ROOT / "bench" / "check_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plain(x):
    return json.loads(json.dumps(x, default=str))


def test_spark_and_reference_agree_on_a_history_with_a_kill_9(spark, tmp_path):
    history = tmp_path / "history"
    _demo().record_killed_run(history, tmp_path / "node", duration_s=8.0, kill_at_s=3.0, down_s=1.0, rate=800)
    job = SparkCheck(spark, history, gap_ms=1000.0, examples_max=100_000)
    try:
        got = job.run()
    finally:
        job.close()
    ref = check_history(history)
    assert _plain(got.summary) == _plain(ref.summary)
    assert [g.as_row() for g in got.gaps] == [g.as_row() for g in ref.gaps]
    (queue,) = [q for q in ref.summary["queues"].values()]
    assert queue["published"] > 1000 and queue["confirmed"] > 1000
    assert queue["lost"] == 0  # every confirmed message was delivered, across the kill
    # the kill shows as a gap in deliveries, aligned with the recorded fault window
    assert queue["max_gap_ms"] >= 500
