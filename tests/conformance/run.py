"""Run the client libraries' own test suites against hutch, RabbitMQ or any AMQP URL.

    python -m tests.conformance.run                       # every suite against a fresh hutch node
    python -m tests.conformance.run --broker rabbitmq --suites amqp,kombu
    python -m tests.conformance.run --broker amqp://guest:guest@127.0.0.1:5672/%2F
    python -m tests.conformance.run --both                # RabbitMQ, then hutch; writes docs/compatibility.md
    python -m tests.conformance.run --broker hutch --update-expected
    python -m tests.conformance.run --broker hutch --check-expected   # exit 1 if an expected test failed
    python -m tests.conformance.run --doc-only [--update-expected]  # from the recorded results

Each suite gets a fresh node (hutch and RabbitMQ targets), its outcomes go to
tests/conformance/results/<broker>.json (merged suite by suite), and a table of counts is
printed. The exit status is 1 when a suite could not run (broker did not start, runner
error, time limit) or, with --check-expected, when a test on an expected list did not
pass; test failures alone are measurements, not errors.
"""

from __future__ import annotations

import argparse
import sys

from . import report, toolchain
from . import results as R
from .runner import run_suite
from .suites import ALL, SUITES
from .targets import make_target


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", default="hutch", help="hutch | rabbitmq | amqp://user:pass@host:port/vhost")
    p.add_argument("--mgmt-url", default=None, help="management API base URL of a --broker URL (http://host:port)")
    p.add_argument("--both", action="store_true", help="run against RabbitMQ, then hutch, and write the doc")
    p.add_argument("--suites", default=",".join(ALL), help=f"comma-separated, from {','.join(ALL)}")
    p.add_argument("--update-expected", action="store_true",
                   help="rewrite expected/<suite>.txt from this hutch run (passed, less flaky)")
    p.add_argument("--check-expected", action="store_true",
                   help="exit 1 when a test on expected/<suite>.txt did not pass against hutch")
    p.add_argument("--doc-only", action="store_true",
                   help="run nothing: regenerate docs/compatibility.md (and, with --update-expected,"
                        " the expected lists) from results/")
    p.add_argument("--no-save", action="store_true", help="do not write results/<broker>.json")
    p.add_argument("--tls", action="store_true",
                   help="give the broker a TLS listener with aiormq's suite certificates and run the TLS tests"
                        " too; results go to results/<broker>-tls.json")
    args = p.parse_args(argv)
    args.suite_names = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in args.suite_names if s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    if args.both and args.broker != "hutch":
        p.error("--both runs RabbitMQ and hutch; do not combine it with --broker")
    return args


def run_against(spec: str, suite_names: list[str], mgmt_url: str | None = None,
                tls: bool = False) -> list[R.SuiteResult]:
    target = make_target(spec, mgmt_url, tls=toolchain.tls_files() if tls else None)
    run = []
    for name in suite_names:
        res = run_suite(SUITES[name], target, log=lambda m: print(m, flush=True))
        c = res.counts()
        print(f"[{target.results_name}] {name}: {res.status}; {c['tests']} tests, {c['passed']} passed, "
              f"{c['failed']} failed, {c['error']} errors, {c['skipped']} skipped in {res.wall_s:.0f} s",
              flush=True)
        run.append(res)
    return run


def update_expected(run: list[R.SuiteResult]) -> int:
    """Add the tests that now pass to the expected lists. A test already expected stays
    expected even if it failed in this run (that is what --check-expected reports); the only
    way out of a list is an entry with a reason in flaky.txt or pending.txt. Returns 1 when
    an expected test did not pass, so a regression cannot be written away."""
    regressions = 0
    for res in run:
        if res.status != R.RAN:
            print(f"expected/{res.suite}.txt left as it is: the suite did not run ({res.status})")
            continue
        old, new, failing = R.merge_expected(res, R.read_expected(res.suite), R.flaky(), R.pending())
        path = R.write_expected(res.suite, new, res.product)
        print(f"{path.relative_to(R.HERE.parents[1])}: {len(new)} tests (+{len(set(new) - set(old))}, "
              f"-{len(set(old) - set(new))} listed in flaky.txt or pending.txt)")
        for t in failing:
            print(f"  EXPECTED TO PASS, kept on the list: {t} -> {res.tests.get(t, 'not run')}")
        regressions += len(failing)
    return 1 if regressions else 0


def check_expected(run: list[R.SuiteResult]) -> int:
    failures = 0
    for res in run:
        expected = R.read_expected(res.suite)
        if not expected:
            continue
        missing = R.missing_expected(res, expected)
        failures += len(missing)
        for t, outcome in missing:
            print(f"EXPECTED TO PASS: [{res.suite}] {t} -> {outcome}")
    return failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.doc_only:
        if args.update_expected:
            status = update_expected([r for name, r in R.load_results("hutch").items() if name in args.suite_names])
        else:
            status = 0
        print(f"wrote {report.write_doc()}")
        return status
    plan = [("rabbitmq", None), ("hutch", None)] if args.both else [(args.broker, args.mgmt_url)]
    status = 0
    hutch_run: list[R.SuiteResult] = []
    for spec, mgmt_url in plan:
        run = run_against(spec, args.suite_names, mgmt_url, tls=args.tls)
        broker = run[0].broker if run else spec
        report.print_run(run, f"{broker}: {run[0].product if run else ''}")
        if broker in R.RECORDED_BROKERS and not args.no_save:
            print(f"wrote {R.save_results(broker, run)}")
        if any(r.status not in (R.RAN, R.NOT_SERVED) for r in run):
            status = 1
        if broker == "hutch":
            hutch_run = run
    if args.update_expected:
        if args.tls:
            print("--update-expected: the expected lists come from runs without --tls", file=sys.stderr)
            return 2
        if not hutch_run:
            print("--update-expected needs a hutch run", file=sys.stderr)
            return 2
        status = max(status, update_expected(hutch_run))
    if args.check_expected and hutch_run and check_expected(hutch_run):
        status = 1
    if args.both:
        print(f"wrote {report.write_doc()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
