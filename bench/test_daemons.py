"""What a test's daemon costs, started as a new interpreter or forked from the zygote.

    python bench/test_daemons.py [--runs 10]

Each run starts a daemon through ``tests.helpers.Daemon`` (a copy of the migrated template
database, the tests' flags, /healthz polled as the tests poll it), asks it for its devices,
and stops it with SIGTERM; the runs alternate between ``DDPQ_TESTS_FRESH_PROCESSES=1`` (a
new ``python -m ddpq serve``) and a fork of ``tests/zygote.py``'s process, which has done a
daemon's imports once before the first run. Measured per start and stop: the machine's busy
CPU from /proc/stat (every process: the daemon, its worker half, its fork server, the
polling), and the wall time. `python -c pass` is timed in the same rounds. Prints a markdown
table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# After the checkout's root is on the path:
from machine import busy_cpu_s, machine_line, python_c_pass_ms  # noqa: E402
from tests import helpers  # noqa: E402


def one_daemon(fresh: bool) -> tuple[float, float]:
    """Busy CPU and wall seconds of one start, one request and one stop."""
    if fresh:
        os.environ["DDPQ_TESTS_FRESH_PROCESSES"] = "1"
    else:
        os.environ.pop("DDPQ_TESTS_FRESH_PROCESSES", None)
    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-daemon-"))
    try:
        cpu, wall = busy_cpu_s(), time.monotonic()
        d = helpers.Daemon(home=home, port=helpers.free_port(), args=["--fake-gpus", "4"])
        d.start()
        assert len(d.client().devices().items) == 4
        assert d.stop() == 0, (home / "daemon.log").read_text()
        return busy_cpu_s() - cpu, time.monotonic() - wall
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    runs = ap.parse_args().runs
    helpers.ZYGOTE.spawn("ddpq", ["--help"], dict(os.environ), os.open(os.devnull, os.O_WRONLY))
    results: dict[str, list[tuple[float, float]]] = {"new interpreter": [], "forked": []}
    floors = []
    load = os.getloadavg()[0]
    for _ in range(runs):
        results["new interpreter"].append(one_daemon(fresh=True))
        results["forked"].append(one_daemon(fresh=False))
        floors.append(python_c_pass_ms(runs=1))
    helpers.ZYGOTE.close()
    print(machine_line())
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {load:.2f} before; "
        f"`python -c pass` {statistics.median(floors):.1f} ms (median); "
        f"command: python bench/test_daemons.py --runs {runs}\n"
    )
    print("| daemon | busy CPU per start and stop, median (min–max) | wall, median |")
    print("|---|---|---|")
    for name, samples in results.items():
        cpu = [c for c, _ in samples]
        wall = [w for _, w in samples]
        print(
            f"| {name} | {statistics.median(cpu):.2f} s ({min(cpu):.2f}–{max(cpu):.2f}) | "
            f"{statistics.median(wall):.2f} s |"
        )


if __name__ == "__main__":
    main()
