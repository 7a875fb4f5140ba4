"""A submission's transaction beside a thread that computes, at two lock turns.

    python bench/lock_turns.py [--submissions 100] [--rounds 2]

In one process, as in ``ddpq serve``: the API's submit handler (the checks, the write
transaction with its cap count, the insert, the commit, the nudge) run one at a time in
the main thread, alone and beside a thread that computes without pause (as the
worker's pass does between its statements), with the interpreter's switch interval at
Python's default (5 ms) and at ``daemon.lock_turns.TURN_S``. Prints each case's wall
time per submission (p50, mean); rounds alternate the two intervals.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from ddpq.config import Settings
from ddpq.daemon.lock_turns import TURN_S
from ddpq.schemas import JobSubmit
from ddpq.server.deps import Caller
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.server.routes import jobs as routes
from ddpq.store.db import Database, migrate
from ddpq.worker.loop import Worker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--submissions", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpq-turns-") as home:
        measure(Settings(home=Path(home), fake_gpus=8), args.submissions, args.rounds)


def measure(settings: Settings, submissions: int, rounds: int) -> None:
    migrate(settings.db_path)
    Worker(settings, listen=False).reconcile()  # the GPUs, as a submission checks them
    db = Database(settings.db_path)
    who, lookups = Caller(name="alice", admin=True), NotifyLookups()

    def submit() -> None:  # the API's handler itself, without HTTP
        body = JobSubmit.model_validate({"command": ["true"], "gpus": 1})
        routes.submit(body, who, settings, db, lookups)

    print(f"python {sys.version.split()[0]}; {submissions} submissions per case")
    for _ in range(rounds):
        for turn in (0.005, TURN_S):
            sys.setswitchinterval(turn)
            for busy in (False, True):
                ms = timed(submit, submissions, busy)
                case = "beside a computing thread" if busy else "alone"
                print(
                    f"turn {turn * 1000:.1f} ms, {case}: p50 {statistics.median(ms):.1f} ms,"
                    f" mean {statistics.mean(ms):.1f} ms"
                )
    db.dispose()


def timed(submit, n: int, busy: bool) -> list[float]:  # type: ignore[no-untyped-def]
    stop = threading.Event()

    def compute() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    spinner = threading.Thread(target=compute) if busy else None
    if spinner is not None:
        spinner.start()
    ms = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            submit()
            ms.append((time.perf_counter() - t0) * 1000)
    finally:
        stop.set()
        if spinner is not None:
            spinner.join()
    return ms


if __name__ == "__main__":
    main()
