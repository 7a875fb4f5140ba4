"""How long `ddpq ls` takes with 60,000 of someone else's held jobs in the queue, against
an empty queue (issue 23: six held arrays of 10,000 made another user's `ls` take 13.8 s).

    PYTHONPATH=src python bench/ls_flood.py [--runs 15] [--before OLD/src --before-runs 3]

Starts a real daemon (`ddpq serve --fake-gpus 2 --max-queued-per-user 0`, this checkout,
a temporary home) and times whole `ddpq ls` processes (the virtualenv's `ddpq` script, as a
user types it) beside `python -c pass`, interleaved one command at a time, in three queues:

1. empty;
2. user `flood` has six held arrays of 10,000 (60,000 jobs, submitted through the API as
   the issue did);
3. and 60,000 plain held jobs of `flood` besides (written straight into the store as
   held rows, one statement: 60,000 submissions would take this bench an hour): 120,000.

In each, the caller (this account) has one held job of its own. `ls --user flood` (a screen
of that user's jobs) is timed too. `--before` is another version's client (for example
main's: `git archive main src | tar -x -C /tmp/before`), timed in the same queues with fewer
runs: it pages through every job. Prints a markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from machine import cpu_model, free_port, start_daemon, stop_daemons

ROOT = Path(__file__).resolve().parents[1]
NO_QUEUE_CAP = ("--max-queued-per-user", "0")  # the flood is the point here
FLOOD = "flood"
ARRAYS, MEMBERS = 6, 10_000


def wall_ms(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def post(url: str, body: dict[str, object], user: str) -> None:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Ddpq-User": user},
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        assert r.status == 201, r.status


def flood_arrays(base: str) -> None:
    template = {"command": ["true"], "gpus": 0, "hold": True, "cwd": "/tmp"}
    for _ in range(ARRAYS):
        body = {"template": template, "array": f"0-{MEMBERS - 1}"}
        post(f"{base}/v1/sweeps", body, FLOOD)


def flood_plain(home: Path, n: int) -> None:
    """``n`` plain held jobs of ``flood``, as rows (what ``store.jobs.create_job`` writes
    for a held job, less its event), in one transaction."""
    sys.path.insert(0, str(ROOT / "src"))
    from sqlalchemy import insert

    from ddpq.core.spec import JobSpec
    from ddpq.core.states import JobState
    from ddpq.store.db import Database
    from ddpq.store.models import Job, new_row

    spec = JobSpec(name="plain", owner=FLOOD, command=["true"], cwd="/tmp", gpus=0, hold=True)
    db = Database(home / "ddpq.db")
    try:
        with db.write() as s:
            row = new_row(spec, JobState.HELD, "held", time.time())
            s.connection().execute(insert(Job.__table__), [row] * n)  # type: ignore[arg-type]
    finally:
        db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--before", help="another version's src folder, timed beside this one")
    ap.add_argument("--before-runs", type=int, default=3)
    args = ap.parse_args()
    versions = {"this checkout": str(ROOT / "src")}
    if args.before:
        versions["before"] = args.before
    for path in versions.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", path], check=True)

    home = Path(tempfile.mkdtemp(prefix="ddpq-ls-flood-"))
    port = free_port()
    daemon = start_daemon(home, port, *NO_QUEUE_CAP)
    url = f"http://127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    base["DDPQ_URL"] = url
    envs = {name: {**base, "PYTHONPATH": path} for name, path in versions.items()}
    script = Path(sys.executable).parent / "ddpq"  # imports ddpq from PYTHONPATH first
    ddpq = [str(script)] if script.exists() else [sys.executable, "-m", "ddpq"]
    me = os.environ.get("USER") or "root"
    rows: list[tuple[str, str, str, list[float]]] = []

    def measure(queue: str) -> None:
        commands = {"ddpq ls": [*ddpq, "ls"], f"ddpq ls --user {FLOOD}": [*ddpq, "ls", "-u", FLOOD]}
        for env in envs.values():
            wall_ms(commands["ddpq ls"], env)  # warm, unrecorded
        samples: dict[tuple[str, str], list[float]] = {}
        for i in range(args.runs):
            for what, argv in commands.items():
                for name, env in envs.items():
                    if name == "before" and i >= args.before_runs:
                        continue
                    samples.setdefault((what, name), []).append(wall_ms(argv, env))
            samples.setdefault(("python -c pass", ""), []).append(
                wall_ms([sys.executable, "-c", "pass"], base)
            )
        rows.extend((queue, what, name, v) for (what, name), v in samples.items())

    try:
        post(f"{url}/v1/jobs", {"command": ["true"], "gpus": 0, "hold": True, "cwd": "/tmp"}, me)
        measure("empty (1 held job of mine)")
        t0 = time.perf_counter()
        flood_arrays(url)
        took = time.perf_counter() - t0
        measure(f"+ {ARRAYS} held arrays of {MEMBERS:,} ({took:.0f} s to submit)")
        flood_plain(home, ARRAYS * MEMBERS)
        measure(f"+ {ARRAYS * MEMBERS:,} plain held jobs (120,001 in all)")
    finally:
        stop_daemons([daemon], home, timeout=120)

    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}, "
        f"{os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} after the run\n"
    )
    print("| queue | command | code | runs | p50 | min | max |")
    print("|---|---|---|---|---|---|---|")
    for queue, what, name, v in rows:
        print(
            f"| {queue} | `{what}` | {name or '-'} | {len(v)} | {statistics.median(v):.1f} ms "
            f"| {min(v):.1f} ms | {max(v):.1f} ms |"
        )


if __name__ == "__main__":
    main()
