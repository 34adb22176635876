"""`hutch lab scenario`: seed 002's gotchas of classic mirrored queues, each run as the command
runs it (a subprocess that starts its own 3-node lab), in a reduced form where one exists.

Each test asserts the exit status (0: the behaviour the blog reports was reproduced), the
report's key lines, and that the scenario left no process of its lab behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hutch.lab.cluster import process_state
from hutch.lab.scenarios import LogLine, _parse_stamp, sync_windows
from tests.support.lab import free_base_port

pytestmark = pytest.mark.timeout(180)
RUN_TIMEOUT_S = 150


def scenario(*args: str, timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch", "lab", "scenario", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def run_scenario(name: str, lab_dir: Path, *extra: str) -> str:
    p = scenario(name, "--dir", str(lab_dir), "--base-port", str(free_base_port(3)), *extra)
    out = p.stdout
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{p.stderr}"
    assert f"== {name}: REPRODUCED" in out, out
    assert "[FAIL]" not in out, out
    # every process the scenario started is gone: the controller and the three nodes
    info = json.loads((lab_dir / "lab.json").read_text())
    pids = [info["controller"]["pid"]] + [n["pid"] for n in info["nodes"]]
    assert info["state"] == "stopped" and all(process_state(pid) == "stopped" for pid in pids), info
    return out


def value(out: str, label: str) -> str:
    """The value printed after `label:` in a report."""
    m = re.search(rf"^  {re.escape(label)}:\s+(.*)$", out, re.MULTILINE)
    assert m, f"no line {label!r} in\n{out}"
    return m.group(1)


def seconds(text: str) -> float:
    m = re.match(r"([\d.]+) (s|ms)\b", text)
    assert m, text
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


# -- without a lab


def test_list_names_the_four_scenarios_and_a_bad_name_is_refused():
    p = scenario("--list")
    assert p.returncode == 0
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == ["autodelete-partition", "cancel-on-failover", "sync-blocks", "confirm-after-reply"]
    bad = scenario("no-such-scenario")
    assert bad.returncode == 2 and "no scenario 'no-such-scenario'" in bad.stderr


def test_a_directory_that_holds_something_else_is_not_wiped(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    p = scenario("cancel-on-failover", "--dir", str(tmp_path), "--base-port", str(free_base_port(3)))
    assert p.returncode == 2 and "holds no lab" in p.stdout
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_sync_windows_pair_each_sync_start_with_its_end():
    def line(t: float, text: str) -> LogLine:
        return LogLine("hutch-1", t, f"[info] <hutch.mirroring> Mirrored queue 'haq' in vhost '/': {text}")
    lines = [line(1.0, "Synchronising: 200 messages to synchronise"), line(1.0, "Synchronising: batch size: 2"),
             line(2.0, "Synchronising: 120 messages"), line(2.5, "Synchronising: 200 messages"),
             line(2.5, "Synchronising: complete"), line(3.0, "Synchronising: 150 messages to synchronise"),
             line(3.5, "Synchronising: cancelled after 20 messages"),
             line(4.0, "Synchronising: 130 messages to synchronise")]
    assert sync_windows(lines) == [(1.0, 2.5, 200, "complete"), (3.0, 3.5, 150, "cancelled after 20 messages"),
                                   (4.0, None, 130, "running")]
    assert _parse_stamp("2026-11-22 12:44:41.293+00:00 [info] x") == pytest.approx(1795351481.293)
    assert _parse_stamp("Traceback (most recent call last):") is None


# -- the scenarios, on labs of their own


def test_autodelete_partition_the_majority_deletes_the_queue_that_lost_its_consumer(tmp_path):
    out = run_scenario("autodelete-partition", tmp_path / "lab")
    assert value(out, "during the partition, hutch-1 says the queue") == "does not exist"
    assert value(out, "during the partition, hutch-2 says the queue") == "does not exist"
    for node in ("hutch-1", "hutch-2", "hutch-3"):
        assert value(out, f"after the heal, {node} says the queue") == "does not exist"
    assert seconds(value(out, "queue deleted on hutch-1 after")) >= 3.0  # once hutch-3 is declared down
    assert "net_tick_timeout" in out  # (the leader may drop the queue before its ring reports the death)
    assert "Raft log that needs a majority" in out  # the report says how hutch differs from the blog


def test_cancel_on_failover_the_consumer_is_cancelled_consumes_again_and_loses_nothing(tmp_path):
    out = run_scenario("cancel-on-failover", tmp_path / "lab")
    assert seconds(value(out, "kill -> basic.cancel")) < 30
    assert seconds(value(out, "kill -> first delivery after consuming again")) < 30
    assert value(out, "held ones redelivered (redelivered flag set)") == "10 of 10"
    assert "0 of 70 missing" in value(out, "delivered after consuming again")
    assert "Promoting slave" in out


def test_sync_blocks_the_slow_consumer_gets_nothing_while_the_sync_runs(tmp_path):
    out = run_scenario("sync-blocks", tmp_path / "lab", "--messages", "50000")
    assert "Synchronising: batch size: 2" in out and "Synchronising: complete" in out
    assert re.search(r"Synchronising: \d{5} messages to synchronise", out)
    assert "no delivery reached the consumer while a sync ran (0 did)" in out
    gap = float(value(out, "consumer's longest gap between deliveries").split()[0])
    assert gap > 0.2  # a delivery comes every 0.1 s otherwise


def test_confirm_after_reply_the_reply_beats_the_confirm_during_a_partition(tmp_path):
    out = run_scenario("confirm-after-reply", tmp_path / "lab")
    reply = seconds(value(out, "reply arrived"))
    confirm = seconds(value(out, "confirm arrived"))
    assert reply < 1.0 and confirm > reply + 2.0  # the confirm waited for the failure detector (4 s)
    assert "(ack)" in value(out, "confirm arrived")
    assert "hutch-3@localhost down: net_tick_timeout" in out
