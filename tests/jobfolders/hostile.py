"""What a hostile job leaves in its folder: the accounts and the files of other users it
points at (made by this folder's conftest), and each kind of thing planted at a name."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpq.executors.base import Launch
from tests import launches

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other accounts)")


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


def plant(kind: str, path: Path, victims: Victims, accounts: Accounts) -> None:
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
# Every name ddpq writes in a local job's folder: as root (the log's header, which is also
# the shim's stderr; the record and notice it clears) or as the shim (its scratch files).
LOCAL_NAMES = ["output.log", "exit.json", "notice", "exit.json.tmp", "output.log.tmp"]


def is_fresh_and_the_jobs(path: Path, accounts: Accounts) -> None:
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1, path
    assert info.st_uid == accounts.ids(accounts.job)[0], path


def a_launch(home: Path, accounts: Accounts, attempt: int, command: list[str]) -> Launch:
    """Attempt ``attempt`` of job 7, as ``accounts.job``."""
    return launches.a_launch(
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
