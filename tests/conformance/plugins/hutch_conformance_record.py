"""pytest plugin loaded into every conformance suite: deselects and records outcomes by node id.

It reads HUTCH_CONFORMANCE_DESELECT (a JSON list of [pattern, reason], `*` matching
anything in a node id) and HUTCH_CONFORMANCE_SHARD ("i/n": of the remaining tests in
collection order, run only every n-th, from the i-th counted from 0; every shard collects
the same tests), and appends to HUTCH_CONFORMANCE_OUTCOMES one JSON line per
finished test — passed, failed, error (setup or teardown broke), skipped — one per
deselected test with its reason, and a last line with pytest's exit status. A line is
written as soon as a test's teardown ends, so a suite killed for running too long still
leaves what it did. Node ids are exact, which a junit report's class names are not; the
runner keeps a junit report as well, for people and CI tools.
"""

from __future__ import annotations

import json
import os
import re

_MESSAGE_CHARS_MAX = 800
_pending: dict[str, dict] = {}


def _pattern(glob: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")) + r"\Z")


def _write(record: dict) -> None:
    path = os.environ.get("HUTCH_CONFORMANCE_OUTCOMES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config, items):
    rules = [(_pattern(g), r) for g, r in json.loads(os.environ.get("HUTCH_CONFORMANCE_DESELECT", "[]"))]
    keep, drop = [], []
    for item in items:
        reason = next((r for pat, r in rules if pat.match(item.nodeid)), None)
        if reason is None:
            keep.append(item)
        else:
            _write({"deselected": item.nodeid, "reason": reason})
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    shard = os.environ.get("HUTCH_CONFORMANCE_SHARD")
    if shard:  # the other shards run the rest: neither recorded nor counted here
        i, n = (int(x) for x in shard.split("/"))
        config.hook.pytest_deselected(items=[item for k, item in enumerate(keep) if k % n != i])
        items[:] = keep = keep[i::n]
    _write({"collected": len(keep)})


def pytest_runtest_logreport(report):
    rec = _pending.setdefault(report.nodeid, {"test": report.nodeid, "outcome": None, "duration_s": 0.0})
    rec["duration_s"] = round(rec["duration_s"] + report.duration, 3)
    if report.when == "setup":
        if report.failed:
            rec["outcome"] = "error"
        elif report.skipped:
            rec["outcome"] = "skipped"
    elif report.when == "call":
        if hasattr(report, "wasxfail"):
            rec["outcome"] = "passed" if report.passed else "skipped"
        else:
            rec["outcome"] = report.outcome  # passed | failed | skipped
    elif report.failed and rec["outcome"] in (None, "passed", "skipped"):
        rec["outcome"] = "error"  # teardown broke
    if report.failed and "message" not in rec:
        rec["message"] = (getattr(report, "longreprtext", "") or "")[-_MESSAGE_CHARS_MAX:]
    if report.when == "teardown":
        _write(_pending.pop(report.nodeid))


def pytest_sessionfinish(session, exitstatus):
    for rec in _pending.values():  # interrupted mid-test
        _write(rec)
    _pending.clear()
    _write({"exitstatus": int(exitstatus)})
