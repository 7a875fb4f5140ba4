"""The shim's view of its job's processes: which they are, and killing all of them.

Standard library only, imported by the shim, which runs with ``python -S``. The job's
processes are its cgroup's members where the worker put it in one (``JOB_CGROUP``), else
those of its session, its re-parented orphans, and those carrying its ``DDPQ_JOB_DIR``.
"""

from __future__ import annotations

import os
import signal
import time


def ancestors() -> set[int]:
    """Our parent, its parent, ... : never part of the job, whatever their environment."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            break
        pid = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return found


# Our ancestors, read the first time the job's processes are looked for by session (a job
# in its own cgroup never is): off every job's start path.
ANCESTORS: set[int] = set()


def session_members(sid: int, marker: bytes = b"", since_ticks: int = 0) -> list[int]:
    """The job's processes: in session ``sid``, re-parented to this shim, or (started
    after the shim) carrying ``marker`` (``DDPQ_JOB_DIR=...``) in their environment,
    which every process of the job inherits even after leaving the session."""
    me = os.getpid()
    if not ANCESTORS:
        ANCESTORS.update(ancestors())
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me or int(name) in ANCESTORS:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parens).
        fields = stat[stat.rfind(b")") + 2 :].split()
        state, ppid, session = fields[0], int(fields[1]), int(fields[3])
        if state == b"Z" and ppid != me:
            continue  # a zombie of someone else: already dead
        ours = session == sid or ppid == me
        escaped = bool(marker) and int(fields[19]) >= since_ticks and _has_marker(name, marker)
        if ours or escaped:
            found.append(int(name))
    return found


def _has_marker(pid: str, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\x00")
    except OSError:
        return False  # gone, or another user's: not ours either way


def own_start_ticks() -> int:
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


# The job's wait status, kept here because reaping stragglers with waitpid(-1)
# may reap the job itself.
MAIN: dict[str, int] = {}


def reap_children() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == MAIN.get("pid"):
            MAIN["status"] = status


# Set once the worker has put this shim in the job's own cgroup (``--cgroup``): then
# the job's processes are exactly that cgroup's members, which no process of the job
# can leave, however it forks or whatever it does to its session and environment.
JOB_CGROUP = {"dir": ""}


def cgroup_members() -> list[int] | None:
    """The other processes of our cgroup (zombies are not listed), None if unreadable."""
    try:
        with open(os.path.join(JOB_CGROUP["dir"], "cgroup.procs"), "rb") as f:
            pids = f.read().split()
    except OSError:
        return None
    me = os.getpid()
    return [int(p) for p in pids if int(p) != me]


def job_members(sid: int, marker: bytes, since: int) -> list[int]:
    """The job's processes: its cgroup's members if it has one, else by session."""
    if JOB_CGROUP["dir"]:
        found = cgroup_members()
        if found is not None:
            return found
    return session_members(sid, marker, since)


# How long the shim keeps killing what is left of a job before it gives up and writes its
# record (processes in uninterruptible sleep, a GPU's teardown, can take seconds to go).
KILL_WAIT_S = 30.0


def kill_everything(sid: int, marker: bytes, since: int, timeout: float = KILL_WAIT_S) -> None:
    """SIGKILL every process of the job until none is left (ESRCH means already gone)."""
    deadline = time.monotonic() + timeout
    while True:
        reap_children()
        members = job_members(sid, marker, since)
        if not members or time.monotonic() > deadline:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already, or not ours to kill (the worker's cgroup.kill is)
                pass
        time.sleep(0.01)
