"""The state folder as the daemon holds it: private modes, one worker, one trust mode."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from ddpq.config import ConfigError, Settings


def make_private(settings: Settings) -> None:
    """State folder 0711 (jobs running as their owners' accounts must pass through to
    their own folders; nobody else may list it), the database and its side files 0600.

    Also for folders made by an older ddpq, whose modes were looser.
    """
    for folder in (settings.home, settings.jobs_dir):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
    for path in settings.home.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)
    for job_dir in settings.jobs_dir.iterdir():
        if job_dir.is_dir() and not job_dir.is_symlink():
            job_dir.chmod(0o700)


# How long a start waits for the worker half of a `ddpq serve` whose API half was killed
# (the lock's pid is gone): it stops on its own once it sees its parent's end.
ORPHAN_STOP_S = 30.0


def worker_lock(home: Path, *, patience_s: float = ORPHAN_STOP_S) -> IO[str]:
    """One worker per state folder: two would each think the other's jobs were lost.

    The lock is held by every process of the daemon that took it (``serve``'s worker
    half inherits it) and names the one started. If that one is gone while the lock is
    held, what holds it is a worker half stopping after its parent's death: waited for,
    ``patience_s`` at most, so a restart right after a crash is not refused."""
    home.mkdir(parents=True, exist_ok=True)
    f = open(home / "worker.lock", "a+")  # noqa: SIM115 - held for the process's life
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            if _alive(pid) or time.monotonic() > deadline:
                f.close()
                raise ConfigError(
                    f"another ddpq worker (pid {pid}) already runs on {home}"
                ) from None
            time.sleep(0.05)  # a stopping worker half: no event to wait on but its lock
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _alive(pid: str) -> bool:
    """Whether the process ``pid`` names runs (an unreadable pid counts as running)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return True
    return True


def agree_on_trust(settings: Settings) -> IO[str]:
    """Hold the state folder's trust mode for this process's life; refuse a different one.

    ``ddpq server`` without --auth believes any user name a client sends; paired with
    a root ``ddpq worker --auth`` that would run anyone's job as any account. So the
    first process on a state folder writes its mode to ``trust-mode`` under a shared
    lock, and a process started with another mode while that one runs refuses to start.
    The file is locked exclusively only while nobody holds it, i.e. when it is free to
    (re)write.
    """
    mine = settings.trust_mode
    f = open(settings.trust_file, "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another ddpq process runs on this folder: its mode stands
    else:
        f.seek(0)
        f.truncate()
        f.write(mine)
        f.flush()
    fcntl.flock(f, fcntl.LOCK_SH)
    f.seek(0)
    theirs = f.read().strip()
    if theirs != mine:
        f.close()
        raise ConfigError(
            f"another ddpq process on {settings.home} runs in {theirs} mode and this one "
            f"in {mine} mode; `ddpq server` and `ddpq worker` must both have --auth or "
            "neither (a worker with --auth would run jobs as whatever user a client without "
            "a token names)"
        )
    return f
