"""Scheduler benchmark: a real daemon with 8 fake GPUs, measured from outside.

    python bench/scheduler_bench.py [--jobs 200] [--latency-samples 50]

Measures
  1. submit latency: the POST /v1/jobs round trip (p50/p99);
  2. submit -> running on idle GPUs: from just before the POST to the job's own first
     output line (a timestamp the job prints), p50/p99, one job at a time;
  3. end-to-end throughput: N trivial 1-GPU jobs submitted in a burst, jobs/s from the
     first submission to the last job's end;
  4. GPU hand-over: for each GPU, the gap between one job's end (its exit record) and the
     next job's start on it, during the burst (p50/p99).
Prints a markdown table to paste into bench/RESULTS.md, and above it this client's own CPU
a POST of the burst: the same code each run, so a gauge of how fast the machine ran it (its
cores change speed for seconds at a time; a throughput means something beside that).

``--autogroup-nice N`` (root, a kernel with ``sched_autogroup_enabled``): the daemon's
session is given the scheduling weight of nice N against other sessions
(``/proc/PID/autogroup``). Each shim leads a session of its own, so by default the
daemon's API and worker together weigh as much as one job: this asks what favouring
them would change.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from job_folder_cost import filesystem, job_folders
from machine import free_port, machine_line, stop_daemons, wait_until

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=50)
    ap.add_argument("--split", action="store_true", help="ddpq server + ddpq worker")
    ap.add_argument("--autogroup-nice", type=int, default=None, help="the daemon's session's")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-"))
    # What a job's folder costs beside the home just now: on an ext4 without a journal it
    # follows what was deleted near it in the last minutes (bench/job_folder_cost.py).
    folder_ms = job_folders(home.parent, 200)[0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    common = ["--home", str(home), "--fake-gpus", "8", "--port-range", "29600-29999"]
    if os.geteuid() == 0:  # a throwaway loopback daemon
        common.append("--allow-root")
    if args.split:  # API and worker as two processes (no shared interpreter lock)
        commands = [
            ["server", "--port", str(port), *common],
            ["worker", *common],
        ]
    else:
        commands = [["serve", "--port", str(port), *common]]
    daemons = [
        subprocess.Popen(
            [sys.executable, "-m", "ddpq", *cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for cmd in commands
    ]
    http = httpx.Client(base_url=url, headers={"X-Ddpq-User": os.environ.get("USER", "root")})
    try:
        if args.autogroup_nice is not None:  # one session: `serve`'s worker half shares it
            Path(f"/proc/{daemons[0].pid}/autogroup").write_text(str(args.autogroup_nice))
        wait_until(lambda: _ok(http), 60, "the daemon")
        wait_until(lambda: devices(http) == 8, 60, "the worker")
        # 1 + 2: one job at a time on idle GPUs.
        submit_ms, to_running_ms = [], []
        for _ in range(args.latency_samples):
            t0 = time.time()
            r = http.post("/v1/jobs", json={"command": ["sh", "-c", "date +%s.%N"], "gpus": 1})
            submit_ms.append((time.time() - t0) * 1000)
            job_id = r.json()["id"]
            job = wait_until(lambda j=job_id: _done(http, j), 30, "a job")
            first = http.get(f"/v1/jobs/{job_id}/log").text.splitlines()
            line = next(ln for ln in first if not ln.startswith("[ddpq]"))
            to_running_ms.append((float(line) - t0) * 1000)
            assert job["state"] == "succeeded"
        # 3 + 4: a burst of trivial jobs through 8 GPUs.
        t0, client_cpu = time.time(), time.process_time()
        ids = [
            http.post("/v1/jobs", json={"command": ["true"], "gpus": 1}).json()["id"]
            for _ in range(args.jobs)
        ]
        submitted, client_cpu = time.time(), time.process_time() - client_cpu
        wait_until(lambda: _all_done(http, ids), 600, "the burst")
        details = [http.get(f"/v1/jobs/{i}").json() for i in ids]
        ends = [_t(d["ended_at"]) for d in details]
        throughput = args.jobs / (max(ends) - t0)
        gaps = _handover_gaps(details)
    finally:
        stop_daemons(daemons, home)

    print(machine_line())
    print(
        f"date: {time.strftime('%Y-%m-%d')}; command: python bench/scheduler_bench.py "
        f"--jobs {args.jobs} --latency-samples {args.latency_samples}"
        f"{' --split' if args.split else ''}"
        + ("" if args.autogroup_nice is None else f" --autogroup-nice {args.autogroup_nice}")
    )
    print(
        f"disk: a job's folder beside the home, {folder_ms:.3f} ms of kernel CPU "
        f"({filesystem(home.parent)}; bench/job_folder_cost.py)"
    )
    # The same code every run: how much more it takes than its best is how much slower
    # the machine ran the burst (its cores change speed for seconds at a time, and
    # everything on them with it).
    print(f"this client's CPU a POST of the burst: {client_cpu / args.jobs * 1000:.2f} ms\n")
    print("| measure | p50 | p99 |")
    print("|---|---|---|")
    print(
        f"| submit latency (POST round trip) | {pct(submit_ms, 0.5):.1f} ms | "
        f"{pct(submit_ms, 0.99):.1f} ms |"
    )
    print(
        f"| submit -> job's first line, idle GPUs | {pct(to_running_ms, 0.5):.1f} ms | "
        f"{pct(to_running_ms, 0.99):.1f} ms |"
    )
    print(
        f"| GPU hand-over (job end -> next start on that GPU) | {pct(gaps, 0.5):.1f} ms | "
        f"{pct(gaps, 0.99):.1f} ms |"
    )
    print(
        f"\nthroughput: {args.jobs} trivial 1-GPU jobs in {max(ends) - t0:.2f} s = "
        f"{throughput:.1f} jobs/s (burst submitted in {submitted - t0:.2f} s)"
    )


def _ok(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _done(http: httpx.Client, job_id: int) -> dict | None:  # type: ignore[type-arg]
    job = http.get(f"/v1/jobs/{job_id}").json()
    return job if job["state"] in TERMINAL else None


def devices(http: httpx.Client) -> int:
    """The GPUs the worker has reported; 0 while the daemon does not answer yet."""
    try:
        return len(http.get("/v1/devices").json()["items"])
    except httpx.TransportError:
        return 0


def _all_done(http: httpx.Client, ids: list[int]) -> bool:
    r = http.get("/v1/jobs", params={"state": ["queued", "starting", "running"], "limit": 1})
    return r.json()["total"] == 0


def _t(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _handover_gaps(details: list[dict]) -> list[float]:  # type: ignore[type-arg]
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for d in details:
        for a in d["attempts"]:
            for g in a["gpus"]:
                by_gpu.setdefault(g, []).append((_t(a["started_at"]), _t(a["ended_at"])))
    gaps = []
    for runs in by_gpu.values():
        runs.sort()
        for (_, end), (start, _) in itertools.pairwise(runs):
            if start >= end:
                gaps.append((start - end) * 1000)
    return gaps


if __name__ == "__main__":
    main()
