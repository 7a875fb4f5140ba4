"""Where a job's way from the POST to its first output line goes, from the API's own times.

    python bench/first_line.py [--jobs 30]

A throwaway loopback `ddpq serve --fake-gpus 8`; one 1-GPU job at a time, each printing its
own start time (`date +%s.%N`). For each: when the POST returned, when the daemon says it
was submitted and when its attempt started (the worker's lease), and the job's first line,
all from just before the POST. Prints the medians in a markdown table for bench/RESULTS.md.
`scheduler_bench.py` measures the whole; this splits it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from machine import (
    free_port,
    machine_line,
    python_c_pass_ms,
    start_daemon,
    stop_daemons,
    wait_until,
)
from scheduler_bench import devices

JOB = {"command": ["sh", "-c", "date +%s.%N"], "gpus": 1}
ENDED = {"succeeded", "failed", "cancelled", "timed_out"}
STEPS = ("POST returned", "submitted (the API's record)", "attempt started (the lease)")


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def one_job(http: httpx.Client) -> tuple[float, float, float, float]:
    """Seconds after the POST began: its return, the submission, the lease, the first line."""
    t0 = time.time()
    posted = http.post("/v1/jobs", json=JOB)
    returned = time.time() - t0
    posted.raise_for_status()
    job_id = posted.json()["id"]

    def ended() -> dict[str, Any] | None:
        job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ENDED else None

    job = wait_until(ended, 30, f"job {job_id} to end")
    log = http.get(f"/v1/jobs/{job_id}/log").text.splitlines()
    first = float(next(line for line in log if not line.startswith("[ddpq]")))
    started = seconds(job["attempts"][0]["started_at"])
    return returned, seconds(job["submitted_at"]) - t0, started - t0, first - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=30)
    jobs = ap.parse_args().jobs
    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-first-line-"))
    port = free_port()
    daemon = start_daemon(home, port, gpus=8)
    load = os.getloadavg()[0]
    try:
        headers = {"X-Ddpq-User": os.environ.get("USER", "root")}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:
            wait_until(lambda: devices(http) == 8, 60, "the worker to report its GPUs")
            samples = [one_job(http) for _ in range(jobs)]
    finally:
        stop_daemons([daemon], home)
    print(machine_line())
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {load:.2f} before; "
        f"`python -c pass` {python_c_pass_ms():.1f} ms; command: python bench/first_line.py "
        f"--jobs {jobs}\n"
    )
    print("| from just before the POST to | p50 |")
    print("|---|---|")
    for i, name in enumerate((*STEPS, "the job's first line")):
        print(f"| {name} | {statistics.median(s[i] for s in samples) * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
