"""Where a daemon's CPU goes per submitted job, thread by thread, during a burst.

    python bench/burst_cpu.py [--jobs 200] [--src PATH] [--hold]

A real daemon (``ddpq serve --fake-gpus 8``, the code under ``--src``, this checkout's
by default), one client submitting ``--jobs`` trivial 1-GPU jobs one call at a time (as
``scheduler_bench.py``'s burst), and the CPU each of the daemon's threads used from the
first submission to the last (``/proc/PID/task/TID/stat``), per job; beside it the whole
machine's busy CPU (``/proc/stat``), of which the fork server's and the shims' it forked
(with their jobs: its reaped children), and this client's. On a shared machine
wall times follow the other sessions' load; CPU per job does much less, so two trees run
alternately compare by it. ``--hold``: the jobs are submitted held (the API's path, and
the worker's passes over a queue that starts nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from machine import ROOT, busy_cpu_s, cpu_model, free_port, stop_daemons, wait_until
from scheduler_bench import _all_done, devices


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
        wait_until(lambda: devices(http) == 8, 60, "the worker")
        for _ in range(5):  # warm: the first of everything, outside the measure
            http.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        wait_until(lambda: _all_done(http, []), 60, "the warm-up")
        server = fork_server(daemon.pid)
        machine_0, server_0, client_0 = busy_cpu_s(), process_cpu(server), own_cpu()
        before, t0 = thread_cpu(daemon.pid), time.time()
        for _ in range(args.jobs):
            body = {"command": ["true"], "gpus": 1, "hold": args.hold}
            http.post("/v1/jobs", json=body).raise_for_status()
        submitted = time.time() - t0
        if not args.hold:
            wait_until(lambda: _all_done(http, []), 600, "the burst")
        done, after = time.time() - t0, thread_cpu(daemon.pid)
        machine_1, server_1, client_1 = busy_cpu_s(), process_cpu(server), own_cpu()
        who = {
            int(k): v
            for written in home.glob(names.name + "*")
            for k, v in json.loads(written.read_text()).items()
        }
    finally:
        stop_daemons([daemon], home)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    total = sum(used.values())
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    print(f"code: {args.src}; {args.jobs} jobs{' held' if args.hold else ''}")
    print(f"burst {submitted:.2f} s, all done {done:.2f} s = {args.jobs / done:.1f} jobs/s")
    per_job = 1000 / args.jobs
    machine, client = machine_1 - machine_0, client_1 - client_0
    own, shims = (server_1[i] - server_0[i] for i in range(2))
    print(f"whole machine's busy CPU per job: {per_job * machine:.1f} ms")
    print(f"  the shims and their jobs (the fork server's children): {per_job * shims:.1f} ms")
    print(f"  the fork server itself: {per_job * own:.1f} ms")
    print(f"  this client: {per_job * client:.1f} ms")
    rest = machine - total - own - shims - client
    print(f"  the rest (the kernel's threads, other processes): {per_job * rest:.1f} ms")
    print(f"daemon CPU per job: {1000 * total / args.jobs:.1f} ms")
    for tid, s in sorted(used.items(), key=lambda kv: -kv[1]):
        if s > 0:
            print(f"  {who.get(tid, '?')}: {1000 * s / args.jobs:.1f} ms")


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


def fork_server(daemon: int) -> int:
    """The pid of the worker's fork server (``executors/local/forkserver.py``), which
    every shim is forked from: a child of the daemon's worker half."""
    for half in (daemon, *children(daemon)):
        for pid in children(half):
            if b"forkserver.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise SystemExit("no fork server under the daemon (DDPQ_SPAWN=exec?)")


def process_cpu(pid: int) -> tuple[float, float]:
    """A process's own CPU seconds and those of its children it has reaped (the shims,
    and with them their jobs, which each shim reaps)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


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
