"""`ddpq shell` and `ddpq attach` as a user runs them: the CLI on a terminal of its own (a
pty the test types into), against a real daemon; and idle reclaim with the fake
libnvidia-ml reporting the GPUs' utilisation from a file the test writes."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from ddpq.schemas import JobSubmit
from tests.cli_inprocess import ddpq_in_process
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.sessions import QUIET_ENV, SHELL, Terminal

QUIET_SHELL = ["--", *SHELL]


@pytest.fixture
def terminals() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_one(d: Daemon, *args: str, sigint_ignored: bool = False) -> Terminal:
        env = {**os.environ, **QUIET_ENV, "DDPQ_URL": d.url, "TERM": "xterm"}
        argv = [sys.executable, "-m", "ddpq", *args]
        if sigint_ignored:  # as from a parent that ignores SIGINT: exec keeps SIG_IGN
            argv = [sys.executable, "-c", IGNORING_SIGINT, *argv]
        t = Terminal(argv, env)
        opened.append(t)
        return t

    yield open_one
    for t in opened:
        t.close()


def job_id_of(t: Terminal) -> int:
    return int(t.expect(r"job (\d+): a session").group(1))


def test_a_shell_runs_what_is_typed_detaches_and_is_reattached(
    shared_daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    c = shared_daemon.client()
    t = terminals(shared_daemon, "shell", "--gpus", "2")  # the login shell, as a user gets it
    job = job_id_of(t)
    t.expect(r"attached \(Ctrl-\\ detaches")
    t.type("echo got-$((6*7))-$DDPQ_JOB_ID-$CUDA_VISIBLE_DEVICES-$MASTER_PORT\r")
    got = t.expect(r"got-42-(\d+)-([\d,]+)-(\d+)")
    running = c.show(job)
    assert got.group(1).decode() == str(job) and running.interactive
    assert got.group(2).decode() == ",".join(map(str, running.leases.gpus))
    assert int(got.group(3)) == running.leases.port
    t.type("\x1c")  # Ctrl-\
    t.expect(rf"detached from job {job}")
    assert t.wait() == 0
    assert c.show(job).state == "running"  # detached, not ended

    back = terminals(shared_daemon, "attach", str(job))
    back.expect(r"got-42")  # what it showed before, replayed
    back.type("echo again-$((2+3))\r")
    back.expect(r"again-5")
    back.type("exit 7\r")
    back.expect(rf"job {job} ended: failed \(exit code 7\)")
    assert back.wait() == 7  # the shell's status
    done = c.show(job)
    assert (done.state, done.exit_code) == ("failed", 7)
    assert done.leases.gpus == [] and done.attach is None


def test_a_cancel_ends_an_attached_session(
    shared_daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    t = terminals(shared_daemon, "shell", *QUIET_SHELL)
    job = job_id_of(t)
    t.expect(r"attached")
    t.type("echo ready-$((1+1))\r")
    t.expect(r"ready-2")
    shared_daemon.client().cancel(job)
    t.expect(r"stopping the session")
    t.expect(rf"job {job} ended: cancelled")
    assert t.wait() != 0
    assert wait_done(shared_daemon.client(), job).state == "cancelled"


def test_a_session_outlives_its_daemon_and_its_end_is_recorded(
    daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    """The shim holds the terminal, not the daemon: a `kill -9` of the daemon leaves the
    attached user typing on; the restarted daemon adopts the job and records its end."""
    t = terminals(daemon, "shell", *QUIET_SHELL)
    job = job_id_of(t)
    t.expect(r"attached")
    daemon.kill9()
    t.type("echo still-here-$((9+9))\r")
    t.expect(r"still-here-18")
    daemon.start()
    t.type("exit 5\r")
    assert t.wait() == 5
    done = wait_done(daemon.client(), job)
    assert (done.state, done.exit_code) == ("failed", 5)


def test_the_window_size_follows_the_users_terminal(
    shared_daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    t = terminals(shared_daemon, "shell", *QUIET_SHELL)
    t.expect(r"attached")
    t.type("stty size\r")
    t.expect(r"\b24 80\r\n")
    t.resize(40, 132)
    t.type("stty size\r")
    t.expect(r"\b40 132\r\n")
    t.type("exit\r")
    assert t.wait() == 0


def test_a_server_on_the_leased_port_and_how_to_reach_it(
    shared_daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"]
    t = terminals(shared_daemon, "shell", "--gpus", "1", "--", *server)
    job = job_id_of(t)
    port = int(t.expect(r"ssh -N -L (\d+):127\.0\.0\.1:\1 ").group(1))
    assert port == shared_daemon.client().show(job).leases.port
    t.expect(r"Serving HTTP on 127\.0\.0\.1 port (\d+)")
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
    use = httpx.get(f"{shared_daemon.url}/v1/jobs/{job}/port", timeout=10).json()
    assert (use["port"], use["listener"], use["uid"]) == (port, "job", os.getuid())
    assert use["pid"] != os.getpid() and use["command"]
    t.type("\x03")  # Ctrl-C reaches the server, which stops: the session ends
    t.wait()
    assert wait_done(shared_daemon.client(), job).state in ("succeeded", "failed")


def test_a_port_someone_else_listens_on_gets_a_warning_not_a_tunnel(
    shared_daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    """Issue 21: another process bound the session's leased port before its server did;
    `ddpq shell` printed an ssh line to it all the same. Here the test itself takes the
    port (a process of no job) once the session runs, while the session waits."""
    waiting = ["sh", "-c", "echo 'server would be on {port}'; exec sleep 60"]
    t = terminals(shared_daemon, "shell", "--gpus", "1", "--", *waiting)
    job = job_id_of(t)
    c = shared_daemon.client()
    port = wait_state(c, job, "running").leases.port
    assert port is not None
    with socket.socket() as taker:
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        taker.bind(("127.0.0.1", port))
        taker.listen()
        use = httpx.get(f"{shared_daemon.url}/v1/jobs/{job}/port", timeout=10).json()
        assert (use["listener"], use["pid"], use["uid"]) == ("other", os.getpid(), os.getuid())
        said = t.expect(rf"warning: port {port} of \S+ is not job {job}'s: (.*) listens on it")
        assert f"pid {os.getpid()}".encode() in said.group(1)
        t.expect(r"attached")
        assert b"ssh -N -L" not in t.seen
    c.cancel(job)
    t.wait()
    assert wait_done(c, job).state == "cancelled"


IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.fixture(scope="module")
def one_gpu(module_daemons: Callable[..., Daemon]) -> Daemon:
    """A daemon of one GPU for the module's tests that keep it busy with a job of their own
    (each waits until its job holds it: a job the one before cancelled may still be ending)."""
    return module_daemons("--fake-gpus", "1", "--grace", "1s")


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_ctrl_c_while_waiting_cancels_the_session(
    one_gpu: Daemon, terminals: Callable[..., Terminal], sigint_ignored: bool
) -> None:
    d = one_gpu
    c = d.client()
    holder = c.submit(JobSubmit(command=["sleep", "60"], gpus=1))
    wait_state(c, holder.id, "running")
    t = terminals(d, "shell", "--gpus", "1", sigint_ignored=sigint_ignored)
    job = job_id_of(t)
    t.expect(rf"job {job} queued: .*GPU")  # the waiting reason, as `ddpq ls` has it
    t.type("\x03")
    t.expect(rf"job {job}: cancelled")
    assert t.wait() == 130
    assert c.show(job).state == "cancelled"
    c.cancel(holder.id)


def test_attach_is_for_sessions(shared_daemon: Daemon) -> None:
    """Refused before any terminal is touched: in this process (tests/cli_inprocess.py)."""
    c = shared_daemon.client()
    batch = c.submit(JobSubmit(command=["sleep", "30"]))
    r = ddpq_in_process(shared_daemon.url, "attach", str(batch.id))
    assert r.returncode == 2 and "not an interactive session" in r.stderr
    assert ddpq_in_process(shared_daemon.url, "attach", "999").returncode == 4
    r = ddpq_in_process(shared_daemon.url, "shell", "--detach-key", "x")
    assert r.returncode == 2 and "--detach-key" in r.stderr
    c.cancel(batch.id)


REFUSED = [
    (["--idle", "5h"], "--idle: at most 4h00m"),
    (["--idle", "0"], "--idle: "),
    (["--time-limit", "soon"], "--time-limit: "),
    (["--gpus", "0", "--", "jupyter", "lab", "--port", "{port}"], "{port} needs a leased port"),
    (["--gpus", "9"], "--gpus: asked for 9 GPUs but this server has 4"),
    (["--env", "CUDA_VISIBLE_DEVICES=1"], "--env: CUDA_VISIBLE_DEVICES is set by ddpq"),
]


def test_a_session_the_daemon_refuses_is_bad_usage(shared_daemon: Daemon) -> None:
    queued = shared_daemon.client().list().total
    for args, says in REFUSED:  # usage errors, in this process
        r = ddpq_in_process(shared_daemon.url, "shell", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr, (args, r.stderr)
    assert shared_daemon.client().list().total == queued  # nothing queued


# ---- idle reclaim, through NVML (the fake libnvidia-ml) ----------------------------------


IDLE_S, GRACE_S = 2, 1


@pytest.fixture
def nvml_daemon(make_daemon: Callable[..., Daemon], tmp_path: Path) -> tuple[Daemon, Path]:
    from tests.nvml.conftest import _compile

    lib = _compile(tmp_path / "nvml")
    util = tmp_path / "utilisation"
    util.write_text("0 0")
    d = make_daemon(
        "--grace",
        "1s",
        "--idle",
        f"{IDLE_S}s",
        "--idle-grace",
        f"{GRACE_S}s",
        LD_LIBRARY_PATH=str(lib),
        FAKE_NVML_GPUS="2",
        FAKE_NVML_UTIL_FILE=str(util),
    )
    return d, util


def session(d: Daemon) -> int:
    job = d.client().submit(JobSubmit(command=["sleep", "600"], gpus=1, interactive=True))
    wait_state(d.client(), job.id, "running")
    return job.id


def test_a_session_on_idle_gpus_is_warned_then_ended_as_idle(
    nvml_daemon: tuple[Daemon, Path],
) -> None:
    d, _ = nvml_daemon
    job = session(d)
    done = wait_done(d.client(), job, timeout=60)
    assert done.state == "timed_out"
    assert done.reason.startswith(
        f"idle: its GPUs were unused for {IDLE_S}s (SIGTERM, SIGKILL after 1s)"
    )
    assert done.job_dir is not None
    log = (Path(done.job_dir) / "output.log").read_text()
    said = f"this session's GPUs have been idle for {IDLE_S}s; it will be ended in {GRACE_S}s"
    warning = log.index(said)
    assert log.index(f"ending the session (idle: its GPUs were unused for {IDLE_S}s)") > warning
    assert any(e.reason.startswith("warned in its terminal") for e in done.events)
    metrics = httpx.get(d.url + "/metrics", timeout=10).text
    assert "ddpq_sessions_reclaimed_idle_total 1.0" in metrics


def test_a_session_whose_gpu_computes_is_not_reclaimed_until_it_stops(
    nvml_daemon: tuple[Daemon, Path],
) -> None:
    d, util = nvml_daemon
    util.write_text("60 0")  # GPU 0 computes, GPU 1 does not
    c = d.client()
    job = session(d)
    assert c.show(job).leases.gpus == [0]
    batch = c.submit(JobSubmit(command=["sleep", "600"], gpus=1))
    assert wait_state(c, batch.id, "running").leases.gpus == [1]

    # The batch job's idle clock shows the worker looking: once it has run twice a session's
    # limit and grace, the computing session has been judged busy all along.
    def idle_long_enough() -> bool:
        since = c.show(batch.id).idle_since
        idle = (datetime.now(UTC) - since).total_seconds() if since is not None else 0.0
        return idle > 2 * (IDLE_S + GRACE_S)

    wait_for(idle_long_enough, 60, "the batch job's GPU to be idle that long")
    shown = c.show(job)
    assert shown.state == "running" and shown.idle_since is None
    assert not any("warned" in e.reason for e in shown.events)
    assert c.show(batch.id).state == "running"  # batch jobs are never reclaimed
    devices = c.devices().items
    assert devices[0].idle_since is None and devices[1].idle_since is not None
    metrics = httpx.get(d.url + "/metrics", timeout=10).text
    assert re.search(r'ddpq_jobs_gpus_idle\{interactive="false"\} 1\.0', metrics)
    assert re.search(r'ddpq_jobs_gpus_idle\{interactive="true"\} 0\.0', metrics)

    util.write_text("0 0")  # the session's GPU stops computing
    done = wait_done(c, job, timeout=60)
    assert done.state == "timed_out" and done.reason.startswith("idle:")
    c.cancel(batch.id)
