"""Per-user tokens: who may see, cancel and read what; jobs run as their owner's account."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from ddpq.client.api import DdpqError, token_file
from ddpq.schemas import JobSubmit
from ddpq.store.db import Database
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, reachable_folder, wait_done, wait_for, wait_state
from tests.template_db import migrated


def add_user(home: Path, name: str, *extra: str) -> str:
    """``ddpq admin user add``'s token: setup, not a test of the command's process, so in
    this process (tests/cli_inprocess.py)."""
    migrated(home / "ddpq.db")  # a fresh folder's: the template's copy, not a migration
    r = run_in_process("admin", "user", "add", name, "--home", str(home), *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(scope="module")
def authed(
    module_daemons: Callable[..., Daemon], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Daemon, str, str, str]:
    """One daemon with three users for the module: its tests only submit and read (one
    job, alice's, looked at by its id and owner)."""
    home = tmp_path_factory.mktemp("authed") / "home"
    alice = add_user(home, "alice", "--unix-user", me())
    bob = add_user(home, "bob", "--unix-user", me())
    admin = add_user(home, "root-admin", "--admin", "--unix-user", me())
    d = module_daemons("--fake-gpus", "2", "--auth", "--grace", "1s", home=home)
    return d, alice, bob, admin


def test_tokens_are_stored_hashed_and_shown_once(authed: tuple[Daemon, str, str, str]) -> None:
    d, alice, _, _ = authed
    assert alice.startswith("ddpq_") and len(alice) > 40
    assert alice.encode() not in (d.home / "ddpq.db").read_bytes()


def test_two_users_share_the_queue_but_not_their_jobs(
    authed: tuple[Daemon, str, str, str],
) -> None:
    d, alice_token, bob_token, admin_token = authed
    alice, bob = d.client(alice_token), d.client(bob_token)
    a_job = alice.submit(JobSubmit(command=["sleep", "30"], owner="mallory"))
    assert a_job.owner == "alice"  # the token says who, not the body
    wait_state(alice, a_job.id, "running")
    # Everyone sees the queue: bob sees alice's job (by owner: the daemon is the module's).
    assert [j.id for j in bob.list().items if j.owner == "alice"] == [a_job.id]
    with pytest.raises(DdpqError) as denied:
        bob.cancel(a_job.id)
    assert denied.value.status == 403 and "belongs to alice" in str(denied.value)
    with pytest.raises(DdpqError) as no_log:
        bob.log(a_job.id)
    assert no_log.value.status == 403
    assert alice.log(a_job.id)[0] is not None
    assert d.client(admin_token).cancel(a_job.id).state == "running"  # admin may; stopping
    assert wait_done(alice, a_job.id).state == "cancelled"


def test_missing_or_wrong_token_is_401(authed: tuple[Daemon, str, str, str]) -> None:
    d, *_ = authed
    assert httpx.get(d.url + "/v1/jobs").status_code == 401
    r = httpx.get(d.url + "/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["detail"] == "unknown token"
    cli = d.cli("ls", check=False, DDPQ_TOKEN="nope")
    assert cli.returncode == 5 and "unknown token" in cli.stderr


@pytest.mark.parametrize(
    ("authorization", "why"),
    [
        (None, "this daemon needs a token"),
        ("Bearer made-up", "unknown token"),
        ("Basic YWxpY2U6eA==", "this daemon needs a token"),
        ("Bearer ", "this daemon needs a token"),
    ],
    ids=["none", "made-up", "basic", "empty"],
)
def test_a_write_without_a_known_token_is_refused_before_its_body_is_read(
    authed: tuple[Daemon, str, str, str], authorization: str | None, why: str
) -> None:
    """A client with no token, or a made-up one, announces an 8 MiB body and sends one
    byte of it: the 401 comes at once. Before, the daemon waited for the body, then
    parsed all of it (about 200 MB of memory for 8 MiB of ``{}``) before refusing."""
    d, *_ = authed
    head = "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if authorization is not None:
        head += f"Authorization: {authorization}\r\n"
    head += f"Content-Length: {8 << 20}\r\n\r\n{{"
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(head.encode())
        answer = b""
        while b"}" not in answer and (more := s.recv(65536)):  # its JSON body, whole
            answer += more
    assert answer.startswith(b"HTTP/1.1 401 ") and why.encode() in answer, answer


def test_a_write_with_a_known_token_is_its_users(authed: tuple[Daemon, str, str, str]) -> None:
    d, alice, _, _ = authed
    r = httpx.post(
        d.url + "/v1/jobs",
        json={"command": ["true"], "hold": True},
        headers={"Authorization": f"Bearer {alice}"},
    )
    assert r.status_code == 201 and r.json()["owner"] == "alice", r.text
    assert d.client(alice).cancel(r.json()["id"]).state == "cancelled"


def test_cli_reads_a_0600_token_file_and_refuses_a_readable_one(
    authed: tuple[Daemon, str, str, str], tmp_path: Path
) -> None:
    d, alice, _, _ = authed
    config = tmp_path / "config"

    def as_alice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return d.cli(*args, check=check, XDG_CONFIG_HOME=str(config), DDPQ_TOKEN="")

    saved = as_alice("login", alice)
    path = Path(saved.stdout.split()[-1])
    assert path == config / "ddpq" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    said = as_alice("whoami").stdout.splitlines()
    assert said[0] == "alice"  # the name first, alone: what scripts read
    assert "by the token the admin gave you, over " + d.url in said[1]
    path.chmod(0o644)
    r = as_alice("whoami", check=False)
    assert r.returncode == 2 and "chmod 600" in r.stderr
    assert token_file().name == "token"


def test_non_loopback_address_needs_auth(tmp_path: Path) -> None:
    """Refused by the settings' check, before the daemon starts: in this process."""
    home = str(tmp_path / "h")
    r = run_in_process("serve", "--home", home, "--host", "0.0.0.0", "--fake-gpus", "1")
    assert r.returncode == 2 and "without --auth" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root daemon")
def test_a_root_daemon_runs_jobs_as_the_owners_account(
    make_daemon: Callable[..., Daemon],
) -> None:
    """The daemon runs from the install other accounts reach (``tests/shared_install.py``):
    skipped, saying why, where there can be none."""
    nobody = pwd.getpwnam("nobody")
    home = reachable_folder("ddpq-auth-")
    token = add_user(home, "carol", "--unix-user", "nobody")
    d = make_daemon("--fake-gpus", "1", "--auth", home=home)
    c = d.client(token)
    job = c.submit(JobSubmit(command=["sh", "-c", "id -u; echo $HOME"], cwd="/"))
    done = wait_done(c, job.id)
    assert done.state == "succeeded", done.reason
    lines = c.log_tail(job.id).decode().splitlines()
    assert str(nobody.pw_uid) in lines and nobody.pw_dir in lines
    unmapped = add_user(home, "dave")  # no Unix account named dave
    with pytest.raises(DdpqError) as refused:  # at submission, not failed at the launch
        d.client(unmapped).submit(JobSubmit(command=["true"], cwd="/"))
    assert refused.value.status == 403 and "dave is mapped to no Unix account" in str(refused.value)
    ghost = add_user(home, "erin", "--unix-user", "nobody")
    with Database(home / "ddpq.db").write() as s:  # its account gone since it was mapped
        s.execute(text("UPDATE users SET unix_user = 'ddpq-no-such-account' WHERE name = 'erin'"))
    with pytest.raises(DdpqError) as gone:
        d.client(ghost).submit(JobSubmit(command=["true"], cwd="/"))
    assert "mapped to 'ddpq-no-such-account', which this host lacks" in str(gone.value)


def test_one_user_follows_a_bounded_number_of_logs_at_once(
    authed: tuple[Daemon, str, str, str],
) -> None:
    """A followed log lasts as long as its job: one user's thousand would hold the API's
    connections from everyone. Past FOLLOWS_PER_USER, 429 saying why; one closed, the next
    is taken (tests/test_log_follow.py: each user counted apart)."""
    from ddpq.server.routes.logs import FOLLOWS_PER_USER

    d, _, bob_token, _ = authed
    bob = d.client(bob_token)
    job = bob.submit(JobSubmit(command=["sleep", "60"]))
    wait_state(bob, job.id, "running")
    url = f"{d.url}/v1/jobs/{job.id}/log"

    def follow(
        token: str, streams: contextlib.ExitStack
    ) -> tuple[httpx.Response, contextlib.ExitStack]:
        one = contextlib.ExitStack()
        r = one.enter_context(
            http.stream(
                "GET",
                url,
                params={"follow": "true"},
                headers={"Authorization": f"Bearer {token}"},
            )
        )
        streams.callback(one.close)
        return r, one

    limits = httpx.Limits(max_connections=FOLLOWS_PER_USER + 8)
    with httpx.Client(timeout=30, limits=limits) as http, contextlib.ExitStack() as streams:
        held = [follow(bob_token, streams) for _ in range(FOLLOWS_PER_USER)]
        assert [r.status_code for r, _ in held] == [200] * FOLLOWS_PER_USER
        over, _ = follow(bob_token, streams)
        assert over.status_code == 429
        over.read()
        assert f"you follow {FOLLOWS_PER_USER} logs already" in over.json()["detail"]
        held[0][1].close()  # one let go: the daemon counts it out once it sees it gone

        def taken() -> bool:
            r, one = follow(bob_token, streams)
            if r.status_code != 200:
                one.close()
            return r.status_code == 200

        wait_for(taken, 30, "a follow once one was let go")
    bob.cancel(job.id)
    assert wait_done(bob, job.id).state == "cancelled"
