"""Whether the accounts jobs run as can run ddpq's shim: a start check of a multi-user daemon.

A root daemon with ``--auth`` runs each job as its owner's Unix account, and that account
runs ddpq's Python: the shim (``python -S shim.py``) on a Slurm node and whenever the fork
server is not there to fork it, torchrun as ``python -m torch.distributed.run``. A ddpq
installed under a private folder (a 0700 home, root's pyenv) starts as root and then fails
every such job with "permission denied"; it must not start.

Checked for real rather than from mode bits: a child that is ``nobody`` (an account with no
rights of its own, as a job's owner may be) runs the interpreter and imports the shim, so
ACLs, mounts and a missing library count as a job would meet them. It costs one ``python
-S`` start (30-110 ms measured), once per daemon start. The mode bits only name, in the
refusal, the folder that shuts others out.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import ConfigError, Settings

PROBE_ACCOUNT = "nobody"
NOBODY_ID = 65534  # nobody's uid and gid where the account has no name
PROBE_TIMEOUT_S = 30.0  # a cold disk under a busy host; a start takes ~0.1 s
# The shim's folder comes first on sys.path, as it does when the shim runs by its path;
# importing it reads the shim and its helpers beside it.
IMPORT_SHIM = "import sys; sys.path.insert(0, sys.argv[1]); import shim"
HOW_TO_INSTALL = (
    "install ddpq and its Python where every account may read and execute them (e.g. a "
    "virtualenv under /opt/ddpq, mode 0755 all the way up): docs/admin.md, "
    '"A multi-user install"'
)


@dataclass(frozen=True)
class Probe:
    """The account that tries: its name for the reason, its ids."""

    name: str
    uid: int
    gid: int


def probe_account() -> Probe:
    try:
        entry = pwd.getpwnam(PROBE_ACCOUNT)
    except KeyError:
        return Probe(f"uid {NOBODY_ID}", NOBODY_ID, NOBODY_ID)
    return Probe(entry.pw_name, entry.pw_uid, entry.pw_gid)


def shut_out_by(paths: list[tuple[Path, int]]) -> str:
    """The first place on the way to each path (its symlinks followed too) whose mode keeps
    other accounts out, in words: a folder they may not pass, or the file without the
    permission bits it needs (S_IXOTH to run, S_IROTH to read); empty if the modes let them
    in (then an ACL, a mount or a missing file is the cause, and the error says which)."""
    for path, needed in paths:
        for route in dict.fromkeys((path, Path(os.path.realpath(path)))):
            for folder in reversed(route.parents):
                try:
                    mode = folder.stat().st_mode
                except OSError:
                    break
                if not mode & stat.S_IXOTH:
                    return f"{folder} is mode {stat.S_IMODE(mode):04o}: others may not pass"
            try:
                mode = route.stat().st_mode
            except OSError:
                continue
            if mode & needed != needed:
                what = "run" if needed & stat.S_IXOTH else "read"
                return f"{route} is mode {stat.S_IMODE(mode):04o}: others may not {what} it"
    return ""


def _last_error(stderr: str, returncode: int) -> str:
    """The line of a failed run that says why (a traceback's last "...Error: ..." line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line]
    if errors:
        return errors[-1]
    return lines[-1] if lines else f"exit code {returncode}"


def cannot_run(python: str, code: str, args: list[str], who: Probe) -> str | None:
    """Why ``python -I -S -c code args...`` fails as ``who`` (no groups, an empty
    environment, in /), or None when it succeeds."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", code, *args],
            user=who.uid,
            group=who.gid,
            extra_groups=[],
            cwd="/",
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{python} did not finish within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:  # the exec itself: this account cannot reach the interpreter
        return f"{exc.filename or python}: {exc.strerror}"
    if done.returncode == 0:
        return None
    return _last_error(done.stderr, done.returncode)


def why_jobs_cannot_run_the_shim(python: str, shim: Path, who: Probe) -> str | None:
    """Why ``who`` cannot run the shim ``shim`` with ``python``, with the folder or file
    that keeps others out when the modes say so; None when it can."""
    failed = cannot_run(python, IMPORT_SHIM, [str(shim.parent)], who)
    if failed is None:
        return None
    where = shut_out_by([(Path(python), stat.S_IXOTH), (shim, stat.S_IROTH)])
    return f"{failed} ({where})" if where else failed


def require_jobs_can_run_the_shim(settings: Settings, *, runs_jobs: bool) -> None:
    """Refuse to start a daemon that runs jobs as other accounts (root with --auth) when
    they cannot run its shim; any other daemon's jobs run as itself."""
    if not (runs_jobs and settings.auth and os.geteuid() == 0):
        return
    from ddpq.executors.local.shim_command import SHIM

    who = probe_account()
    why = why_jobs_cannot_run_the_shim(settings.python, SHIM, who)
    if why is not None:
        raise ConfigError(
            f"jobs run as their owners' accounts, and account {who.name} cannot run ddpq's "
            f"shim ({settings.python} -S {SHIM}): {why}; {HOW_TO_INSTALL}"
        )
