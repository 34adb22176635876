"""Run one suite against one broker target and collect its per-test outcomes.

The suite runs as `python -m pytest` in the conformance virtualenv, in its unpacked
sdist folder (so the library under test is the sdist's own code and the sdist's own
pytest configuration applies), with two kinds of plugins from plugins/: the recorder
(deselection and outcomes by node id) and whatever fixtures the suite gets upstream from
docker or from fixed ports. Every test has a time limit (pytest-timeout) and the suite a
wall-clock limit; a suite over its limit is killed with its whole process group, and
what it finished is still recorded. Suites may run side by side (each against its own
broker): whoever started them can `stop` those still running, which kills them the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import toolchain
from .results import BROKEN, NOT_SERVED, NOT_STARTED, RAN, STOPPED, TIMED_OUT, SuiteResult, read_outcomes
from .suites import Endpoint, Suite
from .targets import BrokerStartError

REPORTS = toolchain.CACHE / "reports"
KILL_GRACE_S = 10
STOP_CHECK_S = 0.5  # how often a suite's wait looks at its `stop` event
PYTEST_RAN_TESTS = (0, 1)  # all passed / some failed; 2-5 mean interrupted, internal error, usage, none


def suite_env(suite: Suite, ep: Endpoint, outcomes: Path, tls: bool,
              shard: tuple[int, int] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HUTCH_CONFORMANCE_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(suite.environment(ep))
    env["PYTHONPATH"] = str(toolchain.PLUGINS)
    env["HUTCH_CONFORMANCE_OUTCOMES"] = str(outcomes)
    env["HUTCH_CONFORMANCE_DESELECT"] = json.dumps([[d.pattern, d.reason] for d in suite.deselections(tls)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if shard is not None:
        env["HUTCH_CONFORMANCE_SHARD"] = f"{shard[0]}/{shard[1]}"
    return env


def pytest_command(suite: Suite, src: Path, python: Path, junit: Path) -> list[str]:
    cmd = [str(python), "-m", "pytest", "-p", "hutch_conformance_record"]
    for plugin in suite.plugins:
        cmd += ["-p", plugin]
    cmd += ["--rootdir", str(src), "--junitxml", str(junit), "-o", "junit_family=xunit1",
            f"--timeout={suite.test_timeout_s}", "-p", "no:cacheprovider", "-q", "-rfE",
            *suite.extra_args, *suite.paths]
    return cmd


def run_suite(suite: Suite, target, log=print, reports_dir: Path = REPORTS,
              stop: threading.Event | None = None) -> SuiteResult:
    """Run `suite` against a fresh broker from `target`; never raises for a broker problem.

    Its pytest log, junit XML, outcomes and the node's log go to `reports_dir` (by default
    cache/reports, overwritten by the next run of the same suite on the same broker).
    A suite with `shards` runs as that many pytest processes side by side, each against a
    broker of its own (when the target starts one per run) and each with every n-th test;
    their outcomes make one result. When `stop` is set while the suite runs, it is killed
    and its result is STOPPED.
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
    shards = suite.shards if target.isolated else 1
    if shards == 1:
        return _run_shard(suite, target, python, src, reports_dir / stem, log, stop, None)
    stop = stop if stop is not None else threading.Event()
    with ThreadPoolExecutor(max_workers=shards, thread_name_prefix=f"{suite.name}-shard") as pool:
        runs = [pool.submit(_run_shard, suite, target, python, src, reports_dir / f"{stem}-{i + 1}of{shards}",
                            log, stop, (i, shards)) for i in range(shards)]
        try:
            parts = [run.result() for run in runs]
        except BaseException:  # interrupted: stop the other shards too before leaving
            stop.set()
            raise
    return merge_shards(result, parts)


def _run_shard(suite: Suite, target, python: Path, src: Path, stem: Path, log, stop: threading.Event | None,
               shard: tuple[int, int] | None) -> SuiteResult:
    """One pytest process of the suite (all of it, or shard (i, n)) against a fresh broker; its
    files are `stem` + .jsonl (outcomes), .xml (junit), .log (pytest's output), .node.log."""
    result = SuiteResult(suite=suite.name, broker=target.results_name)
    outcomes, junit, logfile = (stem.with_name(stem.name + ext) for ext in (".jsonl", ".xml", ".log"))
    for path in (outcomes, junit):
        path.unlink(missing_ok=True)
    try:
        with target.fresh(suite, stem.with_name(stem.name + ".node.log")) as ep:
            result.product = target.product
            if suite.needs_mgmt and not ep.mgmt_url:
                result.status = NOT_SERVED
                result.note = "the broker has no management HTTP API port"
                return result
            cmd = pytest_command(suite, src, python, junit)
            part = f" (shard {shard[0] + 1} of {shard[1]})" if shard else ""
            log(f"[{target.results_name}] {suite.name}{part}: {suite.sdist} against {ep.amqp_url}"
                f"{' + ' + ep.mgmt_url if ep.mgmt_url and suite.needs_mgmt else ''} (log: {logfile})")
            with open(logfile, "wb") as out:
                out.write(f"$ cd {src} && {' '.join(cmd)}\n".encode())
                out.flush()
                started = time.monotonic()
                env = suite_env(suite, ep, outcomes, tls=target.tls is not None, shard=shard)
                proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    if not _wait(proc, suite.suite_timeout_s, stop):
                        result.status, result.note = STOPPED, "stopped by its caller before it finished"
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


def merge_shards(result: SuiteResult, parts: list[SuiteResult]) -> SuiteResult:
    """The shards' results as one: every test's outcome; the first shard that did not run
    gives the status; the wall time is the longest shard's."""
    for part in parts:
        result.tests.update(part.tests)
        result.deselected.update(part.deselected)
        result.messages.update(part.messages)
        if part.exitstatus is not None:
            result.exitstatus = max(result.exitstatus or 0, part.exitstatus)
    result.product = parts[0].product
    result.wall_s = max(part.wall_s for part in parts)
    failed = [part for part in parts if part.status != RAN]
    if failed:
        result.status = failed[0].status
        result.note = "\n".join(f"shard {parts.index(part) + 1} of {len(parts)}: {part.status}: {part.note}"
                                 for part in failed)
    return result


def _wait(proc: subprocess.Popen, timeout_s: float, stop: threading.Event | None) -> bool:
    """Wait for the suite's pytest to exit: True when it did, False when `stop` was set first;
    subprocess.TimeoutExpired after `timeout_s`."""
    if stop is None:
        proc.wait(timeout=timeout_s)
        return True
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(left, STOP_CHECK_S)))
            return True
        except subprocess.TimeoutExpired:
            if left <= STOP_CHECK_S:
                raise
    return False


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
