"""An interactive session's shim with real processes: the job on a terminal, served on a
Unix socket only its owner may use, relayed by ``client.relay``, stopped as any job."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.client import relay
from ddpq.executors.local import procs, shim_pty, shim_wire
from tests.helpers import wait_for
from tests.sessions import ShimSession


@pytest.fixture
def sessions() -> Iterator[list[ShimSession]]:
    started: list[ShimSession] = []
    yield started
    for s in started:
        s.kill()


def start(sessions: list[ShimSession], folder: Path, *args: object, **kw: object) -> ShimSession:
    s = ShimSession(folder, *args, **kw)  # type: ignore[arg-type]
    sessions.append(s)
    return s


def test_the_relay_and_the_shim_speak_the_same_frames() -> None:
    for name in ("INPUT", "WINSIZE", "OUTPUT", "ENDED", "MAX_FRAME"):
        assert getattr(relay, name) == getattr(shim_wire, name), name
    assert relay.HEADER.format == shim_wire.HEADER.format


def test_a_command_typed_in_runs_on_a_terminal_and_the_exit_status_is_recorded(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job")
    assert stat.S_IMODE(s.dir.tty_socket.stat().st_mode) == 0o600
    c = s.client()
    c.size(33, 101)
    c.type("echo answer-$((6*7)); stty size; tty\r")
    c.expect(r"answer-42\r\n33 101\r\n/dev/pts/\d+")
    c.type("exit 3\r")
    c.until_closed()
    assert c.ended == {"exit_code": 3, "signal": None}
    record = s.wait()
    assert (record["exit_code"], record["signal"], record["error"]) == (3, None, None)
    assert not s.dir.tty_socket.exists()  # no stale socket for `ddpq attach`
    assert b"answer-42" in s.dir.log.read_bytes()  # the session's output is its log


def running(session: ShimSession, *argv: str) -> int:
    """The pid of the job's process running ``argv``, once it runs (typed input is echoed
    before the shell has even read it: a key sent then would reach the shell)."""
    wanted = "\0".join(argv).encode() + b"\0"

    def find() -> int | None:
        for pid in procs.session_members(procs.identity(session.proc.pid) or procs.Identity(0, 0)):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == wanted:
                    return pid
            except OSError:
                continue
        return None

    return wait_for(find, 30, f"{argv} to run")


def test_job_control_works_on_the_terminal(sessions: list[ShimSession], tmp_path: Path) -> None:
    s = start(sessions, tmp_path / "job")
    c = s.client()
    c.type("sleep 300\r")
    running(s, "sleep", "300")
    c.type("\x03")  # Ctrl-C: SIGINT to the foreground job, not to the shell or the shim
    c.type("echo after-$((1+1))\r")
    c.expect(r"after-2")
    c.type("sleep 301\r")
    running(s, "sleep", "301")
    c.type("\x1a")  # Ctrl-Z: the shell takes the terminal back
    c.expect(r"Stopped")
    c.type("kill %1; echo killed-$((2+2))\r")
    c.expect(r"killed-4")


def test_a_client_that_comes_back_sees_what_it_missed_and_types_on(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job")
    first = s.client()
    first.type("echo first-$((1+1))\r")
    first.expect(r"first-2")
    first.close()  # detached: the session runs on
    s.dir.write_notice("ddpq: a line for the terminal")
    os.kill(s.proc.pid, signal.SIGUSR2)
    wait_for(lambda: b"a line for the terminal" in s.dir.log.read_bytes(), 10, "the notice")
    assert s.proc.poll() is None
    second = s.client()
    second.expect(r"(?s)first-2.*\[ddpq: a line for the terminal\]")  # the scrollback
    second.type("echo second-$((2+1))\r")
    second.expect(r"second-3")
    second.type("exit\r")
    second.until_closed()
    assert s.wait()["exit_code"] == 0


def test_several_clients_see_the_same_terminal(sessions: list[ShimSession], tmp_path: Path) -> None:
    s = start(sessions, tmp_path / "job")
    a, b = s.client(), s.client()
    a.type("echo shared-$((3*3))\r")
    a.expect(r"shared-9")
    b.expect(r"shared-9")


def test_a_stop_hangs_up_the_shell_and_ends_all_of_the_job(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job", grace=2.0)
    c = s.client()
    # A background job that ignores the hang-up, and a foreground one.
    c.type("nohup sleep 600 >/dev/null 2>&1 & echo bg=$!\r")
    bg = int(c.expect(r"bg=(\d+)").group(1))
    c.type("sleep 601\r")
    running(s, "sleep", "601")
    os.kill(s.proc.pid, signal.SIGTERM)  # a cancel, a time limit or idle: the worker's stop
    c.expect(r"stopping the session")
    c.until_closed()
    record = s.wait()
    assert record["signal"] is not None or record["exit_code"] is not None
    assert procs.stat(bg) is None or procs.stat(bg).state == "Z"  # type: ignore[union-attr]


def test_the_socket_refuses_another_account(
    sessions: list[ShimSession], request: pytest.FixtureRequest
) -> None:
    """0600 keeps others out; SO_PEERCRED is checked too (here with the mode opened up)."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no `nobody` account")
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another account")
    # Out of pytest's folders (0700): the other account must reach the socket's folder.
    base = Path(tempfile.mkdtemp(prefix="ddpq-peer-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    base.chmod(0o755)
    s = start(sessions, base / "job")
    (base / "job").chmod(0o755)
    os.chmod(s.dir.tty_socket, 0o666)  # as if the mode had been got wrong
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(s.dir.tty_socket))
            sock.settimeout(10)
            try:
                sock.sendall(relay.frame(relay.INPUT, b"echo INTRUDER\r"))
                got = sock.recv(100)
            except (ConnectionResetError, BrokenPipeError):
                got = b""  # closed with our input unread: reset
            os.write(w, b"closed" if got == b"" else b"served")
        except OSError as exc:
            os.write(w, f"error {exc}".encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 100) == b"closed"  # accepted, then let go unread
    c = s.client()  # the owner still is served
    c.type("echo still-$((5+5))\r")
    c.expect(r"still-10")
    assert b"INTRUDER" not in c.seen


@pytest.mark.parametrize(
    "garbage",
    [
        relay.frame(b"z", b"what"),  # a kind no client sends
        relay.frame(relay.OUTPUT, b"not yours"),  # the shim's own kind
        struct.pack("!cI", b"i", 1 << 30),  # a frame too large
    ],
)
def test_a_client_that_sends_garbage_is_let_go_and_the_session_goes_on(
    sessions: list[ShimSession], tmp_path: Path, garbage: bytes
) -> None:
    s = start(sessions, tmp_path / "job")
    bad = s.client()
    bad.sock.sendall(garbage)
    bad.until_closed(10)
    good = s.client()
    good.size(0, 0)  # an absurd size is ignored
    good.type("echo fine-$((4+4))\r")
    good.expect(r"fine-8")


def test_a_long_folder_path_still_serves_its_socket(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(deep / "tty.sock")) > 108
    c = start(sessions, deep).client()
    c.type("echo deep-$((7*6))\r")
    c.expect(r"deep-42")


def test_a_command_that_cannot_run_ends_with_127(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job", ["/no/such/program"])
    assert s.wait()["exit_code"] == 127
    assert b"cannot run '/no/such/program'" in s.dir.log.read_bytes()


# ---- the relay itself, on pipes ---------------------------------------------------------


def test_the_detach_key_leaves_the_session_running(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job")
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.write(w_in, b"echo before-$((8*8))\r")
    sock = s.connect()
    # The key is typed once the command's output has come through the relay: a helper
    # process reads what the relay writes, and types the key when it sees the output.
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the typist
        import select
        import time

        seen, deadline = b"", time.monotonic() + 30
        while b"before-64" not in seen and time.monotonic() < deadline:
            if select.select([r_out], [], [], 0.1)[0]:
                seen += os.read(r_out, 65536)
        os.write(w_in, b"ignored\x1cnot sent")
        os._exit(0 if b"before-64" in seen else 3)
    outcome = relay.relay(sock, r_in, w_out, relay.detach_byte("^\\"))
    _, status = os.waitpid(pid, 0)
    os.close(w_out)
    assert outcome == relay.Outcome(detached=True)
    assert os.waitstatus_to_exitcode(status) == 0  # the output came through before the key
    assert s.proc.poll() is None  # still running
    c = s.client()
    c.expect(r"ignored")  # what came before the key was typed in
    assert b"not sent" not in c.seen


def test_the_relay_ends_with_the_sessions_exit_status(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job")
    r_in, w_in = os.pipe()
    _r_out, w_out = os.pipe()  # what it writes there is not read: it is little
    os.write(w_in, b"exit 4\r")
    os.close(w_in)  # input ends; the relay goes on until the session does
    outcome = relay.relay(s.connect(), r_in, w_out, None)
    assert outcome == relay.Outcome(False, 4, None)
    s.wait()


@pytest.mark.parametrize(
    ("spec", "byte"),
    [("^\\", 0x1C), ("^]", 0x1D), ("^a", 0x01), ("^A", 0x01), ("^?", 0x7F), (" ^Z ", 0x1A)],
)
def test_detach_keys(spec: str, byte: int) -> None:
    assert relay.detach_byte(spec) == byte


@pytest.mark.parametrize("spec", ["", "x", "^", "^1", "ctrl-a", "^ab", "^\u00e9"])
def test_detach_keys_that_are_not_control_keys_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="control key"):
        relay.detach_byte(spec)


def test_no_detach_key() -> None:
    assert relay.detach_byte("none") is None and relay.detach_byte("NONE") is None


@pytest.mark.parametrize("who", ["the same account", "another account", "root"])
def test_attach_connects_only_to_a_socket_its_own_account_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    """A job's account may put a listener of its own where its shim's socket was: another
    account attaching would type into it. Refused unless its server is the caller's own
    account (root may attach to any: the shim lets only root and the job's account in)."""
    path = tmp_path / "tty.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(4)
        me = {"the same account": os.geteuid(), "another account": os.geteuid() + 4242}
        uid = me.get(who, 0)
        if who == "another account" and os.geteuid() == 0:
            uid = 4242  # the listener is root's: the caller someone else
        if who == "root":  # root meets a listener of another account's (run as root too)
            monkeypatch.setattr(relay, "served_by", lambda _sock: 4242)
        monkeypatch.setattr(os, "geteuid", lambda: uid)
        if who != "another account":
            relay.connect(str(path)).close()
        else:
            with pytest.raises(relay.CannotAttach, match=r"served by another account \(uid"):
                relay.connect(str(path))


def test_connect_says_why_it_cannot(tmp_path: Path) -> None:
    with pytest.raises(relay.CannotAttach) as missing:
        relay.connect(str(tmp_path / "tty.sock"))
    assert missing.value.waiting  # the folder is there: the shim may not have bound it yet
    with pytest.raises(relay.CannotAttach, match="on the daemon's host") as elsewhere:
        relay.connect(str(tmp_path / "no-such-job" / "tty.sock"))
    assert not elsewhere.value.waiting


READ_ALL = """
import os, tty
tty.setraw(0)
print("ready", flush=True)
n = 0
while n < SIZE:
    n += len(os.read(0, 65536))
print("read", n)
"""


def test_a_long_paste_is_typed_in_whole(sessions: list[ShimSession], tmp_path: Path) -> None:
    """Far more than the shim holds at once (64 KiB): the client is made to wait, and the
    program on the terminal (raw, so no line limit) reads every byte."""
    size = 1_000_000
    program = [sys.executable, "-c", READ_ALL.replace("SIZE", str(size))]
    c = start(sessions, tmp_path / "job", program).client()
    c.expect(r"ready")  # raw: before, a line discipline keeps at most 4 KiB of a line
    for _ in range(size // 50_000):
        c.type("x" * 50_000)
    c.expect(rf"read {size}\b")


@pytest.mark.parametrize(
    "query",
    [
        b"\x1b[6n",  # where is the cursor? (vim, readline's ambiwidth checks)
        b"\x1b[5n",
        b"\x1b[c",  # device attributes
        b"\x1b[>c",
        b"\x1b[=0c",
        b"\x1b[?12$p",  # DECRQM
        b"\x1b]11;?\x07",  # the background colour
        b"\x1b]10;?\x1b\\",
        b"\x1b]4;1;?\x07",
        b"\x1bP$qm\x1b\\",  # DECRQSS
        b"\x1bP+q544e\x1b\\",  # XTGETTCAP
        b"\x1b[14t",  # the window's size in pixels
        b"\x1b[?u",  # the keyboard protocol
        b"\x1b[>0q",  # XTVERSION
    ],
)
def test_a_replay_leaves_out_what_would_make_the_terminal_answer(query: bytes) -> None:
    assert shim_pty.replayable(b"before" + query + b"after") == b"beforeafter"


@pytest.mark.parametrize(
    "drawing",
    [
        b"\x1b[31mred\x1b[0m",
        b"\x1b[2J\x1b[H",
        b"\x1b[?1049h\x1b[?25l",
        b"\x1b]0;a title\x07",
        b"\x1b[10;20H\x1b[K",
        b"\x1b]8;;https://example.org/\x1b\\link\x1b]8;;\x1b\\",
        "caf\u00e9 \u2014 \u4e2d\u6587".encode(),
    ],
)
def test_a_replay_keeps_what_draws(drawing: bytes) -> None:
    assert shim_pty.replayable(drawing) == drawing


def test_a_client_that_attaches_gets_no_query_replayed(
    sessions: list[ShimSession], tmp_path: Path
) -> None:
    s = start(sessions, tmp_path / "job")
    first = s.client()
    first.type("printf 'ask\\033[6nend\\n'\r")
    first.expect("ask\x1b\\[6nend")  # live, the program's query reaches the terminal
    second = s.client()
    second.expect(r"askend")
    assert b"\x1b[6n" not in second.seen


def test_a_client_still_waiting_to_be_let_in_is_told_how_the_job_ended(tmp_path: Path) -> None:
    """`ddpq shell -- true`: the command can end before the shim has let in the client
    that connected meanwhile. The shim lets it in as it closes: it gets what the job
    wrote and how it ended (it was dropped untold, and `ddpq shell` exited 1)."""
    from ddpq.executors.local.shim_log import CappedLog

    path = str(tmp_path / "tty.sock")
    here = os.getcwd()
    listener = shim_wire.listen(path)  # it binds from inside the folder
    os.chdir(here)
    wake_r, wake_w = os.pipe()
    log = CappedLog(str(tmp_path / "output.log"), 1 << 20)
    term = shim_pty.Terminal(path, listener, log, str(tmp_path / "notice"), {}, wake_r)
    term.master, slave = os.openpty()
    os.close(slave)
    term.scrollback += b"said at once\r\n"
    late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        late.connect(path)  # in the listener's queue: the job ended before it was let in
        term.close(3 << 8)  # exit status 3
        data = b""
        while chunk := late.recv(65536):
            data += chunk
    finally:
        late.close()
        log.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
    frames = []
    while data:
        kind, length = shim_wire.HEADER.unpack_from(data)
        frames.append((kind, data[shim_wire.HEADER.size : shim_wire.HEADER.size + length]))
        data = data[shim_wire.HEADER.size + length :]
    assert frames[0] == (shim_wire.OUTPUT, b"said at once\r\n")
    assert frames[-1] == (shim_wire.ENDED, b'{"exit_code": 3, "signal": null}')
    assert not os.path.exists(path)
