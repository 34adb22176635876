"""Tables of conformance results: rich tables for the terminal, docs/compatibility.md for the repo.

The document is generated from results/<broker>.json, flaky.txt, pending.txt and the
suites' deselections, so it always says what the last recorded runs measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import results as R
from .suites import ALL, SUITES

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
HUTCH_FAILURES_LISTED_MAX = 150
NUMBERS = ("tests", "passed", "failed", "error", "skipped", "deselected")


def counted_passing(res: R.SuiteResult, flaky: list[R.ListEntry]) -> int:
    """Passed tests that are not known to be flaky: the number a broker is compared by."""
    return sum(1 for t, o in res.tests.items() if o == "passed" and R.matching(flaky, res.suite, t) is None)


def _expected_cell(res: R.SuiteResult) -> str:
    expected = R.read_expected(res.suite)
    if not expected:
        return "0"
    missing = R.missing_expected(res, expected)
    return f"{len(expected) - len(missing)}/{len(expected)}"


def console_table(run: list[R.SuiteResult], title: str) -> Table:
    flaky = R.flaky()
    show_expected = any(r.broker == "hutch" for r in run)
    table = Table(title=title, title_justify="left")
    table.add_column("suite")
    table.add_column("sdist")
    for name in NUMBERS:
        table.add_column("errors" if name == "error" else name, justify="right")
    table.add_column("passing*", justify="right")
    if show_expected:
        table.add_column("expected ok", justify="right")
    table.add_column("wall", justify="right")
    table.add_column("status")
    totals = dict.fromkeys(NUMBERS, 0)
    total_passing = 0
    for res in run:
        suite = SUITES[res.suite]
        counts = res.counts()
        for k in NUMBERS:
            totals[k] += counts[k]
        passing = counted_passing(res, flaky)
        total_passing += passing
        status = res.status if res.status == R.RAN else f"[bold red]{res.status}[/]"
        if res.status == R.NOT_SERVED:
            status = f"[yellow]{res.status}[/]"
        row = [res.suite, suite.sdist, *(_num(counts[k], k) for k in NUMBERS), str(passing)]
        if show_expected:
            row.append(_expected_cell(res) if res.broker == "hutch" else "")
        row += [f"{res.wall_s:.0f} s", status]
        table.add_row(*row)
    if len(run) > 1:
        row = ["all", "", *(str(totals[k]) for k in NUMBERS), str(total_passing)]
        if show_expected:
            row.append("")
        row += [f"{sum(r.wall_s for r in run):.0f} s", ""]
        table.add_row(*row, style="bold")
    return table


def _num(n: int, kind: str) -> str:
    if n and kind in ("failed", "error"):
        return f"[red]{n}[/]"
    return str(n)


def print_run(run: list[R.SuiteResult], title: str, failures_shown_max: int = 8) -> None:
    # Wide enough for every column when printing to a file or a pipe (CI logs).
    console = Console() if sys.stdout.isatty() else Console(width=170)
    console.print(console_table(run, title))
    console.print("passing* = passed and not on flaky.txt")
    for res in run:
        if res.status != R.RAN and res.note:
            console.print(f"[bold]{res.suite}[/]: {escape(res.status)}: {escape(res.note)}")
        bad = [t for t, o in res.tests.items() if o in ("failed", "error")]
        for t in bad[:failures_shown_max]:
            first = (res.messages.get(t, "").strip().splitlines() or [""])[-1]
            console.print(f"  {res.tests[t]:6} {t}  {first[:160]}", markup=False, highlight=False)
        if len(bad) > failures_shown_max:
            console.print(f"  ... and {len(bad) - failures_shown_max} more (cache/reports/{res.broker}-{res.suite}.log)")


# ---- docs/compatibility.md

def _md_table(header: list[str], rows: list[list[str]], right_from: int = 2) -> str:
    """Columns from `right_from` on are numbers (right-aligned), except a last "status" column."""
    align = ["---" if i < right_from or name == "status" else "---:" for i, name in enumerate(header)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _broker_rows(results: dict[str, R.SuiteResult], flaky: list[R.ListEntry], hutch: bool,
                 names: tuple[str, ...] = ALL) -> list[list[str]]:
    rows = []
    totals = dict.fromkeys(NUMBERS, 0)
    total_passing = 0
    for name in names:
        suite = SUITES[name]
        res = results.get(name)
        if res is None:
            rows.append([name, suite.sdist, *[""] * (len(NUMBERS) + 1 + hutch), "", "not run yet"])
            continue
        counts = res.counts()
        for k in NUMBERS:
            totals[k] += counts[k]
        passing = counted_passing(res, flaky)
        total_passing += passing
        row = [name, suite.sdist, *(str(counts[k]) for k in NUMBERS), str(passing)]
        if hutch:
            row.append(str(len(R.read_expected(name))))
        status = res.status if res.status == R.RAN else f"**{res.status}**"
        row += [f"{res.wall_s:.0f} s", f"{status} ({res.date})"]
        rows.append(row)
    rows.append(["**all**", "", *(f"**{totals[k]}**" for k in NUMBERS), f"**{total_passing}**",
                 *([""] if hutch else []), "", ""])
    return rows


def write_doc(path: Path = DOC) -> Path:
    flaky = R.flaky()
    pending = R.pending()
    rabbit = R.load_results("rabbitmq")
    hutch = R.load_results("hutch")
    product_r = next((r.product for r in rabbit.values() if r.product), "RabbitMQ")
    product_h = next((r.product for r in hutch.values() if r.product and "not started" not in r.product), "hutch")
    header = ["suite", "sdist", "tests", "passed", "failed", "errors", "skipped", "deselected", "passing*"]
    out = [
        "# Compatibility with the client libraries' own test suites",
        "",
        "hutch is measured by the live-broker test suites that AMQP client libraries ship in",
        "their PyPI source distributions, run unchanged against a fresh broker per suite, and",
        "compared with RabbitMQ running the same suites on the same machine. The runner and",
        "the lists this page shows live in `tests/conformance/`; this page is generated by",
        "",
        "```",
        "make conformance                                   # python -m tests.conformance.run --both",
        "python -m tests.conformance.run --doc-only         # regenerate from tests/conformance/results/",
        "python -m tests.conformance.run --broker rabbitmq --tls --suites aiormq,aio-pika   # TLS tests too",
        "```",
        "",
        "Every suite gets a node of its own (hutch: `tests/support/brokers.py`'s HutchNode; RabbitMQ:",
        "a private node of Debian's package with the management plugin), started before it and",
        "removed after it. Wall times are the suites' own, on a 2-core machine that is often busy.",
        "",
        "*passing\\** counts passed tests that are not on the known-flaky list: it is the number",
        "the brokers are compared by. A test counts once: *errors* are tests whose setup or",
        "teardown broke. Deselected tests are not run on either broker (reasons below).",
        "",
        f"## {product_r}",
        "",
        _md_table(header + ["wall", "status"], _broker_rows(rabbit, flaky, hutch=False)),
        "",
        f"## {product_h}",
        "",
        "*expected* is the size of `tests/conformance/expected/<suite>.txt`: the tests that must",
        "pass against hutch (`make test` fails when one does not). A list only grows from runs: a",
        "test leaves it only when `flaky.txt` or `pending.txt` names it with a reason.",
        "",
        _md_table(header + ["expected", "wall", "status"], _broker_rows(hutch, flaky, hutch=True)),
        "",
    ]
    notes = [f"- **{name}**: {r.status}: {r.note.splitlines()[0] if r.note else ''}"
             for name, r in hutch.items() if r.status != R.RAN]
    if notes:
        out += ["Suites that did not run against hutch:", "", *notes, ""]
    for broker in ("rabbitmq-tls", "hutch-tls"):
        tls_results = R.load_results(broker)
        if not tls_results:
            continue
        product = next((r.product for r in tls_results.values() if r.product), broker)
        out += [f"## {product}, with a TLS listener (`--tls`)", "",
                "The same suites with the TLS tests that the runs above deselect: the broker serves",
                "aiormq's suite certificates and trusts its CA (client certificates optional).", "",
                _md_table(header + ["wall", "status"],
                          _broker_rows(tls_results, flaky, hutch=False, names=tuple(tls_results))), ""]
    out += ["## What each suite covers", ""]
    out += [f"- **{s.name}** (`{s.sdist}`, {', '.join(f'`{p}`' for p in s.paths)}): {s.summary}."
            for s in SUITES.values()]
    out += ["", "## Deselected tests", "", "Not run against either broker (counts from the recorded runs):", ""]
    rows = []
    for s in SUITES.values():
        recorded = next((r for r in (rabbit.get(s.name), hutch.get(s.name)) if r is not None and r.deselected), None)
        by_reason: dict[str, list[str]] = {}
        for d in s.deselect:
            by_reason.setdefault(d.reason, []).append(f"`{d.pattern}`")
        for reason, patterns in by_reason.items():
            n = sum(1 for r in recorded.deselected.values() if r == reason) if recorded else None
            rows.append([s.name, "<br>".join(patterns), reason, "" if n is None else str(n)])
    out += [_md_table(["suite", "node ids", "reason", "tests"], rows, right_from=3), ""]
    out += ["## Known flaky", "",
            "Tests that fail now and then against RabbitMQ too (`tests/conformance/flaky.txt`);",
            "they are never on an expected list.", ""]
    out += [_md_table(["suite", "node ids", "reason"],
                      [[e.suite, f"`{e.pattern}`", e.reason] for e in flaky], right_from=3), ""]
    out += ["## Waiting for hutch features", "",
            "Tests that need a feature later work brings (`tests/conformance/pending.txt`), with how",
            "many tests each line covers and how many of those pass against hutch now.", ""]
    prow = []
    for e in pending:
        ids = set()
        for res in (rabbit.get(e.suite), hutch.get(e.suite)):
            if res is not None:
                ids |= {t for t in res.tests if e.matches(e.suite, t)}
        h = hutch.get(e.suite)
        ok = "" if h is None or h.status != R.RAN else str(sum(1 for t in ids if h.tests.get(t) == "passed"))
        prow.append([e.suite, f"`{e.pattern}`", e.reason, str(len(ids)), ok])
    out += [_md_table(["suite", "node ids", "feature", "tests", "pass on hutch"], prow, right_from=3)
            if prow else "None: every test hutch fails is listed below as a bug to fix.", ""]
    hutch_failing = [(name, t, o) for name, r in hutch.items() for t, o in sorted(r.tests.items())
                     if o in ("failed", "error") and R.matching(pending, name, t) is None
                     and R.matching(flaky, name, t) is None]
    out += ["## Failing on hutch in the recorded run", "",
            "Not known-flaky and not waiting for a listed feature: these are hutch's bugs or gaps to look at",
            "(details in `tests/conformance/cache/reports/hutch-<suite>.log` after a run).", ""]
    out += [f"- {name} `{t}`: {o}" for name, t, o in hutch_failing[:HUTCH_FAILURES_LISTED_MAX]] or ["None."]
    if len(hutch_failing) > HUTCH_FAILURES_LISTED_MAX:
        out.append(f"- ... and {len(hutch_failing) - HUTCH_FAILURES_LISTED_MAX} more")
    out.append("")
    failing = [(name, t, o) for name, r in rabbit.items() for t, o in sorted(r.tests.items())
               if o in ("failed", "error")]
    out += ["## Failing on RabbitMQ in the recorded run", ""]
    if failing:
        out += [f"- {name} `{t}`: {o}{' (known flaky)' if R.matching(flaky, name, t) else ''}"
                for name, t, o in failing]
    else:
        out += ["None."]
    out.append("")
    path.write_text("\n".join(out))
    return path
