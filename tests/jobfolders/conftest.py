"""Fixtures of the job folder tests: two accounts of their own (one a member of a group of
its own), a state folder they can pass through, and files of other users beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobfolders.hostile import Accounts, Victims
from tests.test_trust import python_for_everyone, shared_home  # noqa: F401 - a fixture


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
