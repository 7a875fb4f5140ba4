"""Leases through the real daemon: disjoint GPUs and ports, port skipping, requeue on EADDRINUSE."""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ddpq.schemas import JobDetail, JobSubmit
from ddpq.worker.ports import PORT_COOLDOWN_S
from tests.cli_inprocess import ddpq_in_process, run_in_process
from tests.helpers import Daemon, free_block, wait_done, wait_for, wait_state

JOBS = Path(__file__).parent / "jobs"


def test_concurrent_submissions_never_share_a_gpu_or_port(
    make_daemon: object, tmp_path: Path
) -> None:
    d: Daemon = make_daemon("--fake-gpus", "8", "--port-range", "29600-29619")  # type: ignore[operator]
    out = tmp_path / "records"
    out.mkdir()

    def submit(i: int) -> int:
        with d.client() as c:
            job = JobSubmit(
                command=[sys.executable, str(JOBS / "record_env.py"), "0.3", str(out)],
                gpus=1 + i % 4,
                name=f"j{i}",
            )
            return c.submit(job).id

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(submit, range(40)))
    c = d.client()
    for job_id in ids:
        assert wait_done(c, job_id, timeout=180).state == "succeeded"
    records = [json.loads(p.read_text()) for p in out.glob("record-*.json")]
    assert len(records) == 40
    for r in records:
        assert r["order"] == "PCI_BUS_ID"
        assert len(r["gpus"]) == c.show(int(r["job"])).gpus
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            overlap = a["start"] < b["end"] and b["start"] < a["end"]
            if overlap:
                assert not set(a["gpus"]) & set(b["gpus"]), (a, b)
                assert a["port"] != b["port"], (a, b)
    with d.client() as c2:
        assert all(x.status == "free" for x in c2.devices().items)  # every lease released


def test_a_port_held_by_an_outside_program_is_skipped(make_daemon: object) -> None:
    outsider = socket.socket()
    outsider.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    outsider.bind(("0.0.0.0", 29650))
    outsider.listen()
    try:
        d: Daemon = make_daemon("--fake-gpus", "2", "--port-range", "29650-29652")  # type: ignore[operator]
        c = d.client()
        ports = []
        for _ in range(3):
            job = c.submit(JobSubmit(command=["true"], gpus=1))
            ports.append(wait_done(c, job.id).attempts[0].port)
        assert 29650 not in ports
        assert set(ports) <= {29651, 29652}
    finally:
        outsider.close()


def test_a_job_waits_while_every_port_is_held_and_starts_once_one_is_free(
    make_daemon: object,
) -> None:
    """Issue 21: past 8 busy ports a job was launched on a busy one anyway (EADDRINUSE for
    every DDP job once a user binds the range). Now it waits, saying who holds which."""
    lo = free_block(3)
    held = [socket.socket(), socket.socket(), socket.socket(socket.AF_INET6)]
    try:
        for s, port in zip(held, range(lo, lo + 3), strict=True):
            s.bind(("::" if s.family == socket.AF_INET6 else "0.0.0.0", port))
        held[0].listen()  # held[1] is bound, not listening
        held[2].listen()
        d: Daemon = make_daemon("--fake-gpus", "1", "--port-range", f"{lo}-{lo + 2}")  # type: ignore[operator]
        c = d.client()
        job = c.submit(JobSubmit(command=["true"], gpus=1))

        def waiting() -> JobDetail | None:
            shown = c.show(job.id)
            return shown if shown.reason.startswith("no free rendezvous port") else None

        why = wait_for(waiting, what="the waiting reason")
        assert why.state == "queued" and why.attempts == []
        user = pwd.getpwuid(os.getuid()).pw_name
        for port in (lo, lo + 2):
            assert f"{port} held by uid {os.getuid()} ({user}) pid {os.getpid()}" in why.reason
        assert f"{lo + 1} held by" in why.reason
        held[2].close()
        done = wait_done(c, job.id, timeout=PORT_COOLDOWN_S + 60)  # tried again once cooled
        assert done.state == "succeeded" and [a.port for a in done.attempts] == [lo + 2]
    finally:
        for s in held:
            s.close()


def test_rendezvous_port_clash_is_requeued_on_another_port(shared_daemon: Daemon) -> None:
    script = (
        'if [ ! -f "$DDPQ_JOB_DIR/once" ]; then touch "$DDPQ_JOB_DIR/once"; '
        'echo "The server socket has failed to listen on any local network address. '
        'port: $MASTER_PORT, code: -98, name: EADDRINUSE, message: address already in use"; '
        "exit 1; fi; echo second try on $MASTER_PORT"
    )
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=1))
    done = wait_done(c, job.id)
    assert done.state == "succeeded"
    assert len(done.attempts) == 2
    assert done.attempts[0].port != done.attempts[1].port
    requeued = [e for e in done.events if e.from_state == "running" and e.to_state == "queued"]
    assert len(requeued) == 1 and "EADDRINUSE" in requeued[0].reason


def test_contract_env_and_leases_shown_while_running(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "env | sort; sleep 30"], gpus=2))
    running = wait_state(c, job.id, "running")
    assert len(running.leases.gpus) == 2 and running.leases.port is not None

    def printed_env() -> str | None:
        # The log starts with ddpq's own header line: wait for the job's output itself.
        tail = c.log_tail(job.id).decode()
        return tail if "MASTER_PORT=" in tail else None

    printed = wait_for(printed_env, what="the job's environment in its log")
    env = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, running.leases.gpus))
    assert env["MASTER_PORT"] == str(running.leases.port)
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["DDPQ_JOB_ID"] == str(job.id)
    assert env["DDPQ_JOB_DIR"] == running.job_dir
    assert int(env["OMP_NUM_THREADS"]) >= 1
    gpus = json.loads(shared_daemon.cli("gpus", "--json").stdout)
    held = {g["index"]: g for g in gpus["items"] if g["status"] == "leased"}
    assert sorted(held) == running.leases.gpus
    assert all(g["job_id"] == job.id and g["owner"] == running.owner for g in held.values())
    c.cancel(job.id)
    wait_done(c, job.id)


def test_dependencies_and_hold_through_the_api(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    first = c.submit(JobSubmit(command=["sh", "-c", "sleep 0.5"]))
    after_ok = c.submit(JobSubmit(command=["true"], after=[first.id]))
    assert after_ok.state == "held"
    held = c.submit(JobSubmit(command=["true"], hold=True))
    assert wait_done(c, after_ok.id).state == "succeeded"
    assert c.show(held.id).state == "held"
    c.hold(held.id, False)
    assert wait_done(c, held.id).state == "succeeded"
    failing = c.submit(JobSubmit(command=["false"]))
    doomed = c.submit(JobSubmit(command=["true"], after=[failing.id]))
    done = wait_done(c, doomed.id)
    assert done.state == "cancelled" and done.reason == f"dependency {failing.id} failed"


def test_priority_orders_the_queue(make_daemon: object, tmp_path: Path) -> None:
    d: Daemon = make_daemon("--fake-gpus", "1")  # type: ignore[operator]
    c = d.client()
    blocker = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))
    wait_state(c, blocker.id, "running")
    low = c.submit(JobSubmit(command=["true"], gpus=1, priority=0))
    high = c.submit(JobSubmit(command=["true"], gpus=1, priority=5))
    # Each waiting job says why it waits.
    wait_for(lambda: c.show(low.id).reason == "waiting in line", what="the reason")
    assert c.show(high.id).reason == "waiting for 1 free GPU (next in line)"
    c.cancel(blocker.id)
    low_done, high_done = wait_done(c, low.id), wait_done(c, high.id)
    assert high_done.started_at is not None and low_done.started_at is not None
    assert high_done.started_at < low_done.started_at


def test_too_many_gpus_and_an_ephemeral_port_range_are_refused(
    shared_daemon: Daemon, tmp_path: Path
) -> None:
    # Usage errors, in this process: what the command says, not the process.
    r = ddpq_in_process(shared_daemon.url, "submit", "--gpus", "5", "--", "true")
    assert r.returncode == 2 and "--gpus: asked for 5 GPUs but this server has 4" in r.stderr
    lo = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
    bad = run_in_process(
        "serve", "--home", str(tmp_path / "x"), "--port-range", f"{lo}-{int(lo) + 10}"
    )
    assert bad.returncode == 2 and "ephemeral" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.torch
def test_two_torchrun_jobs_train_on_disjoint_gpus_and_ports(make_daemon: object) -> None:
    pytest.importorskip("torch")
    d: Daemon = make_daemon("--fake-gpus", "4")  # type: ignore[operator]
    c = d.client()
    spec = JobSubmit(command=[str(JOBS / "ddp_tiny.py"), "20"], gpus=2, torchrun=True)
    a, b = c.submit(spec), c.submit(spec)
    # The third only has to wait for GPUs: a plain job, not three more torch processes
    # (~3 s of CPU each to start).
    third = c.submit(JobSubmit(command=["true"], gpus=2))
    ra, rb = wait_state(c, a.id, "running", 60), wait_state(c, b.id, "running", 60)
    assert not set(ra.leases.gpus) & set(rb.leases.gpus)
    assert ra.leases.port != rb.leases.port
    assert c.show(third.id).state == "queued"  # waits for two free GPUs
    done_a, done_b = wait_done(c, a.id, 180), wait_done(c, b.id, 180)
    assert (done_a.state, done_b.state) == ("succeeded", "succeeded")
    for job in (done_a, done_b):
        log = c.log_tail(job.id, 64 * 1024).decode()
        assert f"MASTER_PORT={job.attempts[0].port} ok" in log
        assert log.count(" ok") == 2  # both ranks
    done_third = wait_done(c, third.id, 180)
    assert done_third.state == "succeeded"
    assert done_third.started_at is not None and done_a.ended_at is not None
    assert done_third.started_at >= min(done_a.ended_at, done_b.ended_at or done_a.ended_at)


def test_an_unrelated_address_in_use_is_a_plain_failure(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    script = 'echo "tensorboard: [Errno 98] Address already in use"; exit 1'
    job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=1))
    done = wait_done(c, job.id)
    assert done.state == "failed" and len(done.attempts) == 1


def test_port_clash_is_read_from_the_latest_attempt_only() -> None:
    from ddpq.core.disposition import rendezvous_port_clash

    clash = "name: EADDRINUSE, message: address already in use, port: 29601"
    first = f"[ddpq] attempt started x: GPUs [0], port 29601\n{clash}\n"
    second = "[ddpq] attempt started y: GPUs [0], port 29602\nTraceback: ValueError\n"
    assert rendezvous_port_clash(first)
    assert not rendezvous_port_clash(first + second)
    assert not rendezvous_port_clash("[ddpq] attempt started z: GPUs [], port 29603\n" + clash)
