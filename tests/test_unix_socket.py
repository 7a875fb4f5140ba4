"""The daemon's Unix socket as a file and as the CLI's default path (issue 17): made 0666 at
start, removed at exit, a killed daemon's replaced, a live one's never taken; the CLI finds
it without --url and speaks every command over it, streams included, without importing
anything heavier than over TCP.

Who a caller of the socket is, and what that lets it do: tests/test_local_identity.py (in
process) and tests/test_local_users.py (real accounts, as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.client.api import DdpqClient, choose_url, find_socket
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, free_port, root_flags, wait_done, wait_for
from tests.template_db import migrated
from tests.test_cli_speed import DAEMON, HEAVY, STDLIB_HTTP, under


def cli(
    home: Path, *args: str, python: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """`ddpq ARGS` as a user of this machine runs it: no URL, no socket named, the state
    folder of the daemon as $DDPQ_HOME (where a daemon of one's own keeps its socket)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DDPQ_URL", "DDPQ_SOCKET")}
    return subprocess.run(
        [sys.executable, *python, "-m", "ddpq", *args],
        capture_output=True,
        text=True,
        env={**environ, "DDPQ_HOME": str(home), "DDPQ_TOKEN": "", **env},
        timeout=120,
    )


def serve(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A daemon that is expected to refuse to start, at its socket (a real process: it has
    set up its logging and umask by then). Its database is the template's copy: the
    daemon would migrate a fresh one first, for a second of CPU."""
    migrated(home / "ddpq.db")
    return cli(home, *_serve_args(home, *args))


def serve_refused_by_settings(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A daemon that is expected to refuse its settings before it starts anything: in this
    process (tests/cli_inprocess.py)."""
    return run_in_process(*_serve_args(home, *args))


def _serve_args(home: Path, *args: str) -> list[str]:
    argv = ["serve", "--home", str(home), "--port", str(free_port()), "--fake-gpus", "1", *args]
    return [*argv, *root_flags(list(args))]


def test_the_socket_is_open_to_all_and_the_cli_uses_it_without_a_url(shared_daemon: Daemon) -> None:
    path = shared_daemon.home / "ddpq.sock"
    info = path.lstat()
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666
    assert stat.S_IMODE(shared_daemon.home.stat().st_mode) == 0o711  # others pass, cannot list
    # The daemon says at start whom it believes: without --auth, anyone over TCP.
    assert "a mode for a single-user machine" in (shared_daemon.home / "daemon.log").read_text()
    who = cli(shared_daemon.home, "whoami")
    assert who.returncode == 0, who.stderr
    assert f"known from the socket {path}: no token" in who.stdout
    job = cli(shared_daemon.home, "submit", "--", "sh", "-c", "echo hello from the socket")
    assert job.returncode == 0, job.stderr
    job_id = int(job.stdout)
    # A stream on a connection of its own.
    followed = cli(shared_daemon.home, "logs", "-f", str(job_id))
    assert followed.returncode == 0 and "hello from the socket" in followed.stdout
    listed = cli(shared_daemon.home, "ls", "--all", "--json")
    assert f'"id": {job_id}' in listed.stdout
    # $DDPQ_URL still wins: the same daemon over TCP, where the client names itself.
    over_tcp = cli(shared_daemon.home, "whoami", DDPQ_URL=shared_daemon.url)
    assert f"over {shared_daemon.url}" in over_tcp.stdout


def test_the_socket_goes_with_the_daemon_and_a_killed_ones_is_replaced(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1")
    path = d.home / "ddpq.sock"
    d.kill9()
    assert path.exists()  # left behind: nobody listens on it
    stale = cli(d.home, "ls")
    assert stale.returncode == 3
    assert f"on the socket {path}" in stale.stderr and "no daemon listens there" in stale.stderr
    d.start()
    assert cli(d.home, "ls").returncode == 0
    assert d.stop() == 0
    assert not path.exists()


def test_a_socket_a_daemon_answers_on_is_not_taken(shared_daemon: Daemon, tmp_path: Path) -> None:
    theirs = shared_daemon.home / "ddpq.sock"
    r = serve(tmp_path / "other", "--socket", str(theirs))
    assert r.returncode == 2 and f"another ddpq daemon listens on {theirs}" in r.stderr
    assert cli(shared_daemon.home, "ls").returncode == 0  # and it still answers


def test_a_file_in_the_sockets_place_is_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "ddpq.sock").write_text("mine\n")
    r = serve(home)
    assert r.returncode == 2 and "exists and is not a socket" in r.stderr
    assert (home / "ddpq.sock").read_text() == "mine\n"


def test_a_socket_path_too_long_for_a_socket_is_refused_at_start(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 120) / "ddpq.sock"
    r = serve_refused_by_settings(tmp_path / "home", "--socket", str(long))
    assert r.returncode == 2 and "longer than the 107 bytes" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["relative.sock", "./x.sock", "~nobody-such-user/x"])
def test_a_socket_setting_must_be_an_absolute_path(bad: str, tmp_path: Path) -> None:
    r = serve_refused_by_settings(tmp_path / "home", "--socket", bad)
    assert r.returncode == 2 and "--socket" in r.stderr and "absolute path" in r.stderr


def test_a_folder_made_for_the_socket_lets_others_pass(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    where = tmp_path / "run" / "ddpq"
    d = make_daemon("--fake-gpus", "1", "--socket", str(where / "ddpq.sock"))
    assert stat.S_IMODE(where.stat().st_mode) == stat.S_IMODE(where.parent.stat().st_mode) == 0o755
    who = cli(d.home, "whoami", DDPQ_SOCKET=str(where / "ddpq.sock"))
    assert "known from the socket" in who.stdout, who.stderr


def test_no_socket_when_told_so(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", "--socket", "none")
    assert not (d.home / "ddpq.sock").exists()
    assert "API on the Unix socket" not in (d.home / "daemon.log").read_text()


def test_the_client_looks_for_a_socket_only_where_a_daemon_would_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DDPQ_URL", "DDPQ_SOCKET", "DDPQ_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    state = tmp_path / ".local" / "state" / "ddpq"
    state.mkdir(parents=True)
    (state / "ddpq.sock").write_text("a file, not a socket")
    system = Path("/run/ddpq/ddpq.sock")
    found = find_socket()
    assert found == (str(system) if system.is_socket() else None)
    (state / "ddpq.sock").unlink()
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(state / "ddpq.sock"))
        assert find_socket() == str(state / "ddpq.sock")
        assert choose_url() == f"unix:{state / 'ddpq.sock'}"
        assert choose_url("http://h:1/") == "http://h:1"  # --url wins
        monkeypatch.setenv("DDPQ_URL", "http://h:2")
        assert choose_url() == "http://h:2"
    monkeypatch.setenv("DDPQ_SOCKET", "/some/where.sock")  # named: taken as it is
    assert find_socket() == "/some/where.sock"


def test_a_client_on_the_socket_sends_neither_its_name_nor_a_token() -> None:
    with DdpqClient("unix:/nonexistent/ddpq.sock", token="ddpq_secret") as c:
        assert c.json.headers == {}
    with DdpqClient("http://127.0.0.1:1", token="ddpq_secret") as c:
        assert c.json.headers["Authorization"] == "Bearer ddpq_secret"


def test_a_command_over_the_socket_imports_nothing_heavier(shared_daemon: Daemon) -> None:
    for args in (["ls"], ["whoami"], ["token", "ls"], ["submit", "--hold", "--", "true"]):
        r = cli(shared_daemon.home, *args, python=("-X", "importtime"))
        assert r.returncode == 0, r.stderr[-2000:]
        names = {
            line.rsplit("|", 1)[1].strip()
            for line in r.stderr.splitlines()
            if line.startswith("import time:") and "|" in line
        }
        assert "ddpq.client.transport" in names
        assert not under(names, HEAVY + STDLIB_HTTP + DAEMON), args


def test_a_job_submitted_on_the_socket_runs(shared_daemon: Daemon) -> None:
    with DdpqClient(f"unix:{shared_daemon.home / 'ddpq.sock'}") as c:
        job = c.json.submit({"command": ["true"], "cwd": "/"})
        assert wait_done(c, job["id"]).state == "succeeded"
        wait_for(lambda: c.health()["ok"], 5, "health over the socket")


def _over_the_socket(path: Path, request: bytes, body: bytes = b"") -> bytes:
    """The daemon's raw answer to REQUEST (then BODY, which it may stop reading) on PATH."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(path))
        conn.sendall(request)
        # The daemon may answer and close before reading all of it.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(body)
        reply = b""
        while b"too_large" not in reply and (chunk := conn.recv(4096)):
            reply += chunk
    return reply


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_body_over_the_limit_is_refused_on_the_socket_too(
    shared_daemon: Daemon, chunked: bool
) -> None:
    sock = shared_daemon.home / "ddpq.sock"

    def queued() -> list[int]:  # the ids of every job, the module's others' included
        return [
            j["id"] for j in json.loads(cli(shared_daemon.home, "ls", "--all", "--json").stdout)
        ]

    before = queued()
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    if chunked:  # no length to judge by: counted as it arrives
        piece = b" " * (1 << 20)
        frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
        reply = _over_the_socket(sock, head + b"Transfer-Encoding: chunked\r\n\r\n", frame * 9)
    else:
        reply = _over_the_socket(sock, head + b"Content-Length: 1000000000\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"too_large" in reply
    assert queued() == before  # nothing queued
