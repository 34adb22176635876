"""`hutch perf --protocol stream` against a real node: two seconds of publishing with confirms
and consuming over the stream protocol report nonzero rates and no errors."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.brokers import ROOT, HutchNode

RUN_TIMEOUT_S = 60


def test_perf_stream_mode_publishes_confirms_and_consumes(tmp_path):
    with HutchNode() as node:
        out = tmp_path / "summary.json"
        r = subprocess.run(
            [sys.executable, "-m", "hutch", "perf", "--protocol", "stream",
             "--uri", f"rabbitmq-stream://guest:guest@127.0.0.1:{node.stream_port}/%2F",
             "--queue", "perf-stream", "--size", "1024", "--duration", "2", "--json-out", str(out)],
            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        summary = json.loads(out.read_text())
    assert summary["errors"] == []
    assert summary["config"]["protocol"] == "stream"
    assert summary["sent"] > 0 and summary["confirmed"] > 0 and summary["received"] > 0
    assert summary["nacked"] == 0
    assert summary["confirmed_rate"] > 0 and summary["received_rate"] > 0
    assert "confirmed rate avg" in r.stdout and "receiving rate avg" in r.stdout
