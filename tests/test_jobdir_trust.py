"""A job's folder is its owner's to write: a root daemon never writes, chowns or adopts what
a job left there (issue 21, items 2, 3 and 11).

Between two attempts, or before the first, the folder may hold a hard link to another
account's file or to a root-owned one (O_NOFOLLOW does not stop hard links), a symbolic
link, a FIFO, a folder, or another account's file, at every name ddpq writes. Each is
planted in turn, the attempt started by the real spawner (fork server and exec) as a real
second account, and the planted-on files checked unchanged: content, owner and mode.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.disposition import ATTEMPT_HEADER
from ddpq.core.rules import ExitRecord
from ddpq.executors.base import Launch
from ddpq.executors.local import cgroups, procs
from ddpq.executors.local.spawn import Spawner, let_run
from ddpq.executors.slurm import submit
from ddpq.jobdir import STALE, JobDir, make_folder, open_for_append, remove_entry
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done, wait_for
from tests.test_auth import add_user
from tests.test_trust import python_for_everyone, shared_home  # noqa: F401 - a fixture

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other accounts)")
pytestmark = [ROOT_ONLY, pytest.mark.usefixtures("python_for_everyone")]


@dataclass(frozen=True)
class Accounts:
    job: str  # the job's account, a member of ``group``
    victim: str  # another user, whose file the job links to
    group: str

    def ids(self, name: str) -> tuple[int, int]:
        import pwd

        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid

    @property
    def gid(self) -> int:
        import grp

        return grp.getgrnam(self.group).gr_gid


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    """Two accounts of this test's own and a group the job's account is a member of."""
    tag = os.urandom(3).hex()
    made = Accounts(f"ddpqj{tag}", f"ddpqv{tag}", f"ddpqg{tag}")
    subprocess.run(["groupadd", made.group], check=True)
    try:
        subprocess.run(["useradd", "-M", "-G", made.group, made.job], check=True)
        subprocess.run(["useradd", "-M", made.victim], check=True)
        yield made
    finally:
        for name in (made.job, made.victim):
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", made.group], check=False, capture_output=True)


@dataclass
class Victims:
    """Files a hostile job points at: another user's (group-writable) and a root one."""

    theirs: Path
    roots: Path

    def snapshot(self) -> list[tuple[bytes, int, int, int]]:
        out = []
        for path in (self.theirs, self.roots):
            info = os.lstat(path)
            out.append((path.read_bytes(), info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)))
        return out


@pytest.fixture
def home() -> Path:
    """A state folder other accounts can pass through (its victims on the same disk)."""
    path = shared_home()
    path.mkdir(mode=0o711)
    return path


@pytest.fixture
def victims(home: Path, accounts: Accounts) -> Victims:
    theirs = home.parent / "theirs.txt"
    theirs.write_bytes(b"the other user's data\n")
    os.chown(theirs, accounts.ids(accounts.victim)[0], accounts.gid)
    theirs.chmod(0o664)  # writable by the group the job's account is in
    roots = home.parent / "shadow"
    roots.write_bytes(b"root:secret-hash:\n")
    roots.chmod(0o600)
    return Victims(theirs, roots)


def _plant(kind: str, path: Path, victims: Victims, accounts: Accounts) -> None:
    """What the job's user put at ``path`` (made here as root; the result is the same)."""
    job_uid, job_gid = accounts.ids(accounts.job)
    if kind == "hard link to another user's file":
        os.link(victims.theirs, path)
    elif kind == "hard link to a root file":
        os.link(victims.roots, path)
    elif kind == "symbolic link":
        os.symlink(victims.roots, path)
        os.lchown(path, job_uid, job_gid)
    elif kind == "FIFO":
        os.mkfifo(path)
        os.chown(path, job_uid, job_gid)
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("x")
        os.chown(path, job_uid, job_gid)
    elif kind == "another account's file":
        path.write_bytes(b"not the job's\n")
        os.chown(path, *accounts.ids(accounts.victim))
    else:
        raise AssertionError(kind)


KINDS = [
    "hard link to another user's file",
    "hard link to a root file",
    "symbolic link",
    "FIFO",
    "folder",
    "another account's file",
]
# Every name ddpq writes in a local job's folder: as root (the log's header, the shim's
# stderr, the record and notice it clears) or as the shim (its scratch files).
LOCAL_NAMES = ["output.log", "shim.err", "exit.json", "notice", "exit.json.tmp", "output.log.tmp"]


def _launch(home: Path, accounts: Accounts, attempt: int, command: list[str]) -> Launch:
    return Launch(
        job_id=7,
        attempt=attempt,
        job_dir=home / "jobs" / "7",
        command=command,
        launcher="plain",
        gpus=(),
        port=None,
        cwd="/",
        env={},
        owner="alice",
        unix_account=accounts.job,
    )


@pytest.fixture(params=["fork", "exec"])
def spawner(
    request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Spawner]:
    """The local executor's spawner of a root --auth daemon, by either path."""
    monkeypatch.setenv("DDPQ_SPAWN", str(request.param))
    settings = Settings(home=home, auth=True, grace_s=1.0)
    made = Spawner(settings, cgroups.Tracking("session", why="a test"), 1, lambda *_: None)
    yield made
    made.close()


def _run(spawner: Spawner, launch: Launch) -> ExitRecord:
    """Start the attempt, let it run, and wait for its record."""
    spawned = spawner.spawn(launch)
    let_run(spawned)
    if spawned.child is not None:
        spawned.child.wait(60)
    else:
        wait_for(lambda: not procs.is_alive(spawned.ident), 60, "the shim to end")
    record = JobDir(launch.job_dir).read_exit_record(launch.attempt)
    assert record is not None, (launch.job_dir / "shim.err").read_text(errors="replace")
    return record


def _is_fresh_and_the_jobs(path: Path, accounts: Accounts) -> None:
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1, path
    assert info.st_uid == accounts.ids(accounts.job)[0], path


# ---- item 2: the retry path: the folder is the job's, what is in it is not trusted -----


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_writes_nothing_through_what_the_job_left_in_its_folder(
    kind: str, spawner: Spawner, home: Path, accounts: Accounts, victims: Victims
) -> None:
    first = _launch(home, accounts, 1, ["sh", "-c", "echo first-output"])
    assert _run(spawner, first).exit_code == 0
    folder = JobDir(first.job_dir)
    before = victims.snapshot()
    for name in LOCAL_NAMES:
        (folder.path / name).unlink(missing_ok=True)
        _plant(kind, folder.path / name, victims, accounts)
    retry = _launch(home, accounts, 2, ["sh", "-c", "echo second-output"])
    record = _run(spawner, retry)
    assert record.exit_code == 0 and record.launched
    assert victims.snapshot() == before
    _is_fresh_and_the_jobs(folder.log, accounts)
    _is_fresh_and_the_jobs(folder.shim_errors, accounts)
    assert "second-output" in folder.log.read_text()
    assert not any(p.name.startswith(STALE) for p in folder.path.parent.iterdir())  # kept


def test_a_retry_appends_to_the_jobs_own_log(
    spawner: Spawner, home: Path, accounts: Accounts
) -> None:
    """The log as the job's account left it is still one log across attempts."""
    assert _run(spawner, _launch(home, accounts, 1, ["echo", "first-output"])).exit_code == 0
    assert _run(spawner, _launch(home, accounts, 2, ["echo", "second-output"])).exit_code == 0
    text = JobDir(home / "jobs" / "7").log.read_text()
    assert text.index("first-output") < text.index("second-output")


# ---- item 3: the first start path: a folder already there is never adopted ------------


@pytest.mark.parametrize("owner", ["job", "victim"])
def test_a_folder_there_before_the_first_attempt_is_moved_aside_not_adopted(
    owner: str, spawner: Spawner, home: Path, accounts: Accounts, victims: Victims
) -> None:
    launch = _launch(home, accounts, 1, ["sh", "-c", "ls -A; echo fresh-output"])
    old = launch.job_dir
    old.mkdir(parents=True)
    (old / "checkpoint.pt").write_bytes(b"an earlier owner's weights")
    (old / "output.log").write_text("an earlier owner's output\n")
    for kind, name in zip(KINDS, LOCAL_NAMES[1:], strict=False):
        _plant(kind, old / name, victims, accounts)
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


@pytest.mark.parametrize("first", [True, False])
def test_make_folder_moves_aside_a_folder_that_is_not_the_jobs(
    first: bool, tmp_path: Path, accounts: Accounts
) -> None:
    """There before the first attempt, or another account's at a retry: moved, never
    chowned; the job's own folder at a retry stays as it is."""
    job, victim = accounts.ids(accounts.job), accounts.ids(accounts.victim)
    folder = JobDir(tmp_path / "jobs" / "12")
    folder.path.mkdir(parents=True)
    (folder.path / "theirs").write_text("x")
    os.chown(folder.path, *(job if first else victim))
    moved = make_folder(folder, first, job)
    assert moved is not None and moved.parent == tmp_path / "jobs" / STALE
    assert os.stat(moved).st_uid == (job if first else victim)[0]
    assert list(folder.path.iterdir()) == [] and os.stat(folder.path).st_uid == job[0]
    (folder.path / "mine").write_text("x")
    assert make_folder(folder, False, job) is None  # its own: kept
    assert (folder.path / "mine").exists()


# ---- item 2: the Slurm executor's files ------------------------------------------------


SLURM_NAMES = ["output.log", "exit.json", "job.sbatch", ".job.sbatch.tmp"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_slurm_attempt_writes_nothing_through_what_the_job_left(
    kind: str, home: Path, accounts: Accounts, victims: Victims
) -> None:
    settings = Settings(home=home, auth=True)
    first = _launch(home, accounts, 1, ["python", "train.py"])
    submit.prepare(first, settings)
    folder = JobDir(first.job_dir)
    before = victims.snapshot()
    for name in SLURM_NAMES:
        (folder.path / name).unlink(missing_ok=True)
        _plant(kind, folder.path / name, victims, accounts)
    submit.prepare(_launch(home, accounts, 2, ["python", "train.py"]), settings)
    assert victims.snapshot() == before
    _is_fresh_and_the_jobs(folder.log, accounts)
    _is_fresh_and_the_jobs(folder.sbatch_script, accounts)
    assert folder.log.read_text().startswith(ATTEMPT_HEADER)
    assert "train.py" in folder.sbatch_script.read_text()


# ---- the rule itself, for every writer that goes through it -----------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_open_for_append_takes_away_anything_but_the_accounts_own_file(
    kind: str, home: Path, accounts: Accounts, victims: Victims
) -> None:
    folder = home / "jobs" / "3"
    folder.mkdir(parents=True)
    before = victims.snapshot()
    _plant(kind, folder / "output.log", victims, accounts)
    with open_for_append(folder / "output.log", accounts.ids(accounts.job)) as f:
        f.write(b"header\n")
    assert victims.snapshot() == before
    _is_fresh_and_the_jobs(folder / "output.log", accounts)
    assert (folder / "output.log").read_bytes() == b"header\n"


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
    record = _run(spawner, _launch(home, accounts, 1, ["cat", str(data)]))
    log = JobDir(home / "jobs" / "7").log.read_text()
    assert record.exit_code == 0, log
    assert "group-only data" in log


# ---- item 2: the fork server's record of a start that failed ---------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_fork_servers_record_of_a_failed_start_is_written_as_the_jobs_account(
    kind: str, home: Path, accounts: Accounts, victims: Victims
) -> None:
    """A shim that cannot join its cgroup records why: after it has become the job's
    account, never as root through whatever the job left where the record goes."""
    from ddpq.executors.local.forkclient import ForkServer
    from ddpq.executors.local.spawn import shim_args

    folder = JobDir(home / "jobs" / "9")
    make_folder(folder, True, accounts.ids(accounts.job))
    for name in ("exit.json", "exit.json.tmp"):
        _plant(kind, folder.path / name, victims, accounts)
    before = victims.snapshot()
    server = ForkServer(os.path.realpath(sys.executable), home / "jobs")
    gate_r, gate_w = os.pipe()
    try:
        with open_for_append(folder.shim_errors, accounts.ids(accounts.job)) as err:
            server.fork(
                [*shim_args(folder, "/", 1.0, 1 << 20), "true"],
                {"DDPQ_ATTEMPT": "1", "PATH": os.environ["PATH"]},
                uid=accounts.ids(accounts.job)[0],
                gid=accounts.ids(accounts.job)[1],
                umask=0o022,
                cgroup=home / "no-such-cgroup",
                gate=gate_r,
                stderr=err.fileno(),
            )
        record = wait_for(lambda: folder.read_exit_record(1), 60, "the shim's record")
    finally:
        os.close(gate_r)
        os.close(gate_w)
        server.close()
    assert victims.snapshot() == before
    assert record.error is not None and "cannot join its cgroup" in record.error
    assert os.lstat(folder.exit_record).st_uid == accounts.ids(accounts.job)[0]


@pytest.mark.parametrize("kind", KINDS)
def test_the_readers_read_only_a_regular_file_and_never_raise(
    kind: str, home: Path, accounts: Accounts, victims: Victims
) -> None:
    """What the worker and the API read back (the record, the log, progress) from a
    folder holding anything at those names: a folder there once raised IsADirectoryError."""
    from ddpq.jobdir import read_range

    folder = JobDir(home / "jobs" / "5")
    make_folder(folder, True, accounts.ids(accounts.job))
    record = b'{"exit_code": 0, "signal": null, "started_at": 1, "ended_at": 2, "attempt": "1"}'
    victims.roots.write_bytes(record)  # a file the account may not read, that would pass
    victims.theirs.write_bytes(b'{"step": 1, "loss": 0.5}\n')
    for path in (folder.exit_record, folder.log, folder.metrics):
        _plant(kind, path, victims, accounts)
    assert folder.read_exit_record(1) is None
    assert folder.read_progress() is None
    assert folder.log_tail() == "" and read_range(folder.log, 0, 100) == (b"", 0)
    # The account's own files, each with one name, are read.
    for path in (folder.exit_record, folder.log, folder.metrics):
        remove_entry(path)
        path.write_bytes(record if path == folder.exit_record else b'{"step": 3}\n')
        os.chown(path, *accounts.ids(accounts.job))
    assert folder.read_exit_record(1) is not None and folder.log_tail() == '{"step": 3}\n'
    assert folder.read_progress() is not None


def test_a_notice_is_a_new_file_the_jobs_account_can_read(
    home: Path, accounts: Accounts, victims: Victims
) -> None:
    """The worker's notice for a session's shim (which reads it as the job's account):
    written to a new file and renamed over whatever the job left, readable under the
    daemon's umask (077)."""
    folder = JobDir(home / "jobs" / "4")
    make_folder(folder, True, accounts.ids(accounts.job))
    _plant("hard link to a root file", folder.notice, victims, accounts)
    before = victims.snapshot()
    old_umask = os.umask(0o077)
    try:
        folder.write_notice("idle: this session ends in 5 minutes")
    finally:
        os.umask(old_umask)
    assert victims.snapshot() == before
    info = os.lstat(folder.notice)
    assert info.st_nlink == 1 and stat.S_IMODE(info.st_mode) & 0o004


# ---- item 2 end to end: the retry, through a root --auth daemon -------------------


def test_a_job_that_links_its_log_to_another_users_file_gets_a_fresh_log_on_its_retry(
    make_daemon: Callable[..., Daemon], home: Path, accounts: Accounts, victims: Victims
) -> None:
    """The job itself, as its account, swaps its log for a hard link to another user's
    group-writable file (``fs.protected_hardlinks`` allows it: the account may write it)
    and its shim.err for a symbolic link to a root file, then fails; the root daemon's
    retry writes and chowns neither."""
    token = add_user(home, "carol", "--unix-user", accounts.job)
    d = make_daemon("--fake-gpus", "1", "--auth", "--grace", "1s", home=home)
    plant = (
        'cd "$DDPQ_JOB_DIR"; if [ "$DDPQ_ATTEMPT" = 1 ]; then '
        f"rm -f output.log shim.err; ln {victims.theirs} output.log; "
        f"ln -s {victims.roots} shim.err; exit 3; fi; echo second-attempt"
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
    _is_fresh_and_the_jobs(folder.log, accounts)
    _is_fresh_and_the_jobs(folder.shim_errors, accounts)
