#!/usr/bin/env bash
# The whole test suite, as the README and CI (.ci/run) run it: every layer (pure, Spark,
# cluster) in one pytest, on two pytest-xdist workers. Each test module runs on one worker
# (its module-scoped cluster or ZooKeeper starts once), the heaviest modules are handed out
# first (tests/conftest.py), so a cluster module's waits overlap the other worker's tests.
# First mypy over the product packages (pyproject.toml's [tool.mypy]; zero errors is the bar).
# Extra arguments go to pytest (e.g. `-x`, `-k`, a file). Exits with the first failing status.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m mypy
exec python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder "$@"
