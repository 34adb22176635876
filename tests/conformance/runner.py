"""Run one suite against one broker target and collect its per-test outcomes.

The suite runs as `python -m pytest` in the conformance virtualenv, in its unpacked
sdist folder (so the library under test is the sdist's own code and the sdist's own
pytest configuration applies), with two kinds of plugins from plugins/: the recorder
(deselection and outcomes by node id) and whatever fixtures the suite gets upstream from
docker or from fixed ports. Every test has a time limit (pytest-timeout) and the suite a
wall-clock limit; a suite over its limit is killed with its whole process group, and
what it finished is still recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from . import toolchain
from .results import BROKEN, NOT_SERVED, NOT_STARTED, RAN, TIMED_OUT, SuiteResult, read_outcomes
from .suites import Endpoint, Suite
from .targets import BrokerStartError

REPORTS = toolchain.CACHE / "reports"
KILL_GRACE_S = 10
PYTEST_RAN_TESTS = (0, 1)  # all passed / some failed; 2-5 mean interrupted, internal error, usage, none


def suite_env(suite: Suite, ep: Endpoint, outcomes: Path, tls: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HUTCH_CONFORMANCE_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(suite.environment(ep))
    env["PYTHONPATH"] = str(toolchain.PLUGINS)
    env["HUTCH_CONFORMANCE_OUTCOMES"] = str(outcomes)
    env["HUTCH_CONFORMANCE_DESELECT"] = json.dumps([[d.pattern, d.reason] for d in suite.deselections(tls)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def pytest_command(suite: Suite, src: Path, python: Path, junit: Path) -> list[str]:
    cmd = [str(python), "-m", "pytest", "-p", "hutch_conformance_record"]
    for plugin in suite.plugins:
        cmd += ["-p", plugin]
    cmd += ["--rootdir", str(src), "--junitxml", str(junit), "-o", "junit_family=xunit1",
            f"--timeout={suite.test_timeout_s}", "-p", "no:cacheprovider", "-q", "-rfE",
            *suite.extra_args, *suite.paths]
    return cmd


def run_suite(suite: Suite, target, log=print, reports_dir: Path = REPORTS) -> SuiteResult:
    """Run `suite` against a fresh broker from `target`; never raises for a broker problem.

    Its pytest log, junit XML, outcomes and the node's log go to `reports_dir` (by default
    cache/reports, overwritten by the next run of the same suite on the same broker).
    """
    result = SuiteResult(suite=suite.name, broker=target.results_name)
    try:
        python = toolchain.ensure_venv()
        src = toolchain.prepare(suite)
    except (toolchain.ToolchainError, OSError, subprocess.SubprocessError) as e:
        result.status, result.note = BROKEN, f"could not prepare the suite: {e}"
        return result
    reports_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{target.results_name}-{suite.name}"
    outcomes, junit, logfile = (reports_dir / f"{stem}.jsonl", reports_dir / f"{stem}.xml",
                                reports_dir / f"{stem}.log")
    for path in (outcomes, junit):
        path.unlink(missing_ok=True)
    try:
        with target.fresh(suite, reports_dir) as ep:
            result.product = target.product
            if suite.needs_mgmt and not ep.mgmt_url:
                result.status = NOT_SERVED
                result.note = "the broker has no management HTTP API port"
                return result
            cmd = pytest_command(suite, src, python, junit)
            log(f"[{target.results_name}] {suite.name}: {suite.sdist} against {ep.amqp_url}"
                f"{' + ' + ep.mgmt_url if ep.mgmt_url and suite.needs_mgmt else ''} (log: {logfile})")
            with open(logfile, "wb") as out:
                out.write(f"$ cd {src} && {' '.join(cmd)}\n".encode())
                out.flush()
                started = time.monotonic()
                env = suite_env(suite, ep, outcomes, tls=target.tls is not None)
                proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    proc.wait(timeout=suite.suite_timeout_s)
                except subprocess.TimeoutExpired:
                    result.status = TIMED_OUT
                    result.note = f"killed after {suite.suite_timeout_s} s"
                finally:  # also when we are interrupted: leave no pytest behind
                    _kill_group(proc)
                result.wall_s = round(time.monotonic() - started, 1)
    except BrokerStartError as e:
        result.status, result.note = NOT_STARTED, str(e)
        return result
    tests, deselected, messages, exitstatus = read_outcomes(outcomes)
    result.tests, result.deselected, result.messages, result.exitstatus = tests, deselected, messages, exitstatus
    if result.status == RAN and (not tests or proc.returncode not in PYTEST_RAN_TESTS):
        # pytest was interrupted, crashed, or could not even collect: not a measurement.
        result.status = BROKEN
        tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
        result.note = (f"pytest exit status {proc.returncode} after {len(tests)} tests;"
                       f" end of {logfile}:\n{tail}")
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the suite's process group (pytest and anything it started), politely first."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
