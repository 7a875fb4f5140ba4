"""One scheduling pass with a long queue: the worker's own cost, without HTTP or processes.

    PYTHONPATH=src python bench/plan_pass.py [--jobs 10000] [--passes 20]

An in-process worker (the fake executor, a migrated SQLite file in a temporary folder)
with one array of ``--jobs`` CPU-only jobs queued behind the box's cores: the first pass
starts what the cores allow; then each measured pass either finds nothing to start
(nothing ended) or, every other time, one job ended and the next one starts (what
bench/cpu_flood.py's daemon does several times a second). Prints the median and worst
pass, each kind, and the first pass. Point ``PYTHONPATH`` at another tree's ``src`` to
compare two versions of the code, one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.spec import JobSpec
from ddpq.executors.fake import FakeExecutor, FakeHost
from ddpq.store import sweeps
from ddpq.store.db import Database, migrate
from ddpq.worker.loop import Worker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpq-plan-pass-") as tmp:
        cfg = Settings(home=Path(tmp) / "home", fake_gpus=2)
        migrate(cfg.db_path)
        db = Database(cfg.db_path)
        job = JobSpec(name="f", owner="alice", command=["sleep", "1"], cwd="/tmp", gpus=0)
        members = [sweeps.NewMember(i, f"f-{i}", ["sleep", "1"], {}) for i in range(args.jobs)]
        t0 = time.perf_counter()
        with db.write() as s:
            new = sweeps.NewSweep(job, {}, {}, f"0-{args.jobs - 1}", None, members)
            sweeps.create_sweep(s, new, time.time())
        submit_s = time.perf_counter() - t0
        host = FakeHost()
        worker = Worker(cfg, FakeExecutor(host), listen=False)
        worker.scheduler.ports.port_free = lambda port: True  # type: ignore[method-assign]
        t0 = time.perf_counter()
        worker.step()
        first_ms = (time.perf_counter() - t0) * 1000
        idle, handover = [], []
        for n in range(args.passes):
            ends = n % 2 == 1
            if ends:
                host.finish(host.running()[0], 0)
            t0 = time.perf_counter()
            worker.step()
            (handover if ends else idle).append((time.perf_counter() - t0) * 1000)
        running = len(host.running())
        worker.close()
        db.dispose()
    print(f"{args.jobs:,} queued, {running} running; the array submitted in {submit_s:.2f} s")
    print(f"first pass {first_ms:.1f} ms")
    for name, got in (("nothing to start", idle), ("one ended, the next starts", handover)):
        print(f"{name}: median {statistics.median(got):.1f} ms, worst {max(got):.1f} ms")


if __name__ == "__main__":
    main()
