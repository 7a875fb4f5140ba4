"""What a job start costs with its limits' cgroups: start -> the job's first output line.

    python bench/limits_start.py [--runs 20]

Runs ``sh -c 'date +%s.%N'`` through the local executor (fork server, cgroup tracking) as
the worker does, three ways: no limits (``job_pids_max`` 0, no cores, no memory), the
default process cap alone, and cores + memory + process cap. Needs root and the
controllers (cgroup v2 delegated, or v1 hierarchies); it says which it used.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ddpq.config import Settings
from ddpq.core.spec import JobSpec
from ddpq.executors.base import Launch
from ddpq.executors.local.executor import LocalExecutor

COMMAND = ["sh", "-c", "date +%s.%N"]


def measure(runs: int, pids_max: int, **kw: Any) -> tuple[list[float], str]:
    root = Path(tempfile.mkdtemp(prefix="ddpq-limits-"))
    (root / "home").mkdir()
    (root / "jobs").mkdir()
    executor = LocalExecutor(Settings(home=root / "home", job_pids_max=pids_max), gpu_count=0)
    said = executor.limits.describe()
    samples = []
    try:
        for job_id in range(1, runs + 1):
            spec = JobSpec(name="j", owner="bench", command=COMMAND, cwd="/", gpus=0)
            folder = root / "jobs" / str(job_id)
            launch = Launch(job_id, 1, folder, spec, (), None, None, **kw)
            t0 = time.time()
            executor.start(launch)
            executor.proceed([job_id])
            while not executor.ended():
                time.sleep(0.002)
            words = launch.job_dir.joinpath("output.log").read_text().split("\n")
            first = next(w for w in words if w and not w.startswith("[ddpq]"))
            samples.append((float(first) - t0) * 1000)
    finally:
        executor.close()
    samples.sort()
    return samples, said


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    cases = (
        ("no limits", 0, {}),
        ("process cap only (the default)", 4096, {}),
        ("cores + memory + process cap", 4096, {"cores": (0,), "ram_bytes": 1 << 30}),
    )
    for name, pids_max, kw in cases:
        samples, said = measure(args.runs, pids_max, **kw)
        print(
            f"{name}: start -> first line median {statistics.median(samples):.1f} ms, "
            f"p90 {samples[int(len(samples) * 0.9) - 1]:.1f} ms ({said})"
        )


if __name__ == "__main__":
    main()
