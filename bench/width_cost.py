"""What ResNet18's ``--width`` costs: one run under torchrun per width, its wall time and the
CPU of every process it started (torchrun and its ranks), beside ``python -c pass`` and a
bare ``import torch`` measured in the same run.

The narrow network (``--width 16``) is what the tests of resumes, retries and preemptions
train (``tests/workload/runs.NARROW``); the published one (64) what the tests of training
itself do. gloo on the CPU, one thread a rank.

    python bench/width_cost.py                       # 4 ranks, widths 64 and 16, twice
    python bench/width_cost.py --ranks 2 --widths 64 32 16 8
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import cpu_model  # noqa: E402
from tests.workload.runs import job_env, workload_cmd  # noqa: E402


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and the CPU seconds of ``cmd`` and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--rounds", type=int, default=2)
    # The elastic test's recipe: 3 epochs of 12 steps, 4 images a rank.
    ap.add_argument("--synthetic", type=int, default=400)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    print(f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    recipe = ["--synthetic", str(args.synthetic), "--max-steps-per-epoch", str(args.steps)]
    recipe += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    print(f"{args.ranks} ranks, {' '.join(recipe)}")
    print("| round | what | wall | CPU |\n|---|---|---|---|")
    for number in range(1, args.rounds + 1):
        for what, cmd in (("python -c pass", []), ("python -c 'import torch'", ["torch"])):
            code = f"import {cmd[0]}" if cmd else "pass"
            wall, cpu = timed([sys.executable, "-c", code])
            print(f"| {number} | {what} | {wall:.2f} s | {cpu:.2f} s |")
        for width in args.widths:
            with tempfile.TemporaryDirectory(prefix="ddpq-width-") as tmp:
                job = Path(tmp) / "job"
                job.mkdir()
                cmd = workload_cmd([*recipe, "--width", str(width)], args.ranks)
                wall, cpu = timed(cmd, job_env(job))
            print(f"| {number} | --width {width} | {wall:.1f} s | {cpu:.1f} s |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
