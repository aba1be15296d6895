#!/usr/bin/env bash
# The whole test suite, as the README and CI (.ci/run) run it, in three streams side by side:
# - the serial cluster stream, `-m "(cluster and spark or alone) and not beside"`: embedded
#   clusters whose executors run Spark, end to end, one module after another (two of them at
#   once load this 2-core machine to ~25 and the kill-and-failover tests time out), and the few
#   tests marked `alone` (they measure CPU shares or wait out timings; tests/conftest.py);
# - beside it: every other layer (pure, golden, Spark; `-m "not cluster and not alone"`), then
#   the Spark cluster tests marked `beside` (they kill nothing and time nothing, so they may
#   share the machine with the serial stream's last modules, which would otherwise run alone on
#   one of its two cores). The other layers run on two pytest-xdist workers (`-n 2 --dist
#   loadfile`: each module whole on one worker, the longest first, each worker with its own
#   SparkSession and broker): the suite mostly waits (micro-batch triggers, heartbeats,
#   generators' rates, brokers restarting), not on CPU. On 2026-12-01, with three other
#   engineers' runs loading the machine to 83 % busy, one process took 1,271 s for these layers
#   and the serial stream 1,477 s, the same as on a quiet machine (1,247 and 1,460 s);
# - and from the start, the cluster tests without Spark (`-m "cluster and not spark and not
#   alone"`: the embedded master and agents, executors without Spark, ZooKeeper; ~2.5 minutes
#   that mostly wait on timeouts and heartbeats, so they cost the other two streams little CPU),
#   then mypy over the product packages (pyproject.toml's [tool.mypy]; zero errors is the bar).
#   In the second stream these added their whole wall time to the suite's longest stream.
# - once all three end, the Spark cluster tests marked `quiet`: the shedding test, whose
#   scheduler decides from the CPU its agent's cgroup got; beside the other streams its
#   instance, busy all the time with its backlog growing, came out at 77 % of its agent's
#   capacity and nothing was shed (2026-12-01 05:47; two cores for five pytest processes).
#   ~65-90 s.
# The other streams' output is printed once all end. Extra arguments go to every pytest run
# (e.g. `-x`, `-k`, a file). Exits non-zero when mypy or any run fails; a run that selects no
# test (pytest's 5) counts only when none ran a test.
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run() {  # run NAME COMMAND...: the command's output to $logs/NAME, its exit status beside it
  local name=$1
  shift
  "$@" >"$logs/$name" 2>&1
  echo $? >"$logs/$name.status"
}
(
  run others python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
    -m "not cluster and not alone" "$@"
  run beside python3 -m pytest -q -p no:cacheprovider -m "cluster and spark and beside" "$@"
) &
background=$!
(
  run light python3 -m pytest -q -p no:cacheprovider -m "cluster and not spark and not alone" "$@"
  run mypy python3 -m mypy
) &
light_stream=$!
python3 -m pytest -q -p no:cacheprovider -m "(cluster and spark or alone) and not beside and not quiet" "$@"
cluster=$?
wait "$background" "$light_stream"
# last, on a machine left to them: the tests marked `quiet` (tests/conftest.py QUIET_MODULES)
run quiet python3 -m pytest -q -p no:cacheprovider -m "quiet" "$@"
status_of() { cat "$logs/$1.status" 2>/dev/null || echo 1; }
show() {
  echo
  echo "---- $2 ----"
  cat "$logs/$1" 2>/dev/null
}
show mypy "mypy (in the third stream, after the cluster tests without Spark)"
show others "the pure, golden and Spark layers (beside the serial cluster stream)"
show light "the cluster tests without Spark (a third stream, from the start)"
show beside "the Spark cluster tests marked beside (after the pure, golden and Spark layers)"
show quiet "the Spark cluster tests marked quiet (last, once every other stream ended)"
mypy=$(status_of mypy)
others=$(status_of others)
light=$(status_of light)
beside=$(status_of beside)
quiet=$(status_of quiet)
echo "exit statuses: mypy $mypy, serial cluster $cluster, others $others," \
  "cluster without Spark $light, Spark cluster beside $beside, quiet $quiet"

if [ "$mypy" -ne 0 ]; then exit "$mypy"; fi
if [ "$cluster" -eq 5 ] && [ "$others" -eq 5 ] && [ "$light" -eq 5 ] && [ "$beside" -eq 5 ] \
    && [ "$quiet" -eq 5 ]; then
  exit 5
fi
for status in "$cluster" "$others" "$light" "$beside" "$quiet"; do
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
