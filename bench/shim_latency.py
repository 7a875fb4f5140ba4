"""How long the shim takes to start a job: spawn -> the job's first output line.

    python bench/shim_latency.py [--runs 30]

Starts `python -S executors/local/shim.py ... -- sh -c 'date +%s.%N'` in a new session, as
the worker does, and compares the timestamp the job prints with the moment before the spawn.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpq.executors.local.shim_command import shim_argv
from ddpq.jobdir import JobDir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    samples = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ddpq-shim-") as where:  # left nowhere
            folder = JobDir(Path(where))
            t0 = time.time()
            subprocess.run(
                [
                    *shim_argv(sys.executable, folder, "/", 10.0, 1 << 20, None),
                    "sh",
                    "-c",
                    "date +%s.%N",
                ],
                start_new_session=True,
                check=True,
            )
            first = folder.log.read_text().split()[0]
            samples.append((float(first) - t0) * 1000)
    samples.sort()
    print(
        f"spawn -> job's first line over {args.runs} runs: "
        f"p50 {statistics.median(samples):.1f} ms, "
        f"p90 {samples[int(0.9 * (len(samples) - 1))]:.1f} ms"
    )


if __name__ == "__main__":
    main()
