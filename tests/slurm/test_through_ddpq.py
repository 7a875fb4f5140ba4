"""``ddpq serve --executor slurm`` against the test Slurm: what users do, end to end."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.api import DdpqClient, DdpqError, JsonApi
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.slurm.cluster import GPUS_PER_NODE, NODES, SlurmCluster
from tests.test_auth import add_user
from tests.test_local_users import as_account

REPO = Path(__file__).resolve().parents[2]
DDP_TINY = str(REPO / "tests" / "jobs" / "ddp_tiny.py")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (switching accounts)")


@pytest.fixture(scope="module")
def d(slurm_daemons: Callable[..., Daemon]) -> Daemon:
    return slurm_daemons()


def log_of(d: Daemon, job_id: int) -> str:
    return d.client().log_tail(job_id, 1 << 16).decode(errors="replace")


def test_jobs_run_in_slurm_and_end_as_their_shim_recorded(d: Daemon, slurm: SlurmCluster) -> None:
    c = d.client()
    # A second long: a look at the queue sees it run.
    echo = "echo hello from $SLURM_JOB_ID; echo CVD=$CUDA_VISIBLE_DEVICES; sleep 1"
    ok = c.submit(JobSubmit(command=["sh", "-c", echo], gpus=2, cwd="/"))
    bad = c.submit(JobSubmit(command=["sh", "-c", "echo failing; exit 3"], cwd="/"))
    done, failed = wait_done(c, ok.id), wait_done(c, bad.id)
    assert done.state == "succeeded", done.reason
    assert (failed.state, failed.exit_code, failed.reason) == ("failed", 3, "exit code 3")
    attempt = done.attempts[-1]
    assert attempt.executor == "slurm" and attempt.handle is not None and attempt.handle.isdigit()
    log = log_of(d, ok.id)
    assert log.startswith("[ddpq] attempt started ")
    assert f"hello from {attempt.handle}\n" in log
    assert f"[ddpq] Slurm job {attempt.handle} is running on n" in log
    devices = log.split("CVD=", 1)[1].split()[0].split(",")
    assert len(devices) == 2, log  # Slurm's choice of the node's devices
    assert f"(slurm {attempt.handle})" in d.cli("show", str(ok.id)).stdout
    name = slurm.run(
        "squeue", "--noheader", "--states=all", f"--jobs={attempt.handle}", "--format=%j"
    )
    assert name.stdout.strip() == f"ddpq-{ok.id}"
    # The budget: every GPU of the partition, as the worker's devices.
    assert len(c.devices().items) == GPUS_PER_NODE * len(NODES)


def test_cancel_stops_a_running_job_then_kills_it_after_the_grace(d: Daemon) -> None:
    c = d.client()
    polite = "trap 'echo got TERM; exit 5' TERM; echo job-is-up; sleep 60 & wait"
    stubborn = "trap '' TERM; echo job-is-up; sleep 60"
    jobs = [c.submit(JobSubmit(command=["sh", "-c", cmd], cwd="/")) for cmd in (polite, stubborn)]
    for job in jobs:
        job_id = job.id
        wait_for(lambda: "\njob-is-up\n" in log_of(d, job_id), 60, f"job {job_id} to run")  # noqa: B023
        c.cancel(job_id)
    first, second = (wait_done(c, job.id) for job in jobs)
    assert first.state == "cancelled" and first.reason.endswith("exit code 5"), first.reason
    assert "got TERM" in log_of(d, first.id)
    assert second.state == "cancelled" and second.reason.endswith("killed by signal 9")


def test_a_time_limit_stops_a_job(d: Daemon) -> None:
    c = d.client()
    job = c.submit(JobSubmit(command=["sleep", "60"], time_limit_s=2, cwd="/"))
    done = wait_done(c, job.id, 90)
    assert done.state == "timed_out" and done.reason.startswith("time limit reached"), done.reason


def test_a_retry_is_a_new_slurm_job(d: Daemon) -> None:
    c = d.client()
    job = c.submit(JobSubmit(command=["sh", "-c", 'test "$DDPQ_ATTEMPT" = 2'], retries=1, cwd="/"))
    done = wait_done(c, job.id, 90)
    assert done.state == "succeeded" and [a.state for a in done.attempts] == ["failed", "succeeded"]
    first, second = (a.handle for a in done.attempts)
    assert first != second and first is not None and second is not None


def test_torchrun_ranks_rendezvous_on_the_leased_port(d: Daemon) -> None:
    c = d.client()
    job = c.submit(JobSubmit(command=[DDP_TINY, "20"], gpus=2, torchrun=True, cwd=str(REPO)))
    port = wait_state(c, job.id, "running").leases.port
    assert port is not None

    def store_listens() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(store_listens, 90, f"torchrun's rendezvous to listen on port {port}")
    done = wait_done(c, job.id, 120)
    log = log_of(d, job.id)
    assert done.state == "succeeded", log
    assert "rank 0/2" in log and "rank 1/2" in log and log.count(" ok\n") == 2


def test_a_taken_port_is_requeued_and_slurms_reason_to_wait_shown(
    d: Daemon, slurm: SlurmCluster
) -> None:
    c = d.client()
    # Outside ddpq, someone holds every GPU of the cluster.
    argv = ["sbatch", "--parsable", f"--gres=gpu:{GPUS_PER_NODE}", "--output=/dev/null"]
    blockers = [slurm.run(*argv, "--wrap=sleep 300").stdout.strip() for _ in NODES]
    job = c.submit(JobSubmit(command=[DDP_TINY, "1"], gpus=1, torchrun=True, cwd=str(REPO)))
    try:
        wait_for(lambda: "is waiting: Resources" in log_of(d, job.id), 60, "Slurm's reason")
        port = c.show(job.id).leases.port
        assert port is not None
        with socket.socket() as taken:  # the job's leased port, taken meanwhile
            taken.bind(("0.0.0.0", port))
            taken.listen()
            slurm.run("scancel", *blockers)
            wait_for(lambda: len(c.show(job.id).attempts) == 2, 90, "a second attempt")
    finally:
        slurm.run("scancel", *blockers, check=False)
    done = wait_done(c, job.id, 120)
    assert done.state == "succeeded", log_of(d, job.id)
    first, second = done.attempts
    assert first.port == port and second.port != port and first.state == "failed"
    assert any("rendezvous port was taken (EADDRINUSE)" in e.reason for e in done.events)
    assert f"rendezvous port {port} is taken" in log_of(d, job.id)


def test_a_job_no_node_can_hold_waits_with_slurms_reason(d: Daemon) -> None:
    c = d.client()
    job = c.submit(JobSubmit(command=["true"], gpus=GPUS_PER_NODE + 1, cwd="/"))
    wait_for(lambda: "is waiting: BadConstraints" in log_of(d, job.id), 60, "Slurm's reason")
    assert c.show(job.id).state == "running"  # handed to Slurm, which keeps it waiting
    # ... and the queue says why, as `ddpq show` and the page do.
    wait_for(lambda: c.show(job.id).reason == "waiting in Slurm: BadConstraints", 30, "the reason")
    assert "waiting in Slurm: BadConstraints" in d.cli("show", str(job.id)).stdout
    c.cancel(job.id)
    done = wait_done(c, job.id)
    assert done.state == "cancelled" and "was cancelled" in done.reason, done.reason


def test_kill_9_and_restart_readopts_slurm_jobs_by_id(
    slurm_daemons: Callable[..., Daemon], slurm: SlurmCluster
) -> None:
    d = slurm_daemons()
    c = d.client()
    quick = c.submit(JobSubmit(command=["sh", "-c", "sleep 1; echo quick-done"], cwd="/"))
    slow = c.submit(JobSubmit(command=["sh", "-c", "sleep 6; echo slow-done"], cwd="/"))
    handles = {j.id: wait_state(c, j.id, "running").attempts[-1].handle for j in (quick, slow)}
    d.kill9()
    # While ddpq is down, one of them ends and the other runs on.
    wait_for(lambda: slurm.state(str(handles[quick.id]))[0] == "COMPLETED", 60, "the quick job")
    assert slurm.state(str(handles[slow.id]))[0] == "RUNNING"
    d.start()
    c = d.client()
    for job in (quick, slow):
        done = wait_done(c, job.id, 60)
        assert done.state == "succeeded" and len(done.attempts) == 1
        assert done.attempts[0].handle == handles[job.id]
    assert "slow-done" in log_of(d, slow.id) and "quick-done" in log_of(d, quick.id)
    assert "re-adopted" in (d.home / "daemon.log").read_text()


@ROOT_ONLY
def test_with_auth_the_owners_account_submits_never_root(
    slurm_daemons: Callable[..., Daemon], slurm: SlurmCluster
) -> None:
    tokens: dict[str, str] = {}

    def users(home: Path) -> None:
        tokens["carol"] = add_user(home, "carol", "--unix-user", "nobody")
        tokens["dave"] = add_user(home, "dave", "--unix-user", "root")

    d = slurm_daemons("--auth", prepare=users)
    carol, dave = d.client(tokens["carol"]), d.client(tokens["dave"])
    job = carol.submit(JobSubmit(command=["sh", "-c", "id -un; sleep 2"], cwd="/"))
    handle = wait_state(carol, job.id, "running").attempts[-1].handle
    user = slurm.run("squeue", "--noheader", "--states=all", f"--jobs={handle}", "--format=%u")
    assert user.stdout.strip() == "nobody"
    done = wait_done(carol, job.id)
    assert done.state == "succeeded", done.reason
    assert "nobody\n" in carol.log_tail(job.id).decode()
    refused = wait_done(dave, dave.submit(JobSubmit(command=["id"], cwd="/")).id)
    assert refused.state == "failed" and "never submits Slurm jobs as root" in refused.reason


@ROOT_ONLY
def test_on_the_socket_the_caller_submits_to_slurm_and_root_is_refused_with_the_reason(
    slurm_daemons: Callable[..., Daemon], slurm: SlurmCluster
) -> None:
    d = slurm_daemons("--auth")
    path = "unix:" + str(d.home / "ddpq.sock")
    body = {"command": ["sh", "-c", "id -un; sleep 2"], "cwd": "/"}

    def submit() -> dict[str, Any]:
        with JsonApi(path) as api:
            return api.submit(body)

    job_id = int(as_account("nobody", submit)["id"])  # no token: the socket says who
    root = DdpqClient(path)  # root on the socket: an admin, who reads every log
    handle = wait_state(root, job_id, "running").attempts[-1].handle
    user = slurm.run("squeue", "--noheader", "--states=all", f"--jobs={handle}", "--format=%u")
    assert user.stdout.strip() == "nobody"
    done = wait_done(root, job_id)
    assert done.state == "succeeded", done.reason
    assert "nobody\n" in root.log_tail(job_id).decode()
    with pytest.raises(DdpqError, match="never submits a Slurm job as root") as refused:
        submit()
    assert refused.value.status == 403


def test_a_two_node_job_from_the_cli_runs_one_rank_on_each_node(d: Daemon) -> None:
    common = ("--nodes", "2", "--gpus-per-node", "1", "--torchrun", "--cwd", str(REPO))
    refused = d.cli("submit", *common, "--slurm-opt", "--comment=x", "--", "true", check=False)
    # An option ddpq keeps for itself is refused by name; nothing is queued.
    assert refused.returncode == 2, refused
    assert "--slurm-opt: '--comment=x' is --comment to sbatch, which ddpq sets" in refused.stderr
    job_id = int(d.cli("submit", *common, "--", DDP_TINY, "3").stdout)
    c = d.client()
    done = wait_done(c, job_id, 180)
    log = log_of(d, job_id)
    assert done.state == "succeeded", log
    assert (done.gpus, done.nodes, done.gpus_per_node) == (2, 2, 1)
    assert "rank 0/2" in log and "rank 1/2" in log
    script = (Path(str(done.job_dir)) / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "--nnodes 2" in script, script
