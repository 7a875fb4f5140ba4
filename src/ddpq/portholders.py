"""Who holds a TCP port on this host: the sockets bound to it, and the processes that own them.

The worker asks when a rendezvous port fails its test-bind (so that the waiting reason
names who holds it), the API when a session's owner asks who listens on its port
(``who_listens``: the job itself, someone else, or nobody yet).

- ``/proc/net/tcp`` and ``tcp6`` list listening and connected sockets, each with its
  local port, the uid that made it and its inode. A socket that is bound but does not
  listen is in neither: only the kernel's socket diagnostics (netlink ``sock_diag``, for
  bound-only sockets Linux 6.9 and later) tell it, with the same facts.
- ``/proc/PID/fd`` links (``socket:[INODE]``) tell which process has that inode. A root
  daemon sees every process's; another only its own account's (then the uid still says
  whose the socket is). Only processes of the sockets' uids are looked into, and at most
  ``MAX_LINKS`` links are read in one look: a host with a million descriptors makes the
  answer shorter, never the pass longer.

Nothing here raises for what it reads: a look that fails says less (no PID, or no holder).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ddpq.core.jobenv import ATTEMPT_VAR, JOB_ID_VAR
from ddpq.procfs import PROC, account_name, environment, process_name, process_uid

MAX_LINKS = 20_000  # /proc/PID/fd links read in one look, all processes together (~50 ms)
MAX_HOLDERS = 64  # sockets reported per look (a port is rarely held by more than one)
TCP_LISTEN = 0x0A
TCP_TIME_WAIT = 0x06  # owned by nobody: no inode, and SO_REUSEADDR binds over it
TCP_BOUND_INACTIVE = 13  # inet_diag's state for bound-only sockets (Linux 6.9+)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_DUMP_REQUEST = 0x301  # NLM_F_REQUEST | NLM_F_DUMP
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_DIAG_MSG = struct.Struct("=BBBB2x2x16s16sI8sIIIII")  # inet_diag_msg, ports read apart
_NLMSG = struct.Struct("=IHHII")
_DIAG_READ_LIMIT = 4 << 20  # bytes of one dump: bound-only sockets are few


@dataclass(frozen=True)
class Holder:
    """A socket bound to ``port``, whose (``uid``: its maker), and, when it could be found,
    the process that has it."""

    port: int
    uid: int
    listening: bool
    pid: int | None = None
    comm: str | None = None

    @property
    def user(self) -> str | None:
        return account_name(self.uid)

    def describe(self) -> str:
        """``29600 held by uid 1001 (alice) pid 4242 python``."""
        user = self.user
        who = f"uid {self.uid}" + (f" ({user})" if user else "")
        proc = (
            "" if self.pid is None else f" pid {self.pid}" + (f" {self.comm}" if self.comm else "")
        )
        how = "" if self.listening else " (bound, not listening)"
        return f"{self.port} held by {who}{proc}{how}"


@dataclass(frozen=True)
class _Socket:
    port: int
    uid: int
    listening: bool


def holders(
    ports: Collection[int], *, listening_only: bool = False, proc: Path = PROC
) -> dict[int, list[Holder]]:
    """The sockets bound to each of ``ports`` (those a look finds), with their processes."""
    wanted = set(ports)
    if not wanted:
        return {}
    try:
        found = _from_proc_net(wanted, listening_only, proc)
        if not listening_only:
            for inode, sock in _bound_only(wanted).items():
                found.setdefault(inode, sock)
        inodes = dict(list(found.items())[:MAX_HOLDERS])
        owners = _owners(inodes, {s.uid for s in inodes.values()}, proc)
    except Exception:  # a look that fails must never fail the caller's pass
        return {}
    out: dict[int, list[Holder]] = {}
    for inode, sock in inodes.items():
        pid = owners.get(inode)
        comm = None if pid is None else process_name(pid, proc)
        uid = sock.uid if pid is None else process_uid(pid, proc)
        out.setdefault(sock.port, []).append(
            Holder(sock.port, sock.uid if uid is None else uid, sock.listening, pid, comm)
        )
    return out


def _from_proc_net(wanted: set[int], listening_only: bool, proc: Path) -> dict[int, _Socket]:
    found: dict[int, _Socket] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(proc / "net" / name, "rb") as f:
                lines = f.read().split(b"\n")[1:]
        except OSError:
            continue  # no IPv6 here
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            try:
                port = int(fields[1].rpartition(b":")[2], 16)
                state, uid, inode = int(fields[3], 16), int(fields[7]), int(fields[9])
            except ValueError:
                continue
            if port not in wanted or inode == 0 or state == TCP_TIME_WAIT:
                continue
            if listening_only and state != TCP_LISTEN:
                continue
            found[inode] = _Socket(port, uid, state == TCP_LISTEN)
    return found


def _bound_only(wanted: set[int]) -> dict[int, _Socket]:
    """Sockets bound to a wanted port that do not listen, from netlink ``sock_diag``;
    nothing where the kernel cannot say."""
    found: dict[int, _Socket] = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            for port, uid, inode in _diag_dump(family, 1 << TCP_BOUND_INACTIVE):
                if port in wanted and inode:
                    found[inode] = _Socket(port, uid, False)
        except OSError:
            continue
    return found


def _diag_dump(family: int, states: int) -> list[tuple[int, int, int]]:
    """``(local port, uid, inode)`` of the TCP sockets of ``family`` in ``states``."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states) + bytes(48)
    header = _NLMSG.pack(
        _NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_DUMP_REQUEST, 1, 0
    )
    out: list[tuple[int, int, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(header + request, (0, 0))
        read = 0
        while read < _DIAG_READ_LIMIT:
            data = nl.recv(65536)
            read += len(data) or _DIAG_READ_LIMIT
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, offset)[:2]
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < _NLMSG.size:
                    return out
                body = offset + _NLMSG.size
                if body + _DIAG_MSG.size <= len(data):
                    fields = _DIAG_MSG.unpack_from(data, body)
                    sport = struct.unpack_from("!H", data, body + 4)[0]
                    out.append((sport, fields[-2], fields[-1]))
                offset += (length + 3) & ~3
    return out


def _owners(sockets: dict[int, _Socket], uids: set[int], proc: Path) -> dict[int, int]:
    """inode -> the PID of a process that has it, looking only into the processes of
    ``uids`` (one stat each), at most MAX_LINKS links in all."""
    targets = {f"socket:[{inode}]": inode for inode in sockets}
    found: dict[int, int] = {}
    budget = MAX_LINKS
    with os.scandir(proc) as entries:
        for entry in entries:
            if budget <= 0 or len(found) == len(targets):
                break
            try:
                if not entry.name.isdigit() or entry.stat().st_uid not in uids:
                    continue
                with os.scandir(proc / entry.name / "fd") as links:
                    for link in links:
                        budget -= 1
                        inode = targets.get(_readlink(link.path))
                        if inode is not None:
                            found.setdefault(inode, int(entry.name))
                        if budget <= 0:
                            break
            except OSError:
                continue  # gone, or not ours to look into
    return found


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""  # gone meanwhile


@dataclass(frozen=True)
class Listening:
    """Who listens on a job's port: ``job`` (its processes alone), ``other`` (``holder``
    is the first that is not the job's), ``nobody``, or ``unknown`` (a process of the
    job's account whose PID the bounded look did not find: it cannot be told apart)."""

    who: Literal["job", "other", "nobody", "unknown"]
    holder: Holder | None = None


def who_listens(
    port: int, job_id: int, attempt: int, account_uid: int | None, proc: Path = PROC
) -> Listening:
    """Whether this attempt of the job listens on ``port``, someone else, or nobody.

    A listener is the job's when it runs as the job's account (``account_uid``) and its
    environment is this attempt's (the job contract's ``DDPQ_JOB_ID``, ``DDPQ_ATTEMPT``).
    Only that account and root can make or read such an environment, so another user
    never passes for the job; a process of the same account outside the job is "other"
    too. One listener that is not the job's makes it ``other``: ``ssh -L`` may reach it."""
    found = holders([port], listening_only=True, proc=proc).get(port, [])
    if not found:
        return Listening("nobody")
    verdicts = [(h, _of_job(h, job_id, attempt, account_uid, proc)) for h in found]
    for holder, verdict in verdicts:
        if verdict is False:
            return Listening("other", holder)
    for holder, verdict in verdicts:
        if verdict is None:
            return Listening("unknown", holder)
    return Listening("job", found[0])


def _of_job(
    holder: Holder, job_id: int, attempt: int, account_uid: int | None, proc: Path
) -> bool | None:
    """Whether ``holder`` is a process of this attempt; None: its PID was not found."""
    if account_uid is None or holder.uid != account_uid:
        return False
    if holder.pid is None:
        return None
    env = environment(holder.pid, proc)
    return (
        env is not None
        and env.get(JOB_ID_VAR.encode()) == str(job_id).encode()
        and env.get(ATTEMPT_VAR.encode()) == str(attempt).encode()
    )
