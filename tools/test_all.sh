#!/usr/bin/env bash
# `make test`: every suite, in about half an hour on two cores.
#
# The unit tests and the simulations come first: they are fast, and the simulations keep both
# cores busy. The rest mostly waits (for nodes to start, fault windows, heartbeats, timeouts),
# using about 40% of the machine, so the two slowest suites that only wait, the client
# libraries' own test suites (tests/conformance) and the short fault campaigns
# (tests/cluster/test_campaign.py), run beside it in a second pytest. After them, still beside
# the rest, the whole-cluster simulation runs the rest of its wide sweep (2,240 seeds more than
# the 290 of the first part: 2,530 in all, and 60 more with queues paged to disk) on workers that take a core only when nothing else
# wants it (SCHED_IDLE), so that the idle share of the machine does the work. Their output
# follows the main run's; `make test` fails if any part fails. PYTEST_ADDOPTS applies to all.
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python
ARGS=(-q -p no:cacheprovider)
BESIDE=(tests/conformance tests/cluster/test_campaign.py)

"$PY" -m pytest "${ARGS[@]}" tests/unit tests/sim || exit $?

mkdir -p var
log=var/test-beside.log
(
    "$PY" -m pytest "${ARGS[@]}" "${BESIDE[@]}"
    rc=$?
    HUTCH_SIM_SEEDS=rest "$PY" -m pytest "${ARGS[@]}" -k batch_of_seeds tests/sim/test_cluster_sim.py || rc=$?
    exit $rc
) >"$log" 2>&1 &
beside=$!
trap 'pkill -TERM -P "$beside"; kill "$beside" 2>/dev/null' INT TERM

"$PY" -m pytest "${ARGS[@]}" --ignore=tests/cluster/test_campaign.py \
    tests/cluster tests/integration tests/crash tests/pipeline tests/packaging tests/ui
main_rc=$?
wait "$beside"
beside_rc=$?

echo
echo "==== run beside the rest: ${BESIDE[*]}, then the rest of the simulation sweep ===="
cat "$log"
if [ "$main_rc" -ne 0 ]; then exit "$main_rc"; fi
exit "$beside_rc"
