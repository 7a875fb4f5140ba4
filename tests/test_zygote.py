"""The tests' forked daemons (``tests/zygote.py``) are what ``python -m ddpq`` would start:
the environment, folder, session, descriptors, program name and exit status asked for."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ddpq.executors.local import procs
from tests.helpers import ZYGOTE, Daemon, free_port, root_flags, wait_for
from tests.shared_install import shared_install
from tests.template_db import migrated
from tests.zygote import (
    DAEMON,
    READ_AS_TORCH_LOADS,
    ROOT,
    TRAINING,
    Answer,
    Forked,
    Zygote,
    ZygoteGone,
)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """One daemons' zygote for the tests that only ask it for children (each start imports
    what a daemon imports and builds its app: ~1.5 s of CPU); one that kills it leaves the
    next request to start another, as it would for any test."""
    z = Zygote(DAEMON, start_env=dict(os.environ))
    yield z
    z.close()


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def descriptors(pid: int) -> set[str]:
    """What ``pid``'s descriptors above 2 refer to (a socket's inode, a file's path)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            if int(fd) > 2:
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def spawn(zygote: Zygote, log: Path, *argv: str, **env: str) -> Forked:
    with log.open("ab") as out:
        return zygote.spawn("ddpq", list(argv), {**os.environ, **env}, out.fileno())


def test_a_command_ends_with_its_status_and_output_in_the_log(
    zygote: Zygote, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    shown = spawn(zygote, log, "--help")
    assert shown.wait(30) == 0
    refused = spawn(zygote, log, "serve", "--no-such-flag")
    assert refused.wait(30) == 2
    said = log.read_text()
    assert "ddpq" in said.splitlines()[0]
    # Click names the program as `python -m ddpq` names it, not after the forking process.
    assert "Usage: python -m ddpq serve" in said
    assert "zygote" not in said


def test_a_command_has_the_environment_asked_for_not_the_zygotes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPQ_URL", "http://127.0.0.1:2")  # the zygote's, at its start
    zygote = Zygote(DAEMON, start_env=dict(os.environ))
    try:
        log = tmp_path / "log"
        assert spawn(zygote, log, "ls", DDPQ_URL="http://127.0.0.1:1").wait(30) == 3
        no_url = {k: v for k, v in os.environ.items() if k != "DDPQ_URL"}
        with log.open("ab") as out:
            assert zygote.spawn("ddpq", ["ls"], no_url, out.fileno()).wait(30) == 3
    finally:
        zygote.close()
    said = log.read_text().splitlines()
    assert "http://127.0.0.1:1 " in said[0], said
    assert "127.0.0.1:2" not in log.read_text()  # removed, not inherited


def test_a_daemon_has_the_folder_session_and_descriptors_asked_for(
    zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    migrated(home / "ddpq.db")
    monkeypatch.chdir(tmp_path)
    port = free_port()
    argv = ["serve", "--home", str(home), "--port", str(port), "--fake-gpus", "1"]
    with (tmp_path / "log").open("ab") as out:
        daemon = zygote.spawn("ddpq", [*argv, *root_flags([])], dict(os.environ), out.fileno())
    try:
        wait_for(lambda: answers(port), 30, "the daemon to answer")
        assert os.readlink(f"/proc/{daemon.pid}/cwd") == str(tmp_path)
        assert os.getsid(daemon.pid) == daemon.pid  # a session of its own, as Popen's
        assert zygote.pid is not None
        # None of the zygote's sockets: its control socket, its answers' (anonymous
        # inodes, its pidfds and epoll, have no name to tell one from another).
        zygotes = {fd for fd in descriptors(zygote.pid) if fd.startswith("socket:")}
        assert len(zygotes) >= 2, "its control socket and the daemon's answer at least"
        assert not zygotes & descriptors(daemon.pid)
        assert os.readlink(f"/proc/{daemon.pid}/fd/0") == os.devnull
        assert os.readlink(f"/proc/{daemon.pid}/fd/1") == str(tmp_path / "log")
        assert os.readlink(f"/proc/{daemon.pid}/fd/2") == str(tmp_path / "log")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0


def test_a_killed_daemon_reports_the_signal_as_popen_does(zygote: Zygote, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    migrated(home / "ddpq.db")
    daemon = spawn(
        zygote,
        tmp_path / "log",
        "serve",
        "--home",
        str(home),
        "--port",
        str(free_port()),
        "--fake-gpus",
        "1",
        *root_flags([]),
    )
    assert daemon.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.wait(0.2)
    daemon.kill()
    assert daemon.wait(30) == -signal.SIGKILL
    assert daemon.poll() == -signal.SIGKILL
    daemon.kill()  # a no-op once it has ended, as Popen's


def test_the_zygote_ends_with_its_pytest_side(tmp_path: Path) -> None:
    zygote = Zygote(DAEMON, start_env=dict(os.environ))
    assert spawn(zygote, tmp_path / "log", "--help").wait(30) == 0
    proc = zygote._proc
    assert proc is not None
    zygote.close()  # waits for it
    assert proc.returncode == 0


def test_a_new_interpreter_where_its_start_would_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ZYGOTE.accepts({**os.environ, "DDPQ_URL": "x"})  # read as it runs
    assert not ZYGOTE.accepts({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert not ZYGOTE.accepts({**os.environ, "PYTHONHASHSEED": "7"})
    assert not ZYGOTE.accepts({**os.environ, "LD_LIBRARY_PATH": str(tmp_path)})
    # A daemon loads no torch: OpenMP's and torch's variables are read as it runs jobs.
    assert ZYGOTE.accepts({**os.environ, "OMP_NUM_THREADS": "13", "TORCHINDUCTOR_X": "1"})
    training = Zygote(TRAINING, start_env=dict(os.environ), read_first=READ_AS_TORCH_LOADS)
    assert not training.accepts({**os.environ, "OMP_NUM_THREADS": "13"})
    assert not training.accepts({**os.environ, "TORCH_LOGS": "+dynamo"})
    assert training.accepts({**os.environ, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"})  # set by torch
    monkeypatch.setenv("DDPQ_TESTS_FRESH_PROCESSES", "1")
    assert not ZYGOTE.accepts(dict(os.environ))
    d = Daemon(home=tmp_path, port=free_port(), args=["--fake-gpus", "1"]).start()
    try:
        assert isinstance(d.proc, subprocess.Popen)
    finally:
        assert d.stop() == 0


def test_the_zygote_forks_with_one_thread(zygote: Zygote, tmp_path: Path) -> None:
    """A fork keeps only the forking thread: a lock another thread held would stay held
    in every child. Its imports must start none."""
    assert spawn(zygote, tmp_path / "log", "--help").wait(30) == 0
    assert zygote.pid is not None
    assert os.listdir(f"/proc/{zygote.pid}/task") == [str(zygote.pid)]


def test_a_zygote_that_died_is_started_anew(zygote: Zygote, tmp_path: Path) -> None:
    assert spawn(zygote, tmp_path / "log", "--help").wait(30) == 0
    first = zygote.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: (st := procs.stat(first)) is None or st.state == "Z", 10, "its end")
    assert spawn(zygote, tmp_path / "log", "--help").wait(30) == 0
    assert zygote.pid not in (None, first)


def test_a_pid_and_a_status_that_come_in_one_read_are_two_answers() -> None:
    """A child that ends at once: its status may follow its pid into one read."""
    ours, theirs = socket.socketpair()
    answer = Answer(ours)
    theirs.sendall(b"4242\n-9\n")
    theirs.close()
    assert answer.line(5, "a pid") == b"4242"
    assert answer.line(5, "a status") == b"-9"
    with pytest.raises(ZygoteGone, match="a status is lost"):
        answer.line(5, "a status")


def test_a_status_not_yet_sent_is_no_answer_and_no_wait() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        answer = Answer(ours)
        assert answer.line(0, "a status") is None
        assert answer.line(0.05, "a status") is None
        theirs.sendall(b"0")  # half a line is not an answer
        assert answer.line(0, "a status") is None
        theirs.sendall(b"\n")
        assert answer.line(0, "a status") == b"0"
    answer.close()


def test_a_zygote_on_another_interpreter_forks_children_that_import_its_install(
    tmp_path: Path,
) -> None:
    # The daemons that run jobs as other accounts start from the shared install
    # (helpers.shared_zygote): their children must import its ddpq, not the checkout's.
    shared = shared_install()
    env = shared.env(dict(os.environ))
    other = Zygote(("ddpq",), start_env=env, python=shared.python)
    try:
        log = tmp_path / "log"
        with log.open("ab") as out:
            assert other.spawn("site", [], env, out.fileno()).wait(30) == 0
    finally:
        other.close()
    said = log.read_text()  # `python -m site`: the child's sys.path, one entry a line
    assert f"'{shared.site_packages}'," in said, said
    assert str(ROOT / "src") not in said and sys.prefix not in said, said
