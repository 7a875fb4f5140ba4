"""Where a daemon's CPU goes per submitted job, thread by thread, during a burst.

    python bench/burst_cpu.py [--jobs 200] [--src PATH] [--hold]

A real daemon (``ddpq serve --fake-gpus 8``, the code under ``--src``, this checkout's
by default), one client submitting ``--jobs`` trivial 1-GPU jobs one call at a time (as
``scheduler_bench.py``'s burst), and the CPU each of the daemon's threads used from the
first submission to the last (``/proc/PID/task/TID/stat``), per job. On a shared machine
wall times follow the other sessions' load; CPU per job does much less, so two trees run
alternately compare by it. ``--hold``: the jobs are submitted held (the API's path, and
the worker's passes over a queue that starts nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from machine import ROOT, cpu_model, free_port
from scheduler_bench import _all_done, wait_until


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddpq-burst-"))
    names = home / "threads.json"
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{args.src}:{ROOT / 'bench' / 'sampled'}",
        "DDPQ_BENCH_THREADS": str(names),
    }
    cmd = ["serve", "--port", str(port), "--home", str(home), "--fake-gpus", "8"]
    cmd += ["--port-range", "29600-29999"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen(
        [sys.executable, "-m", "ddpq", *cmd], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-Ddpq-User": "root"})
    try:
        wait_until(lambda: _devices(http) == 8, 60, "the worker")
        for _ in range(5):  # warm: the first of everything, outside the measure
            http.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        wait_until(lambda: _all_done(http, []), 60, "the warm-up")
        before, t0 = thread_cpu(daemon.pid), time.time()
        for _ in range(args.jobs):
            body = {"command": ["true"], "gpus": 1, "hold": args.hold}
            http.post("/v1/jobs", json=body).raise_for_status()
        submitted = time.time() - t0
        if not args.hold:
            wait_until(lambda: _all_done(http, []), 600, "the burst")
        done, after = time.time() - t0, thread_cpu(daemon.pid)
        who = {
            int(k): v
            for written in home.glob(names.name + "*")
            for k, v in json.loads(written.read_text()).items()
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        shutil.rmtree(home, ignore_errors=True)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    total = sum(used.values())
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    print(f"code: {args.src}; {args.jobs} jobs{' held' if args.hold else ''}")
    print(f"burst {submitted:.2f} s, all done {done:.2f} s = {args.jobs / done:.1f} jobs/s")
    print(f"daemon CPU per job: {1000 * total / args.jobs:.1f} ms")
    for tid, s in sorted(used.items(), key=lambda kv: -kv[1]):
        if s > 0:
            print(f"  {who.get(tid, '?')}: {1000 * s / args.jobs:.1f} ms")


def _devices(http: httpx.Client) -> int:
    try:
        return len(http.get("/v1/devices").json()["items"])
    except httpx.TransportError:  # not listening yet
        return 0


def thread_cpu(pid: int) -> dict[int, float]:
    """Each thread's user + system CPU seconds so far, the daemon's and its child's
    (``serve``'s worker half; the fork server and the jobs are the worker's children)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for process in (pid, *children(pid)):
        for tid in os.listdir(f"/proc/{process}/task"):
            try:
                stat = Path(f"/proc/{process}/task/{tid}/stat").read_text()
            except OSError:
                continue  # ended meanwhile
            fields = stat.rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


if __name__ == "__main__":
    main()
