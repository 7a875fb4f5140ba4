"""How long a freshly forked, single-threaded process takes to move itself into a cgroup,
by each file that can move it (what a forked shim does before its job runs).

    sudo python bench/cgroup_join.py [--runs 30]

For each writable hierarchy (a v1 ``pids`` mount, the v2 tree), a throwaway cgroup per run
beneath a ``ddpq-join-bench`` folder; each run forks a child that writes "0" (itself) into
the file and reports how long the write took. The runs are 0.2 s apart, as a shim's joins
are when jobs start one at a time: the kernel's global lock for ``cgroup.procs`` writes
stays cheap for a while after a write, and a burst of writes hides what one job pays.
Prints the median and the largest, beside ``python -c pass``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from machine import machine_line, python_c_pass_ms

HIERARCHIES = {"v1 pids": Path("/sys/fs/cgroup/pids"), "v2": Path("/sys/fs/cgroup/unified")}
FILES = {"v1 pids": ("cgroup.procs", "tasks"), "v2": ("cgroup.procs",)}


def one_join(folder: Path, name: str) -> float:
    """Seconds a forked child took to write "0" into ``folder/name``."""
    folder.mkdir()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one thread, like a shim just forked
        os.close(read)
        t0 = time.perf_counter()
        with open(folder / name, "w") as f:
            f.write("0")
        os.write(write, repr(time.perf_counter() - t0).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        took = float(answer.read())
    os.waitpid(pid, 0)
    folder.rmdir()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; {args.runs} joins each, 0.2 s apart\n")
    print("| hierarchy | file | median | largest |")
    print("|---|---|---|---|")
    for label, mount in HIERARCHIES.items():
        base = mount / "ddpq-join-bench"
        try:
            base.mkdir(exist_ok=True)
        except OSError as exc:
            print(f"| {label} | - | not writable here ({exc.strerror}) | |")
            continue
        try:
            for name in FILES[label]:
                times = []
                for run in range(args.runs):
                    times.append(one_join(base / f"run{run}", name))
                    time.sleep(0.2)
                print(
                    f"| {label} | {name} | {statistics.median(times) * 1000:.2f} ms | "
                    f"{max(times) * 1000:.2f} ms |"
                )
        finally:
            base.rmdir()


if __name__ == "__main__":
    main()
