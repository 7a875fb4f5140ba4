"""A session's shim against what its job may do to it: the job owns its folder (so whatever
lies where the worker's notice goes may be the job's), its terminal (whose foreground it
may hand to any group of its session) and its working directory (which may be gone)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.executors.local import shim_log, shim_procs, shim_pty
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done
from tests.sessions import ShimSession

INJECTED = "INJECTED-BY-THE-JOB"


@pytest.fixture
def sessions() -> Iterator[list[ShimSession]]:
    started: list[ShimSession] = []
    yield started
    for s in started:
        s.kill()


# ---- the notice: what may lie in its place ----------------------------------------------


def fifo_held_open(path: Path, cleanup: list[Callable[[], None]]) -> None:
    """A FIFO with a writer that never writes: a blocking read would wait forever, a
    non-blocking one fails with EAGAIN."""
    os.mkfifo(path)
    held = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    cleanup.append(lambda: os.close(held))


def fifo_with_data(path: Path, cleanup: list[Callable[[], None]]) -> None:
    os.mkfifo(path)
    held = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    os.write(held, f"ddpq: {INJECTED}".encode())
    cleanup.append(lambda: os.close(held))


def empty_fifo(path: Path, cleanup: list[Callable[[], None]]) -> None:
    os.mkfifo(path)


def directory(path: Path, cleanup: list[Callable[[], None]]) -> None:
    (path / "inside").mkdir(parents=True)  # not empty: not even rmdir takes it away


def link_to_a_file(path: Path, cleanup: list[Callable[[], None]]) -> None:
    target = path.parent.parent / "elsewhere"
    target.write_text(f"ddpq: {INJECTED}")
    path.symlink_to(target)


def link_to_a_fifo(path: Path, cleanup: list[Callable[[], None]]) -> None:
    target = path.parent.parent / "a-fifo"
    fifo_held_open(target, cleanup)
    path.symlink_to(target)


def dangling_link(path: Path, cleanup: list[Callable[[], None]]) -> None:
    path.symlink_to(path.parent / "no-such-file")


def unix_socket(path: Path, cleanup: list[Callable[[], None]]) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(path.parent)  # the pytest folder's path may be longer than an address holds
    try:
        sock.bind(path.name)
    finally:
        os.chdir(cwd)
    cleanup.append(sock.close)


def unreadable_file(path: Path, cleanup: list[Callable[[], None]]) -> None:
    path.write_text(f"ddpq: {INJECTED}")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads it anyway: then it is only an odd file
        path.chmod(0o644)
        path.write_text("")


NOT_A_NOTICE = {
    "a FIFO a writer holds open": fifo_held_open,
    "a FIFO with data in it": fifo_with_data,
    "an empty FIFO": empty_fifo,
    "a directory": directory,
    "a link to a file": link_to_a_file,
    "a link to a FIFO": link_to_a_fifo,
    "a dangling link": dangling_link,
    "a Unix socket": unix_socket,
    "an unreadable file": unreadable_file,
}


@pytest.mark.parametrize("make", NOT_A_NOTICE.values(), ids=NOT_A_NOTICE.keys())
def test_whatever_lies_in_place_of_the_notice_neither_stops_nor_speaks_in_the_session(
    sessions: list[ShimSession], tmp_path: Path, make: Callable[..., None]
) -> None:
    s = ShimSession(tmp_path / "job")
    sessions.append(s)
    c = s.client()
    cleanup: list[Callable[[], None]] = []
    try:
        make(s.dir.notice, cleanup)
        os.kill(s.proc.pid, signal.SIGUSR2)
        # The shim takes the notice on the loop's turn after the signal; a command's output
        # comes back on a later turn, so seeing it means the notice was dealt with.
        c.type("echo alive-$((20+3))\r")
        c.expect(r"alive-23")
        os.kill(s.proc.pid, signal.SIGUSR2)  # and again: nothing was left in a bad state
        c.type("echo still-$((30+4))\r")
        c.expect(r"still-34")
    finally:
        for undo in cleanup:
            undo()
    assert s.proc.poll() is None
    assert INJECTED.encode() not in c.seen
    assert INJECTED.encode() not in s.dir.log.read_bytes()
    c.type("exit 5\r")
    c.until_closed()
    assert s.wait()["exit_code"] == 5  # the shim ended it as any session, with a record


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("ddpq: \x1b]0;a title\x07idle\x1b[2J", "ddpq:  ]0;a title idle [2J"),  # no escapes
        ("ddpq: one\nline\r\x00two", "ddpq: one line  two"),
        ("", None),
        ("   \n\t ", None),
    ],
)
def test_a_notice_is_one_printable_line(
    sessions: list[ShimSession], tmp_path: Path, written: str, shown: str | None
) -> None:
    s = ShimSession(tmp_path / "job")
    sessions.append(s)
    c = s.client()
    s.dir.write_notice(written)
    os.kill(s.proc.pid, signal.SIGUSR2)
    c.type("echo after-$((6+6))\r")
    c.expect(r"after-12")
    assert b"\x1b]0;" not in c.seen and b"\x1b[2J" not in c.seen
    if shown is None:
        assert b"\r\n[" not in c.seen  # no line for a notice that says nothing
    else:
        assert f"[{shown}]".encode() in c.seen
    assert not s.dir.notice.exists()  # taken: the next signal shows no stale line


def test_a_notice_longer_than_its_limit_is_cut(sessions: list[ShimSession], tmp_path: Path) -> None:
    s = ShimSession(tmp_path / "job")
    sessions.append(s)
    c = s.client()
    s.dir.notice.write_text("ddpq: " + "n" * (shim_pty.NOTICE_MAX * 4))  # as a job could
    os.kill(s.proc.pid, signal.SIGUSR2)
    found = c.expect(r"\[ddpq: (n+)\]")
    assert len(found.group(1)) == shim_pty.NOTICE_MAX - len("ddpq: ")


# ---- the job hands the terminal's foreground to the shim's own group ---------------------


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[shim_pty.Terminal]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    wake_r, wake_w = os.pipe()
    log = shim_log.CappedLog(str(tmp_path / "output.log"), 1 << 20)
    term = shim_pty.Terminal(
        str(tmp_path / "tty.sock"), listener, log, str(tmp_path / "notice"), {"at": 0.0}, wake_r
    )
    term.master, _slave = os.openpty()
    term.pid = 1 << 22  # no such group: the test's own calls are recorded, not made
    yield term
    for fd in (term.master, _slave, wake_r, wake_w):
        os.close(fd)
    listener.close()


def record_signals(monkeypatch: pytest.MonkeyPatch, foreground: int) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "tcgetpgrp", lambda fd: foreground)
    monkeypatch.setattr(os, "killpg", lambda group, sig: sent.append((group, sig)))
    monkeypatch.setattr(shim_procs, "job_members", lambda *_: [])
    return sent


def test_a_hang_up_never_signals_the_shims_own_group(
    terminal: shim_pty.Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal's foreground is the shim's group until the job takes it, and the job
    may give it back (``tcsetpgrp``): the shim would hang up itself and its group."""
    sent = record_signals(monkeypatch, foreground=os.getpgrp())
    terminal.hang_up(sid=0, marker=b"", since=0)
    assert sent == [(terminal.pid, signal.SIGHUP)]


def test_a_hang_up_signals_the_jobs_foreground_group(
    terminal: shim_pty.Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = record_signals(monkeypatch, foreground=terminal.pid + 1)
    terminal.hang_up(sid=0, marker=b"", since=0)
    assert sorted(sent) == [(terminal.pid, signal.SIGHUP), (terminal.pid + 1, signal.SIGHUP)]


@pytest.mark.parametrize("own", [True, False], ids=["the shim's group", "the job's group"])
def test_a_redraw_is_asked_of_the_job_only(
    terminal: shim_pty.Terminal, monkeypatch: pytest.MonkeyPatch, own: bool
) -> None:
    foreground = os.getpgrp() if own else terminal.pid
    sent = record_signals(monkeypatch, foreground)
    client = shim_pty.Client(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        terminal._window(client, shim_pty.DEFAULT_SIZE)  # same size: no SIGWINCH from the kernel
    finally:
        client.sock.close()
    assert sent == ([] if own else [(terminal.pid, signal.SIGWINCH)])


# ---- a working directory that cannot be entered -----------------------------------------


@pytest.mark.parametrize("kind", ["missing", "a file", "closed"])
def test_a_session_whose_directory_cannot_be_entered_leaves_no_socket(
    sessions: list[ShimSession], tmp_path: Path, kind: str
) -> None:
    cwd = tmp_path / "cwd"
    if kind == "a file":
        cwd.write_text("not a folder")
    elif kind == "closed":
        if os.geteuid() == 0:
            pytest.skip("root enters any folder")
        cwd.mkdir(mode=0)
    s = ShimSession(tmp_path / "job", cwd=cwd)
    sessions.append(s)
    record = s.wait()
    assert record["exit_code"] is None
    assert "cannot enter its working directory" in str(record["error"])
    # `ddpq attach` must say the session is gone, not find a socket no one serves.
    assert not s.dir.tty_socket.exists()


# ---- the next attempt's folder ------------------------------------------------------------


def test_a_directory_left_where_the_notice_goes_does_not_stop_the_next_attempt(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", "1s")
    c = d.client()
    script = (
        'test "$DDPQ_ATTEMPT" -ge 2 && exit 0; '
        'mkdir -p "$DDPQ_JOB_DIR/notice/inside" && ln -s /etc/passwd "$DDPQ_JOB_DIR/notice/x"; '
        "exit 3"
    )
    job = c.submit(JobSubmit(command=["sh", "-c", script], retries=1, gpus=1))
    done = wait_done(c, job.id, timeout=60)
    assert done.state == "succeeded", done.reason
    assert [(a.number, a.exit_code) for a in done.attempts] == [(1, 3), (2, 0)]
