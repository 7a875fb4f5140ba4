"""The jobs held still while the database's reserve is given back (``store.headroom``).

On a full disk the reserve frees a part of its blocks for a write that must happen (a
cancel, a job's end). Freed blocks are the filesystem's: a job that keeps writing takes
them before that write, then the next part, until none is left and nothing can be
cancelled. So while a process gives the reserve back and retries its write, every job
cgroup of its state folder is frozen (cgroup v2 ``cgroup.freeze``: its processes stop
wherever they are, and cannot write), and what the write left free is taken back into
the reserve before they run again.

Freezing is counted per process: the API, the worker and the disk watch may each be
making room at the same time, and the jobs run again when the last one is done. A daemon
that dies meanwhile leaves them frozen until the worker starts again
(``cgroups._remember`` thaws every job cgroup it finds). Jobs tracked by session (no
cgroup v2 here) cannot be frozen: then only a filesystem of the job folders' own bounds
them (docs/admin.md, "A full disk").
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from ddpq.config import Settings
from ddpq.executors.local import cgroups

log = logging.getLogger("ddpq.disk")

# How long freezing may take to reach every process (one inside a system call finishes
# it first); past it the write goes ahead with what is frozen.
SETTLE_S = 1.0

_lock = threading.Lock()
_holders = 0
_frozen: list[Path] = []


@contextmanager
def jobs_frozen(home: Path) -> Iterator[None]:
    """Every job of the state folder ``home`` frozen for the block, thawed after it."""
    global _holders, _frozen
    with _lock:
        _holders += 1
        if _holders == 1:
            _frozen = freeze_all(home)
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                for job in _frozen:
                    cgroups.thaw(job)
                _frozen = []


def freeze_all(home: Path) -> list[Path]:
    """Freeze each job cgroup of ``home``; the ones frozen (to thaw), once each is frozen
    or SETTLE_S has passed."""
    frozen = []
    for tree in cgroups.remembered_trees(home):
        for job in tree.glob("job-*"):
            try:
                with open(job / "cgroup.freeze", "w") as f:
                    f.write("1")
            except OSError:
                continue  # gone meanwhile, or no cgroup.freeze (a kernel before 5.2)
            frozen.append(job)
    deadline = time.monotonic() + SETTLE_S
    waiting = list(frozen)
    while waiting and time.monotonic() < deadline:
        waiting = [job for job in waiting if not is_frozen(job)]
        if waiting:
            time.sleep(0.002)
    if waiting:
        log.warning("%d job(s) not frozen after %.1f s: writing anyway", len(waiting), SETTLE_S)
    return frozen


def is_frozen(path: Path) -> bool:
    """Whether every process of the cgroup is frozen (``frozen 1`` in cgroup.events);
    a cgroup gone counts as frozen: nothing of it writes any more."""
    try:
        with open(path / "cgroup.events") as f:
            return any(line.split() == ["frozen", "1"] for line in f)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def pauser(settings: Settings) -> Callable[[], AbstractContextManager[object]] | None:
    """What holds this daemon's jobs still (``store.headroom.Reserve``'s ``pause_jobs``);
    None where they are not this host's processes (Slurm's)."""
    if settings.executor != "local":
        return None
    return functools.partial(jobs_frozen, settings.home)
