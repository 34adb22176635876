"""pytest configuration for tests/conformance.

The unpacked client suites (cache/) and the runner's plugins are never collected here: they
run in their own virtualenv, in a subprocess. What test_suites.py measured is printed at the
end of the session, whether its tests passed or not.
"""

collect_ignore = ["cache", "plugins"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.conformance.test_suites import SUMMARY_KEY

    lines = config.stash.get(SUMMARY_KEY, [])
    if lines:
        terminalreporter.section("client suites against hutch")
        for line in lines:
            terminalreporter.write_line(line)
