"""Crash soak: jobs stream through 8 fake GPUs while the daemon is killed -9 and restarted.

Short here (CI); `DDPQ_LONG=1` (make test-long) runs the long version.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.client.api import Unreachable
from ddpq.executors.local import procs
from ddpq.schemas import JobSubmit
from tests.helpers import TERMINAL, Daemon, wait_for

JOBS = Path(__file__).parent / "jobs"
LONG = os.environ.get("DDPQ_LONG") == "1"


def soak(make_daemon: Callable[..., Daemon], tmp_path: Path, n_jobs: int, kills: int) -> None:
    d = make_daemon("--fake-gpus", "8", "--grace", "1s", "--port-range", "29700-29799")
    out = tmp_path / "records"
    out.mkdir()
    accepted: list[int] = []
    lock = threading.Lock()
    done_submitting = threading.Event()
    rng = random.Random(1234)

    def submitter() -> None:
        i = 0
        while i < n_jobs:
            spec = JobSubmit(
                command=[sys.executable, str(JOBS / "record_env.py"), "0.05", str(out)],
                gpus=1 + i % 3,
                name=f"soak{i}",
            )
            try:
                with d.client() as c:
                    job = c.submit(spec)
            except Unreachable:
                continue  # daemon down: try again (this one was not accepted)
            with lock:
                accepted.append(job.id)  # the API answered 201
            i += 1
        done_submitting.set()

    thread = threading.Thread(target=submitter)
    thread.start()
    for k in range(kills):
        target = (k + 1) * n_jobs // (kills + 1)
        wait_for(lambda: len(accepted) >= target, timeout=300, what="submissions")  # noqa: B023 - asked at once, in this turn
        wait_for(lambda: rng.random() < 0.3, what="a random moment")
        d.kill9()
        d.start()
    thread.join(timeout=600)
    assert done_submitting.is_set()

    c = d.client()

    def all_final() -> bool:
        items = c.list(limit=1000).items
        return all(j.state in TERMINAL for j in items)

    wait_for(all_final, timeout=600, what="every job to finish")
    jobs = {j.id: j for j in c.list(limit=1000).items}
    assert set(accepted) <= set(jobs), "an accepted submission was lost"
    records = [json.loads(p.read_text()) for p in out.glob("record-*.json")]
    ran = [int(r["job"]) for r in records]
    assert len(ran) == len(set(ran)), "a job ran twice"
    for job_id in accepted:
        assert jobs[job_id].state == "succeeded", (job_id, jobs[job_id].reason)
        assert job_id in ran
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            if a["start"] < b["end"] and b["start"] < a["end"]:
                assert not set(a["gpus"]) & set(b["gpus"]), (a, b)
                assert a["port"] != b["port"], (a, b)
    devices = c.devices()
    assert all(g.status == "free" for g in devices.items) and devices.ports_leased == {}
    # No shim of any attempt outlives its job.
    shims = [
        procs.Identity(int(pid), int(ticks))
        for job_id in jobs
        for a in c.show(job_id).attempts
        if a.handle and a.handle != "gone"  # "gone": it had ended before it was re-adopted
        for pid, _, ticks in [a.handle.partition(":")]
    ]
    assert shims and not [s for s in shims if procs.is_alive(s)]


@pytest.mark.timeout(900)
def test_crash_soak_short(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    soak(make_daemon, tmp_path, n_jobs=200, kills=5)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not LONG, reason="long soak: set DDPQ_LONG=1 (make test-long)")
def test_crash_soak_long(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    soak(make_daemon, tmp_path, n_jobs=1000, kills=25)
