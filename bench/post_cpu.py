"""The API's CPU per request, with no worker beside it: a submission, the reads a client polls
with (one job's detail, a page of the queue), and the framework's floor.

    python bench/post_cpu.py [--requests 300] [--rounds 2] [--src PATH]

``ddpq server`` alone (no worker: the queue only grows, and nothing else runs on the
machine) of the code under ``--src`` (this checkout's by default) on loopback, and one
``httpx`` client making its requests one after another: ``--requests`` submissions of a
CPU job (the server alone knows no GPUs), then as many ``GET``s of one queued job (what
``ddpq show`` and a waiting script poll), of the queue's first page (``ddpq ls``, the web
page) and of a path no route has (a 404: the framework's work and the middleware's, none of
ddpq's). For each, per request: the server's CPU (``/proc/PID/stat``, all its threads), the
client's, and the round trip's wall time. Run two trees alternately and compare within a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from burst_cpu import own_cpu, process_cpu
from machine import ROOT, free_port, machine_line, python_c_pass_ms, stop_daemons, wait_healthy


def per_request(server: int, requests: int, call: Callable[[], object]) -> tuple[float, ...]:
    """Server CPU, client CPU and median wall time of one ``call``, in ms."""
    server_0, client_0, walls = process_cpu(server)[0], own_cpu(), []
    for _ in range(requests):
        began = time.perf_counter()
        call()
        walls.append(time.perf_counter() - began)
    server_cpu = process_cpu(server)[0] - server_0
    return (
        server_cpu / requests * 1000,
        (own_cpu() - client_0) / requests * 1000,
        statistics.median(walls) * 1000,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--src", default=str(ROOT / "src"))
    args = ap.parse_args()
    print(machine_line())
    print(f"src: {args.src}; python -c pass {python_c_pass_ms():.1f} ms")
    home = Path(tempfile.mkdtemp(prefix="ddpq-post-"))
    port = free_port()
    cmd = ["server", "--home", str(home), "--port", str(port)]
    cmd += ["--allow-root"] if os.geteuid() == 0 else []
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen(
        [sys.executable, "-m", "ddpq", *cmd],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": args.src},
    )
    try:
        wait_healthy(daemon, port, home / "daemon.log")
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}")

        def submit() -> None:
            http.post("/v1/jobs", json={"command": ["true"], "gpus": 0}).raise_for_status()

        def detail() -> None:
            http.get("/v1/jobs/1").raise_for_status()

        def page() -> None:
            http.get("/v1/jobs", params={"limit": 20}).raise_for_status()

        def not_found() -> None:
            assert http.get("/v1/nothing-here").status_code == 404

        for call in (submit, not_found):  # warm: the first of everything, outside the measure
            for _ in range(20):
                call()
        print("| round | request | server CPU | client CPU | round trip p50 |")
        print("|---|---|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            calls = [("submission", submit), ("a job's detail", detail)]
            calls += [("a page of 20 jobs", page), ("404", not_found)]
            for name, call in calls:
                server, client, wall = per_request(daemon.pid, args.requests, call)
                row = f"| {round_} | {name} | {server:.2f} ms | {client:.2f} ms | {wall:.2f} ms |"
                print(row)
    finally:
        stop_daemons([daemon], home)
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
