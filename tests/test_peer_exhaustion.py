"""A daemon out of file descriptors or memory answers 503 with the cause, never "you have no
account" (issue 21, item 1).

Python's pwd and grp say "not found" when the password database could not be read at all:
at 10,000 running jobs the daemon ran out of descriptors and its Unix socket's callers
were told 403 "uid N has no account". Here the class of causes (EMFILE, ENFILE, ENOMEM),
every lookup that identifies a caller (``server.identity``, the cwd check's account), the
socket's credentials themselves, and a real exhausted descriptor table.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import resource
import socket
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from ddpq.config import Settings
from ddpq.server import exhaustion, identity, paths
from ddpq.server.app import create_app
from ddpq.server.peer import PeerCredentials, UnknownPeer, read_peer_credentials, with_peer
from tests.inprocess import BASE
from tests.template_db import migrated

CAUSES = {errno.EMFILE: "EMFILE", errno.ENFILE: "ENFILE", errno.ENOMEM: "ENOMEM"}
ME = pwd.getpwuid(os.getuid())


def refused_with(code: int) -> Callable[..., NoReturn]:
    def fail(*_args: Any, **_kw: Any) -> NoReturn:
        raise OSError(code, os.strerror(code))

    return fail


def not_found(*_args: Any) -> NoReturn:
    raise KeyError("not found")  # what pwd and grp say when they could not read at all


def out_of(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process can open no file now (as exhaustion.check finds out)."""
    fake_os = types.SimpleNamespace(**{**vars(os), "open": refused_with(code)})
    monkeypatch.setattr(exhaustion, "os", fake_os)


class UnixSocketPeer:
    """Serves the app as if every request came on the Unix socket with ``peer``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.peer: PeerCredentials | UnknownPeer = PeerCredentials(1, ME.pw_uid, ME.pw_gid)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await with_peer(self.app, self.peer)(scope, receive, send)


@pytest.fixture
def socket_api(tmp_path: Path) -> Iterator[tuple[TestClient, UnixSocketPeer]]:
    config = Settings(home=tmp_path / "home", fake_gpus=1, auth=True, shared_account=True)
    migrated(config.db_path)
    app = UnixSocketPeer(create_app(config))
    with TestClient(app, base_url=BASE, raise_server_exceptions=False) as client:
        yield client, app


def assert_unavailable(response: Any, cause: str) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["code"] == "unavailable" and cause in body["detail"], body
    assert "no account" not in body["detail"]


@pytest.mark.parametrize("code", sorted(CAUSES), ids=CAUSES.get)
def test_a_socket_caller_is_told_503_with_the_cause_when_lookups_cannot_read(
    socket_api: tuple[TestClient, UnixSocketPeer], monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    client, _ = socket_api
    assert client.get("/v1/whoami").json()["account"] == ME.pw_name
    monkeypatch.setattr(pwd, "getpwuid", not_found)
    out_of(code, monkeypatch)
    assert_unavailable(client.get("/v1/whoami"), CAUSES[code])
    assert_unavailable(client.get("/v1/jobs"), CAUSES[code])


@pytest.mark.parametrize("raised", [OSError(errno.EMFILE, "x"), MemoryError()])
def test_a_lookup_that_itself_runs_out_is_503(
    socket_api: tuple[TestClient, UnixSocketPeer],
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
) -> None:
    client, _ = socket_api

    def lookup(_uid: int) -> NoReturn:
        raise raised

    monkeypatch.setattr(pwd, "getpwuid", lookup)
    cause = "EMFILE" if isinstance(raised, OSError) else "ENOMEM"
    assert_unavailable(client.get("/v1/whoami"), cause)


def test_a_uid_that_truly_has_no_account_is_still_refused(
    socket_api: tuple[TestClient, UnixSocketPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = socket_api
    monkeypatch.setattr(pwd, "getpwuid", not_found)  # files can be opened: believed
    r = client.get("/v1/whoami")
    assert r.status_code == 403 and "has no account" in r.json()["detail"]


class FailingSocket:
    """An accepted AF_UNIX connection whose credentials the kernel will not give."""

    family = socket.AF_UNIX

    def __init__(self, code: int) -> None:
        self.code = code

    def getsockopt(self, *_args: Any) -> NoReturn:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", sorted(CAUSES), ids=CAUSES.get)
def test_credentials_that_cannot_be_read_for_want_of_a_resource_are_503(
    socket_api: tuple[TestClient, UnixSocketPeer], code: int
) -> None:
    """Before, the connection then counted as TCP: 401 "needs a token" with --auth."""
    client, app = socket_api
    peer = read_peer_credentials(FailingSocket(code))
    assert isinstance(peer, UnknownPeer) and peer.exhausted
    app.peer = peer
    assert_unavailable(client.get("/v1/whoami"), CAUSES[code])


def test_credentials_that_cannot_be_read_otherwise_are_403_not_tcp(
    socket_api: tuple[TestClient, UnixSocketPeer],
) -> None:
    client, app = socket_api
    peer = read_peer_credentials(FailingSocket(errno.ENOTCONN))
    assert isinstance(peer, UnknownPeer) and not peer.exhausted
    app.peer = peer
    r = client.get("/v1/whoami")
    assert r.status_code == 403 and "caller is unknown" in r.json()["detail"], r.text


LOOKUPS: dict[str, Callable[[], object]] = {
    "the socket's caller": lambda: identity.account_of_uid(ME.pw_uid),
    "an account's token": lambda: identity.account_named(ME.pw_name, ME.pw_uid),
    "the admin group": lambda: identity.is_admin(
        identity.LocalAccount("nobody", 65534, 65534), "root"
    ),
    "the admin group's existence": lambda: identity.group_exists("root"),
    "the cwd check's account": lambda: paths.account(ME.pw_name),
}


@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
@pytest.mark.parametrize("code", sorted(CAUSES), ids=CAUSES.get)
def test_no_lookup_takes_an_unreadable_database_for_a_missing_entry(
    monkeypatch: pytest.MonkeyPatch, lookup: str, code: int
) -> None:
    for name in ("getpwuid", "getpwnam"):
        monkeypatch.setattr(pwd, name, not_found)
    monkeypatch.setattr(grp, "getgrnam", not_found)
    out_of(code, monkeypatch)
    with pytest.raises(exhaustion.Exhausted, match=CAUSES[code]):
        LOOKUPS[lookup]()


def test_group_membership_read_short_of_descriptors_is_no_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """glibc's getgrouplist gives what it could read, the primary group alone, when it
    cannot open /etc/group: "not an admin" then proves nothing."""
    monkeypatch.setattr(os, "getgrouplist", lambda _name, gid: [gid])
    member = identity.LocalAccount("nobody", 65534, 65534)
    assert identity.is_admin(member, "root") is False  # files open: believed
    out_of(errno.EMFILE, monkeypatch)
    with pytest.raises(exhaustion.Exhausted, match="EMFILE"):
        identity.is_admin(member, "root")


@pytest.fixture
def few_descriptors() -> Iterator[Callable[[], None]]:
    """``fill()`` uses up every descriptor this process may open (its soft limit lowered
    to what it has open now and a few more); all given back at the end."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    def fill() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, limits[1])
        )
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                return

    try:
        yield fill
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_a_real_descriptor_table_that_is_full(few_descriptors: Callable[[], None]) -> None:
    """No stand-in: the process really has no descriptor left. Where the C library must open
    the password database to answer, pwd says "not found" (the lie this is about) and the
    caller hears of the shortage; where it answers from what it already holds open (as it
    may after earlier look-ups in the same process), the account is known. Never "no
    account"."""
    few_descriptors()
    try:
        pwd.getpwuid(ME.pw_uid)
    except KeyError:  # the lie: an unreadable database read as a missing entry
        with pytest.raises(exhaustion.Exhausted, match="EMFILE"):
            identity.account_of_uid(ME.pw_uid)
    else:
        assert identity.account_of_uid(ME.pw_uid).name == ME.pw_name
