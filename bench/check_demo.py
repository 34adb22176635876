"""`make check-demo`: a recorded workload against a hutch node killed with SIGKILL mid-run,
checked with Spark.

1. start a node (data under ./var/check-demo/node);
2. run `hutch perf` with confirms, persistent messages on a durable queue and `--record`;
3. a few seconds in, kill -9 the node, record the fault window, and start it again — the
   load tool's clients reconnect and carry on, as a careful application would;
4. `hutch check` the history with `--expect lost=0`, and print where the HTML report is.

Duplicates without the redelivered flag can appear here and are the client's own: the load
tool republishes the messages whose confirm the kill swallowed, under the same ids.

`record_killed_run()` is also what the pipeline tests use to get a real history.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.brokers import HutchNode  # noqa: E402

from hutch.pipeline.history import HistoryWriter, fault_end, fault_start  # noqa: E402


def record_killed_run(history: Path, node_dir: Path, duration_s: float = 16.0, kill_at_s: float = 5.0,
                      down_s: float = 1.5, rate: int = 1500) -> None:
    """Record a history of a confirmed, persistent workload across a kill -9 of the node."""
    shutil.rmtree(history, ignore_errors=True)
    shutil.rmtree(node_dir, ignore_errors=True)
    history.mkdir(parents=True)
    node = HutchNode(data_dir=node_dir, log_level="warning", mgmt_port=0)
    node.start()
    try:
        perf = subprocess.Popen(
            [sys.executable, "-m", "hutch", "perf", "--uri", node.url, "--producers", "1", "--consumers", "1",
             "--size", "128", "--rate", str(rate), "--confirm", "200", "--qos", "100", "--persistent",
             "--durable", "--queue", "check-demo", "--duration", str(duration_s), "--record", str(history),
             "--id", "check-demo"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(kill_at_s)  # the workload's own schedule: the fault happens at a fixed time
            lab = HistoryWriter(history, run_id="check-demo", client_id="lab", node=node.name)
            lab.record("fault", "check-demo", detail=fault_start("kill", f"kill -9 {node.name}"))
            node.kill()
            time.sleep(down_s)
            node.start()
            lab.record("fault", "check-demo", detail=fault_end("kill", f"{node.name} started"))
            lab.close()
            out, _ = perf.communicate(timeout=duration_s + 120)
        finally:
            if perf.poll() is None:
                perf.kill()
                perf.wait()
        if perf.returncode != 0:
            raise RuntimeError(f"hutch perf failed ({perf.returncode}):\n{out[-3000:]}")
    finally:
        node.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(ROOT / "var" / "check-demo"))
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()
    base = Path(args.dir)
    history, out = base / "history", base / "check"
    print(f"recording a workload with a kill -9 in the middle into {history} ...", flush=True)
    record_killed_run(history, base / "node", duration_s=args.duration, kill_at_s=args.duration / 3)
    print("checking it with Spark ...", flush=True)
    rc = subprocess.call([sys.executable, "-m", "hutch", "check", str(history), "--out", str(out),
                          "--master", args.master, "--expect", "drained=1", "--expect", "lost=0"], cwd=ROOT)
    print(f"\nHTML report: {out / 'report.html'}")
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    sys.exit(main())
