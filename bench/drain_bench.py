"""How fast a full queue drains through 8 GPUs, with no submission competing for the CPU.

    python bench/drain_bench.py [--jobs 200] [--src PATH]

A real daemon (``ddpq serve --fake-gpus 8``, the code under ``--src``, this checkout's by
default) on loopback. Eight ``sleep 3`` jobs take the eight GPUs; ``--jobs`` trivial
1-GPU jobs (``true``) are queued behind them while they sleep. From the first GPU's
release to the last job's end, the worker turns the GPUs over on its own: each pass
records the ends, leases the next jobs, starts their shims and lets them go. Prints the
drain rate (jobs/s), how long each job held its GPU (its lease to its end: the pass's
starts, the shim's start, the job, its record) and the hand-over on each GPU.
``scheduler_bench.py``'s burst measures the same turn-over with the submissions beside it.
Run two trees alternately and compare within a run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx
from machine import (
    ROOT,
    free_port,
    machine_line,
    python_c_pass_ms,
    start_daemon,
    stop_daemons,
    wait_until,
)
from scheduler_bench import _all_done, _handover_gaps, _t, devices, pct

SLEEPERS = 8
SLEEP_S = 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--src", default=str(ROOT / "src"))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddpq-drain-"))
    port = free_port()
    daemon = start_daemon(home, port, "--port-range", "29600-29999", gpus=SLEEPERS, src=args.src)
    http = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"X-Ddpq-User": os.environ.get("USER", "root")},
    )

    def submit(command: list[str]) -> int:
        answer = http.post("/v1/jobs", json={"command": command, "gpus": 1})
        answer.raise_for_status()
        return int(answer.json()["id"])

    try:
        wait_until(lambda: devices(http) == SLEEPERS, 60, "the worker")
        sleepers = [submit(["sleep", str(SLEEP_S)]) for _ in range(SLEEPERS)]
        began = time.time()
        trivial = [submit(["true"]) for _ in range(args.jobs)]
        queued_s = time.time() - began
        wait_until(lambda: _all_done(http, sleepers + trivial), 600, "the queue to drain")
        slept = [http.get(f"/v1/jobs/{i}").json() for i in sleepers]
        ran = [http.get(f"/v1/jobs/{i}").json() for i in trivial]
    finally:
        stop_daemons([daemon], home)
    if any(job["state"] != "succeeded" for job in slept + ran):
        raise SystemExit("a job did not succeed: the figures would mean nothing")
    first_free = min(_t(job["ended_at"]) for job in slept)
    if min(_t(job["started_at"]) for job in ran) < first_free:
        raise SystemExit("a trivial job started before the sleepers ended: raise SLEEP_S")
    drained_s = max(_t(job["ended_at"]) for job in ran) - first_free
    held = [(_t(job["ended_at"]) - _t(job["started_at"])) * 1000 for job in ran]
    gaps = _handover_gaps(slept + ran)
    print(machine_line())
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M')} UTC; command: python bench/drain_bench.py "
        f"--jobs {args.jobs}; src {args.src}; python -c pass {python_c_pass_ms():.1f} ms"
    )
    print(f"queued in {queued_s:.2f} s, before the first GPU came free\n")
    print("| measure | p50 | p90 |")
    print("|---|---|---|")
    print(
        f"| a job's hold of its GPU (lease to end) | {pct(held, 0.5):.1f} ms | "
        f"{pct(held, 0.9):.1f} ms |"
    )
    print(f"| GPU hand-over | {pct(gaps, 0.5):.1f} ms | {pct(gaps, 0.9):.1f} ms |")
    print(f"\ndrain: {args.jobs} jobs in {drained_s:.2f} s = {args.jobs / drained_s:.1f} jobs/s")


if __name__ == "__main__":
    main()
