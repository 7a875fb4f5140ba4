"""Where the worker's CPU goes, phase by phase, while a burst of trivial jobs runs through it.

    python bench/worker_phases.py [--jobs 400] [--src PATH]

`ddpq server` and `ddpq worker --fake-gpus 8` of the code under ``--src`` (this
checkout's by default) on loopback (two processes, as `serve` runs them); the worker runs
under this script (``--as-worker``), which wraps its pass's phases and a few of their
parts and adds up the CPU its thread spent in each (``time.thread_time``: the interpreter
lock and the other processes' load do not count) and the wall time they took. One client
submits ``--jobs`` 1-GPU ``true`` jobs one call at a time, then waits for them. Prints
each phase's CPU and wall time in all, per call and per job. Phases nest: ``scheduling``
holds ``lease_next``, the start (``executor.start_many``), ``record_exits`` and
``mark_running_many``; the start holds the fork server's requests and answers
(``forkserver.send``, ``forkserver.answer``: wall time beyond their CPU is waiting for
the server) and the job's folder and log (``make_folder``, ``open_for_append``).
``the worker process in all``: its CPU, every thread, from its first pass to its exit (the
wait between passes, the wakes and the stop included), beside which the phases' sum is read.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import http.client
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from machine import ROOT, free_port, machine_line, stop_daemons, wait_until

SPENT: defaultdict[str, float] = defaultdict(float)
WALL: defaultdict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()
# The worker process's CPU (all its threads) from its first pass on: what the phases leave
# out (the wait between passes, wakes, other threads) is the difference.
FIRST_PASS: dict[str, float] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` so that the CPU its calls spend on this thread adds up under
    ``label``."""
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return measured(label, functools.partial(original, *args, **kwargs))

    setattr(owner, name, wrapper)


def measured(label: str, call: Callable[[], Any]) -> Any:
    """``call()``, its thread's CPU and its wall time added up under ``label``."""
    start, began = time.thread_time(), time.perf_counter()
    FIRST_PASS.setdefault("process", time.process_time())
    try:
        return call()
    finally:
        SPENT[label] += time.thread_time() - start
        WALL[label] += time.perf_counter() - began
        CALLS[label] += 1


def run_worker(report: Path, argv: list[str]) -> None:
    """``ddpq worker ARGV`` in this process (the code on its PYTHONPATH, ``--src``), its
    phases timed; the sums into ``report``."""
    from ddpq.executors.local import executor, forkclient, spawn
    from ddpq.worker import loop, scheduling

    original_guarded = loop.Worker._guarded

    def guarded(self: Any, phase: str, run: Callable[[], None]) -> None:
        measured(phase, functools.partial(original_guarded, self, phase, run))

    loop.Worker._guarded = guarded  # type: ignore[method-assign]
    timed(scheduling.Scheduler, "lease_next", "lease_next")
    timed(loop, "record_exits", "record_exits")
    timed(loop.attempt_store, "mark_running_many", "mark_running_many")
    # A tree from before start_many (stop 40) starts one job a call: each is timed.
    for name in ("start_many", "start", "ended"):
        if hasattr(executor.LocalExecutor, name):
            timed(executor.LocalExecutor, name, f"executor.{name}")
    for name in ("send", "answer", "fork"):
        if hasattr(forkclient.ForkServer, name):
            timed(forkclient.ForkServer, name, f"forkserver.{name}")
    for name in ("make_folder", "open_for_append"):
        timed(spawn, name, name)

    def write() -> None:
        SPENT["the worker process in all"] = time.process_time() - FIRST_PASS["process"]
        CALLS["the worker process in all"] = 1
        WALL["the worker process in all"] = 0.0  # not timed
        report.write_text(json.dumps([SPENT, WALL, CALLS]))

    atexit.register(write)
    sys.argv = ["ddpq", "worker", *argv]
    runpy.run_module("ddpq", run_name="__main__", alter_sys=True)


def request(port: int, method: str, path: str, body: object = None) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"X-Ddpq-User": "root", "Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        return json.loads(answer.read() or b"null")
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--as-worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_worker is not None:
        report, *argv = args.as_worker
        return run_worker(Path(report), argv)
    home = Path(tempfile.mkdtemp(prefix="ddpq-bench-phases-"))
    port, report = free_port(), home / "phases.json"
    common = ["--home", str(home), "--fake-gpus", "8", "--port-range", "29600-29999"]
    common += ["--allow-root"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": args.src}
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemons
    server = subprocess.Popen(
        [sys.executable, "-m", "ddpq", "server", "--port", str(port), *common],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, __file__, "--as-worker", str(report), *common],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        wait_until(lambda: gpus(port) == 8, 60, "the worker to report its GPUs")
        t0 = time.time()
        for _ in range(args.jobs):
            request(port, "POST", "/v1/jobs", {"command": ["true"], "gpus": 1})
        live = "/v1/jobs?state=queued&state=starting&state=running&limit=1"
        wait_until(lambda: request(port, "GET", live)["total"] == 0, 600, "the burst")
        took = time.time() - t0
    finally:
        stop_daemons([worker, server], None)
        log.close()
    spent, wall, calls = json.loads(report.read_text())  # written as the worker ended
    shutil.rmtree(home, ignore_errors=True)
    print(machine_line())
    print(f"command: python bench/worker_phases.py --jobs {args.jobs}; {took:.2f} s")
    print(f"src: {args.src}\n")
    print("| phase | CPU in all | calls | CPU per call | CPU per job | wall per job |")
    print("|---|---|---|---|---|---|")
    for phase, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(
            f"| {phase} | {seconds * 1000:.0f} ms | {calls[phase]} | "
            f"{seconds / calls[phase] * 1000:.2f} ms | {seconds / args.jobs * 1000:.2f} ms | "
            f"{wall[phase] / args.jobs * 1000:.2f} ms |"
        )


def gpus(port: int) -> int:
    """The GPUs the worker reported; 0 while the API does not answer yet."""
    try:
        return len(request(port, "GET", "/v1/devices")["items"])
    except OSError:
        return 0


if __name__ == "__main__":
    main()
