"""The conformance runner's own parts: outcome recording, deselection, and the committed lists.

Fast checks (no broker): the recorder plugin turns a real pytest session into the right
outcome per node id; every pattern on flaky.txt and pending.txt names a suite and matches
tests that the recorded RabbitMQ run really has (a typo would silently match nothing);
the expected lists hold no flaky test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conformance import results as R
from tests.conformance.suites import ALL, SUITES
from tests.conformance.toolchain import PLUGINS

SAMPLE = '''
import pytest

@pytest.fixture
def broken_setup():
    raise RuntimeError("setup broke")

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown broke")

def test_passes():
    pass

def test_fails():
    assert False

def test_setup_breaks(broken_setup):
    pass

def test_teardown_breaks(broken_teardown):
    pass

def test_skips():
    pytest.skip("not here")

@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_variant(variant):
    pass
'''


def test_recorder_gives_one_outcome_per_test_and_honours_deselection(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    outcomes = tmp_path / "outcomes.jsonl"
    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "HUTCH_CONFORMANCE_OUTCOMES": str(outcomes),
           "HUTCH_CONFORMANCE_DESELECT": json.dumps([["*[tls]", "needs TLS"]])}
    env.pop("PYTEST_ADDOPTS", None)
    subprocess.run([sys.executable, "-m", "pytest", "-p", "hutch_conformance_record", "-p", "no:cacheprovider",
                    "-q", "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    tests, deselected, messages, exitstatus = R.read_outcomes(outcomes)
    assert tests == {
        "test_sample.py::test_passes": "passed",
        "test_sample.py::test_fails": "failed",
        "test_sample.py::test_setup_breaks": "error",
        "test_sample.py::test_teardown_breaks": "error",
        "test_sample.py::test_skips": "skipped",
        "test_sample.py::test_variant[plain]": "passed",
    }
    assert deselected == {"test_sample.py::test_variant[tls]": "needs TLS"}
    assert "setup broke" in messages["test_sample.py::test_setup_breaks"]
    assert exitstatus == 1


def test_patterns_treat_brackets_literally_and_star_as_anything():
    pat = R.glob_pattern("tests/t.py::test_x[*-connection-True]")
    assert pat.match("tests/t.py::test_x[amqp-named-cancel-connection-True]")
    assert not pat.match("tests/t.py::test_x[amqp-connection-False]")
    assert not R.glob_pattern("t.py::test_[ab]").match("t.py::test_a")


@pytest.mark.parametrize("name", ["flaky.txt", "pending.txt"])
def test_every_list_entry_names_a_suite_and_matches_recorded_tests(name):
    entries = R.read_list(R.HERE / name)
    recorded = [R.load_results("rabbitmq"), R.load_results("rabbitmq-tls")]
    for e in entries:
        assert e.suite in SUITES, f"{name}: unknown suite {e.suite!r}"
        assert e.reason, f"{name}: {e.pattern} has no reason"
        runs = [r[e.suite] for r in recorded if e.suite in r and r[e.suite].status == R.RAN]
        if not runs:
            continue
        assert any(e.matches(e.suite, t) for res in runs for t in res.tests), \
            f"{name}: {e.suite} {e.pattern} matches no test"


@pytest.mark.parametrize("suite", ALL)
def test_expected_lists_hold_no_flaky_test(suite):
    flaky = R.flaky()
    assert [t for t in R.read_expected(suite) if R.matching(flaky, suite, t)] == []


def test_updating_the_expected_lists_never_drops_a_test_that_stopped_passing():
    res = R.SuiteResult("amqp", "hutch", tests={"t.py::a": "passed", "t.py::b": "failed", "t.py::c": "passed",
                                                "t.py::d": "failed", "t.py::e": "passed"})
    flaky = [R.ListEntry("amqp", "t.py::e", "times out under load")]
    pending = [R.ListEntry("amqp", "t.py::d", "feature being rebuilt")]
    old, new, failing = R.merge_expected(res, ["t.py::a", "t.py::b", "t.py::d"], flaky, pending)
    assert new == ["t.py::a", "t.py::b", "t.py::c"]  # b stays although it failed; c joins; d leaves by pending.txt
    assert failing == ["t.py::b"]  # reported, and update_expected exits 1
