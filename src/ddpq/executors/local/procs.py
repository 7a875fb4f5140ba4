"""Processes by identity: a PID plus its start time, so a reused PID is never taken for a job.

Linux only (reads /proc). Signals treat ESRCH as "already gone", which is the
outcome we wanted anyway.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ddpq.core.proc_status import EFFECTIVE, STATUS_LIMIT, status_uid

# The most of a process's environment read when looking for a job's marker in it.
MARKER_SEARCH_BYTES = 256 * 1024


@dataclass(frozen=True)
class Identity:
    pid: int
    start_ticks: int  # field 22 of /proc/PID/stat: clock ticks after boot


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    session: int
    start_ticks: int


def stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0].decode(),
        ppid=int(fields[1]),
        session=int(fields[3]),
        start_ticks=int(fields[19]),
    )


def identity(pid: int) -> Identity | None:
    st = stat(pid)
    return None if st is None else Identity(pid, st.start_ticks)


def live_stat(ident: Identity) -> ProcStat | None:
    """The stat of that very process (not a later one with the same PID) if it still runs
    (stopped counts: only gone and zombie do not); None otherwise."""
    st = stat(ident.pid)
    if st is None or st.start_ticks != ident.start_ticks or st.state == "Z":
        return None
    return st


def is_alive(ident: Identity) -> bool:
    """True if that very process (not a later one with the same PID) still runs."""
    return live_stat(ident) is not None


def all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def occupied_sessions() -> set[int]:
    """Session ids that live processes belong to (one pass over /proc)."""
    sessions = set()
    for pid in all_pids():
        st = stat(pid)
        if st is not None and st.state != "Z":
            sessions.add(st.session)
    return sessions


def session_members(leader: Identity) -> list[int]:
    """Live processes of the session that ``leader`` (a job's shim) started.

    Linux does not hand out a PID while a session or process group of that
    number still exists. So if another process now leads a session with the
    leader's number, the job's session is empty and that one is a stranger:
    nothing here belongs to the job.
    """
    members = []
    for pid in all_pids():
        st = stat(pid)
        if st is None or st.session != leader.pid or st.state == "Z":
            continue
        if pid == leader.pid and st.start_ticks != leader.start_ticks:
            return []  # the number was reused by a new session leader
        if st.start_ticks >= leader.start_ticks:
            members.append(pid)
    return members


def marked_with(marker: bytes, not_before_ticks: int) -> list[int]:
    """Live processes whose environment holds ``marker`` (e.g. ``DDPQ_JOB_DIR=/x``).

    Every process of a job inherits the job's environment, also one that escaped its
    session with setsid and a double fork; this finds those when no shim is left to.
    """
    found = []
    for pid in all_pids():
        st = stat(pid)
        if st is None or st.state == "Z" or st.start_ticks < not_before_ticks:
            continue
        try:
            # Bounded: a job may start processes with megabytes of environment, read once
            # per process for each lost job (one that bloats it past the marker is hidden,
            # as one run with `env -i` is: this mode is the fallback without cgroups).
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read(MARKER_SEARCH_BYTES)
        except OSError:
            continue
        if marker in environ.split(b"\x00"):
            found.append(pid)
    return found


def send(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        send(pid, signal.SIGKILL)


def find_shim(job_dir: str) -> int | None:
    """The PID of a shim started for ``job_dir``, found by its command line: ``python -S
    shim.py --job-dir D ...`` by exec, ``ddpq-shim --job-dir D`` forked by the fork server.

    Needed for an attempt whose handle was never stored (the worker died first). Anyone
    can write such a command line: only a process of the account that owns the folder
    (as the shim runs) counts, or another user's process would be watched as this job's.
    """
    needle = b"\x00--job-dir\x00" + job_dir.encode() + b"\x00"
    try:
        owner = os.lstat(job_dir).st_uid
    except OSError:
        return None
    for pid in all_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        shim_like = b"shim.py" in cmdline or cmdline.startswith(b"ddpq-shim\x00")
        if shim_like and needle in cmdline and effective_uid(pid) == owner:
            return pid
    return None


def effective_uid(pid: int) -> int | None:
    """The process's effective uid, from its status (its /proc folder is root's when it
    is not dumpable, as a shim that changed its uid is not)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return status_uid(f.read(STATUS_LIMIT), EFFECTIVE)
    except OSError:
        return None


def pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (child or not)."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
