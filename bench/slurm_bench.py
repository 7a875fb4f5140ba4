"""ddpq on Slurm versus sbatch directly, on the same Slurm, in one run.

    sudo python bench/slurm_bench.py [--jobs 100] [--latency-samples 20]

Starts the test Slurm (``tests/slurm/cluster.py``: munged, slurmctld, two slurmd on
loopback, 4 GRES GPUs each) twice: with Slurm's default scheduler settings, and with
``batch_sched_delay=0,bf_interval=1`` (what the tests use). On each, measures
  1. submit -> running, one job at a time on an idle cluster: from just before the
     submission (``sbatch`` / the POST) to the job's own first output line (a timestamp the
     job prints), p50/p99;
  2. N trivial 1-GPU jobs submitted one call at a time (as a shell loop would), from the
     first submission until the last has ended as its submitter sees it (squeue / the API);
for ``sbatch --gres=gpu:1`` directly, for ``ddpq serve --executor slurm`` (its budget: the
cluster's 8 GPUs), and for the same with ``--slurm-gpus 16`` (twice the cluster: Slurm then
holds a queue of ddpq's jobs and starts the next one as soon as a GPU frees). Prints a
markdown table for bench/RESULTS.md. Needs root (slurmd) and Debian's slurm-wlm and munge.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
from machine import free_port, machine_line, stop_daemons, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.slurm.cluster import GPUS_PER_NODE, NODES, SlurmCluster, missing

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}
Measure = Callable[[SlurmCluster, Path, int, int], tuple[list[float], float]]
STAMP = "date +%s.%N"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def first_line(path: Path) -> float | None:
    try:
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("[ddpq]")]
    except OSError:
        return None
    return float(lines[0]) if lines else None


# ---- sbatch directly ---------------------------------------------------------------


def direct(slurm: SlurmCluster, work: Path, samples: int, jobs: int) -> tuple[list[float], float]:
    latencies = []
    for i in range(samples):
        out = work / f"direct-{i}.out"
        t0 = time.time()
        argv = ["sbatch", "--parsable", "--gres=gpu:1", f"--output={out}", f"--wrap={STAMP}"]
        slurm.run(*argv)
        started = wait_until(lambda out=out: first_line(out), 60, "a direct job")
        assert isinstance(started, float)
        latencies.append((started - t0) * 1000)
        wait_until(lambda: not slurm.job_ids(), 60, "the job to leave the queue")
    t0 = time.time()
    ids = [
        slurm.run("sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap=true")
        .stdout.strip()
        .split(";")[0]
        for _ in range(jobs)
    ]

    def all_ended() -> bool:
        argv = ["squeue", "--noheader", "--states=all", "--format=%T", f"--jobs={','.join(ids)}"]
        states = slurm.run(*argv).stdout.split()
        return len(states) == len(ids) and all(s == "COMPLETED" for s in states)

    wait_until(all_ended, 900, "the direct burst")
    return latencies, time.time() - t0


# ---- through ddpq ------------------------------------------------------------------


def through_ddpq(
    slurm: SlurmCluster, work: Path, samples: int, jobs: int, flags: tuple[str, ...] = ()
) -> tuple[list[float], float]:
    home, port = Path(tempfile.mkdtemp(dir=work, prefix="ddpq-")), free_port()
    argv = [sys.executable, "-m", "ddpq", "serve", "--home", str(home), "--port", str(port)]
    argv += ["--executor", "slurm", *flags] + (["--allow-root"] if os.geteuid() == 0 else [])
    with open(home / "daemon.log", "w") as log:
        daemon = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **slurm.env},
            start_new_session=True,
        )
    http = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"X-Ddpq-User": os.environ.get("USER", "root")},
    )
    try:
        wait_until(lambda: _ok(http), 60, "the daemon")
        latencies = []
        for _ in range(samples):
            t0 = time.time()
            job = http.post("/v1/jobs", json={"command": ["sh", "-c", STAMP], "gpus": 1}).json()
            log_path = home / "jobs" / str(job["id"]) / "output.log"
            started = wait_until(lambda p=log_path: first_line(p), 60, "a ddpq job")
            assert isinstance(started, float)
            latencies.append((started - t0) * 1000)
            wait_until(lambda j=job["id"]: _done(http, j), 60, "the job to end")
        t0 = time.time()
        ids = [
            http.post("/v1/jobs", json={"command": ["true"], "gpus": 1}).json()["id"]
            for _ in range(jobs)
        ]
        wait_until(lambda: all(_done(http, i) for i in ids), 900, "the ddpq burst")
        return latencies, time.time() - t0
    finally:
        stop_daemons([daemon], None)


def _ok(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _done(http: httpx.Client, job_id: int) -> bool:
    return http.get(f"/v1/jobs/{job_id}").json()["state"] in TERMINAL


# ---- the run -------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--latency-samples", type=int, default=20)
    args = ap.parse_args()
    why = missing()
    if why is not None:
        raise SystemExit(why)
    rows = []
    version = ""
    for quick in (False, True):
        work = Path(tempfile.mkdtemp(prefix="ddpq-slurm-bench-"))
        slurm = SlurmCluster.start(work / "slurm", quick=quick)
        try:
            version = slurm.run("sinfo", "--version").stdout.strip()
            config = "batch_sched_delay=0, bf_interval=1" if quick else "Slurm's defaults"
            over = str(2 * GPUS_PER_NODE * len(NODES))
            ways: list[tuple[str, Measure]] = [
                ("sbatch", direct),
                ("ddpq", through_ddpq),
                # Twice the cluster's GPUs: Slurm then queues what ddpq hands it early.
                (f"ddpq --slurm-gpus {over}", partial(through_ddpq, flags=("--slurm-gpus", over))),
            ]
            for name, measure in ways:
                latencies, burst = measure(slurm, work, args.latency_samples, args.jobs)
                rows.append((config, name, latencies, burst))
                slurm.cancel_all()
        finally:
            slurm.stop()
            shutil.rmtree(work, ignore_errors=True)

    print(machine_line())
    print(
        f"{version}; date: {time.strftime('%Y-%m-%d %H:%M %Z')}; command: python "
        f"bench/slurm_bench.py --jobs {args.jobs} --latency-samples {args.latency_samples}\n"
    )
    print(f"| scheduler | submitted by | submit → first line p50 / p99 | {args.jobs} jobs |")
    print("|---|---|---|---|")
    for config, name, latencies, burst in rows:
        print(
            f"| {config} | {name} | {pct(latencies, 0.5):.0f} / {pct(latencies, 0.99):.0f} ms "
            f"| {burst:.1f} s ({args.jobs / burst:.1f} jobs/s) |"
        )


if __name__ == "__main__":
    main()
