"""The conformance runner's own parts: outcome recording, deselection, and the committed lists.

Fast checks (no broker): the recorder plugin turns a real pytest session into the right
outcome per node id, and a suite's shards together run each of its tests once; every pattern on flaky.txt and pending.txt names a suite and matches
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
from tests.conformance.runner import merge_shards
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


SHARDS = 2


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """SAMPLE under the recorder plugin (deselecting its [tls] variant), whole and in SHARDS
    shards, all at once: {None: whole run, 0: shard 0, ...} -> read_outcomes of each."""
    folder = tmp_path_factory.mktemp("sample")
    (folder / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    (folder / "pytest.ini").write_text("[pytest]\n")
    procs = {}
    for shard in (None, *range(SHARDS)):
        env = {**os.environ, "PYTHONPATH": str(PLUGINS), "HUTCH_CONFORMANCE_OUTCOMES": str(folder / f"{shard}.jsonl"),
               "HUTCH_CONFORMANCE_DESELECT": json.dumps([["*[tls]", "needs TLS"]])}
        env.pop("PYTEST_ADDOPTS", None)
        if shard is not None:
            env["HUTCH_CONFORMANCE_SHARD"] = f"{shard}/{SHARDS}"
        procs[shard] = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "hutch_conformance_record",
                                         "-p", "no:cacheprovider", "-q", "test_sample.py"], cwd=folder, env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for proc in procs.values():
            proc.wait(timeout=120)
    finally:
        for proc in procs.values():
            proc.kill()
    return {shard: R.read_outcomes(folder / f"{shard}.jsonl") for shard in procs}


def test_recorder_gives_one_outcome_per_test_and_honours_deselection(recorded):
    tests, deselected, messages, exitstatus = recorded[None]
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


def test_shards_run_every_test_once_and_merge_into_the_whole_run(recorded):
    parts = []
    for shard in range(SHARDS):
        tests, deselected, messages, exitstatus = recorded[shard]
        assert deselected == {"test_sample.py::test_variant[tls]": "needs TLS"}  # the other shards' are not
        parts.append(R.SuiteResult("sample", "hutch", product="hutch 0.1.0", wall_s=float(shard), tests=tests,
                                   deselected=deselected, messages=messages, exitstatus=exitstatus))
    assert [len(p.tests) for p in parts] == [3, 3]
    merged = merge_shards(R.SuiteResult("sample", "hutch"), parts)
    assert merged.status == R.RAN and merged.tests == recorded[None][0]
    assert merged.wall_s == 1.0 and merged.exitstatus == 1 and merged.product == "hutch 0.1.0"
    assert merged.counts() == {"tests": 6, "passed": 2, "failed": 1, "error": 2, "skipped": 1, "deselected": 1}
    parts[1].status, parts[1].note = R.TIMED_OUT, "killed after 300 s"
    late = merge_shards(R.SuiteResult("sample", "hutch"), parts)
    assert late.status == R.TIMED_OUT and late.note == "shard 2 of 2: timed out: killed after 300 s"


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
