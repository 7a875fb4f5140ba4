"""Local users through the real Unix socket of a root daemon with --auth (issue 17): two
Unix accounts made for the test submit with no token, each job runs as its submitter, each
may cancel only their own, a member of the admin group may cancel both, a forged
X-Ddpq-User changes nothing, and a token made through the socket works over TCP until it
is revoked or expires.

Each account's requests come from a child of the test that switched to the account after
everything was imported (``as_account``): the checkout may lie where other accounts cannot
reach it (a 0700 home; CI's Python under a 0700 /root), and the socket's credentials are
those of the process that connects. The daemon, and the real `ddpq` command one test runs
as an account, come from the install other accounts reach (``tests/shared_install.py``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from ddpq.client.api import DdpqClient, DdpqError, JsonApi
from ddpq.client.transport import Transport
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.shared_install import shared_install
from tests.test_trust import shared_home

T = TypeVar("T")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="making Unix accounts (useradd) needs root"),
    pytest.mark.skipif(
        shutil.which("useradd") is None or shutil.which("groupadd") is None,
        reason="useradd and groupadd (the passwd package) are not installed",
    ),
]


@dataclass(frozen=True)
class Accounts:
    """The module's tests share one daemon: what one account does cannot show in another
    test's, so a test that counts an account's jobs or tokens has an account of its own."""

    alice: str
    bob: str
    admin: str  # a member of ``group``
    group: str
    carol: str  # the real `ddpq` command's (`cancel --mine` cancels every job of hers)
    dave: str  # the token commands' (token numbers count per account)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    """Three fresh accounts and an admin group, removed again at the end."""
    tag = secrets.token_hex(3)
    made = Accounts(*(f"ddpq{k}{tag}" for k in ("a", "b", "c", "adm", "d", "e")))
    users: list[str] = []
    _run("groupadd", made.group)
    try:
        plain: list[str] = []
        for name, extra in (
            (made.alice, plain),
            (made.bob, plain),
            (made.admin, ["-G", made.group]),
            (made.carol, plain),
            (made.dave, plain),
        ):
            _run("useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", *extra, name)
            users.append(name)
        yield made
    finally:
        for name in users:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", made.group], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def daemon(accounts: Accounts, module_daemons: Callable[..., Daemon]) -> Daemon:
    """One root daemon for the module (its tests submit and read, each its own jobs)."""
    home = shared_home()
    return module_daemons(
        "--fake-gpus", "2", "--auth", "--grace", "1s", "--admin-group", accounts.group, home=home
    )


def sock(d: Daemon) -> str:
    return "unix:" + str(d.home / "ddpq.sock")


def as_account(name: str, work: Callable[[], T]) -> T:
    """``work()`` in a child that is the account ``name`` (uid, gid, groups), its result
    (JSON) sent back; a ``DdpqError`` there is raised here, with its status."""
    entry = pwd.getpwnam(name)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        result: dict[str, Any]
        try:
            os.close(read_end)
            os.setgroups(os.getgrouplist(name, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            result = {"value": work()}
        except DdpqError as exc:
            result = {"error": str(exc), "status": exc.status, "exit": exc.exit_code}
        except BaseException as exc:  # reported to the parent, which fails
            result = {"crash": repr(exc)}
        finally:
            try:
                os.write(write_end, json.dumps(result).encode())
            finally:
                os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    answer = json.loads(data)
    if "crash" in answer:
        raise AssertionError(f"as {name}: {answer['crash']}")
    if "error" in answer:
        raise DdpqError(answer["error"], answer["exit"], answer["status"])
    value: T = answer["value"]
    return value


def on_socket(d: Daemon, call: Callable[[JsonApi], T]) -> Callable[[], T]:
    def work() -> T:
        with JsonApi(sock(d)) as c:
            return call(c)

    return work


def cancelling(job_id: int) -> Callable[[JsonApi], dict[str, Any]]:
    return lambda c: c.cancel(job_id)


def test_local_users_submit_without_tokens_and_jobs_run_as_them(
    daemon: Daemon, accounts: Accounts
) -> None:
    d = daemon
    watcher = DdpqClient(sock(d))  # root on the socket: an admin, who may read every log
    uids = {}
    for name in (accounts.alice, accounts.bob):
        me = as_account(name, on_socket(d, lambda c: c.whoami()))
        assert (me["name"], me["via"], me["runs_as"]) == (name, "socket", name)
        job = as_account(
            name, on_socket(d, lambda c: c.submit({"command": ["sh", "-c", "id -u"], "cwd": "/"}))
        )
        assert job["owner"] == name
        done = wait_done(watcher, job["id"])
        assert done.state == "succeeded", done.reason
        uids[name] = watcher.log_tail(job["id"]).decode().split()[-1]
    assert uids == {name: str(pwd.getpwnam(name).pw_uid) for name in uids}


def test_each_cancels_only_their_own_and_the_admin_group_cancels_both(
    daemon: Daemon, accounts: Accounts
) -> None:
    d = daemon
    sleeper = {"command": ["sleep", "60"], "cwd": "/"}
    a = as_account(accounts.alice, on_socket(d, lambda c: c.submit(sleeper)))["id"]
    b = as_account(accounts.bob, on_socket(d, lambda c: c.submit(sleeper)))["id"]
    watcher = DdpqClient(sock(d))
    for job in (a, b):
        wait_state(watcher, job, "running")
    for name, theirs in ((accounts.alice, b), (accounts.bob, a)):
        with pytest.raises(DdpqError) as refused:
            as_account(name, on_socket(d, cancelling(theirs)))
        assert refused.value.status == 403 and "belongs to" in str(refused.value)
    assert watcher.show(a).state == "running" and watcher.show(b).state == "running"
    me = as_account(accounts.admin, on_socket(d, lambda c: c.whoami()))
    assert me["admin"] is True
    for job in (a, b):
        as_account(accounts.admin, on_socket(d, cancelling(job)))
        assert wait_done(watcher, job).state == "cancelled"
    mine = as_account(accounts.alice, on_socket(d, lambda c: c.submit({**sleeper, "hold": True})))
    as_account(accounts.alice, on_socket(d, lambda c: c.cancel(mine["id"])))
    assert wait_done(watcher, mine["id"]).state == "cancelled"


def test_a_forged_user_header_changes_nothing_on_the_socket(
    daemon: Daemon, accounts: Accounts
) -> None:
    d = daemon
    victim = accounts.bob

    def forge() -> dict[str, Any]:
        forged = {"X-Ddpq-User": victim, "Authorization": "Bearer ddpq_forged"}
        http = Transport(sock(d), forged, 10)
        try:
            me = http.request("GET", "/v1/whoami").json()
            job = http.request(
                "POST", "/v1/jobs", body={"command": ["id", "-u"], "cwd": "/", "owner": victim}
            ).json()
            return {"me": me, "job": job}
        finally:
            http.close()

    got = as_account(accounts.alice, forge)
    assert got["me"]["name"] == accounts.alice
    assert got["job"]["owner"] == accounts.alice
    watcher = DdpqClient(sock(d))
    done = wait_done(watcher, got["job"]["id"])
    assert watcher.log_tail(done.id).decode().split()[-1] == str(
        pwd.getpwnam(accounts.alice).pw_uid
    )


def test_a_token_made_on_the_socket_works_over_tcp_until_revoked_or_expired(
    daemon: Daemon, accounts: Accounts
) -> None:
    d = daemon
    name = accounts.alice
    made = as_account(name, on_socket(d, lambda c: c.create_token(3600, "laptop")))
    tcp = DdpqClient(d.url, made["token"])
    me = tcp.whoami()
    assert (me["name"], me["via"], me["token"]["id"]) == (name, "account_token", made["id"])
    assert tcp.list().total >= 0  # it watches the queue
    with pytest.raises(DdpqError) as no_jobs:  # remote_accounts is off
        tcp.json.submit({"command": ["true"], "cwd": "/"})
    assert no_jobs.value.status == 403
    listed = as_account(name, on_socket(d, lambda c: c.tokens()))
    assert [t["id"] for t in listed] == [made["id"]]
    as_account(name, on_socket(d, lambda c: c.revoke_token(made["id"])))
    with pytest.raises(DdpqError) as revoked:
        DdpqClient(d.url, made["token"]).whoami()
    assert revoked.value.status == 401

    short = as_account(name, on_socket(d, lambda c: c.create_token(2)))
    assert DdpqClient(d.url, short["token"]).whoami()["name"] == name

    def expired() -> str | None:
        try:
            DdpqClient(d.url, short["token"]).whoami()
        except DdpqError as exc:
            return str(exc) if exc.status == 401 else None
        return None

    assert "expired" in wait_for(expired, 15, "the token to expire")


def command_as(name: str, d: Daemon) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real `ddpq` command as the account ``name`` (its uid, gid and groups), from the
    install other accounts reach, with no URL and no token: the socket found where
    $DDPQ_SOCKET says (the system's, /run/ddpq/ddpq.sock, is no test's to take); ``env``
    adds to that."""
    entry = pwd.getpwnam(name)
    shared = shared_install()
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DDPQ_SOCKET": str(d.home / "ddpq.sock"),
        "HOME": "/nonexistent",
    }

    def ddpq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shared.python, "-m", "ddpq", *args],
            capture_output=True,
            text=True,
            env={**base, **env},
            cwd="/",
            timeout=60,
            user=entry.pw_uid,
            group=entry.pw_gid,
            extra_groups=os.getgrouplist(name, entry.pw_gid),
        )

    return ddpq


def test_the_ddpq_command_of_a_local_user_needs_no_setup(
    daemon: Daemon, accounts: Accounts
) -> None:
    """`ddpq whoami`, `ddpq submit` and `ddpq cancel` as the account, through the real
    command line: no token, no URL."""
    d = daemon
    ddpq = command_as(accounts.carol, d)
    who = ddpq("whoami")
    assert who.returncode == 0, who.stderr
    first, second, third = who.stdout.splitlines()
    assert first == accounts.carol
    assert "known from the socket" in second and "no token" in second
    assert third == f"jobs run as {accounts.carol}"
    submitted = ddpq("submit", "--", "id", "-u")
    assert submitted.returncode == 0, submitted.stderr
    watcher = DdpqClient(sock(d))
    done = wait_done(watcher, int(submitted.stdout))
    assert done.owner == accounts.carol and done.state == "succeeded", done.reason
    assert watcher.log_tail(done.id).decode().split()[-1] == str(
        pwd.getpwnam(accounts.carol).pw_uid
    )
    held = ddpq("submit", "--hold", "--", "true")
    cancelled = ddpq("cancel", "--mine")
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(held.stdout.strip() + ":")


def test_a_users_token_commands_from_making_to_revoking(daemon: Daemon, accounts: Accounts) -> None:
    d = daemon
    ddpq = command_as(accounts.dave, d)
    made = ddpq("token", "create", "--expires", "1h", "--note", "laptop")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    # Token numbers are the daemon's: the module's other tests may have made some.
    number = re.search(rf"\btoken (\d+) of {accounts.dave},", made.stderr)
    assert token.startswith("ddpq_") and number, made.stderr
    n = number.group(1)
    listed = ddpq("token", "ls").stdout.splitlines()
    assert listed[0].split() == ["ID", "NOTE", "MADE", "WORKS", "UNTIL"]
    assert [row.split()[:2] for row in listed[1:]] == [[n, "laptop"]]
    # Elsewhere (here: over TCP), with the token and no socket.
    remote = {"DDPQ_URL": d.url, "DDPQ_TOKEN": token, "DDPQ_SOCKET": ""}
    who = ddpq("whoami", **remote)
    assert who.returncode == 0, who.stderr
    assert who.stdout.splitlines()[0] == accounts.dave
    assert f"by your token {n} (works until" in who.stdout and f"over {d.url}" in who.stdout
    again = ddpq("token", "create", **remote)  # a token cannot make another
    assert again.returncode == 2 and "through the daemon's Unix socket" in again.stderr
    refused = ddpq("submit", "--", "true", **remote)
    assert refused.returncode == 5 and "remote_accounts" in refused.stderr
    assert ddpq("token", "revoke", n, **remote).stdout.strip() == f"token {n} revoked"
    gone = ddpq("whoami", **remote)
    assert gone.returncode == 5 and "unknown token" in gone.stderr
    assert "no tokens" in ddpq("token", "ls").stderr
    missing = ddpq("token", "revoke", n, "99")
    assert missing.returncode == 4 and "you have no token 99" in missing.stderr
