"""The HTML report of a check: one self-contained page a person can read at a glance.

It renders what a checker found (`hutch.pipeline.model.Findings`, only small tables) as a
verdict, a table of promises kept and broken per queue (broken ones in red), and for each
queue a picture: throughput and latency per second over the run, with fault windows shaded
and every stall longer than the threshold marked, so a failover reads as a shaded band
followed by a dip in deliveries and a spike in latency. Plots are matplotlib PNGs embedded
in the page (no files beside it, no scripts, nothing fetched from the network).
"""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from pathlib import Path

from hutch.pipeline.model import NS_PER_MS, NS_PER_S, Findings

# a republished message may come again without the flag, or behind later ones: only what a second
# publish does not explain is marked
BAD_IF_POSITIVE = ("lost", "duplicates_unexplained", "unexpected", "reordered_unexplained")
TABLE_FIELDS = ("published", "confirmed", "delivered", "lost", "unread", "drained", "duplicates", "duplicates_without_redelivered",
                "duplicates_unexplained", "unexpected", "reordered", "reordered_unexplained", "unconfirmed", "nacked",
                "returned", "gaps", "max_gap_ms")
OP_STYLE = {"publish": ("#1f77b4", "published/s"), "confirm": ("#2ca02c", "confirmed/s"),
            "deliver": ("#ff7f0e", "delivered/s"), "nack": ("#d62728", "nacked/s")}
FAULT_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
EXAMPLE_ROWS_MAX = 20
QUEUE_PAGES_MAX = 40  # queues drawn in full; the rest appear in the tables only


def queue_figure(findings: Findings, run_id: str, queue: str, width_in: float = 11.0):
    """Throughput and latency per second for one queue, fault windows shaded, gaps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thr = [r for r in findings.throughput if r["run_id"] == run_id and r["queue"] == queue]
    lat = [r for r in findings.latency if r["run_id"] == run_id and r["queue"] == queue]
    seconds = [r["second"] for r in thr] + [r["second"] for r in lat]
    t0 = min(seconds) if seconds else 0

    fig, (ax_t, ax_l) = plt.subplots(2, 1, figsize=(width_in, 5.6), sharex=True,
                                     gridspec_kw={"height_ratios": [1, 1]}, constrained_layout=True)
    t_last = max(seconds) if seconds else 0
    for op, (colour, label) in OP_STYLE.items():
        counts = {r["second"]: r["count"] for r in thr if r["op"] == op}
        if counts:  # seconds without an event of this kind are zeros, not missing
            xs = list(range(t_last - t0 + 2))
            ax_t.step(xs, [counts.get(t0 + x, 0) for x in xs], where="post", color=colour, label=label, lw=1.3)
    ax_t.set_ylabel("messages per second")
    ax_t.set_title(f"queue {queue}  (run {run_id})", loc="left", fontsize=11)
    for kind, colour in (("confirm", "#2ca02c"), ("e2e", "#ff7f0e")):
        pts = sorted((r["second"] - t0, r["p50_ns"] / NS_PER_MS, r["p99_ns"] / NS_PER_MS, r["max_ns"] / NS_PER_MS)
                     for r in lat if r["kind"] == kind)
        if not pts:
            continue
        xs = [p[0] for p in pts]
        name = "confirm" if kind == "confirm" else "publish→deliver"
        ax_l.plot(xs, [p[1] for p in pts], color=colour, lw=1.3, label=f"{name} p50")
        ax_l.plot(xs, [p[2] for p in pts], color=colour, lw=1.0, ls="--", label=f"{name} p99")
        ax_l.plot(xs, [p[3] for p in pts], color=colour, lw=0.6, ls=":", label=f"{name} max")
    ax_l.set_yscale("log")
    ax_l.set_ylabel("latency (ms), by publish second")
    ax_l.set_xlabel("seconds since the run's first event")

    t0_ns = t0 * NS_PER_S
    for i, w in enumerate(w for w in findings.windows if w.run_id == run_id):
        colour = FAULT_COLOURS[i % len(FAULT_COLOURS)]
        for ax in (ax_t, ax_l):
            ax.axvspan((w.start_ns - t0_ns) / NS_PER_S, (w.end_ns - t0_ns) / NS_PER_S, color=colour, alpha=0.12)
        ax_t.annotate(w.name, xy=((w.start_ns - t0_ns) / NS_PER_S, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(2, -12), textcoords="offset points", fontsize=8, color=colour)
    for e in (e for e in findings.faults if e.run_id == run_id and e.kind == "point"):
        for ax in (ax_t, ax_l):
            ax.axvline((e.ts_ns - t0_ns) / NS_PER_S, color="#555555", lw=0.8, ls="-.")
    for g in (g for g in findings.gaps if g.run_id == run_id and g.queue == queue):
        y = 0.02 if g.kind == "deliver" else 0.06
        ax_t.plot([(g.start_ns - t0_ns) / NS_PER_S, (g.end_ns - t0_ns) / NS_PER_S], [y, y], transform=ax_t.get_xaxis_transform(),
                  color="#ff7f0e" if g.kind == "deliver" else "#2ca02c", lw=4, solid_capstyle="butt",
                  label="deliveries stalled" if g.kind == "deliver" else "confirms stalled")
    for ax in (ax_t, ax_l):
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles, strict=True))
        if uniq:
            ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def figure_png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return buf.getvalue()


def _table(header: list[str], rows: list[list], bad: set[tuple[int, int]] | None = None) -> str:
    bad = bad or set()
    out = ["<table><thead><tr>", *[f"<th>{html.escape(h)}</th>" for h in header], "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cells = []
        for j, v in enumerate(row):
            cls = ' class="bad"' if (i, j) in bad else ""
            cells.append(f"<td{cls}>{html.escape('' if v is None else str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _ms(v) -> str:
    return "" if v is None else f"{v:.1f}"


def _trouble(q: dict) -> int:
    return sum(q.get(f, 0) for f in BAD_IF_POSITIVE) + q.get("gaps", 0)


def render_html(findings: Findings, title: str, gap_ms: float) -> str:
    s = findings.summary
    broken = s.get("expectations", {}).get("broken", [])
    checked = s.get("expectations", {}).get("checked", [])
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}"
        "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
        "td:first-child,td:nth-child(2){text-align:left}td.bad{background:#fbd5d5;font-weight:bold}"
        ".verdict{padding:.6em 1em;border-radius:6px;font-weight:bold}.ok{background:#d9f2d9}.no{background:#fbd5d5}"
        "img{max-width:100%}h2{margin-top:1.6em;border-bottom:1px solid #ddd}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Checked {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC; stalls reported above {gap_ms:g} ms.</p>",
    ]
    if checked:
        if broken:
            parts.append("<p class='verdict no'>Broken promises:<br>" + "<br>".join(html.escape(b) for b in broken) + "</p>")
        else:
            parts.append(f"<p class='verdict ok'>All {len(checked)} expectations hold: {html.escape(', '.join(checked))}</p>")

    header = ["run", "queue", *TABLE_FIELDS]
    rows, bad = [], set()
    for run, r in sorted(s["runs"].items()):
        for queue, q in sorted(r["queues"].items()):
            row = [run, queue] + [q.get(f, 0) for f in TABLE_FIELDS]
            for j, f in enumerate(TABLE_FIELDS):
                if f in BAD_IF_POSITIVE and q.get(f, 0) > 0 or f == "drained" and not q.get(f, 0):
                    bad.add((len(rows), j + 2))
            rows.append(row)
    parts += ["<h2>Promises, per queue</h2>", _table(header, rows, bad)]
    if any(not q.get("drained", 0) for r in s["runs"].values() for q in r["queues"].values()):
        parts.append("<p>A queue with <code>drained</code> 0 was not read empty at the end of its run: its "
                     "confirmed messages that were never delivered are counted as <code>unread</code>, not "
                     "<code>lost</code>, since nobody could have read them.</p>")
    lat_rows = []
    for run, r in sorted(s["runs"].items()):
        for queue, q in sorted(r["queues"].items()):
            for kind, key in (("confirm", "confirm_latency_ms"), ("publish→deliver", "e2e_latency_ms")):
                v = q.get(key) or {}
                if v.get("count"):
                    lat_rows.append([run, queue, kind, v["count"], _ms(v.get("p50")), _ms(v.get("p95")),
                                     _ms(v.get("p99")), _ms(v.get("max"))])
    if lat_rows:
        parts += ["<h2>Latency (ms)</h2>",
                  _table(["run", "queue", "latency", "messages", "p50", "p95", "p99", "max"], lat_rows)]

    for run, r in sorted(s["runs"].items()):
        faults = r.get("faults", [])
        if faults:
            t0 = min(w["start_ns"] for w in faults)
            parts += [f"<h2>Fault windows of run {html.escape(run)}</h2>", _table(
                ["window", "start (s)", "length (s)", "closed"],
                [[w["name"], f"{(w['start_ns'] - t0) / NS_PER_S:.2f}", f"{(w['end_ns'] - w['start_ns']) / NS_PER_S:.2f}",
                  w["closed"]] for w in faults])]
        drawn = sorted(r["queues"].items(), key=lambda kv: (-_trouble(kv[1]), kv[0]))[:QUEUE_PAGES_MAX]
        if len(drawn) < len(r["queues"]):
            parts.append(f"<p>Showing the {len(drawn)} queues with the most trouble of {len(r['queues'])}.</p>")
        for queue, q in drawn:
            parts.append(f"<h2>Queue {html.escape(queue)} (run {html.escape(run)})</h2>")
            png = figure_png(queue_figure(findings, run, queue))
            parts.append(f"<img alt='throughput and latency of {html.escape(queue)}' "
                         f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
            gaps = [g for g in findings.gaps if g.run_id == run and g.queue == queue]
            if gaps:
                g0 = min(g.start_ns for g in gaps)
                parts += ["<h3>Stalls</h3>", _table(
                    ["kind", "starts at (s)", "length (ms)", "recovered", "cause", "fault → recovery (ms)"],
                    [[g.kind, f"{(g.start_ns - g0) / NS_PER_S:.2f}", f"{g.gap_ms:.0f}", g.recovered, g.cause or "(none recorded)",
                      _ms(g.recovery_ms)] for g in gaps])]
            outcome = [
                ["confirmed", q["confirmed"], q["confirmed"] - q["lost"] - q.get("unread", 0) - q["returned"],
                 q["lost"] + q.get("unread", 0)],
                ["nacked", q["nacked"], q["nacked_delivered"], q["nacked"] - q["nacked_delivered"]],
                ["returned", q["returned"], q["returned_delivered"], q["returned"] - q["returned_delivered"]],
                ["never confirmed", q["unconfirmed"], q["unconfirmed_delivered"], q["unconfirmed"] - q["unconfirmed_delivered"]],
            ]
            parts += ["<h3>What became of the published messages</h3>",
                      _table(["outcome", "messages", "delivered", "not delivered"], outcome, {(0, 3)} if q["lost"] else set())]
            if q.get("lost_by_window"):
                parts += ["<h3>Lost, by the fault window they were published in</h3>",
                          _table(["window", "lost"], [[k, v] for k, v in sorted(q["lost_by_window"].items())])]
            for name, rows_, cols in (
                ("Lost messages", findings.lost, ["msg_id", "publisher", "seq", "window"]),
                ("Duplicated messages", findings.duplicates, ["msg_id", "deliveries", "repeats_without_redelivered", "unexplained"]),
                ("Unexpected deliveries", findings.unexpected, ["msg_id", "deliveries"]),
                ("Reorders", findings.reorders, ["client_id", "publisher", "prev_seq", "seq", "republished"]),
            ):
                mine = [x for x in rows_ if x["run_id"] == run and x["queue"] == queue][:EXAMPLE_ROWS_MAX]
                if mine:
                    parts += [f"<h3>{name} (first {len(mine)})</h3>", _table(cols, [[x[c] for c in cols] for x in mine])]
    parts.append("<p>Definitions: docs/lab-and-checker.md.</p></body></html>")
    return "\n".join(parts)


def write_report(findings: Findings, path: Path, title: str = "hutch check", gap_ms: float = 1000.0) -> Path:
    path.write_text(render_html(findings, title, gap_ms), encoding="utf-8")
    return path
