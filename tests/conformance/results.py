"""Outcomes of conformance runs and the lists they are judged by.

- A suite run yields a `SuiteResult`: one outcome per test node id (passed, failed,
  error, skipped), the tests deselected with their reasons, and a status saying whether
  the suite ran at all (its broker may not have started, or may not serve what it needs).
- results/<broker>.json keeps the latest result of every suite for one broker (committed,
  so the expected list and docs/compatibility.md can be derived from it).
- expected/<suite>.txt: node ids that must pass against hutch (`make test` enforces it).
- flaky.txt: tests that fail now and then on RabbitMQ too; never on the expected list.
- pending.txt: tests that wait for a hutch feature, with the feature's name.

List lines are `SUITE  PATTERN  -- REASON`, `*` in a pattern matching anything.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
EXPECTED = HERE / "expected"
FLAKY = HERE / "flaky.txt"
PENDING = HERE / "pending.txt"

OUTCOMES = ("passed", "failed", "error", "skipped")
RECORDED_BROKERS = ("hutch", "rabbitmq", "hutch-tls", "rabbitmq-tls")  # results/<name>.json

# Why a suite has no test outcomes.
RAN = "ran"
NOT_STARTED = "broker did not start"
NOT_SERVED = "not yet served"
BROKEN = "runner error"
TIMED_OUT = "timed out"
STOPPED = "stopped"


@dataclass
class SuiteResult:
    suite: str
    broker: str
    product: str = ""
    status: str = RAN
    note: str = ""
    wall_s: float = 0.0
    exitstatus: int | None = None
    tests: dict[str, str] = field(default_factory=dict)
    deselected: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    date: str = field(default_factory=lambda: dt.date.today().isoformat())

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.tests.values() if o == outcome)

    @property
    def total(self) -> int:
        return len(self.tests)

    def counts(self) -> dict[str, int]:
        return {"tests": self.total, **{o: self.count(o) for o in OUTCOMES},
                "deselected": len(self.deselected)}

    def passed_ids(self) -> set[str]:
        return {t for t, o in self.tests.items() if o == "passed"}

    def to_json(self) -> dict:
        reasons: dict[str, int] = {}
        for reason in self.deselected.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        return {"status": self.status, "note": self.note, "product": self.product, "date": self.date,
                "wall_s": self.wall_s, "exitstatus": self.exitstatus, "counts": self.counts(),
                "deselected_by_reason": reasons, "tests": dict(sorted(self.tests.items()))}

    @classmethod
    def from_json(cls, suite: str, broker: str, data: dict) -> SuiteResult:
        res = cls(suite=suite, broker=broker, product=data.get("product", ""), status=data["status"],
                  note=data.get("note", ""), wall_s=data.get("wall_s", 0.0),
                  exitstatus=data.get("exitstatus"), tests=dict(data.get("tests", {})),
                  date=data.get("date", ""))
        # Deselected ids are not stored, only how many per reason; keep the count right.
        n = 0
        for reason, count in data.get("deselected_by_reason", {}).items():
            for _ in range(count):
                res.deselected[f"#{n}"] = reason
                n += 1
        return res


def read_outcomes(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], int | None]:
    """Parse the JSON lines of plugins/hutch_conformance_record.py: tests, deselected, messages, exit."""
    tests: dict[str, str] = {}
    deselected: dict[str, str] = {}
    messages: dict[str, str] = {}
    exitstatus = None
    if not path.exists():
        return tests, deselected, messages, exitstatus
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "test" in rec:
            tests[rec["test"]] = rec["outcome"] or "error"
            if rec.get("message"):
                messages[rec["test"]] = rec["message"]
        elif "deselected" in rec:
            deselected[rec["deselected"]] = rec["reason"]
        elif "exitstatus" in rec:
            exitstatus = rec["exitstatus"]
    return tests, deselected, messages, exitstatus


# ---- results/<broker>.json

def results_path(broker: str) -> Path:
    return RESULTS / f"{broker}.json"


def load_results(broker: str) -> dict[str, SuiteResult]:
    path = results_path(broker)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {name: SuiteResult.from_json(name, broker, s) for name, s in data.get("suites", {}).items()}


def save_results(broker: str, results: list[SuiteResult]) -> Path:
    """Merge these suites' results into results/<broker>.json (other suites keep theirs)."""
    path = results_path(broker)
    data = json.loads(path.read_text()) if path.exists() else {"broker": broker, "suites": {}}
    for r in results:
        data["suites"][r.suite] = r.to_json()
    data["suites"] = dict(sorted(data["suites"].items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


# ---- lists

def glob_pattern(glob: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")) + r"\Z")


@dataclass(frozen=True)
class ListEntry:
    suite: str
    pattern: str
    reason: str

    def matches(self, suite: str, nodeid: str) -> bool:
        return suite == self.suite and glob_pattern(self.pattern).match(nodeid) is not None


def read_list(path: Path) -> list[ListEntry]:
    entries = []
    if not path.exists():
        return entries
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, reason = line.partition(" -- ")
        parts = head.split(None, 1)
        if not sep or len(parts) != 2:
            raise ValueError(f"{path.name}:{n}: expected 'SUITE PATTERN -- REASON', got {raw!r}")
        entries.append(ListEntry(parts[0], parts[1].strip(), reason.strip()))
    return entries


def flaky() -> list[ListEntry]:
    return read_list(FLAKY)


def pending() -> list[ListEntry]:
    return read_list(PENDING)


def matching(entries: list[ListEntry], suite: str, nodeid: str) -> ListEntry | None:
    return next((e for e in entries if e.matches(suite, nodeid)), None)


def expected_path(suite: str) -> Path:
    return EXPECTED / f"{suite}.txt"


def read_expected(suite: str) -> list[str]:
    path = expected_path(suite)
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def write_expected(suite: str, nodeids: list[str], product: str) -> Path:
    EXPECTED.mkdir(parents=True, exist_ok=True)
    path = expected_path(suite)
    header = (f"# Tests of the {suite} suite that must pass against hutch ({len(nodeids)}).\n"
              f"# Grown from results/hutch.json ({product}) by `python -m tests.conformance.run"
              f" --broker hutch --update-expected`:\n"
              f"# a test that passes joins; one leaves only when flaky.txt or pending.txt names it with a reason.\n"
              f"# tests/conformance/test_suites.py fails when one of them does not pass.\n")
    path.write_text(header + "".join(f"{n}\n" for n in sorted(nodeids)))
    return path


def derive_expected(result: SuiteResult, flaky_entries: list[ListEntry]) -> list[str]:
    return sorted(t for t in result.passed_ids() if matching(flaky_entries, result.suite, t) is None)


def merge_expected(result: SuiteResult, old: list[str], flaky_entries: list[ListEntry],
                   pending_entries: list[ListEntry]) -> tuple[list[str], list[str], list[str]]:
    """(old list, new list, expected tests that did not pass in `result`). The new list is the
    old one plus every test that passed (less flaky ones); an old test leaves it only when
    flaky.txt or pending.txt names it, never because it failed."""
    listed = [e for e in (*flaky_entries, *pending_entries)]
    keep = {t for t in old if matching(listed, result.suite, t) is None}
    new = sorted(keep | set(derive_expected(result, flaky_entries)))
    failing = sorted(t for t in keep if result.tests.get(t) != "passed")
    return sorted(old), new, failing


def missing_expected(result: SuiteResult, expected: list[str]) -> list[tuple[str, str]]:
    """Expected tests that did not pass, with what happened to them instead."""
    return [(t, result.tests.get(t, "not run")) for t in expected if result.tests.get(t) != "passed"]
