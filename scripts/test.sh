#!/usr/bin/env bash
# The whole test suite, as the README and CI (.ci/run) run it. First mypy over the product
# packages (pyproject.toml's [tool.mypy]; zero errors is the bar). Then two pytest runs side by
# side: the cluster layer (embedded clusters end to end, one module after another: two at once
# load this 2-core machine to ~25 and the kill-and-failover tests time out), and beside it every
# other layer (pure, golden, Spark), whose output is printed once it ends. Extra arguments go to
# both runs (e.g. `-x`, `-k`, a file). Exits non-zero when either run fails; a run that selects no
# test (pytest's 5) counts only when neither ran a test.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m mypy || exit $?

others_log=$(mktemp)
trap 'rm -f "$others_log"' EXIT
python3 -m pytest -q -p no:cacheprovider -m "not cluster" "$@" >"$others_log" 2>&1 &
others_pid=$!
python3 -m pytest -q -p no:cacheprovider -m cluster "$@"
cluster=$?
wait "$others_pid"
others=$?
echo
echo "---- the pure, golden and Spark layers (run beside the cluster layer) ----"
cat "$others_log"
echo "test layers: cluster exit $cluster, others exit $others"

if [ "$cluster" -eq 5 ] && [ "$others" -eq 5 ]; then exit 5; fi
for status in "$cluster" "$others"; do
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
