"""Where the worker's time goes: 200 queued trivial jobs through a Worker in this process.

    python bench/worker_profile.py [--jobs 200] [--top 25]

No HTTP: the jobs are written straight into the store, then the worker loop runs until
they have all finished, under cProfile. Prints the wall time and the top functions by
their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import pwd
import shutil
import tempfile
import time
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs
from ddpq.store.db import Database, migrate
from ddpq.worker.loop import Worker

LIVE = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="tottime", help="tottime or cumulative")
    ap.add_argument("--dump", help="also write the profile here (pstats, for print_callees)")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddpq-profile-"))
    try:
        settings = Settings(home=home, fake_gpus=8, poll_s=0.05)
        migrate(settings.db_path)
        worker = Worker(settings)
        worker.reconcile()
        db = Database(settings.db_path)
        me = pwd.getpwuid(os.geteuid()).pw_name  # a root daemon runs jobs as their owner
        with db.write() as s:
            for _ in range(args.jobs):
                spec = JobSpec(name="t", owner=me, command=["true"], cwd="/", gpus=1)
                jobs.create_job(s, spec, time.time())
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        steps = 0
        while True:
            worker.step()
            steps += 1
            with db.read() as s:
                counts = jobs.count_by_state(s)
            if not any(counts.get(state, 0) for state in LIVE):
                break
            worker._wait()
        profile.disable()
        wall = time.perf_counter() - t0
        with db.read() as s:
            ok = jobs.list_jobs(s, states=["succeeded"], limit=1)[1]
        print(
            f"{args.jobs} jobs in {wall:.2f} s ({args.jobs / wall:.1f} jobs/s), {steps} steps, "
            f"{ok} succeeded"
        )
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
        if args.dump:
            profile.dump_stats(args.dump)
        worker.close()
        db.dispose()
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
