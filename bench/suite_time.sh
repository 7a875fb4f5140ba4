#!/usr/bin/env bash
# Time the whole test suite as `make test` runs it, with what to judge the figure by:
# the machine (CPU, cores), its load before and after, and `python -c pass` beside it.
#
#   bench/suite_time.sh                 # as `make test`: -n auto (a worker more than the cores)
#   TEST_WORKERS=0 bench/suite_time.sh  # one process, as before pytest-xdist
#   bench/suite_time.sh tests/worker    # a subset (the same options)
#
# The figures go to stdout and, with pytest's output, to $LOG (default: a temporary file).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORKERS=${TEST_WORKERS:-auto}
LOG=${LOG:-$(mktemp --suffix=.suite.log)}

python_c_pass_ms() {
    "$PY" - <<'PYEOF'
import statistics, subprocess, sys, time
runs = []
for _ in range(20):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    runs.append(time.perf_counter() - t)
print(f"{statistics.median(runs) * 1000:.1f}")
PYEOF
}

echo "machine:   $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "python:    $("$PY" -c 'import sys; print(sys.version.split()[0])')"
echo "before:    load $(cut -d' ' -f1-3 /proc/loadavg), python -c pass $(python_c_pass_ms) ms"
command=("$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" --durations=30 "$@")
echo "command:   ${command[*]}"
# The machine's busy CPU over the run (/proc/stat, in USER_HZ ticks): every process counts,
# the jobs' shims too (double-forked, so no rusage of the suite's includes them).
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
busy0=$(busy_ticks)
start=$(date +%s.%N)
set +e
"${command[@]}" >"$LOG" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
busy1=$(busy_ticks)
echo "after:     load $(cut -d' ' -f1-3 /proc/loadavg), python -c pass $(python_c_pass_ms) ms"
echo "result:    $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$LOG" | tail -1 | tr -d '=' | xargs) (exit $rc)"
awk -v s="$start" -v e="$end" 'BEGIN { w = e - s; printf "wall time: %d min %02d s (%.0f s)\n", w / 60, w % 60, w }'
awk -v b0="$busy0" -v b1="$busy1" -v s="$start" -v e="$end" -v n="$(nproc)" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { c = (b1 - b0) / hz; printf "busy CPU:  %.0f s, %.0f %% of the %d cores over the run\n", c, 100 * c / ((e - s) * n), n }'
echo "log:       $LOG"
exit $rc
