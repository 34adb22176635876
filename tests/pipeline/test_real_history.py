"""The Spark job and the reference checker agree on a real history: `hutch perf` recording
against a hutch node that is killed with SIGKILL mid-run and restarted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hutch.pipeline.check import SparkCheck
from hutch.pipeline.history import read_history
from hutch.pipeline.reference import check_history
from tests.support.brokers import HutchNode

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
    assert queue["drained"] == 1  # the workload read the queue empty before it ended
    assert queue["lost"] == 0 and queue["unread"] == 0  # every confirmed message was delivered, across the kill
    # the kill shows as a gap in deliveries, aligned with the recorded fault window
    assert queue["max_gap_ms"] >= 500


def _record_backlogged_run(node: HutchNode, history: Path, *drain_args: str) -> dict:
    """A recorded run whose consumer reads at half the publish rate, so the queue holds a
    backlog when the run's time is up."""
    subprocess.run(
        [sys.executable, "-m", "hutch", "perf", "--uri", node.url, "--producers", "1", "--consumers", "1",
         "--rate", "400", "--consumer-rate", "200", "--confirm", "50", "--qos", "20", "--queue", history.name,
         "--duration", "2", "--record", str(history), "--id", history.name, "--quiet", *drain_args],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=120)
    return check_history(history).summary["queues"][history.name]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = HutchNode(data_dir=tmp_path_factory.mktemp("node"), log_level="warning", mgmt_port=0)
    n.start()
    yield n
    n.cleanup()


def test_a_recorded_run_drains_its_backlog_so_no_confirmed_message_goes_unread(node, tmp_path):
    q = _record_backlogged_run(node, tmp_path / "drained")
    assert q["confirmed"] > 500
    assert (q["drained"], q["lost"], q["unread"]) == (1, 0, 0)
    assert q["delivered"] >= q["confirmed"]
    drains = [r for r in read_history(tmp_path / "drained").to_pylist() if r["op"] == "drain"]
    assert [r["detail"] for r in drains] == ["complete"]


def test_a_run_that_does_not_drain_reports_its_backlog_as_unread_not_lost(node, tmp_path):
    q = _record_backlogged_run(node, tmp_path / "undrained", "--no-drain")
    assert q["drained"] == 0 and q["lost"] == 0
    assert q["unread"] > 100  # half the publishes were still queued when the run ended
