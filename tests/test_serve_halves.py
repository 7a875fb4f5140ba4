"""``ddpq serve`` runs its worker in a child process, and is still one daemon (issue 22, 8).

The API stays in the process started (the one signals reach, the lock file names); the
worker runs in a child forked after the start-up. Stopping the daemon stops both; either
half's death stops the other, with one line saying why; nothing is left behind.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.config import ConfigError
from ddpq.daemon import halves, state_folder
from ddpq.daemon.watchdog import Shutdown
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, free_port, root_flags, wait_done, wait_for
from tests.launches import remove_job_cgroups
from tests.workload.runs import children  # the worker half is the serve process's child


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    home = tmp_path / "home"
    home.mkdir()
    d = Daemon(home, free_port(), ["--fake-gpus", "1"]).start()
    yield d
    assert d.proc is not None
    if d.proc.poll() is None:
        os.killpg(d.proc.pid, signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    # A half killed with SIGKILL leaves its cgroup tree (its exit handlers never ran).
    assert remove_job_cgroups(home) == []


def worker_half(d: Daemon) -> int:
    assert d.proc is not None
    (pid,) = wait_for(lambda: children(d.proc.pid) if d.proc else None, 30, "the worker half")
    return pid


def log(d: Daemon) -> str:
    return (d.home / "daemon.log").read_text(errors="replace")


def test_the_worker_runs_in_a_child_and_sigterm_stops_both(daemon: Daemon) -> None:
    job = daemon.client().submit(JobSubmit(command=["true"], gpus=1))
    assert wait_done(daemon.client(), job.id).state == "succeeded"
    child = worker_half(daemon)
    assert daemon.proc is not None
    # The lock file says one daemon: the process started, which signals reach.
    assert (daemon.home / "worker.lock").read_text() == str(daemon.proc.pid)
    assert daemon.stop(signal.SIGTERM) == 0, log(daemon)
    assert not running(child)
    assert "stopping: running jobs keep running" in log(daemon)
    assert "CRITICAL" not in log(daemon)
    assert "forking beside threads" not in log(daemon)  # forked before any thread started


def test_a_killed_worker_half_stops_the_api_with_status_1(daemon: Daemon) -> None:
    child = worker_half(daemon)
    os.kill(child, signal.SIGKILL)
    assert daemon.proc is not None
    assert daemon.proc.wait(60) == 1, log(daemon)
    text = log(daemon)
    line = f"CRITICAL ddpq: the worker process (pid {child}) was killed by SIGKILL"
    assert text.count(line) == 1, text
    assert text.rstrip().splitlines()[-1].startswith(f"ddpq: the worker process (pid {child})")
    assert not running(child)


def test_a_killed_api_half_stops_its_worker(daemon: Daemon) -> None:
    child = worker_half(daemon)
    assert daemon.proc is not None
    parent = daemon.proc.pid
    daemon.kill9()
    wait_for(lambda: not running(child), 60, "the worker half to end")
    text = log(daemon)
    assert text.count(f"CRITICAL ddpq: the API process (pid {parent}) ended") == 1, text
    # Its lock is free: a daemon started again at once runs (not "another worker runs").
    again = Daemon(daemon.home, free_port(), ["--fake-gpus", "1"]).start()
    try:
        job = again.client().submit(JobSubmit(command=["true"], gpus=1))
        assert wait_done(again.client(), job.id).state == "succeeded"
    finally:
        assert again.stop() == 0


def test_a_worker_half_stopped_alone_stops_the_daemon_cleanly(daemon: Daemon) -> None:
    """A service manager sends SIGTERM to every process of the unit: the worker half may
    stop before the API hears of its own. An orderly stop, not a failure."""
    child = worker_half(daemon)
    os.kill(child, signal.SIGTERM)
    assert daemon.proc is not None
    assert daemon.proc.wait(60) == 0, log(daemon)
    assert "CRITICAL" not in log(daemon)


def test_one_end_described() -> None:
    assert halves._described(os.CLD_KILLED, signal.SIGKILL) == "was killed by SIGKILL"
    assert halves._described(os.CLD_EXITED, 3) == "exited with status 3"
    assert halves._described(os.CLD_DUMPED, 250) == "was killed by signal 250"


def test_a_setting_the_worker_refuses_stays_a_failed_starts_one_line(tmp_path: Path) -> None:
    """Refused in the child (no Slurm commands here), said once by the parent, status 2."""
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["--home", str(tmp_path / "home"), "--port", str(free_port()), "--executor", "slurm"]
    done = subprocess.run(
        [sys.executable, "-m", "ddpq", "serve", *args, *root_flags(args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(empty)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("ddpq: --executor slurm needs Slurm's commands on PATH"), line


def _last_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_start_waits_for_the_lock_of_a_worker_half_whose_parent_is_gone(
    tmp_path: Path,
) -> None:
    """After `kill -9` of `serve`, its worker half holds the lock while it stops: a start
    then waits for it (the lock names a pid that is gone) instead of refusing."""
    held = open(tmp_path / "worker.lock", "a+")  # noqa: SIM115 - released by the timer
    fcntl.flock(held, fcntl.LOCK_EX)
    held.write(str(_last_pid()))
    held.flush()
    threading.Timer(0.3, held.close).start()  # the orphaned half ends
    lock = state_folder.worker_lock(tmp_path, patience_s=60)
    try:
        assert (tmp_path / "worker.lock").read_text() == str(os.getpid())
    finally:
        lock.close()


def test_a_start_beside_a_running_worker_is_refused_at_once(tmp_path: Path) -> None:
    held = state_folder.worker_lock(tmp_path)  # names this process, which runs
    try:
        with pytest.raises(ConfigError, match=f"another ddpq worker \\(pid {os.getpid()}\\)"):
            state_folder.worker_lock(tmp_path, patience_s=60)
    finally:
        held.close()


class FakeServer:
    should_exit = False
    force_exit = False


def test_a_clean_stop_of_the_worker_half_stops_the_api_as_a_signal_would() -> None:
    """Before the API server is attached or after: it stops, unforced, and nothing failed."""
    early, late = Shutdown(), Shutdown()
    early_server, late_server = FakeServer(), FakeServer()
    early.stop()
    early.attach(early_server)
    late.attach(late_server)
    late.stop()
    for shutdown, server in ((early, early_server), (late, late_server)):
        assert server.should_exit and not server.force_exit
        assert shutdown.died is None and shutdown.event.is_set()


def test_a_worker_half_stops_when_its_api_half_dies_without_reading_ready() -> None:
    """A `serve` killed as it starts, with the worker's READY still unread: the worker's
    end reads ECONNRESET, not b"", and its watch once died of it, leaving the worker to
    run alone, holding the state folder's lock."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = halves.ApiParent(os.getpid(), theirs)
    parent.ready()  # into the API half's buffer, never read
    shutdown = Shutdown()
    parent.watch(shutdown)
    ours.close()  # the API half killed
    assert shutdown.event.wait(10)
    assert shutdown.died is not None and "ended" in shutdown.died
