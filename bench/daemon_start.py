"""What one `ddpq serve` start and stop costs, as the test suite's daemons pay it.

    python bench/daemon_start.py [--runs 10] [--pythonpath OLD/src ...]

Each run: a fresh state folder holding a copy of a database already at the newest schema
(what ``tests/helpers.Daemon`` starts on), ``python -m ddpq serve --fake-gpus 4 --grace 1s``
with the test daemons' flags, /healthz polled as the tests poll it (one connection per look,
every 20 ms at first, then less often), then SIGTERM and the wait for its exit. Measured:
the wall time to the first answer and to the exit, and the CPU (user + system) of the daemon
and everything it waited for (its worker child, the fork server), from RUSAGE_CHILDREN.
`python -c pass` is measured the same way in the same rounds: the floor of any Python
process, and the figure to compare against on a loaded machine.

Each `--pythonpath` is another version of the code (for example main's, unpacked with
`git archive main src migrations | tar -x -C /tmp/before`), measured in the same rounds, interleaved
one start at a time so that they share the machine's noise. Each is byte-compiled first,
as an installed package is. Prints a markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from machine import cpu_model, free_port, runs_and_versions, wait_healthy

FLOOR = "python -c pass"
# Those of tests/helpers.Daemon that change what a start does (a small database reserve,
# CPU-only leases out of 64 cores), so that a start here is a test daemon's.
TEST_FLAGS = ["--state-reserve", "1M", "--cpu-capacity", "64", "--cpus-per-gpu", "0"]


@dataclass
class Sample:
    start_s: float  # to the first 200 from /healthz
    total_s: float  # to the exit after SIGTERM
    cpu_s: float  # user + system of the process and its waited-for descendants


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def template(src: str, folder: Path) -> Path:
    """A database at the newest schema of the code in ``src``, made by its own ``migrate``."""
    path = folder / "template.db"
    make = f"import pathlib, ddpq.store.db as d; d.migrate(pathlib.Path({str(path)!r}))"
    subprocess.run([sys.executable, "-c", make], env={**os.environ, "PYTHONPATH": src}, check=True)
    return path


def one_daemon(src: str, db: Path, scratch: Path) -> Sample:
    home = Path(tempfile.mkdtemp(dir=scratch)) / "home"
    home.mkdir()
    shutil.copyfile(db, home / "ddpq.db")
    port = free_port()
    argv = [sys.executable, "-m", "ddpq", "serve", "--home", str(home), "--port", str(port)]
    argv += ["--fake-gpus", "4", "--grace", "1s", *TEST_FLAGS]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    env.update(PYTHONPATH=src, OMP_NUM_THREADS="1")
    log = home / "daemon.log"
    cpu0, t0 = children_cpu(), time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_healthy(proc, port, log)
        t1 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    t2 = time.perf_counter()
    if code != 0:
        raise SystemExit(f"the daemon exited {code}:\n{log.read_text()}")
    return Sample(t1 - t0, t2 - t0, children_cpu() - cpu0)


def floor_sample() -> Sample:
    cpu0, t0 = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    wall = time.perf_counter() - t0
    return Sample(wall, wall, children_cpu() - cpu0)


def report(samples: dict[str, list[Sample]], runs: int, load_before: float) -> None:
    load = os.getloadavg()[0]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}, "
        f"{os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
        f"load average {load_before:.1f} before the run, {load:.1f} after; {runs} runs each\n"
    )
    floor = statistics.median(s.cpu_s for s in samples[FLOOR])
    print("| code | start p50 | start+stop p50 | CPU p50 | CPU min–max | × the floor's CPU |")
    print("|---|---|---|---|---|---|")
    for name, values in samples.items():
        cpu = [s.cpu_s for s in values]
        print(
            f"| {name} | {statistics.median(s.start_s for s in values):.2f} s "
            f"| {statistics.median(s.total_s for s in values):.2f} s "
            f"| {statistics.median(cpu):.3f} s | {min(cpu):.3f}–{max(cpu):.3f} s "
            f"| {statistics.median(cpu) / floor:.0f}× |"
        )


def main() -> None:
    runs, versions = runs_and_versions(10)
    scratch = Path(tempfile.mkdtemp(prefix="ddpq-start-bench-"))
    try:
        dbs = {}
        for i, (name, path) in enumerate(versions.items()):
            (scratch / str(i)).mkdir()
            dbs[name] = template(path, scratch / str(i))
        for name, path in versions.items():  # warm the page cache, unrecorded
            one_daemon(path, dbs[name], scratch)
        load_before = os.getloadavg()[0]
        samples: dict[str, list[Sample]] = {FLOOR: []}
        for _ in range(runs):
            samples[FLOOR].append(floor_sample())
            for name, path in versions.items():
                samples.setdefault(name, []).append(one_daemon(path, dbs[name], scratch))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
    report(samples, runs, load_before)


if __name__ == "__main__":
    main()
