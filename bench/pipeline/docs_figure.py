"""Render the picture of a report shown in docs/lab-and-checker.md from a synthetic history.

    python bench/pipeline/docs_figure.py docs/img/check-report-queue.png

The history: three publishers at 400 messages/s each for 15 s into one queue, two
consumers; a node killed at 4 s (deliveries and confirms stall for 2.5 s, seven confirmed
messages lost), a partition at 10 s for 1.5 s, a few duplicates and reorders. The figure
is the one `hutch check` embeds for each queue (`hutch.pipeline.report.queue_figure`),
drawn from the reference checker's findings (same numbers as the Spark job's).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hutch.pipeline.reference import check_history
from hutch.pipeline.report import figure_png, queue_figure
from hutch.pipeline.synth import Defects, Fault, SynthSpec, generate


def main(out: Path) -> None:
    spec = SynthSpec(
        run_id="demo", publishers_per_queue=3, consumers_per_queue=2, messages_per_publisher=6000,
        rate_per_publisher=400.0, faults=(Fault("kill-node2", 4.0, 2.5), Fault("partition", 10.0, 1.5)),
        defects=Defects(lost=7, dup_flagged=20, dup_unflagged=2, reordered=3), seed=11,
    )
    with tempfile.TemporaryDirectory() as d:
        generate(spec, d)
        findings = check_history(d)
    out.write_bytes(figure_png(queue_figure(findings, "demo", "q0", width_in=10.0)))
    s = findings.summary["queues"]["q0"]
    print({k: s[k] for k in ("published", "confirmed", "delivered", "lost", "duplicates", "reordered", "max_gap_ms")})


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/check-report-queue.png"))
