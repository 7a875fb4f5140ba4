"""Sweeps benchmark: submitting big sweeps, and what 1,000 queued members cost the planner.

    python bench/sweep_bench.py [--members 1000] [--repeat 5]

Measures
  1. POST /v1/sweeps against a real daemon (`ddpq serve --fake-gpus 8`) from outside, the
     whole round trip: an array of N members (`0-(N-1)`), a product of three parameters
     over a command (N combinations), and the same over the built-in workload's options
     (each value checked by its parser). Held (`hold: true`), so nothing runs meanwhile.
  2. core.scheduler.plan() alone, in process: N queued jobs, plain or members of one sweep
     capped at 8 (all capped out but 8), with 8 GPUs and 400 ports.
  3. One worker pass (Worker.step with the fake executor, no process) in its steady
     state: N queued, 8 running, nothing can start; plain jobs against one capped sweep.
Prints markdown to paste into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from machine import free_port, machine_line, stop_daemons

from ddpq.config import Settings
from ddpq.core import scheduler as planner
from ddpq.core.spec import JobSpec
from ddpq.executors.fake import FakeExecutor, FakeHost
from ddpq.store import jobs as job_store
from ddpq.store import sweeps as sweep_store
from ddpq.store.db import Database, migrate
from ddpq.worker.loop import Worker


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Milliseconds per call, ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(what: str, ms: list[float]) -> str:
    return f"| {what} | {statistics.median(ms):.1f} ms | {max(ms):.1f} ms |"


def cube(n: int) -> list[str]:
    """Values for three parameters whose product is about n (at most n)."""
    side = max(1, round(n ** (1 / 3)))
    while side > 1 and side**3 > n:
        side -= 1
    return [str(v) for v in range(1, side + 1)]


def submit_figures(members: int, repeat: int) -> list[str]:
    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-"))
    port = free_port()
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    cmd = [sys.executable, "-m", "ddpq", "serve", "--home", str(home), "--port", str(port)]
    cmd += ["--fake-gpus", "8"] + (["--allow-root"] if os.geteuid() == 0 else [])
    cmd += ["--max-queued-per-user", "0"]  # every repeat's members stay held: no cap here
    daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the daemon did not start")
            time.sleep(0.05)
        values = cube(members)
        bodies = {
            f"array of {members} (`0-{members - 1}`)": {
                "template": {"command": ["run", "{index}"], "hold": True},
                "array": f"0-{members - 1}",
            },
            f"product of 3 parameters over a command ({len(values) ** 3})": {
                "template": {"command": ["run", "{a}", "{b}", "{c}"], "hold": True},
                "params": {"a": values, "b": values, "c": values},
            },
            f"product of 3 options of the resnet18 workload ({len(values) ** 3})": {
                "template": {"workload": "resnet18", "gpus": 1, "hold": True},
                "params": {"epochs": values, "seed": values, "warmup-epochs": values},
            },
        }
        lines = []
        for what, body in bodies.items():

            def post(body: dict[str, Any] = body) -> None:
                r = http.post("/v1/sweeps", json=body)
                assert r.status_code == 201, r.text

            lines.append(row(f"POST /v1/sweeps, {what}", timed(post, repeat)))
        return lines
    finally:
        log.close()  # ours; the daemon writes through its own descriptor
        stop_daemons([daemon], home)


def planner_figures(members: int, repeat: int) -> list[str]:
    gpus, ports = list(range(8)), list(range(29600, 30000))
    running = [planner.RunningJob(i, (i,), 0.0, None) for i in range(8)]
    free_gpus = list(range(8, 16))  # 8 more GPUs free: the cap, not the GPUs, holds members

    def queue(sweep: int | None) -> list[planner.QueuedJob]:
        return [
            planner.QueuedJob(100 + i, "alice", 1, 0, float(i), sweep_id=sweep)
            for i in range(members)
        ]

    plain, capped = queue(None), queue(7)
    caps = planner.SweepCaps({7: 8}, {7: 8})
    everything = [*gpus, *free_gpus]
    cases = {
        f"plan(), {members} plain jobs (8 of them placed)": lambda: planner.plan(
            plain, everything, running, ports, {}, 1000.0
        ),
        f"plan(), {members} members of a sweep at its cap of 8 (none placed)": lambda: planner.plan(
            capped, everything, running, ports, {}, 1000.0, sweep_caps=caps
        ),
        "plan(), an empty queue": lambda: planner.plan([], everything, running, ports, {}, 1000.0),
    }
    return [row(what, timed(fn, repeat * 10)) for what, fn in cases.items()]


class Clock:
    def __init__(self) -> None:
        self.at = 1_000_000.0

    def __call__(self) -> float:
        return self.at


def worker_pass_ms(capped: bool, members: int, repeat: int) -> list[float]:
    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-"))
    try:
        settings = Settings(home=home, fake_gpus=16, port_range=(29600, 29999))
        migrate(settings.db_path)
        clock = Clock()
        host = FakeHost(clock=clock)
        worker = Worker(settings, FakeExecutor(host), clock=clock, listen=False)
        worker.scheduler.ports.port_free = lambda port: True
        worker.reconcile()
        db = Database(settings.db_path)
        job = JobSpec(name="b", owner="alice", command=["true"], cwd="/", gpus=1)
        with db.write() as s:
            if capped:
                rows = [sweep_store.NewMember(i, f"b-{i}", ["true"], {}) for i in range(members)]
                sweep_store.create_sweep(
                    s, sweep_store.NewSweep(job, {}, {}, "bench", 8, rows), clock()
                )
            else:
                # 8 fill half the GPUs; the rest ask for all 16 and wait.
                for i in range(members):
                    spec = job if i < 8 else JobSpec(**{**job.__dict__, "gpus": 16})
                    job_store.create_job(s, spec, clock())
        worker.step()  # 8 start; from here on every pass finds nothing to start
        assert len(host.running()) == 8, host.running()

        def step() -> None:
            clock.at += 0.01
            worker.step()

        step()
        out = timed(step, repeat)
        worker.close()
        db.dispose()
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


def worker_figures(members: int, repeat: int) -> list[str]:
    return [
        row(
            f"one worker pass, {members} queued {kind}, 8 running",
            worker_pass_ms(c, members, repeat * 4),
        )
        for kind, c in (("plain jobs", False), ("members of one sweep capped at 8", True))
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    lines = submit_figures(args.members, args.repeat)
    lines += planner_figures(args.members, args.repeat)
    lines += worker_figures(args.members, args.repeat)
    print(machine_line())
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M')}; command: python bench/sweep_bench.py "
        f"--members {args.members} --repeat {args.repeat}; load average before: "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print("| measure | median | max |")
    print("|---|---|---|")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
