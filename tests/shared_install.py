"""ddpq installed as a lab installs it for many accounts, for the tests that need that.

A root daemon with --auth runs jobs as other accounts and refuses to start unless they can
run its shim (``ddpq.daemon.reach``); tests run ``ddpq`` as other accounts too. The
checkout cannot serve them: it may lie in a 0700 home, and its interpreter under a 0700
/root (pyenv). So, once per session: a virtualenv in a world-readable temporary folder,
made from a Python interpreter that ``nobody`` can run, with the wheel of this checkout
(built without build isolation, as test_packaging does) and copies of its dependencies as
this environment holds them. Where there is no such interpreter the tests that need one
are skipped, with the reason: that is a limit of the machine, not of the checkout.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ddpq.daemon.reach import cannot_run, probe_account, shut_out_by

ROOT = Path(__file__).resolve().parents[1]
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
# Python's own environment variables would point the install back at the checkout.
PYTHON_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONUSERBASE")


@dataclass(frozen=True)
class SharedInstall:
    folder: Path  # the temporary folder (0755) that holds it, removed at the session's end
    python: str  # its interpreter: a virtualenv's, ddpq and its dependencies installed
    site_packages: Path  # where they are

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` without what would make its Python import ddpq from the checkout."""
        return {k: v for k, v in base.items() if k not in PYTHON_VARIABLES}


def interpreter_candidates() -> list[str]:
    """This Python's version (the dependencies copied are built for it), wherever it is
    installed: the system's first, as a lab's install is made from, then the PATH's, then
    the one running the tests."""
    found = [f"/usr/local/bin/python{VERSION}", f"/usr/bin/python{VERSION}"]
    for name in (f"python{VERSION}", "python3"):
        where = shutil.which(name)
        if where:
            found.append(os.path.realpath(where))
    found.append(os.path.realpath(sys.executable))
    return list(dict.fromkeys(path for path in found if os.path.exists(path)))


def interpreter_for_everyone() -> tuple[str | None, list[str]]:
    """A Python of this version that ``nobody`` can run, or None and why each could not."""
    same_version = f"import sys; sys.exit(sys.version_info[:2] != {sys.version_info[:2]!r})"
    why: list[str] = []
    who = probe_account()
    for python in interpreter_candidates():
        failed = cannot_run(python, same_version, [], who)
        if failed is None:
            return python, []
        where = shut_out_by([(Path(python), stat.S_IXOTH)])
        failed = failed if failed.startswith(python) else f"{python}: {failed}"
        why.append(f"{failed} ({where})" if where else failed)
    return None, why


def build_wheel(into: Path) -> Path:
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(
        [*pip, "-w", str(into), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = into.glob("ddpq-*.whl")
    return wheel


def requirements_of(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def runtime_closure(requirements: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions these requirements need (no extras), transitively."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(name)
        todo += dist.requires or []
    return list(found.values())


def copy_distribution(dist: importlib.metadata.Distribution, site: Path) -> None:
    """Its files as its RECORD lists them; scripts (outside site-packages) are not needed."""
    for file in dist.files or []:
        if file.parts and file.parts[0] == "..":
            continue
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def open_to_everyone(folder: Path) -> None:
    """Folders 0755, files readable (and executable where their owner may execute)."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            path.chmod(0o755)
        else:
            path.chmod(mode | 0o444 | (0o111 if mode & stat.S_IXUSR else 0))


def install(python: str, folder: Path) -> SharedInstall:
    venv = folder / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    target = str(venv / "bin" / "python")
    wheel = build_wheel(folder / "wheel")
    pip = [sys.executable, "-m", "pip", "--python", target]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [target, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    for dist in runtime_closure(requirements_of(wheel)):
        copy_distribution(dist, site)
    open_to_everyone(folder)
    return SharedInstall(folder, target, site)


@functools.cache
def _made() -> SharedInstall | str:
    """The session's install, or why there can be none (cached: built or refused once)."""
    python, why = interpreter_for_everyone()
    if python is None:
        return (
            f"no Python {VERSION} interpreter that account {probe_account().name} can run, "
            f"for ddpq installed where other accounts reach it: {'; '.join(why)}"
        )
    folder = Path(tempfile.mkdtemp(prefix="ddpq-shared-install-"))
    try:
        return install(python, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def shared_install() -> SharedInstall:
    """The session's shared install (made on first use); skips the test if there is none."""
    made = _made()
    if isinstance(made, str):
        pytest.skip(made)
    return made


def remove_shared_install() -> None:
    """At the session's end: remove the install if one was made."""
    if _made.cache_info().currsize:
        made = _made()
        if not isinstance(made, str):
            shutil.rmtree(made.folder, ignore_errors=True)
        _made.cache_clear()


__all__ = ["SharedInstall", "remove_shared_install", "shared_install"]
