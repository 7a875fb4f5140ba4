"""``scheduler_bench.py`` again and again, each run beside the machine's speed at that moment.

    python bench/burst_series.py [--runs 10] [--gap 30] [--jobs 200] [--latency-samples 50]

This machine's cores change speed for seconds at a time with nothing running in it, and a
single run's throughput says little alone. Each run here is a fresh ``python
bench/scheduler_bench.py --jobs J --latency-samples L``, ``--gap`` seconds after the last
(its deleted state folder makes the next one's job folders dearer for a while on an ext4
without a journal). Beside each run: the load, a fixed pure-Python loop timed by this
thread's CPU just before it (a million iterations: the cores' speed then), and what the
run printed: its client's CPU a POST of the burst (the same code every run: how fast the
machine ran the burst itself), a job folder's kernel CPU, the throughput and the latencies.
Then jobs/s × the client's ms a POST over the runs (how far the throughput follows the
machine's speed), and how many runs reached 100 jobs/s.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_line

HERE = Path(__file__).resolve().parent
TARGET = 100.0  # jobs/s: issue 22, step 8

# What scheduler_bench.py prints, by the figure each pattern takes.
FIGURES = {
    "client_ms": r"this client's CPU a POST of the burst: ([\d.]+) ms",
    "folder_ms": r"a job's folder beside the home, ([\d.]+) ms of kernel CPU",
    "jobs_s": r"= ([\d.]+) jobs/s \(burst submitted in [\d.]+ s\)",
    "burst_s": r"jobs/s \(burst submitted in ([\d.]+) s\)",
    "post_ms": r"submit latency \(POST round trip\) \| ([\d.]+) ms",
    "first_ms": r"first line, idle GPUs \| ([\d.]+) ms \| ([\d.]+) ms",
    "handover_ms": r"hand-over \(job end -> next start on that GPU\) \| ([\d.]+) ms \| ([\d.]+) ms",
}


def loop_ms() -> float:
    """This thread's CPU for a million iterations of a plain loop, in ms."""
    start, total = time.thread_time(), 0
    for i in range(1_000_000):
        total += i
    return (time.thread_time() - start) * 1000


def one_run(jobs: int, samples: int) -> dict[str, str]:
    command = [sys.executable, str(HERE / "scheduler_bench.py"), "--jobs", str(jobs)]
    command += ["--latency-samples", str(samples)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    found: dict[str, str] = {}
    for name, pattern in FIGURES.items():
        match = re.search(pattern, out)
        if match is None:
            raise SystemExit(f"scheduler_bench.py printed no {name}:\n{out}")
        found[name] = " / ".join(match.groups())
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--gap", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=50)
    args = ap.parse_args()
    print(machine_line())
    print(
        f"command: python bench/burst_series.py --runs {args.runs} --gap {args.gap:g} "
        f"--jobs {args.jobs} --latency-samples {args.latency_samples}\n"
    )
    print(
        "| UTC | load | loop before | client CPU a POST | a job folder | jobs/s | burst of POSTs "
        "| first line p50 / p99 | hand-over p50 / p99 | POST p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    pairs: list[tuple[float, float]] = []
    for n in range(args.runs):
        if n:
            time.sleep(args.gap)  # a series spaced out in time, not a wait for a condition
        load = Path("/proc/loadavg").read_text().split()[0]
        speed = loop_ms()
        f = one_run(args.jobs, args.latency_samples)
        pairs.append((float(f["client_ms"]), float(f["jobs_s"])))
        print(
            f"| {time.strftime('%H:%M:%S')} | {load} | {speed:.0f} ms | {f['client_ms']} ms "
            f"| {f['folder_ms']} ms | {f['jobs_s']} | {f['burst_s']} s | {f['first_ms']} ms "
            f"| {f['handover_ms']} ms | {f['post_ms']} ms |",
            flush=True,
        )
    products = [client * rate for client, rate in pairs]
    reached = [client for client, rate in pairs if rate >= TARGET]
    missed = [client for client, rate in pairs if rate < TARGET]
    print(
        f"\njobs/s x the client's ms a POST: {min(products):.0f}-{max(products):.0f} "
        f"(mean {statistics.mean(products):.0f})"
    )
    print(f"{len(reached)} of {len(pairs)} runs at {TARGET:.0f} jobs/s or more", end="")
    if reached:
        print(f" (the client at {min(reached):.2f}-{max(reached):.2f} ms a POST)", end="")
    if missed:
        print(f"; below in runs with the client at {min(missed):.2f}-{max(missed):.2f} ms", end="")
    print()


if __name__ == "__main__":
    main()
