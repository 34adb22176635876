"""The client libraries' own test suites against a fresh hutch node: no expected test may fail.

One test per suite (py-amqp, rabbitpy, kombu, amqpstorm, aiormq and amqpstorm's
management-API suite; aio-pika, ~11 minutes, runs with `make conformance`). Each suite runs
its pinned sdist through tests.conformance.runner against a hutch node of its own (one per
shard for the suites run in shards), and its test asserts that every node id in
tests/conformance/expected/<suite>.txt passed. The suites spend most of their time waiting
(heartbeat timeouts through a slowed proxy, client-side delays), so the selected ones all
start together when the first of their tests runs and each test waits for its own: the
module takes about as long as its longest suite, not the sum of them. The expected lists
only grow as hutch learns more (`python -m tests.conformance.run --broker hutch
--update-expected`); known flaky tests are never on them. The counts of every suite are
printed in pytest's summary.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

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


class SuiteRuns:
    """Suites running side by side, each in a thread of its own against its own fresh node."""

    def __init__(self, names: list[str], reports_dir: Callable[[str], Path]) -> None:
        self.stop = threading.Event()
        self.reports: dict[str, Path] = {name: reports_dir(name) for name in names}
        self.logs: dict[str, list[str]] = {name: [] for name in names}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="conformance")
        # Reports in a temporary folder: a `python -m tests.conformance.run` going on meanwhile keeps its own.
        self._runs: dict[str, Future[R.SuiteResult]] = {
            name: self._pool.submit(run_suite, SUITES[name], HutchTarget(), log=self.logs[name].append,
                                    reports_dir=self.reports[name], stop=self.stop)
            for name in names}

    def result(self, name: str) -> R.SuiteResult:
        return self._runs[name].result()

    def close(self) -> None:
        """Kill the suites still running (the session ends early) and wait for every thread."""
        self.stop.set()
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def suite_runs(request, tmp_path_factory):
    names = [item.callspec.params["suite_name"] for item in request.session.items
             if item.path == request.path
             and item.originalname == test_expected_tests_of_client_suite_pass_against_hutch.__name__]
    runs = SuiteRuns(names, tmp_path_factory.mktemp)
    try:
        yield runs
    finally:
        runs.close()


@pytest.mark.slow
@pytest.mark.parametrize("suite_name", [
    pytest.param(name, marks=pytest.mark.timeout(SUITES[name].suite_timeout_s + TIMEOUT_MARGIN_S))
    for name in MAKE_TEST
])
def test_expected_tests_of_client_suite_pass_against_hutch(suite_name, request, suite_runs):
    res = suite_runs.result(suite_name)
    reports = suite_runs.reports[suite_name]
    for line in suite_runs.logs[suite_name]:
        print(line)
    expected = R.read_expected(suite_name)
    missing = R.missing_expected(res, expected) if res.status == R.RAN else [(t, res.status) for t in expected]
    line = _summary_line(res, expected, missing)
    request.config.stash.setdefault(SUMMARY_KEY, []).append(line)
    print(line)
    assert res.status == R.RAN, f"{suite_name} did not run against hutch: {res.status}: {res.note}"
    assert not missing, (
        f"{len(missing)} of {len(expected)} tests expected to pass did not (logs in {reports}):\n"
        + "\n".join(f"  {outcome:8} {t}\n{_indent(res.messages.get(t, ''))}" for t, outcome in missing[:20])
        + (f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else ""))


def _indent(text: str, lines_max: int = 6) -> str:
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines_max:]
    return "\n".join("      " + line for line in tail)
