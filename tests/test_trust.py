"""Who may run what as whom: trust modes, accounts, and what the state folder lets others see."""

from __future__ import annotations

import os
import pwd
import secrets
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.config import ConfigError, Settings
from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import (
    Daemon,
    free_port,
    reachable_folder,
    runs_jobs_as_others,
    wait_done,
    wait_for,
)
from tests.shared_install import shared_install
from tests.test_auth import add_user

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (switching accounts)")


def ddpq(
    *args: str, user: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the ddpq command; as the account ``user`` (its ids, no groups, in /). That, and a
    root daemon that runs jobs as other accounts, from the install they reach
    (``tests/shared_install.py``)."""
    python, env, cwd = sys.executable, None, None
    uid = gid = None
    if user is not None:
        entry = pwd.getpwnam(user)
        uid, gid, cwd = entry.pw_uid, entry.pw_gid, "/"
    if user is not None or runs_jobs_as_others(list(args)):
        shared = shared_install()
        python, env = shared.python, shared.env(dict(os.environ))
    return subprocess.run(
        [python, "-m", "ddpq", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        user=uid,
        group=gid,
        extra_groups=[] if user is not None else None,
    )


def shared_home() -> Path:
    """A state folder other accounts can reach (pytest's tmp_path is under a 0700 folder)."""
    return reachable_folder("ddpq-trust-") / "home"


# ---- item 3: --auth without the power to switch accounts -------------------------


@pytest.mark.parametrize("euid", [1000, 65534])
def test_auth_without_root_is_refused_unless_the_account_is_shared(
    monkeypatch: pytest.MonkeyPatch, euid: int, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    settings = Settings(home=tmp_path, auth=True)
    with pytest.raises(ConfigError, match="--shared-account"):
        settings.validate(ephemeral=(32768, 60999))
    # The API alone runs no job: it may run unprivileged beside a root worker.
    settings.validate(ephemeral=(32768, 60999), runs_jobs=False)
    Settings(home=tmp_path, auth=True, shared_account=True).validate(ephemeral=(32768, 60999))


@ROOT_ONLY
def test_a_non_root_daemon_with_auth_refuses_to_start() -> None:
    home = shared_home()
    home.mkdir()
    os.chown(home, 65534, 65534)
    port = str(free_port())
    r = ddpq(
        "serve", "--home", str(home), "--port", port, "--auth", "--fake-gpus", "1", user="nobody"
    )
    assert r.returncode == 2, r.stderr
    assert "--shared-account" in r.stderr and "Traceback" not in r.stderr


# ---- item 6: accounts only by explicit mapping -----------------------------------


@ROOT_ONLY
@pytest.mark.parametrize("name", ["root", "daemon", "bin", "nobody"])
def test_a_user_named_like_a_system_account_is_not_mapped_to_it(name: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    add_user(home, name)
    r = run_in_process("admin", "user", "list", "--home", str(home))
    assert r.stdout.split() == [name, "user", "-"]


@pytest.mark.parametrize(
    "bad", ["../../etc", "root/..", "Alice", "a b", "-rf", "x" * 40, "bob\n", "élise", ""]
)
def test_unix_user_must_be_an_account_name(bad: str, tmp_path: Path) -> None:
    home = str(tmp_path / "h")
    r = run_in_process("admin", "user", "add", "eve", "--unix-user", bad, "--home", home)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_mapping_is_explicit_and_can_be_changed(tmp_path: Path) -> None:
    home = str(tmp_path / "h")
    add_user(tmp_path / "h", "carol", "--unix-user", "nobody")

    def admin_user(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in_process("admin", "user", *args, "--home", home)

    assert admin_user("list").stdout.split() == ["carol", "user", "nobody"]
    assert admin_user("map", "carol", "--clear").returncode == 0
    assert admin_user("list").stdout.split() == ["carol", "user", "-"]
    assert admin_user("map", "nobody-here", "nobody").returncode == 4
    assert admin_user("map", "carol", "no-such-acct").returncode == 2


@ROOT_ONLY
def test_account_for_never_uses_the_owners_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpq.executors.accounts import NoAccount, account_for

    with pytest.raises(NoAccount):
        account_for("root", None)
    with pytest.raises(NoAccount):
        account_for("alice", "../../etc")
    account = account_for("root", "root")  # the admin said so explicitly
    assert account is not None and account.uid == 0


# ---- item 7: ddpq server and ddpq worker must agree on the trust mode -----------------


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ddpq", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.parametrize("first_auth", [False, True])
def test_server_and_worker_must_agree_on_auth(tmp_path: Path, first_auth: bool) -> None:
    home = str(tmp_path / "home")
    root = ["--allow-root"] if os.geteuid() == 0 else []
    server_args = ["server", "--home", home, "--port", str(free_port()), "--fake-gpus", "1"]
    worker_args = ["worker", "--home", home, "--fake-gpus", "1"]
    if first_auth:
        server_args.append("--auth")
        worker_args += root
    else:
        server_args += root
        worker_args.append("--auth")
    server = _start(server_args)
    try:
        wait_for(lambda: (tmp_path / "home" / "trust-mode").exists(), 30, "the server to start")
        wait_for(
            lambda: (tmp_path / "home" / "trust-mode").read_text().strip() != "", 30, "its mode"
        )
        worker = ddpq(*worker_args, timeout=60)
        assert worker.returncode == 2, worker.stdout + worker.stderr
        assert "must both have --auth or neither" in worker.stderr
        assert server.poll() is None  # the first one serves on
    finally:
        server.terminate()
        server.wait(30)


# ---- items 4 and 5: what the state folder and a job's folder let others do ------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_state_is_private_to_the_daemon(daemon: Daemon) -> None:
    c = daemon.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "echo secret"], env={"TOKEN": "s3cret"}))
    wait_done(c, job.id)
    home = daemon.home
    assert _mode(home) == 0o711
    assert _mode(home / "jobs") == 0o711
    for name in ("ddpq.db", "ddpq.db-wal", "ddpq.db-shm", "worker.lock"):
        if (home / name).exists():
            assert _mode(home / name) & 0o077 == 0, name
    job_dir = home / "jobs" / str(job.id)
    assert _mode(job_dir) == 0o700
    assert _mode(job_dir / "output.log") & 0o077 == 0


@ROOT_ONLY
def test_a_job_cannot_read_the_database_or_other_jobs(make_daemon: Callable[..., Daemon]) -> None:
    """Under a root --auth daemon, a job (as nobody) probes the state folder and fails."""
    home = shared_home()
    token = add_user(home, "carol", "--unix-user", "nobody")
    other = add_user(home, "dave", "--unix-user", "root")
    d = make_daemon("--fake-gpus", "2", "--auth", home=home)
    c, c_dave = d.client(token), d.client(other)
    # A duration of this test's own: pgrep must find dave's job, not a sleep of a test beside.
    sleep = f"30.{os.getpid()}{secrets.randbelow(10**6)}"
    secret = c_dave.submit(JobSubmit(command=["sleep", sleep], env={"API_KEY": "s3cret"}, cwd="/"))
    wait_for(lambda: c_dave.show(secret.id).state == "running", 30, "dave's job to run")
    probe = (
        f"cat {home}/ddpq.db; cat {home}/ddpq.db-wal; ls {home} {home}/jobs; "
        f"cat {home}/jobs/{secret.id}/output.log; ls {home}/jobs/{secret.id}; "
        f"cat /proc/$(pgrep -f 'sleep {sleep}' | head -1)/environ; echo probe-done"
    )
    job = c.submit(JobSubmit(command=["sh", "-c", probe], cwd="/"))
    done = wait_done(c, job.id)
    log = c.log_tail(job.id, 1 << 20).decode(errors="replace")
    assert done.state == "succeeded" and "probe-done" in log
    assert "s3cret" not in log and "SQLite format" not in log
    assert log.count("Permission denied") >= 5, log
    c_dave.cancel(secret.id)


@ROOT_ONLY
def test_the_working_directory_is_entered_as_the_jobs_account(
    make_daemon: Callable[..., Daemon],
) -> None:
    private = reachable_folder("ddpq-private-")
    (private / "secret.txt").write_text("root-only\n")
    private.chmod(0o755)  # open while the API checks it at submit...
    home = shared_home()
    token = add_user(home, "carol", "--unix-user", "nobody")
    d = make_daemon("--fake-gpus", "1", "--auth", home=home)
    c = d.client(token)
    job = c.submit(JobSubmit(command=["cat", "secret.txt"], cwd=str(private), hold=True))
    private.chmod(0o700)  # ...closed (root's alone) by the time the job starts
    c.hold(job.id, False)
    done = wait_done(c, job.id)
    assert done.state == "failed"
    assert "cannot enter its working directory" in done.reason
    assert "Permission denied" in done.reason
    assert "root-only" not in c.log_tail(job.id).decode()


@pytest.mark.parametrize("local", ["_svc", "svc user", "x" * 70])
def test_a_local_account_that_is_no_ddpq_name_submits_anonymously(
    monkeypatch: pytest.MonkeyPatch, local: str
) -> None:
    from ddpq.client.api import DdpqClient

    monkeypatch.setenv("LOGNAME", local)  # the first that getpass.getuser reads
    with DdpqClient("http://127.0.0.1:1") as c:
        assert "X-Ddpq-User" not in c.json.headers
    monkeypatch.setenv("LOGNAME", "alice")
    with DdpqClient("http://127.0.0.1:1") as c:
        assert c.json.headers["X-Ddpq-User"] == "alice"
