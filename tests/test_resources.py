"""Shared resources one user can exhaust: rendezvous ports, and the disk."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ddpq.schemas import JobSubmit
from ddpq.store.headroom import Reserve
from tests.helpers import Daemon, wait_done, wait_for, wait_state


def test_cpu_jobs_take_no_rendezvous_port(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", "--port-range", "29700-29701", "--grace", "1s")
    c = d.client()
    script = 'echo "port=[$MASTER_PORT]"; sleep 30'
    cpu = [c.submit(JobSubmit(command=["sh", "-c", script])) for _ in range(5)]
    for job in cpu:
        assert wait_state(c, job.id, "running").leases.port is None
        wait_for(lambda: b"port=[]" in c.log_tail(job.id), 10, "the job's first line")  # noqa: B023 - asked at once
    gpu = c.submit(JobSubmit(command=["sh", "-c", 'echo "port=$MASTER_PORT"'], gpus=1))
    done = wait_done(c, gpu.id)
    assert done.state == "succeeded" and done.attempts[0].port in (29700, 29701)
    assert f"port={done.attempts[0].port}" in c.log_tail(gpu.id).decode()
    for job in cpu:
        c.cancel(job.id)


def test_one_user_cannot_hold_every_port(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "4", "--ports-per-user", "2", "--grace", "1s")
    c = d.client()
    alice = [
        c.submit(JobSubmit(command=["sleep", "30"], torchrun=False, gpus=1, owner="alice"))
        for _ in range(3)
    ]
    bob = c.submit(JobSubmit(command=["sleep", "30"], gpus=1, owner="bob"))
    wait_state(c, bob.id, "running")
    wait_state(c, alice[0].id, "running")
    wait_state(c, alice[1].id, "running")
    third = wait_for(
        lambda: j if "rendezvous ports" in (j := c.show(alice[2].id)).reason else None,
        10,
        "the third job to say why it waits",
    )
    assert third.state == "queued" and "alice holds 2" in third.reason
    c.cancel(alice[0].id)
    wait_state(c, alice[2].id, "running")  # a port came back within alice's share
    for job in [*alice, bob]:
        c.cancel(job.id)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs: a disk a job can fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)])
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_job_that_fills_the_disk_ends_saying_so(
    make_daemon: Callable[..., Daemon], small_disk: Path
) -> None:
    d = make_daemon(
        "--fake-gpus", "1", "--grace", "1s", "--job-folder-max", "unlimited",
        home=small_disk / "home",
    )  # fmt: skip
    c = d.client()
    # Fill the disk from the job's folder, then print: the shim cannot write the log.
    fill = (
        'dd if=/dev/zero of="$DDPQ_JOB_DIR/fill" bs=1M 2>/dev/null; '
        "for i in $(seq 1 2000); do echo 'more output than fits'; done"
    )
    job = c.submit(JobSubmit(command=["sh", "-c", fill], gpus=1))
    fill_file = small_disk / "home" / "jobs" / str(job.id) / "fill"
    wait_for(lambda: fill_file.exists() and fill_file.stat().st_size > 8 << 20, 30, "a full disk")
    # The database may not be able to grow either; make room once the job has ended,
    # as an admin would, and the end is recorded with its cause.
    exit_record = fill_file.with_name("exit.json")
    wait_for(exit_record.exists, 30, "the shim's exit record")
    fill_file.unlink()
    done = wait_done(c, job.id)
    assert done.state == "failed"
    assert "the disk is full" in done.reason, done.reason
    nxt = c.submit(JobSubmit(command=["true"], gpus=1))
    assert wait_done(c, nxt.id).state == "succeeded"
    log = (d.home / "daemon.log").read_text()
    # Failures while the disk was full are logged once per condition, not every pass.
    assert log.count("Traceback") <= 5, log[-4000:]


def test_a_full_state_disk_still_takes_cancels_holds_and_jobs_ends(
    make_daemon: Callable[..., Daemon], small_disk: Path
) -> None:
    """A job fills the disk that holds the database and stays: new jobs are refused with a
    507 that says why, while its cancel, a hold and a release are taken and its end is
    recorded (the reserve given back); once an admin makes room, all is as before."""
    home = small_disk / "home"
    # No per-job limit: the job is to fill the disk (the default, half of it, would stop it).
    # The default reserve, 64M, on a 24M disk: made all the same, an eighth of the disk (a
    # reserve only made with as much again free beside it was never made here, and the
    # cancel below was answered 503).
    limits = ["--state-reserve", "64M", "--job-folder-max", "unlimited"]
    d = make_daemon("--fake-gpus", "1", "--grace", "1s", *limits, home=home)
    reserve = Reserve(home / "db-reserve", 64 << 20)
    assert reserve.size == 3 << 20
    wait_for(lambda: reserve.held() == reserve.size, 30, "the disk watch to make the reserve")
    c = d.client()
    held = c.submit(JobSubmit(command=["true"], gpus=1, hold=True))  # waits on the GPU
    fill = 'dd if=/dev/zero of="$DDPQ_JOB_DIR/fill" bs=1M 2>/dev/null; sleep 300'
    job = c.submit(JobSubmit(command=["sh", "-c", fill], gpus=1))
    fill_file = home / "jobs" / str(job.id) / "fill"
    wait_for(lambda: os.statvfs(small_disk).f_bfree == 0, 30, "the job to fill the disk")
    refused = httpx.post(d.url + "/v1/jobs", json={"command": ["true"]}, timeout=30)
    assert refused.status_code == 507, refused.text
    assert refused.json()["detail"].startswith("the disk holding ddpq's state is full (0 free")
    assert c.hold(held.id, False).state == "queued"
    assert c.hold(held.id).state == "held"
    assert c.cancel(job.id).state in ("running", "cancelled")
    done = wait_done(c, job.id, 30)
    assert done.state == "cancelled", done.reason
    assert reserve.held() < reserve.size  # what the writes took it from
    fill_file.unlink()  # the admin makes room
    wait_for(lambda: reserve.held() == reserve.size, 30, "the reserve to be whole again")
    nxt = c.submit(JobSubmit(command=["true"], gpus=1))
    assert wait_done(c, nxt.id).state == "succeeded"
