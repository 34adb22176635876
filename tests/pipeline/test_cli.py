"""`hutch check` as a user runs it: a process, on local[2] and on a Spark standalone cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from hutch.pipeline.synth import generate

from .scenarios import SCENARIOS
from .standalone import SparkStandalone

pytestmark = pytest.mark.spark


def hutch_check(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "hutch", "check", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def test_hutch_check_writes_summary_tables_and_report_and_fails_a_broken_expectation(tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    truth = generate(SCENARIOS["everything_at_once"], history)
    r = hutch_check(str(history), "--out", str(out), "--master", "local[2]", "--shuffle-partitions", "2",
                    "--expect", "lost=0", "--expect", "unexpected<=2", "--expect", "max_gap_ms<=5000")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "BROKEN: run all queue q0: lost is 4, expected lost=0" in r.stderr
    assert "unexpected" not in r.stderr and "max_gap_ms" not in r.stderr

    summary = json.loads((out / "summary.json").read_text())
    for queue, qt in truth.queues.items():
        s = summary["queues"][queue]
        assert {k: s[k] for k in ("published", "confirmed", "delivered", "lost", "duplicates",
                                  "duplicates_without_redelivered", "unexpected", "reordered")} == {
            "published": qt.published, "confirmed": qt.confirmed, "delivered": qt.delivered, "lost": qt.lost,
            "duplicates": qt.duplicates, "duplicates_without_redelivered": qt.duplicates_without_redelivered,
            "unexpected": qt.unexpected, "reordered": qt.reordered}
        assert isinstance(s["max_gap_ms"], int) and s["max_gap_ms"] >= 1500
    assert summary["expectations"]["broken"] and len(summary["expectations"]["checked"]) == 3

    assert pq.read_table(out / "lost.parquet").num_rows == sum(q.lost for q in truth.queues.values())
    assert pq.read_table(out / "reorders.parquet").num_rows == sum(q.reordered for q in truth.queues.values())
    gaps = pq.read_table(out / "gaps.parquet").to_pylist()
    assert {g["cause"] for g in gaps} == {"kill-node1", "partition"}
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(truth.queues)
    assert "lost is 4" in html


def test_a_malformed_expectation_is_refused_before_spark_starts(tmp_path):
    generate(SCENARIOS["clean"], tmp_path)
    r = hutch_check(str(tmp_path), "--expect", "lost==zero", timeout_s=30)
    assert r.returncode == 2 and "cannot read expectation" in r.stderr


def test_the_same_job_runs_on_a_spark_standalone_cluster(tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    truth = generate(SCENARIOS["losses_in_a_failover"], history)
    with SparkStandalone(worker_cores=2, worker_memory="1g") as cluster:
        r = hutch_check(str(history), "--out", str(out), "--master", cluster.master_url, "--shuffle-partitions", "2",
                        "--driver-memory", "512m", "--no-report", "--expect", "lost=7")
        assert r.returncode == 0, r.stdout + r.stderr + cluster.log("worker")[-3000:]
        assert "all 1 expectations hold" in r.stdout
        assert list((cluster.dir / "work").glob("app-*/*")), "no executor ran on the cluster's worker"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["master"].startswith("spark://127.0.0.1:")
    assert summary["queues"]["q0"]["lost_by_window"] == truth.queues["q0"].lost_by_window
