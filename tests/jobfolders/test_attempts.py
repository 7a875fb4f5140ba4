"""A job's folder is its owner's to write: a root daemon never writes, chowns or adopts what
a job left there (issue 21, items 2, 3 and 11), as the local executor starts attempts.

Between two attempts, or before the first, the folder may hold a hard link to another
account's file or to a root-owned one (O_NOFOLLOW does not stop hard links), a symbolic
link, a FIFO, a folder, or another account's file, at every name ddpq writes. Each is
planted in turn (tests/jobfolders/hostile.py), the attempt started by the real spawner (fork
server and exec) as a real second account, and the planted-on files checked unchanged:
content, owner and mode.
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.rules import ExitRecord
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.local import cgroups, procs
from ddpq.executors.local.spawn import Spawner, let_run
from ddpq.jobdir import STALE, JobDir
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for
from tests.jobfolders.hostile import (
    KINDS,
    LOCAL_NAMES,
    ROOT_ONLY,
    Accounts,
    Victims,
    a_launch,
    is_fresh_and_the_jobs,
    plant,
)
from tests.test_auth import add_user

pytestmark = [ROOT_ONLY, pytest.mark.usefixtures("python_for_jobs")]


@pytest.fixture(params=["fork", "exec"])
def spawner(
    request: pytest.FixtureRequest,
    home: Path,
    python_for_jobs: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Spawner]:
    """The local executor's spawner of a root --auth daemon, by either path."""
    monkeypatch.setenv("DDPQ_SPAWN", str(request.param))
    settings = Settings(home=home, auth=True, grace_s=1.0, python=python_for_jobs)
    made = Spawner(settings, cgroups.Tracking("session", why="a test"), 1, lambda *_: None)
    yield made
    made.close()


def _run(spawner: Spawner, launch: Launch) -> ExitRecord:
    """Start the attempt, let it run, and wait for its record."""
    (spawned,) = spawner.spawn_many([launch])
    assert not isinstance(spawned, LaunchFailed), spawned
    let_run(spawned)
    try:
        if spawned.child is not None:
            spawned.child.wait(60)
        else:
            wait_for(lambda: not procs.is_alive(spawned.ident), 60, "the shim to end")
    finally:  # one that hangs (on a FIFO, say) is ended with its session, never left
        if procs.is_alive(spawned.ident):
            os.killpg(spawned.ident.pid, signal.SIGKILL)
        if spawned.child is not None:
            spawned.child.wait()
    record = JobDir(launch.job_dir).read_exit_record(launch.attempt)
    assert record is not None, (launch.job_dir / "output.log").read_text(errors="replace")
    return record


# ---- item 2: the retry path: the folder is the job's, what is in it is not trusted -----


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_writes_nothing_through_what_the_job_left_in_its_folder(
    kind: str, spawner: Spawner, home: Path, accounts: Accounts, victims: Victims
) -> None:
    first = a_launch(home, accounts, 1, ["sh", "-c", "echo first-output"])
    assert _run(spawner, first).exit_code == 0
    folder = JobDir(first.job_dir)
    before = victims.snapshot()
    for name in LOCAL_NAMES:
        (folder.path / name).unlink(missing_ok=True)
        plant(kind, folder.path / name, victims, accounts)
    retry = a_launch(home, accounts, 2, ["sh", "-c", "echo second-output"])
    record = _run(spawner, retry)
    assert record.exit_code == 0 and record.launched
    assert victims.snapshot() == before
    is_fresh_and_the_jobs(folder.log, accounts)
    assert "second-output" in folder.log.read_text()
    assert not any(p.name.startswith(STALE) for p in folder.path.parent.iterdir())  # kept


# What the job's own account can put in place of the record's reserved file while it runs.
SWAPS = {
    "symbolic link": "ln -s {victim} exit.json.tmp",
    "hard link to another user's file": "ln {victim} exit.json.tmp",
    "FIFO": "mkfifo exit.json.tmp",
    "folder": "mkdir exit.json.tmp",
    "nothing": ":",
}


@pytest.mark.parametrize("swap", SWAPS)
def test_a_job_that_swaps_its_reserved_record_still_ends_with_its_exit_status(
    swap: str, spawner: Spawner, home: Path, accounts: Accounts, victims: Victims
) -> None:
    # Not "lost": the shim writes its record to a fresh file when the reserved one is no
    # longer at its name, and never through what the job put there.
    planted = SWAPS[swap].format(victim=shlex.quote(str(victims.theirs)))
    script = f'cd "$DDPQ_JOB_DIR" && rm -f exit.json.tmp && {planted} && exit 3'
    launch = a_launch(home, accounts, 1, ["sh", "-c", script])
    before = victims.snapshot()
    record = _run(spawner, launch)
    assert (record.exit_code, record.error) == (3, None)
    assert victims.snapshot() == before
    is_fresh_and_the_jobs(JobDir(launch.job_dir).path / "exit.json", accounts)


def test_a_retry_appends_to_the_jobs_own_log(
    spawner: Spawner, home: Path, accounts: Accounts
) -> None:
    """The log as the job's account left it is still one log across attempts."""
    assert _run(spawner, a_launch(home, accounts, 1, ["echo", "first-output"])).exit_code == 0
    assert _run(spawner, a_launch(home, accounts, 2, ["echo", "second-output"])).exit_code == 0
    text = JobDir(home / "jobs" / "7").log.read_text()
    assert text.index("first-output") < text.index("second-output")


# ---- item 3: the first start path: a folder already there is never adopted ------------


@pytest.mark.parametrize("owner", ["job", "victim"])
def test_a_folder_there_before_the_first_attempt_is_moved_aside_not_adopted(
    owner: str, spawner: Spawner, home: Path, accounts: Accounts, victims: Victims
) -> None:
    launch = a_launch(home, accounts, 1, ["sh", "-c", "ls -A; echo fresh-output"])
    old = launch.job_dir
    old.mkdir(parents=True)
    (old / "checkpoint.pt").write_bytes(b"an earlier owner's weights")
    (old / "output.log").write_text("an earlier owner's output\n")
    for kind, name in zip(KINDS, LOCAL_NAMES[1:], strict=False):
        plant(kind, old / name, victims, accounts)
    uid = accounts.ids(getattr(accounts, owner))[0]
    for path in [old, old / "checkpoint.pt", old / "output.log"]:
        os.chown(path, uid, uid)
    before = victims.snapshot()
    record = _run(spawner, launch)
    assert record.exit_code == 0
    assert victims.snapshot() == before
    log = JobDir(old).log.read_text()
    assert "fresh-output" in log and "earlier owner" not in log and "checkpoint" not in log
    (aside,) = (old.parent / STALE).iterdir()
    assert aside.name.startswith("7-")
    assert (aside / "checkpoint.pt").read_bytes() == b"an earlier owner's weights"
    assert os.stat(aside / "output.log").st_uid == uid  # never chowned to the new job
    info = os.stat(old.parent / STALE)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)


# ---- item 11: a job has its account's supplementary groups ----------------------------


def test_a_job_reads_a_file_only_its_accounts_group_may_read(
    spawner: Spawner, home: Path, accounts: Accounts
) -> None:
    shared = home.parent / "group-data"
    shared.mkdir(mode=0o755)
    data = shared / "dataset.txt"
    data.write_text("group-only data\n")
    os.chown(data, 0, accounts.gid)
    data.chmod(0o640)
    record = _run(spawner, a_launch(home, accounts, 1, ["cat", str(data)]))
    log = JobDir(home / "jobs" / "7").log.read_text()
    assert record.exit_code == 0, log
    assert "group-only data" in log


# ---- item 2 end to end: the retry, through a root --auth daemon -------------------


def test_a_job_that_links_its_log_to_another_users_file_gets_a_fresh_log_on_its_retry(
    home: Path, accounts: Accounts, victims: Victims, make_daemon: Callable[..., Daemon]
) -> None:
    """The job itself, as its account, swaps its log for a hard link to another user's
    group-writable file (``fs.protected_hardlinks`` allows it: the account may write it)
    and fails; the root daemon's retry neither writes nor chowns it (the log, which is
    also the shim's stderr, is the one file root opens in the folder)."""
    token = add_user(home, "carol", "--unix-user", accounts.job)
    d = make_daemon("--fake-gpus", "1", "--auth", "--grace", "1s", home=home)
    plant = (
        'cd "$DDPQ_JOB_DIR"; if [ "$DDPQ_ATTEMPT" = 1 ]; then '
        f"rm -f output.log; ln {victims.theirs} output.log; "
        "exit 3; fi; echo second-attempt"
    )
    before = victims.snapshot()
    with d.client(token) as c:
        job = c.submit(JobSubmit(command=["sh", "-c", plant], cwd="/", retries=1))
        done = wait_done(c, job.id, 120)
        log = c.log_tail(job.id).decode(errors="replace")
    assert victims.snapshot() == before  # not chowned to carol's account, nor appended to
    assert (done.state, done.attempt) == ("succeeded", 2), done.reason
    assert "second-attempt" in log
    folder = JobDir(home / "jobs" / str(job.id))
    is_fresh_and_the_jobs(folder.log, accounts)
