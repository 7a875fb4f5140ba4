"""The rules for a job folder's files, writer by writer (issue 21, items 2 and 3): making
the folder, appending to a file, the Slurm executor's files, the fork server's record of a
failed start, the readers, the notice; each against every kind of thing a job may leave
(tests/jobfolders/hostile.py).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.disposition import ATTEMPT_HEADER
from ddpq.executors.slurm import submit
from ddpq.jobdir import (
    STALE,
    JobDir,
    append_if_own,
    make_folder,
    open_for_append,
    remove_entry,
)
from tests.helpers import wait_for
from tests.jobfolders.hostile import (
    KINDS,
    ROOT_ONLY,
    Accounts,
    Victims,
    a_launch,
    is_fresh_and_the_jobs,
    plant,
)

pytestmark = [ROOT_ONLY, pytest.mark.usefixtures("python_for_jobs")]


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
    first = a_launch(home, accounts, 1, ["python", "train.py"])
    submit.prepare(first, settings)
    folder = JobDir(first.job_dir)
    before = victims.snapshot()
    for name in SLURM_NAMES:
        (folder.path / name).unlink(missing_ok=True)
        plant(kind, folder.path / name, victims, accounts)
    submit.prepare(a_launch(home, accounts, 2, ["python", "train.py"]), settings)
    assert victims.snapshot() == before
    is_fresh_and_the_jobs(folder.log, accounts)
    is_fresh_and_the_jobs(folder.sbatch_script, accounts)
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
    plant(kind, folder / "output.log", victims, accounts)
    with open_for_append(folder / "output.log", accounts.ids(accounts.job)) as f:
        f.write(b"header\n")
    assert victims.snapshot() == before
    is_fresh_and_the_jobs(folder / "output.log", accounts)
    assert (folder / "output.log").read_bytes() == b"header\n"


# ---- item 2: the fork server's record of a start that failed ---------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_fork_servers_record_of_a_failed_start_is_written_as_the_jobs_account(
    kind: str, home: Path, accounts: Accounts, victims: Victims
) -> None:
    """A shim that cannot join its cgroup records why: after it has become the job's
    account, never as root through whatever the job left where the record goes."""
    from ddpq.executors.local.forkclient import ForkServer
    from ddpq.executors.local.shim_command import shim_args

    folder = JobDir(home / "jobs" / "9")
    make_folder(folder, True, accounts.ids(accounts.job))
    for name in ("exit.json", "exit.json.tmp"):
        plant(kind, folder.path / name, victims, accounts)
    before = victims.snapshot()
    server = ForkServer(os.path.realpath(sys.executable), home / "jobs")
    gate_r, gate_w = os.pipe()
    try:
        with open_for_append(folder.log, accounts.ids(accounts.job)) as err:
            asked = server.send(
                [*shim_args(folder, "/", 1.0, 1 << 20, None), "true"],
                {"DDPQ_ATTEMPT": "1", "PATH": os.environ["PATH"]},
                uid=accounts.ids(accounts.job)[0],
                gid=accounts.ids(accounts.job)[1],
                umask=0o022,
                cgroup=home / "no-such-cgroup",
                gate=gate_r,
                stderr=err.fileno(),
            )
        server.answer(asked)
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
        plant(kind, path, victims, accounts)
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
    plant("hard link to a root file", folder.notice, victims, accounts)
    before = victims.snapshot()
    old_umask = os.umask(0o077)
    try:
        folder.write_notice("idle: this session ends in 5 minutes")
    finally:
        os.umask(old_umask)
    assert victims.snapshot() == before
    info = os.lstat(folder.notice)
    assert info.st_nlink == 1 and stat.S_IMODE(info.st_mode) & 0o004


# The job's account holds a lease on a file of its own until it is killed: an open for
# writing by anyone else must break it, which waits up to the kernel's lease-break-time.
LEASE_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
signal.signal(signal.SIGIO, signal.SIG_IGN)  # told to let go: it does not
print("leased", flush=True)
signal.pause()
"""


def test_a_lease_on_the_jobs_own_log_does_not_hold_the_daemon(
    home: Path, accounts: Accounts, python_for_jobs: str
) -> None:
    """What the job's account holds a lease on counts as something else: taken away and
    made afresh at once, where opening it would wait 45 s for the lease (the worker with
    it, at every attempt's start)."""
    lease_break_s = float(Path("/proc/sys/fs/lease-break-time").read_text())  # 45 by default
    if lease_break_s < 6:
        pytest.skip(f"leases here are broken after {lease_break_s:g} s: no wait to tell")
    folder = home / "jobs" / "4"
    folder.mkdir(parents=True)
    log = folder / "output.log"
    log.write_bytes(b"old\n")
    uid, gid = accounts.ids(accounts.job)
    os.chown(log, uid, gid)
    holder = subprocess.Popen(
        [python_for_jobs, "-S", "-c", LEASE_HOLDER, str(log)],
        user=uid,
        group=gid,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"leased\n"
        done: list[bool] = []

        def append() -> None:
            done.append(append_if_own(log, uid, b"x\n"))
            with open_for_append(log, (uid, gid)) as f:
                f.write(b"header\n")
            done.append(True)

        worker = threading.Thread(target=append, daemon=True)
        worker.start()
        worker.join(lease_break_s / 3)
        assert done == [False, True], "an open waited on the job's lease"
        is_fresh_and_the_jobs(log, accounts)
        assert log.read_bytes() == b"header\n"
    finally:
        holder.kill()
        holder.wait()
