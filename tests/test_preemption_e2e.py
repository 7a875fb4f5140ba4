"""Preemption through a real daemon: the API asks, the shim signals, the job checkpoints and
comes back; a job that ignores the signal is stopped after its grace period."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for, wait_state

# Saves its progress on the preemption signal and exits "requeue me"; resumes from it.
JOB = """
import os, signal, sys, time
state = os.path.join(os.environ["DDPQ_JOB_DIR"], "state")
done = int(open(state).read()) if os.path.exists(state) else 0
def save(*_):
    open(state, "w").write(str(done))
    sys.exit(int(os.environ["DDPQ_REQUEUE_EXIT"]))
signal.signal(getattr(signal, "SIG" + os.environ["DDPQ_PREEMPT_SIGNAL"]), save)
print("attempt", os.environ["DDPQ_ATTEMPT"], "from", done, flush=True)
while done < int(sys.argv[1]):
    done += 1
    time.sleep(0.05)
print("finished at", done, flush=True)
"""


def preempt(d: Daemon, job_id: int) -> httpx.Response:
    return httpx.post(f"{d.url}/v1/jobs/{job_id}/preempt", json={})


def test_a_preempted_job_resumes_from_what_it_saved(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", "--preempt-grace", "5s")
    c = d.client()
    job = c.submit(JobSubmit(command=[sys.executable, "-c", JOB, "60"], gpus=1, preemptible=True))
    wait_for(lambda: b"attempt 1 from 0" in c.log_tail(job.id), what="the first attempt")
    assert d.cli("preempt", str(job.id)).stdout.startswith(f"{job.id}: running")
    done = wait_done(c, job.id, timeout=60)
    assert done.state == "succeeded" and done.attempt == 2 and done.preemptions == 1
    assert done.attempts[0].state == "preempted"
    # The CLI names its user (without --auth the daemon believes it).
    assert done.attempts[0].reason == f"preempted by {getpass.getuser()}: checkpointed"
    log = (Path(str(done.job_dir)) / "output.log").read_text()
    resumed_from = int(log.split("attempt 2 from ")[1].split()[0])
    assert 0 < resumed_from < 60 and "finished at 60" in log
    assert preempt(d, job.id).status_code == 409  # over: nothing to preempt


def test_a_job_that_ignores_the_signal_is_stopped_after_its_grace(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1", "--preempt-grace", "1s", "--grace", "1s")
    c = d.client()
    stubborn = (
        "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
        "print('ignoring', flush=True); time.sleep(60)"
    )
    job = c.submit(JobSubmit(command=[sys.executable, "-c", stubborn], preemptible=True))
    # Only once it ignores the signal: before that, USR1's default action ends it at once.
    wait_for(lambda: b"ignoring" in c.log_tail(job.id), what="the job to ignore SIGUSR1")
    assert preempt(d, job.id).status_code == 200
    wait_for(lambda: (j := c.show(job.id)).attempt == 2 and j, timeout=30, what="a second attempt")
    first = c.show(job.id).attempts[0]
    assert first.state == "preempted" and "did not exit within its 1s to checkpoint" in first.reason
    c.cancel(job.id)


def test_only_a_preemptible_running_job_can_be_preempted(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1")
    c = d.client()
    job = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))
    wait_state(c, job.id, "running")
    r = preempt(d, job.id)
    assert r.status_code == 409 and "not submitted --preemptible" in r.json()["detail"]
    assert preempt(d, 999).status_code == 404
    c.cancel(job.id)


def test_with_auth_only_an_admin_may_preempt(tmp_path: Path) -> None:
    import time

    from ddpq.store import users as user_store
    from ddpq.store.db import Database
    from tests.inprocess import make_client

    with make_client(tmp_path, auth=True, fake_gpus=1) as c:
        with Database(tmp_path / "ddpq.db").write() as s:
            _, alice = user_store.add_user(s, "alice", admin=False, unix_user=None, now=time.time())
            _, boss = user_store.add_user(s, "boss", admin=True, unix_user=None, now=time.time())
        as_alice = {"Authorization": f"Bearer {alice}"}
        r = c.post("/v1/jobs/1/preempt", json={}, headers=as_alice)
        assert r.status_code == 403 and "only an admin" in r.json()["detail"]
        r = c.post("/v1/jobs/1/preempt", json={}, headers={"Authorization": f"Bearer {boss}"})
        assert r.status_code == 404  # an admin gets as far as the job (there is none)
