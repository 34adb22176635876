"""The client libraries' own test suites against a fresh hutch node: no expected test may fail.

One test per suite (py-amqp, rabbitpy, kombu, amqpstorm, aiormq and amqpstorm's
management-API suite; aio-pika, ~11 minutes, runs with `make conformance`). Each starts a hutch node of its own, runs
the suite's pinned sdist through tests.conformance.runner, and asserts that every node id
in tests/conformance/expected/<suite>.txt passed. The expected lists only grow as hutch
learns more (`python -m tests.conformance.run --broker hutch --update-expected`); known
flaky tests are never on them. The counts of every suite are printed in pytest's summary.
"""

from __future__ import annotations

import pytest

from tests.conformance import results as R
from tests.conformance.runner import run_suite
from tests.conformance.suites import MAKE_TEST, SUITES
from tests.conformance.targets import HutchTarget

SUMMARY_KEY = pytest.StashKey[list[str]]()
TIMEOUT_MARGIN_S = 180


def _summary_line(res: R.SuiteResult, expected: list[str], missing: list) -> str:
    c = res.counts()
    return (f"{res.suite:14} {res.status:14} tests {c['tests']:4}  passed {c['passed']:4}  failed {c['failed']:4}  "
            f"errors {c['error']:3}  skipped {c['skipped']:3}  deselected {c['deselected']:4}  "
            f"expected {len(expected) - len(missing)}/{len(expected)}  ({res.wall_s:.0f} s)")


@pytest.mark.slow
@pytest.mark.parametrize("suite_name", [
    pytest.param(name, marks=pytest.mark.timeout(SUITES[name].suite_timeout_s + TIMEOUT_MARGIN_S))
    for name in MAKE_TEST
])
def test_expected_tests_of_client_suite_pass_against_hutch(suite_name, request, tmp_path):
    # Reports in tmp_path: a `python -m tests.conformance.run` going on meanwhile keeps its own.
    res = run_suite(SUITES[suite_name], HutchTarget(), reports_dir=tmp_path)
    expected = R.read_expected(suite_name)
    missing = R.missing_expected(res, expected) if res.status == R.RAN else [(t, res.status) for t in expected]
    line = _summary_line(res, expected, missing)
    request.config.stash.setdefault(SUMMARY_KEY, []).append(line)
    print(line)
    assert res.status == R.RAN, f"{suite_name} did not run against hutch: {res.status}: {res.note}"
    assert not missing, (
        f"{len(missing)} of {len(expected)} tests expected to pass did not (logs in {tmp_path}):\n"
        + "\n".join(f"  {outcome:8} {t}\n{_indent(res.messages.get(t, ''))}" for t, outcome in missing[:20])
        + (f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else ""))


def _indent(text: str, lines_max: int = 6) -> str:
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines_max:]
    return "\n".join("      " + line for line in tail)
