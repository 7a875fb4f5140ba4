"""A flood of 10,000 CPU jobs held to the box's cores, with the daemon answering throughout
(issue 23: one 10,000-member sweep of `sleep 3600` ran 9,985 jobs at once, load 560).

    PYTHONPATH=src python bench/cpu_flood.py [--jobs 10000] [--seconds 60] [--sleep 0.5]

Starts a real daemon (`machine.start_daemon`: this checkout, a temporary home,
`--fake-gpus 2`, no cap on waiting jobs; cores and memory at their defaults: the host's
cores, 90% of its memory), submits one array of `--jobs`
CPU-only jobs (`sleep --sleep`, each leasing the one core a job that names none takes), and
for `--seconds` asks `/healthz` every 20 ms on one connection while it samples, every
0.25 s, how many jobs run (the daemon's own count, `GET /v1/queue`) and the host's load.
Prints a markdown table for bench/RESULTS.md: the submission's time, /healthz p50, p99 and
the worst, the most jobs running at once against the cores, the jobs finished, and
`python -c pass` measured in the same run. The flood is cancelled and the daemon stopped at
the end (its jobs with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from ls_flood import NO_QUEUE_CAP
from machine import cpu_model, free_port, python_c_pass_ms, start_daemon

ROOT = Path(__file__).resolve().parents[1]


def request(url: str, method: str = "GET", body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as answer:
        raw = answer.read()
    return json.loads(raw) if raw else None


def running(base: str) -> int:
    view = request(f"{base}/v1/queue?state=running&state=starting&expand=true&limit=1")
    assert isinstance(view, dict)
    return int(view["total"])


def flood(base: str, jobs: int, seconds: float, sleep_s: float) -> dict[str, float]:
    import http.client

    template = {"command": ["sleep", str(sleep_s)], "cwd": "/tmp"}
    body = {"template": template, "array": f"0-{jobs - 1}"}
    t0 = time.perf_counter()
    sweep = request(f"{base}/v1/sweeps", "POST", body)
    submit_s = time.perf_counter() - t0
    assert isinstance(sweep, dict)
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    health: list[float] = []
    most, loads, sampled_at = 0, [], 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        health.append((time.perf_counter() - t) * 1000)
        if time.monotonic() - sampled_at >= 0.25:
            sampled_at = time.monotonic()
            most = max(most, running(base))
            loads.append(os.getloadavg()[0])
        time.sleep(0.02)
    conn.close()
    done = request(f"{base}/v1/queue?state=succeeded&expand=true&limit=1")
    assert isinstance(done, dict)
    request(f"{base}/v1/sweeps/{sweep['id']}/cancel", "POST")
    health.sort()
    return {
        "submit_s": submit_s,
        "p50": statistics.median(health),
        "p99": health[int(0.99 * (len(health) - 1))],
        "worst": health[-1],
        "asks": len(health),
        "most_running": most,
        "finished": int(done["total"]),
        "load_max": max(loads) if loads else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--sleep", type=float, default=0.5, help="each job's sleep")
    args = ap.parse_args()
    floor = python_c_pass_ms()
    with tempfile.TemporaryDirectory(prefix="ddpq-cpu-flood-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        port = free_port()
        proc = start_daemon(home, port, *NO_QUEUE_CAP)
        try:
            r = flood(f"http://127.0.0.1:{port}", args.jobs, args.seconds, args.sleep)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    cores = len(os.sched_getaffinity(0))
    print(f"{cpu_model()}, {cores} cores, Python {platform.python_version()}")
    print(f"`python -c pass`: {floor:.1f} ms (median of 10, same run)\n")
    print(
        "| jobs | submit | /healthz p50 | p99 | worst | asks | most running | cores | "
        "finished | load (max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.jobs:,} | {r['submit_s']:.1f} s | {r['p50']:.1f} ms | {r['p99']:.1f} ms | "
        f"{r['worst']:.1f} ms | {r['asks']:,.0f} | {r['most_running']:.0f} | {cores} | "
        f"{r['finished']:,.0f} in {args.seconds:g} s | {r['load_max']:.1f} |"
    )


if __name__ == "__main__":
    main()
