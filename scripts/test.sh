#!/usr/bin/env bash
# The whole test suite, as the README and CI (.ci/run) run it: every layer (pure, Spark,
# cluster) in one pytest, on two pytest-xdist workers. Each test module runs on one worker
# (its module-scoped cluster or ZooKeeper starts once), the heaviest modules are handed out
# first (tests/conftest.py), so a cluster module's waits overlap the other worker's tests.
# Extra arguments go to pytest (e.g. `-x`, `-k`, a file). Exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder "$@"
