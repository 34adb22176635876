"""`hutch lab campaign-long`: many randomised fault campaigns across queue types and mirroring
configurations, and the table of their results (docs/reliability.md).

Run i (counted from 0) uses configuration ``CONFIGURATIONS[i % 5]`` — quorum queues; classic
queues mirrored on every node (`ha-mode: all`) or on exactly two (`ha-mode: exactly`), both
promoting only synchronised mirrors; streams; durable classic queues without mirrors — and seed
``first_seed + i``, from which it draws
what else varies: the consumers' mode, the number of publishers and their rate. Every run has
the whole nemesis (partitions, kill -9, SIGSTOP, slow links, fsync errors, a full disk) on a
fresh 3-node lab (`hutch.lab.campaign.run_campaign`) and is checked by the campaign itself
(its tally, the reference checker, the copies' digests).

Results go to OUT: one directory per run (``run-NNN/``: campaign.json, history/; the lab's node
logs only when the run failed) and one line per finished run in ``runs.jsonl``. The runner is
resumable: it skips the runs ``runs.jsonl`` already holds, so ``--runs 100`` after an
interrupted or shorter series runs only what is missing, and a larger ``--runs`` appends.
``table_lines`` sums ``runs.jsonl`` up per configuration; ``--table FILE`` writes that table
between the markers ``TABLE_START`` and ``TABLE_END`` of FILE. ``hutch check OUT`` reads every
run's history at once (each run has its own run id).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from hutch.lab.campaign import ALL_FAULT_KINDS, CONSUMER_MODES, CampaignConfig, CampaignError, run_campaign
from hutch.lab.cluster import BASE_PORT_DEFAULT, LabError

log = logging.getLogger("hutch.lab.campaign")

RUNS_JSONL = "runs.jsonl"
TABLE_START = "<!-- campaign-long table: start (written by hutch lab campaign-long) -->"
TABLE_END = "<!-- campaign-long table: end -->"
RUNS_MAX = 10_000


@dataclass(frozen=True)
class Configuration:
    name: str
    queue_type: str
    ha_mode: str = "all"


CONFIGURATIONS = (
    Configuration("quorum", "quorum"),
    Configuration("mirrored, ha-mode all, when-synced", "mirrored", "all"),
    Configuration("mirrored, ha-mode exactly 2, when-synced", "mirrored", "exactly"),
    Configuration("stream", "stream"),
    Configuration("classic, durable, no mirrors", "classic"),
)


def run_config(index: int, first_seed: int, duration_s: float) -> tuple[Configuration, CampaignConfig]:
    """The configuration and campaign of run `index`: a pure function of its arguments."""
    conf = CONFIGURATIONS[index % len(CONFIGURATIONS)]
    seed = first_seed + index
    rng = random.Random(f"campaign-long/{seed}")
    publishers = rng.randint(2, 4)
    return conf, CampaignConfig(
        seed=seed, duration_s=duration_s, queue_type=conf.queue_type, ha_mode=conf.ha_mode,
        publishers=publishers, consumers=rng.randint(2, 3), consumer_mode=rng.choice(CONSUMER_MODES),
        rate_per_publisher=float(rng.choice((20, 40, 60))), faults=ALL_FAULT_KINDS)


def run_row(index: int, conf: Configuration, result) -> dict:
    """One line of runs.jsonl: what the table needs from a run."""
    c, ref = result.check, result.reference or {}
    gaps = result.gaps
    return {"index": index, "configuration": conf.name, "seed": result.seed, "run_id": result.run_id,
            "ok": result.ok, "verdict": result.verdict, "duration_s": result.duration_s, "drained": result.drained,
            "faults": result.fault_counts, "published": c["published"], "confirmed": c["confirmed"],
            "lost": c["lost"], "unexpected": c["unexpected"], "duplicates": c["duplicates"],
            "duplicates_unexplained": ref.get("duplicates_unexplained"),
            "reordered_unexplained": ref.get("reordered_unexplained"),
            "copies_disagree": sum(len(r["problems"]) for r in result.replicas.values()),
            "copies_compared": sum(r["copies"] for r in result.replicas.values()),
            "unavailable_windows": len(gaps), "unavailable_s": round(sum(g["gap_ms"] for g in gaps) / 1000, 1),
            "longest_unavailable_s": round(max((g["gap_ms"] for g in gaps), default=0) / 1000, 1),
            "finished_ms": time.time_ns() // 1_000_000}


def read_rows(out: Path) -> list[dict]:
    path = out / RUNS_JSONL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table_lines(rows: list[dict]) -> list[str]:
    """The results table (Markdown), one line per configuration and a total."""
    head = ["| configuration | runs (ok) | faults | confirmed | lost | duplicates (unexplained) | "
            "reordered, unexplained | copies compared (disagreeing) | unavailability windows > 1 s | longest window |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    groups = [(conf.name, [r for r in rows if r["configuration"] == conf.name]) for conf in CONFIGURATIONS]
    for name, rs in [*groups, ("all", rows)]:
        if not rs:
            continue

        def total(key: str, rs: list[dict] = rs) -> int:
            return sum(int(r.get(key) or 0) for r in rs)

        faults = sum(sum(r["faults"].values()) for r in rs)
        label = f"**{name}**" if name == "all" else name
        lines.append(
            f"| {label} | {len(rs)} ({sum(r['ok'] for r in rs)}) | {faults} | {total('confirmed')} | {total('lost')} | "
            f"{total('duplicates')} ({total('duplicates_unexplained')}) | {total('reordered_unexplained')} | "
            f"{total('copies_compared')} ({total('copies_disagree')}) | "
            f"{total('unavailable_windows')}, {sum(r['unavailable_s'] for r in rs):.0f} s in all | "
            f"{max(r['longest_unavailable_s'] for r in rs):.1f} s |")
    return head + lines


def write_table(path: Path, rows: list[dict]) -> None:
    """Replace what stands between TABLE_START and TABLE_END in `path` with the table of `rows`."""
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise CampaignError(f"{path} has no campaign-long table markers ({TABLE_START} ... {TABLE_END})")
    before, rest = text.split(TABLE_START, 1)
    _, after = rest.split(TABLE_END, 1)
    runs = len(rows)
    seconds = sum(r["duration_s"] for r in rows)
    body = [TABLE_START, "", f"{runs} runs, {seconds / 60:.0f} minutes of faults in all "
            f"(runs.jsonl of `hutch lab campaign-long`).", "", *table_lines(rows), "", TABLE_END]
    path.write_text(before + "\n".join(body) + after)


def campaign_long(out: Path, runs: int, duration_s: float, first_seed: int = 1, base_port: int = BASE_PORT_DEFAULT,
                  table: Path | None = None, echo=print) -> list[dict]:
    """Run until `runs` runs are in OUT/runs.jsonl; returns every row."""
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(out)
    done = {r["index"] for r in rows}
    for index in range(runs):
        if index in done:
            continue
        conf, cfg = run_config(index, first_seed, duration_s)
        run_dir = out / f"run-{index:03d}"
        echo(f"run {index} of {runs}: {conf.name}, seed {cfg.seed}")
        result = run_campaign(cfg, run_dir, base_port=base_port, tied_to_caller=True)
        row = run_row(index, conf, result)
        with open(out / RUNS_JSONL, "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        if result.ok:  # keep the node logs of a failed run only: a lab's data is large
            shutil.rmtree(run_dir / "lab", ignore_errors=True)
        echo(f"  {'OK' if result.ok else 'FAILED: ' + result.verdict}; confirmed {row['confirmed']}, lost "
             f"{row['lost']}, duplicates {row['duplicates']}, unavailable {row['unavailable_s']} s")
        if table is not None:
            write_table(table, rows)
    if table is not None:
        write_table(table, rows)
    return rows


@click.command(name="campaign-long")
@click.option("--runs", type=click.IntRange(1, RUNS_MAX), default=100, show_default=True,
              help="Runs to have in OUT/runs.jsonl when done (runs already there are skipped).")
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds of faults and load per run.")
@click.option("--first-seed", type=int, default=1, show_default=True, help="Run i uses seed FIRST_SEED + i.")
@click.option("--out", "out_dir", default="./var/campaign-long", show_default=True, type=click.Path(file_okay=False))
@click.option("--base-port", type=int, default=BASE_PORT_DEFAULT, show_default=True)
@click.option("--table", "table_path", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Write the results table into this file (between its campaign-long markers) after every run.")
@click.option("-v", "--verbose", is_flag=True)
def campaign_long_cli(runs: int, duration_s: float, first_seed: int, out_dir: str, base_port: int,
                      table_path: str | None, verbose: bool) -> Any:
    """Randomised fault campaigns across quorum queues, mirrored queues (ha-mode all and exactly 2,
    promoting only synchronised mirrors) and streams, one configuration after the other, every
    fault kind; a results table per configuration. Resumable. Exit status 1 when a run failed."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiormq").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    try:
        rows = campaign_long(Path(out_dir), runs, duration_s, first_seed, base_port,
                             Path(table_path) if table_path else None, echo=click.echo)
    except (CampaignError, LabError) as e:
        raise click.ClickException(str(e)) from None
    for line in table_lines(rows):
        click.echo(line)
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)
