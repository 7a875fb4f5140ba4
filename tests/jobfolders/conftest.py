"""Fixtures of the job folder tests: two accounts of their own (one a member of a group of
its own), a state folder they can pass through, and files of other users beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.daemon.reach import probe_account, why_jobs_cannot_run_the_shim
from ddpq.executors.local.shim_command import SHIM
from tests.jobfolders.hostile import Accounts, Victims
from tests.shared_install import shared_install
from tests.test_trust import shared_home


@pytest.fixture(scope="module")
def python_for_jobs() -> str:
    """An interpreter the jobs' accounts can run (the session's shared install, as a lab
    installs ddpq), with this checkout's shim within their reach; else these tests are
    skipped with the reason (a checkout in a 0700 home, say), never failed for it."""
    python = shared_install().python
    why = why_jobs_cannot_run_the_shim(python, SHIM, probe_account())
    if why is not None:
        pytest.skip(f"the jobs' accounts cannot run this checkout's shim: {why}")
    return python


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


@pytest.fixture
def home() -> Iterator[Path]:
    """A state folder other accounts can pass through (its victims on the same disk);
    removed with them afterwards (a test that starts a daemon asks for it first, so the
    daemon is stopped before)."""
    path = shared_home()
    path.mkdir(mode=0o711)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


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
