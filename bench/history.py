"""The scheduler benchmark at several commits, one after another in one run, to compare.

    python bench/history.py COMMIT [COMMIT ...] [--jobs 200] [--latency-samples 50]
    python bench/history.py HEAD --env DDPQ_SPAWN=exec     # one setting changed

Each commit is checked out into a temporary git worktree and measured with that commit's
own ``bench/scheduler_bench.py`` and code (``PYTHONPATH`` set to its ``src``), in this
virtualenv. These machines are noisy: compare the rows of one run, not runs of two days.
Prints one markdown row per commit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {
    "first line": re.compile(r"first line, idle GPUs \| ([\d.]+) ms \| ([\d.]+) ms"),
    "hand-over": re.compile(r"GPU hand-over [^|]*\| ([\d.]+) ms \| ([\d.]+) ms"),
    "submit": re.compile(r"submit latency [^|]*\| ([\d.]+) ms \| ([\d.]+) ms"),
    "throughput": re.compile(r"= ([\d.]+) jobs/s"),
}


def measure(commit: str, args: argparse.Namespace, env: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory(prefix="ddpq-history-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), commit],
            check=True,
        )
        try:
            run = subprocess.run(
                [
                    sys.executable,
                    str(tree / "bench" / "scheduler_bench.py"),
                    "--jobs",
                    str(args.jobs),
                    "--latency-samples",
                    str(args.latency_samples),
                ],
                cwd=tree,
                env={**os.environ, **env, "PYTHONPATH": str(tree / "src")},
                capture_output=True,
                text=True,
                timeout=1200,
            )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True
            )
    if run.returncode != 0:
        return f"| {commit} | failed: {run.stderr.strip().splitlines()[-1:]} |"
    found = {name: pattern.search(run.stdout) for name, pattern in FIGURES.items()}
    cells = []
    for name in ("throughput", "first line", "hand-over", "submit"):
        match = found[name]
        if match is None:
            cells.append("?")
        elif name == "throughput":
            cells.append(f"{match.group(1)} jobs/s")
        else:
            cells.append(f"{match.group(1)} / {match.group(2)} ms")
    label = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()[:60]
    extra = " ".join(f"{k}={v}" for k, v in env.items())
    return f"| {label}{' (' + extra + ')' if extra else ''} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("commits", nargs="+")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=50)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemon")
    args = ap.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    print("| commit | throughput | submit -> first line p50 / p99 | hand-over p50 / p99 |", end="")
    print(" submit p50 / p99 |")
    print("|---|---|---|---|---|")
    for commit in args.commits:
        print(measure(commit, args, env), flush=True)


if __name__ == "__main__":
    main()
