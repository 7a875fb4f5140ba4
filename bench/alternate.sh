#!/bin/bash
# The scheduler benchmark at several commits, alternating, with the daemon's write-lock,
# GC and CPU figures (bench/sql_timing.py) after each run. On a shared, busy machine,
# alternating runs are the only fair comparison.
#
#   bench/alternate.sh [-r ROUNDS] COMMIT [COMMIT ...]
#   DDPQ_BENCH_FSYNC_MS=9 bench/alternate.sh 0906c85 HEAD    # a slow disk, emulated
#
# Each commit is exported (git archive, no worktree) and run with its own
# bench/scheduler_bench.py and src; this checkout's bench/sampled starts the timing.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
rounds=2
if [ "${1:-}" = "-r" ]; then rounds=$2; shift 2; fi
work=$(mktemp -d /tmp/ddpq-alternate-XXXXXX)
trap 'rm -rf "$work"' EXIT
for c in "$@"; do
  mkdir -p "$work/$c" && git -C "$here" archive "$c" | tar -x -C "$work/$c"
done
n=0
for _ in $(seq "$rounds"); do
  for c in "$@"; do
    n=$((n + 1))
    start=$( { /usr/bin/time -f "%e" "$python" -c pass; } 2>&1 )
    echo "== run $n: $c (fsync +${DDPQ_BENCH_FSYNC_MS:-0} ms), python -c pass ${start} s," \
      "load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$work/$c" && PYTHONPATH="$work/$c/src:$here/bench/sampled" \
      DDPQ_BENCH_SQL="$work/sql$n" "$python" bench/scheduler_bench.py --jobs 200 \
      --latency-samples "${SAMPLES:-20}" | grep -E "\| .* ms|jobs/s")
    grep -hE "cpu:|full coll|gate wait|lock wait|held" "$work"/sql$n.* | grep -v MainThread
  done
done
