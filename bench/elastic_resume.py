"""An elastic ResNet18 against runs that had 4 ranks all along (docs/elastic.md).

The elastic run starts on 2 ranks (``--batch-size B``: a global batch of 2B), is preempted
in the middle of epoch ``--at-epoch`` as ddpq preempts (the signal to each rank) and resumes
on 4 ranks with the same arguments: per-rank batch B/2, the same global batch and learning
rate. The references run the same recipe on 4 ranks from the start (``--batch-size B/2``),
with the elastic run's seed and with other seeds: how far apart two runs of one recipe land
is the scale to judge the elastic run's difference by. gloo on the CPU, one thread a rank.

    python bench/elastic_resume.py               # about 10 minutes on 2 busy cores
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.workload.runs import (  # noqa: E402
    PREEMPTIBLE,
    RUN_TIMEOUT_S,
    finish,
    kill_job,
    records,
    run,
    signal_ranks,
    start,
    wait_for,
)


def last_epoch(job: Path) -> dict[str, Any]:
    return [r for r in records(job) if r["phase"] == "epoch"][-1]


def elastic(common: list[str], batch: int, at_epoch: int, job: Path) -> tuple[dict[str, Any], str]:
    args = [*common, "--batch-size", str(batch)]
    log = job.with_name("elastic.log")
    proc = start(args, job, 2, log, {**PREEMPTIBLE, "DDPQ_ATTEMPT": "1"}, signal.SIGUSR1)
    try:
        # Some steps into the epoch: a mid-epoch checkpoint.
        wait_for(
            lambda: any(r["epoch"] == at_epoch and r["step"] >= 3 for r in records(job)),
            RUN_TIMEOUT_S * 5,
            proc,
        )
        signal_ranks(proc, signal.SIGUSR1)
        finish(proc, timeout=120)
    finally:
        kill_job(proc, signal.SIGKILL)
    env = {**PREEMPTIBLE, "DDPQ_ATTEMPT": "2"}
    code, out = run(args, job, nproc=4, env=env, log_name="elastic2.log")
    if code != 0:
        raise SystemExit(f"the resumed run failed ({code}):\n{out}")
    said = [line for line in out.splitlines() if line.startswith(("resum", "continuing"))]
    return last_epoch(job), " / ".join(said)


def reference(common: list[str], batch: int, seed: int, job: Path) -> dict[str, Any]:
    args = [*common, "--batch-size", str(batch // 2), "--seed", str(seed)]
    code, out = run(args, job, nproc=4)
    if code != 0:
        raise SystemExit(f"the 4-rank run failed ({code}):\n{out}")
    return last_epoch(job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=1000, help="synthetic training images")
    ap.add_argument("--batch-size", type=int, default=16, help="per rank on 2 ranks (even)")
    ap.add_argument("--steps", type=int, default=15, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--at-epoch", type=int, default=2, help="the epoch preempted in")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--other-seeds", type=int, nargs="*", default=[5, 6])
    a = ap.parse_args()
    common = ["--synthetic", str(a.images), "--max-steps-per-epoch", str(a.steps)]
    common += ["--epochs", str(a.epochs)]
    started = dt.datetime.now(dt.UTC)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        got, said = elastic([*common, "--seed", str(a.seed)], a.batch_size, a.at_epoch, base / "e")
        rows = [(f"elastic 2 → 4 ranks, seed {a.seed}", got)]
        for seed in (a.seed, *a.other_seeds):
            ref = reference(common, a.batch_size, seed, base / f"r{seed}")
            rows.append((f"4 ranks all along, seed {seed}", ref))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load:.1f} → {os.getloadavg()[0]:.1f}"
    )
    print(f"`python bench/elastic_resume.py` ({' '.join(common)}, global batch {2 * a.batch_size})")
    print(f"the resumed run said: {said}\n")
    print("| run | train_loss | train_acc | test_loss | test_acc |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['train_loss']:.3f} | {r['train_acc']:.3f} | "
            f"{r['test_loss']:.3f} | {r['test_acc']:.3f} |"
        )


if __name__ == "__main__":
    main()
