"""Whether the machine's slow minutes are stolen time: a fixed Python loop, timed against
the whole machine's steal ticks in /proc/stat.

    python bench/cpu_steal.py [--rounds 8]

Each round runs 2,000,000 additions and prints the loop's wall and CPU time beside the
machine's user, idle and steal ticks over it (a tick is 10 ms). A slow round whose own CPU
grew with no steal means the CPU itself ran slower, not that the hypervisor took it away.
"""

from __future__ import annotations

import argparse
import time

from machine import machine_line


def ticks() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    print(machine_line())
    for _ in range(args.rounds):
        before, wall, cpu = ticks(), time.perf_counter(), time.process_time()
        total = 0
        for k in range(2_000_000):
            total += k
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        d = [b - a for a, b in zip(before, ticks(), strict=True)]
        print(
            f"loop: wall {wall * 1e3:.1f} ms, its CPU {cpu * 1e3:.1f} ms; machine ticks: "
            f"user {d[0]}, idle {d[3]}, steal {d[7]}"
        )
        time.sleep(0.5)  # rounds apart, so that they sample different minutes' speed


if __name__ == "__main__":
    main()
