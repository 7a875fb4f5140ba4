"""Slow or idle connections cannot starve the API (slowloris): a deadline on a request's
headers and a bound on open connections, against a real daemon."""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import select
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, reachable_folder, wait_for, wait_state

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 2.0
# A request whose headers announce a body that never comes whole.
BODY_STALL = (
    b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n{"
)
STALLS = [
    b"",  # connects and says nothing
    b"GET /healthz HT",  # half a request line
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",  # headers never end
]


def connect(daemon: Daemon, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
    if first:
        s.sendall(first)
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Has the server closed ``s``? (EOF or a reset; never blocks)."""
    readable, _, _ = select.select([s], [], [], 0)
    if not readable:
        return False
    try:
        return s.recv(65536) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def healthy(daemon: Daemon) -> bool:
    # Answered at all is the point (how fast is bench/'s): a loaded CI box may take a few
    # seconds to work through hundreds of stalled connections first.
    return httpx.get(daemon.url + "/healthz", timeout=30).status_code == 200


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


@pytest.fixture(scope="module")
def deadline_daemon(module_daemons: Callable[..., Daemon]) -> Daemon:
    """The daemon of the header-deadline tests: each leaves it with its connections closed
    (by the server, which each waits for) and no job."""
    return module_daemons(
        "--fake-gpus",
        "1",
        DDPQ_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
        DDPQ_BODY_TIMEOUT=str(BODY_TIMEOUT),
    )


def test_stalled_connections_are_closed_and_healthz_answers(
    deadline_daemon: Daemon, sockets: list[socket.socket]
) -> None:
    d = deadline_daemon
    started = time.monotonic()
    sockets += [connect(d, STALLS[i % len(STALLS)]) for i in range(200)]
    assert healthy(d)  # at once, with 200 stalled connections open
    wait_for(
        lambda: all(closed_by_server(s) for s in sockets),
        HEADER_TIMEOUT + 20,
        "the server to close every stalled connection",
    )
    assert time.monotonic() - started >= HEADER_TIMEOUT  # not before their time
    assert healthy(d)


@pytest.mark.parametrize("after_a_response", [False, True])
def test_trickling_bytes_does_not_extend_the_deadline(
    deadline_daemon: Daemon, after_a_response: bool
) -> None:
    """One header byte every 0.1 s, for ever: closed at the deadline all the same, whether
    on a new connection or on one kept alive after a complete request."""
    d = deadline_daemon
    with connect(d) as s:
        if after_a_response:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reply = b""
            while b'"ok":true' not in reply:
                chunk = s.recv(65536)
                assert chunk, reply
                reply += chunk
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        deadline = time.monotonic() + HEADER_TIMEOUT + 20
        while True:
            assert time.monotonic() < deadline, "the server kept a trickling connection"
            # The wait for the server's close is also the trickle's pace.
            readable, _, _ = select.select([s], [], [], 0.1)
            if readable and closed_by_server(s):
                break
            try:
                s.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
    assert healthy(d)


@pytest.mark.parametrize("trickle", [False, True])
def test_a_body_that_never_arrives_whole_is_cut_at_its_deadline(
    deadline_daemon: Daemon, trickle: bool
) -> None:
    """Headers announcing 1,000 bytes of body, then one byte (or one every 0.1 s): the
    connection is closed BODY_TIMEOUT after its headers, not held for ever."""
    d = deadline_daemon
    with connect(d, BODY_STALL) as s:
        started = time.monotonic()
        deadline = started + BODY_TIMEOUT + 20
        while True:
            assert time.monotonic() < deadline, "the server kept a request whose body stalled"
            readable, _, _ = select.select([s], [], [], 0.1)
            if readable and closed_by_server(s):
                break
            if trickle:
                try:
                    s.sendall(b" ")
                except (BrokenPipeError, ConnectionResetError):
                    break
        assert time.monotonic() - started >= BODY_TIMEOUT - 0.5  # not before its time
    assert healthy(d)


@contextlib.contextmanager
def as_nobody(work: Callable[[], bytes]) -> Iterator[bytes]:
    """What ``work`` returned, run in a child process as nobody that holds what it opened
    until the block ends."""
    nobody = pwd.getpwnam("nobody")
    said_r, said_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, holding its connections until released
        code = 1
        try:
            os.close(said_r)
            os.close(release_w)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                os.write(said_w, work())
            except BaseException as exc:  # said, for the parent's assertion to show
                os.write(said_w, f"[{exc!r}]".encode())
            os.close(said_w)
            os.read(release_r, 1)
            code = 0
        finally:
            os._exit(code)
    os.close(said_w)
    os.close(release_r)
    try:
        with os.fdopen(said_r, "rb") as said:
            yield said.read()
    finally:
        os.close(release_w)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="connects as another account")
@pytest.mark.parametrize("auth", [True, False])
def test_one_account_holds_a_bounded_share_of_the_connections(
    make_daemon: Callable[..., Daemon], auth: bool
) -> None:
    """On the socket of a daemon with --auth, nobody opens 4 connections whose bodies
    stall (busy: none may be closed to make room), then a fifth: 503 naming its account.
    Root's own connection is taken all the same (the global bound of 16 is far). Without
    --auth (one trusted user) the fifth is taken too, and closed only when its headers do
    not come."""
    d = make_daemon(
        "--fake-gpus",
        "1",
        *(["--auth"] if auth else []),
        home=reachable_folder("ddpq-peers-") / "home",
        DDPQ_MAX_CONNECTIONS="16",
        DDPQ_MAX_CONNECTIONS_PER_ACCOUNT="4",
        DDPQ_HEADER_TIMEOUT="2",
    )
    path = str(d.home / "ddpq.sock")

    def hold_four_then_one_more() -> bytes:
        held = []
        for _ in range(4):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(20)
            s.connect(path)
            # Busy for sure before the next: the server asks for the body once it has
            # read the headers (100 Continue), and one byte of it comes.
            head, _, first = BODY_STALL.partition(b"\r\n\r\n")
            s.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
            said = b""
            while b"100 Continue" not in said:
                chunk = s.recv(65536)
                if not chunk:
                    return b"[closed before its body was asked for] " + said
                said += chunk
            s.sendall(first)
            held.append(s)
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.settimeout(20)
        extra.connect(path)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := extra.recv(65536):
                reply += chunk
        # A client writes its request, then reads its answer: a refused connection must
        # still take the request, however late it comes (`ddpq ls` said "cannot reach the
        # daemon" on the broken pipe of a socket closed at once, and never read the 503).
        if auth:  # refused (without --auth it is taken, and closed at its deadline)
            try:
                extra.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: ddpq\r\n\r\n")
            except OSError as exc:
                reply += f"[request refused: {exc}] ".encode()
        states = []
        for s in held:
            readable, _, _ = select.select([s], [], [], 0)
            states.append(s.recv(300) if readable else b"-")
        alive = all(x == b"-" for x in states)
        return reply + (b"\n[held alive]" if alive else b"\n[held closed]" + repr(states).encode())

    with as_nobody(hold_four_then_one_more) as reply:
        assert reply.endswith(b"[held alive]"), reply
        if auth:
            assert reply.startswith(b"HTTP/1.1 503") and b"from your account" in reply, reply
            assert b"[request refused" not in reply, reply
        else:
            assert reply == b"\n[held alive]", reply  # taken; closed at its header deadline
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=30) as root:
            assert root.get("http://ddpq/healthz").status_code == 200


def test_a_flood_of_connections_beyond_the_descriptor_limit(
    make_daemon: Callable[..., Daemon], sockets: list[socket.socket]
) -> None:
    """400 stalled connections against a daemon allowed 256 open files: the oldest waiting
    ones are closed to make room, so /healthz is still accepted and answered."""
    d = make_daemon("--fake-gpus", "1", DDPQ_HEADER_TIMEOUT="120", DDPQ_MAX_CONNECTIONS="64")
    assert d.proc is not None
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (256, 256))
    for i in range(400):
        sockets.append(connect(d, STALLS[i % len(STALLS)]))
    assert healthy(d)
    wait_for(
        lambda: sum(not closed_by_server(s) for s in sockets) <= 64,
        30,
        "the server to keep at most 64 connections",
    )
    assert not closed_by_server(sockets[-1])  # the newest stay; the oldest made room
    assert healthy(d)


def test_when_every_connection_is_busy_a_newcomer_is_told_so(
    make_daemon: Callable[..., Daemon], sockets: list[socket.socket]
) -> None:
    """Connections in the middle of a request (here: following a log) are not closed to
    make room; one more connection gets a 503 and the rest keep streaming."""
    d = make_daemon("--fake-gpus", "1", DDPQ_MAX_CONNECTIONS="8")
    c = d.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "echo hello; sleep 60"]))
    wait_state(c, job.id, "running")
    c.close()
    request = f"GET /v1/jobs/{job.id}/log?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for _ in range(8):
        s = connect(d, request.encode())
        reply = b""
        while b"hello" not in reply:
            chunk = s.recv(65536)
            assert chunk, reply
            reply += chunk
        sockets.append(s)
    with connect(d) as extra:
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := extra.recv(65536):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 503") and b'"code":"too_busy"' in reply, reply
    assert not any(closed_by_server(s) for s in sockets)
    for s in sockets:
        s.close()
    wait_for(lambda: _healthy_quietly(d), 10, "the API to take connections again")


def _healthy_quietly(d: Daemon) -> bool:
    try:
        return healthy(d)
    except httpx.TransportError:
        return False
