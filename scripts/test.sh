#!/usr/bin/env bash
# The whole test suite, as the README and CI (.ci/run) run it. First mypy over the product
# packages (pyproject.toml's [tool.mypy]; zero errors is the bar). Then two streams side by side:
# - the serial cluster stream, `-m "cluster and (spark or alone)"`: embedded clusters whose
#   executors run Spark, end to end, one module after another (two of them at once load this
#   2-core machine to ~25 and the kill-and-failover tests time out), and the few cluster tests
#   marked `alone` (they measure CPU shares or timings; tests/conftest.py);
# - beside it, every other layer (pure, golden, Spark; `-m "not cluster"`), then the cluster
#   tests without Spark (`-m "cluster and not spark and not alone"`: the embedded master and
#   agents, executors without Spark, ZooKeeper), which took a Spark cluster module no longer
#   and added ~3-5 to its load of ~15 (docs/architecture.md, "Tests").
# The background stream's output is printed once both end. Extra arguments go to every run
# (e.g. `-x`, `-k`, a file). Exits non-zero when any run fails; a run that selects no test
# (pytest's 5) counts only when none ran a test.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m mypy || exit $?

others_log=$(mktemp)
light_log=$(mktemp)
trap 'rm -f "$others_log" "$light_log" "$others_log.status" "$light_log.status"' EXIT
(
  python3 -m pytest -q -p no:cacheprovider -m "not cluster" "$@" >"$others_log" 2>&1
  echo $? >"$others_log.status"
  python3 -m pytest -q -p no:cacheprovider -m "cluster and not spark and not alone" "$@" \
    >"$light_log" 2>&1
  echo $? >"$light_log.status"
) &
background=$!
python3 -m pytest -q -p no:cacheprovider -m "cluster and (spark or alone)" "$@"
cluster=$?
wait "$background"
others=$(cat "$others_log.status" 2>/dev/null || echo 1)
light=$(cat "$light_log.status" 2>/dev/null || echo 1)
echo
echo "---- the pure, golden and Spark layers (run beside the serial cluster stream) ----"
cat "$others_log"
echo
echo "---- the cluster tests without Spark (beside the serial cluster stream, after those) ----"
cat "$light_log"
echo "exit statuses: serial cluster $cluster, others $others, cluster without Spark $light"

if [ "$cluster" -eq 5 ] && [ "$others" -eq 5 ] && [ "$light" -eq 5 ]; then exit 5; fi
for status in "$cluster" "$others" "$light"; do
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
