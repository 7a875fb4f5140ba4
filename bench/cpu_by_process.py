"""Where a command's CPU goes, by kind of process: every process on the machine looked at
twice a second while the command runs, its CPU attributed to a kind by its command line.

    python bench/cpu_by_process.py -- bash bench/suite_time.sh
    python bench/cpu_by_process.py --every 0.25 -- .venv/bin/python -m pytest -q tests/worker

Meant for the test suite, whose processes are mostly not the command's own children (a
daemon's jobs are double-forked, torchrun's ranks sit in sessions of their own), so no
rusage of the command counts them. A process that lives between two looks is missed: what
the machine's busy time (/proc/stat) has beyond the sum is shown as "unseen (short-lived)".
A process already running when the command starts counts only what it uses after.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from machine import busy_cpu_s, machine_line, python_c_pass_ms

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
# The first pattern that matches a command line names its kind (checked in this order).
KINDS = (
    ("pytest's workers", re.compile(r"execnet|import sys;exec\(eval\(sys\.stdin")),
    ("pytest itself", re.compile(r"-m pytest")),
    ("torchrun's agents", re.compile(r"torch\.distributed\.run")),
    ("ResNet18 ranks", re.compile(r"ddpq\.workloads\.resnet18|resnet18\.py")),
    ("torch test jobs", re.compile(r"elastic_example\.py|ddp_tiny\.py")),
    ("daemons, forked", re.compile(r"tests\.zygote .*ddpq\.daemon")),
    ("zygotes", re.compile(r"tests\.zygote")),
    ("daemons", re.compile(r"ddpq (serve|server|worker)\b")),
    ("shims", re.compile(r"^ddpq-shim")),
    ("CLI calls", re.compile(r"bin/ddpq |-m ddpq ")),
    ("Slurm and munge", re.compile(r"slurm|munge")),
    ("chromium", re.compile(r"chrom")),
    ("other Python", re.compile(r"python")),
    ("kernel threads", re.compile(r"^\[")),
)


def kind_of(cmdline: str) -> str:
    return next((name for name, pattern in KINDS if pattern.search(cmdline)), "other")


def look(seen: dict[tuple[int, int], list[float | str]]) -> None:
    """Each live process's CPU so far, by (pid, start time): a reused pid is a new entry."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) * TICK_S
            key = (int(entry.name), int(fields[19]))
            if key not in seen:
                raw = (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip()
                name = raw.decode(errors="replace") or "[" + stat.split("(", 1)[1].rsplit(")")[0]
                seen[key] = [name, cpu]  # its command line, its CPU so far
            else:
                seen[key][1] = cpu
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.5, help="seconds between looks")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    print(machine_line())
    print(f"python -c pass {python_c_pass_ms():.1f} ms; command: {' '.join(command)}")
    seen: dict[tuple[int, int], list[float | str]] = {}
    look(seen)
    already = {key: float(values[1]) for key, values in seen.items()}
    busy0, began = busy_cpu_s(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        look(seen)
        time.sleep(args.every)  # the look's period, not a wait for a condition
    look(seen)
    busy, wall = busy_cpu_s() - busy0, time.monotonic() - began
    by_kind: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for key, (cmdline, now) in seen.items():
        used = float(now) - already.get(key, 0.0)
        if used > 0:
            kind = kind_of(str(cmdline))
            by_kind[kind] += used
            count[kind] += 1
    by_kind["unseen (short-lived)"] = max(0.0, busy - sum(by_kind.values()))
    print(f"wall {wall:.0f} s; the machine busy {busy:.0f} s (exit {proc.returncode})")
    print("| kind | processes | CPU | share |")
    print("|---|---|---|---|")
    for kind, used in sorted(by_kind.items(), key=lambda item: -item[1]):
        share = 100 * used / busy if busy else 0.0
        print(f"| {kind} | {count[kind] or ''} | {used:.0f} s | {share:.0f} % |")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
