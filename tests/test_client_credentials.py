"""A token goes only to the daemon it was made for, and whatever answers instead of a ddpq
daemon (not HTTP, cut short, garbage, JSON of another shape) is one line and an exit
status, never a traceback."""

from __future__ import annotations

import json
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.client import cli, credentials
from ddpq.client.api import DdpqError, JsonApi
from ddpq.entry import command_line
from tests.helpers import free_port
from tests.stub_api import Answer, Request, StubApi, json_answer

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def ddpq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Run:
    """`ddpq ARGS` in this process on a machine with no daemon's socket and nothing saved;
    returns its exit status, standard output and error. An exception that the command line
    lets through fails the test (a user would have seen a traceback)."""
    for name in ("DDPQ_URL", "DDPQ_TOKEN", "DDPQ_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("DDPQ_HOME", str(tmp_path / "no-daemon-here"))
    monkeypatch.setattr(credentials, "SYSTEM_SOCKET", str(tmp_path / "no-system-socket"))

    def run(*args: str, **env: str) -> tuple[int, str, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as ended:
            cli.run(lambda: command_line(list(args))(list(args), prog_name="ddpq"))
        out = capfd.readouterr()
        code = ended.value.code
        return (code if isinstance(code, int) else 1), out.out, out.err

    return run


def whoami_answer(request: Request) -> Answer:
    return json_answer(200, {"name": "alice", "via": "header"})


@pytest.fixture
def daemon() -> Iterator[StubApi]:
    with StubApi(whoami_answer) as stub:
        yield stub


@pytest.fixture
def stranger() -> Iterator[StubApi]:
    with StubApi(whoami_answer) as stub:
        yield stub


def tokens_sent(stub: StubApi) -> list[str | None]:
    return [r.headers.get("authorization") for r in stub.requests]


def test_login_keeps_the_daemon_with_the_token_and_sends_it_there_only(
    ddpq: Run, daemon: StubApi, stranger: StubApi, tmp_path: Path
) -> None:
    code, out, _ = ddpq("--url", daemon.url + "/", "login", "ddpq_secret")
    assert code == 0 and f"token for {daemon.url} saved" in out
    path = tmp_path / "config" / "ddpq" / "token"
    assert json.loads(path.read_text()) == {"url": daemon.url, "token": "ddpq_secret"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # No URL named, no socket here: the saved token's own daemon, with it.
    assert ddpq("whoami")[0] == 0
    assert ddpq("whoami", DDPQ_URL=daemon.url)[0] == 0
    assert tokens_sent(daemon) == ["Bearer ddpq_secret"] * 2
    # Another daemon named: it gets no token (a name, as to any daemon without one).
    assert ddpq("--url", stranger.url, "whoami")[0] == 0
    assert ddpq("whoami", DDPQ_URL=stranger.url)[0] == 0
    assert tokens_sent(stranger) == [None, None]


def test_an_unreachable_daemon_is_one_line_and_the_token_goes_nowhere_else(
    ddpq: Run, stranger: StubApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever listens where ddpq looks when it finds no socket is a stranger.
    monkeypatch.setattr(credentials, "DEFAULT_URL", stranger.url)
    gone = f"http://127.0.0.1:{free_port()}"
    assert ddpq("--url", gone, "login", "ddpq_secret")[0] == 0
    for command in (["ls"], ["show", "1"], ["whoami"], ["logs", "1"]):
        code, _, err = ddpq(*command)
        assert code == 3 and err.count("\n") == 1 and gone in err, err
    assert stranger.requests == []


def test_a_token_of_the_environment_needs_the_daemon_named(
    ddpq: Run, stranger: StubApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials, "DEFAULT_URL", stranger.url)
    for args, env in ((["whoami"], {"DDPQ_TOKEN": "ddpq_env"}), (["--token", "t", "ls"], {})):
        code, _, err = ddpq(*args, **env)
        assert code == 2 and "sent only to the daemon you name" in err and err.count("\n") == 1
    assert stranger.requests == []
    assert ddpq("whoami", DDPQ_URL=stranger.url, DDPQ_TOKEN="ddpq_env")[0] == 0
    assert tokens_sent(stranger) == ["Bearer ddpq_env"]


def test_login_needs_the_daemon_named(ddpq: Run, tmp_path: Path) -> None:
    for args in (["login", "ddpq_x"], ["--url", "unix:/run/ddpq/ddpq.sock", "login", "ddpq_x"]):
        code, _, err = ddpq(*args)
        assert code == 2 and "name the daemon the token is for" in err, err
    assert not (tmp_path / "config" / "ddpq" / "token").exists()


def test_a_token_saved_by_an_older_ddpq_is_not_sent(
    ddpq: Run, stranger: StubApi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(credentials, "DEFAULT_URL", stranger.url)
    path = tmp_path / "config" / "ddpq" / "token"
    path.parent.mkdir(parents=True)
    path.write_text("ddpq_old\n")
    path.chmod(0o600)
    code, _, err = ddpq("whoami")
    assert code == 0 and "names no daemon" in err and "is not sent" in err
    assert ddpq("whoami", DDPQ_URL=stranger.url)[0] == 0
    assert tokens_sent(stranger) == [None, None]
    for garbage in ("{", '{"url": 1, "token": "t"}', '{"token": "t"}', "two words\n", "x" * 9000):
        path.write_text(garbage)
        code, _, err = ddpq("whoami")
        assert code == 2 and "is not a token `ddpq login` saved" in err, garbage


def test_the_library_sends_no_token_to_where_it_found_no_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DDPQ_URL", raising=False)
    monkeypatch.delenv("DDPQ_SOCKET", raising=False)
    monkeypatch.setenv("DDPQ_HOME", str(tmp_path))
    monkeypatch.setattr(credentials, "SYSTEM_SOCKET", str(tmp_path / "none"))
    with pytest.raises(DdpqError, match="sent only to the daemon you name"):
        JsonApi(None, "ddpq_secret")


# ---- what answers is not a ddpq daemon ---------------------------------------------------


class RawServer:
    """Answers every request on a loopback port with the same bytes, then hangs up."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    head = b""
                    while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                        head += data
                    conn.sendall(self.answer)
                except OSError:
                    continue

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.sock.close()
        self.thread.join(timeout=5)


def http(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", *headers]
    return "\r\n".join([*head, "", ""]).encode("latin-1") + body


def sized(body: bytes) -> bytes:
    return http(body, f"Content-Length: {len(body)}")


MALFORMED = {
    "not HTTP": b"SSH-2.0-OpenSSH_9.6\r\n",
    "nothing": b"",
    "a status line cut short": b"HTTP/1.1 200",
    "headers cut short": b"HTTP/1.1 200 OK\r\nContent-Type: appl",
    "a header without a colon": b"HTTP/1.1 200 OK\r\nnonsense\r\n\r\n",
    "a huge header": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 200_000 + b"\r\n\r\n",
    "too many headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: a\r\n" * 1000 + b"\r\n",
    "a status of four digits": b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}",
    "a body cut short": http(b"{}", "Content-Length: 100"),
    "a length of other digits": http(b"{}", "Content-Length: \xb2"),
    "a negative length": http(b"{}", "Content-Length: -1"),
    "a chunk size that is not hex": http(b"zz\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
    "a negative chunk size": http(b"-2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
    "a huge chunk cut short": http(b"fffffffffff\r\n{}", "Transfer-Encoding: chunked"),
    "chunks without an end": http(b"2\r\n{}\r\n", "Transfer-Encoding: chunked"),
    "not JSON": sized(b"<html>hello</html>"),
    "JSON cut short": sized(b'{"items": ['),
    "JSON not UTF-8": sized(b'{"name": "\xff"}'),
    "JSON nested too deep": sized(b"[" * 100_000),
    "a list for an object": sized(b"[]"),
    "a string for an object": sized(b'"ok"'),
    "an empty object": sized(b"{}"),
    "keys of the wrong kind": sized(
        json.dumps(
            {"items": {"a": 1}, "total": "x", "id": [], "state": 5, "command": 7, "gpus": {}}
        ).encode()
    ),
    "items of the wrong kind": sized(json.dumps({"items": [1, "a", None], "total": 3}).encode()),
    "a refusal that is not JSON": b"HTTP/1.1 500 Oops\r\nContent-Length: 5\r\n\r\n\x1b[2J!",
    "a refusal of another shape": b'HTTP/1.1 422 X\r\nContent-Length: 13\r\n\r\n{"detail": 5}',
}
COMMANDS = {
    "ls": ["ls"],
    "show": ["show", "1"],
    "submit": ["submit", "--", "true"],
    "logs": ["logs", "1"],
}


@pytest.fixture(params=sorted(MALFORMED))
def impostor(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    server = RawServer(MALFORMED[request.param])
    yield server
    server.close()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_what_answers_instead_of_a_daemon_is_one_line(
    ddpq: Run, impostor: RawServer, command: str
) -> None:
    code, _, err = ddpq("--url", impostor.url, *COMMANDS[command])
    lines = err.splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("ddpq: "), (code, err)
    assert "Traceback" not in err and "\x1b" not in err


def test_the_local_user_is_the_one_getpass_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import getpass

    from ddpq.client.api import local_user

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    assert local_user() == getpass.getuser()  # from the password entry
    monkeypatch.setenv("USERNAME", "carol")
    assert local_user() == getpass.getuser() == "carol"
    monkeypatch.setenv("USER", "bob")
    assert local_user() == getpass.getuser() == "bob"
    monkeypatch.setenv("LOGNAME", "alice")
    assert local_user() == getpass.getuser() == "alice"
    monkeypatch.setenv("LOGNAME", "")  # empty: the next one
    assert local_user() == getpass.getuser() == "bob"
