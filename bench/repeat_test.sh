#!/usr/bin/env bash
# One test (or any pytest selection) run again and again, each in a new pytest process, and
# how many runs failed: how to tell a race that shows one run in ten from a fixed one.
#
#   bench/repeat_test.sh 'tests/test_supervision.py::test_kill9_restart_readopts_running_and_finalises_ended_jobs' 16
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
selection=$1
runs=${2:-10}
failed=0
for run in $(seq "$runs"); do
  last=$("$PY" -m pytest -q -n 0 -p no:cacheprovider "$selection" 2>&1 | tail -1)
  case "$last" in *failed*|*error*) failed=$((failed + 1)); echo "run $run: $last" ;; esac
done
echo "$(git rev-parse --short HEAD): $failed of $runs runs failed: $selection"
