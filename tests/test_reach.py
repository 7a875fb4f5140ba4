"""A daemon that runs jobs as other accounts starts only when they can run its shim (issue 27).

The accounts are tried for real (``ddpq.daemon.reach``): ``nobody`` runs the interpreter and
imports the shim. Each way an install can shut them out is refused with the place that does,
in one line; an install they reach is let through, and daemons whose jobs run as themselves
are not asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tests.shared_install
from ddpq.config import ConfigError, Settings
from ddpq.daemon.reach import (
    probe_account,
    require_jobs_can_run_the_shim,
    why_jobs_cannot_run_the_shim,
)
from ddpq.executors.local.shim_command import SHIM
from tests.helpers import free_port
from tests.shared_install import SharedInstall, shared_install

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (switching accounts)")
SHIM_FILES = sorted(SHIM.parent.glob("shim*.py"))  # the shim and the helpers it imports


@pytest.fixture
def shared() -> SharedInstall:
    return shared_install()


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every account may pass through (pytest's tmp_path is under a 0700 one)."""
    folder = Path(tempfile.mkdtemp(prefix="ddpq-reach-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def shim_copy(into: Path, mode: int = 0o644) -> Path:
    into.mkdir(exist_ok=True)
    for file in SHIM_FILES:
        shutil.copy(file, into / file.name)
        (into / file.name).chmod(mode)
    return into / SHIM.name


def python_behind_a_private_folder(shared: SharedInstall, base: Path) -> tuple[str, Path]:
    (base / "private").mkdir(mode=0o700)
    link = base / "private" / "python"
    link.symlink_to(shared.python)
    return str(link), shim_copy(base / "shim")


def python_others_may_not_run(shared: SharedInstall, base: Path) -> tuple[str, Path]:
    wrapper = base / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shared.python} "$@"\n')
    wrapper.chmod(0o750)
    return str(wrapper), shim_copy(base / "shim")


def shim_behind_a_private_folder(shared: SharedInstall, base: Path) -> tuple[str, Path]:
    (base / "private").mkdir(mode=0o700)
    return shared.python, shim_copy(base / "private" / "shim")


def shim_others_may_not_read(shared: SharedInstall, base: Path) -> tuple[str, Path]:
    return shared.python, shim_copy(base / "shim", mode=0o600)


Layout = Callable[[SharedInstall, Path], tuple[str, Path]]


@ROOT_ONLY
@pytest.mark.parametrize(
    ("layout", "error", "where"),
    [
        (python_behind_a_private_folder, "Permission denied", "private is mode 0700"),
        (python_others_may_not_run, "Permission denied", "python is mode 0750"),
        (shim_behind_a_private_folder, "No module named 'shim'", "private is mode 0700"),
        (shim_others_may_not_read, "Permission denied", "shim.py is mode 0600"),
    ],
)
def test_an_install_others_cannot_reach_is_found_with_the_place_that_shuts_them_out(
    shared: SharedInstall, open_folder: Path, layout: Layout, error: str, where: str
) -> None:
    python, shim = layout(shared, open_folder)
    why = why_jobs_cannot_run_the_shim(python, shim, probe_account())
    assert why is not None and error in why and where in why, why
    assert "\n" not in why


@ROOT_ONLY
def test_an_install_others_reach_is_let_through(shared: SharedInstall, open_folder: Path) -> None:
    shim = shim_copy(open_folder / "shim")
    assert why_jobs_cannot_run_the_shim(shared.python, shim, probe_account()) is None


@ROOT_ONLY
@pytest.mark.parametrize(
    ("auth", "runs_jobs", "euid"), [(False, True, 0), (True, False, 0), (True, True, 1000)]
)
def test_a_daemon_whose_jobs_run_as_itself_is_not_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, auth: bool, runs_jobs: bool, euid: int
) -> None:
    # tmp_path is under a 0700 folder: nobody could run this interpreter.
    (tmp_path / "python").symlink_to(os.path.realpath(sys.executable))
    settings = Settings(home=tmp_path, auth=auth, python=str(tmp_path / "python"))
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    require_jobs_can_run_the_shim(settings, runs_jobs=runs_jobs)  # no refusal
    if (auth, runs_jobs) == (True, True):
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        with pytest.raises(ConfigError, match="account nobody cannot run ddpq's shim"):
            require_jobs_can_run_the_shim(settings, runs_jobs=runs_jobs)


@ROOT_ONLY
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_root_daemon_with_auth_from_a_private_install_refuses_to_start(
    shared: SharedInstall, tmp_path: Path, command: str
) -> None:
    """ddpq in a virtualenv under a 0700 folder (a checkout in a home, pyenv under /root),
    as `ddpq serve --auth` would run from there: refused before it serves or runs a job."""
    venv = tmp_path / "venv"  # tmp_path lies under pytest's 0700 folder
    base = os.path.realpath(shared.python)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*")) / "site-packages"
    (site / "shared.pth").write_text(f"{shared.site_packages}\n")
    home = tmp_path / "home"
    args = ["--home", str(home), "--auth", "--fake-gpus", "1"]
    if command == "serve":
        args += ["--port", str(free_port())]
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "ddpq", command, *args],
        capture_output=True,
        text=True,
        env=shared.env(dict(os.environ)),
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"account nobody cannot run ddpq's shim ({venv}/bin/python -S " in line
    assert "Permission denied" in line and "is mode 0700: others may not pass" in line
    assert "docs/admin.md" in line
    assert not (home / "ddpq.db").exists()


@ROOT_ONLY
def test_without_an_interpreter_others_can_run_the_tests_say_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, open_folder: Path
) -> None:
    """The shared install's tests are skipped, not failed, where every Python lies behind a
    private folder (CI's pyenv under a 0700 /root): the reason names each and what shuts
    others out."""
    (open_folder / "private").mkdir(mode=0o700)
    hidden = open_folder / "private" / "python3"
    hidden.symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(
        tests.shared_install, "interpreter_candidates", lambda: [str(hidden), "/nonexistent/py"]
    )
    python, why = tests.shared_install.interpreter_for_everyone()
    assert python is None
    assert why == [
        f"{hidden}: Permission denied ({open_folder}/private is mode 0700: others may not pass)",
        "/nonexistent/py: No such file or directory",
    ]
