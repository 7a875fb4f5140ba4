"""A /dev/shm of the attempt's own: a fresh tmpfs in a mount namespace of its own.

The host's /dev/shm is memory every user shares, and what a job leaves there stays until
someone removes it: NCCL's segments and Python's shared memory of a job killed mid-run,
a data loader's files. Under ddpq a job's processes are the shim's descendants, so a mount
namespace made by the shim's fork before it runs anything holds every process of the job
and nothing else. A tmpfs mounted on /dev/shm there is the job's alone: its ranks share
it, no other job sees it, and the kernel frees it with the namespace when the job's last
process is gone, whatever it left. Its pages are the job's memory (its cgroup's limit
counts them), and its size is that limit where the job has one.

Made by the fork server's child while it is still root (mounting needs CAP_SYS_ADMIN),
before it becomes the job's account. Standard library only, imported by the fork server.
"""

from __future__ import annotations

import os
import sys

# Beside it, as for the shim: first on sys.path in the fork server (python -S), ddpq's
# module where tests import it.
if __package__:
    from ddpq.executors.local import shim_libc
else:
    import shim_libc  # type: ignore[import-not-found,no-redef]

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_REC, MS_SLAVE = 0x2, 0x4, 0x4000, 0x80000
SHM = b"/dev/shm"
OK = "ok"  # the trial child's word that it could


def make_private(size: int | None) -> str | None:
    """Give this process (and all it starts) a new mount namespace with an empty tmpfs on
    /dev/shm of ``size`` bytes (None: tmpfs's own default, half the host's memory). None,
    or why not: the job then runs with the host's."""
    try:
        libc = shim_libc.libc()
        libc.unshare, libc.mount  # noqa: B018 - both there, or say so before anything changes
    except (OSError, AttributeError) as exc:
        return f"cannot give the job a /dev/shm of its own: {exc}"
    if libc.unshare(CLONE_NEWNS) != 0:
        return failed("a mount namespace of its own")
    # Nothing mounted here may reach the host's namespace: the root's mounts, shared with
    # the host's where systemd made them so, become slaves (the host's still reach us).
    if libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None) != 0:
        return failed("its mounts kept from the host's")
    options = b"mode=1777" + (b",size=%d" % size if size else b"")
    if libc.mount(b"tmpfs", SHM, b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return failed("a tmpfs on /dev/shm")
    return None


# Why no child of this process can have a /dev/shm of its own ("": they can), once found.
_REFUSED_HERE: list[str] = []


def refused_here() -> str | None:
    """Why this host refuses a /dev/shm of a job's own (None: it does not), found once, by
    a child that makes one and exits: where mounting is refused (a container without the
    right to mount), every job runs with the host's without each log saying so, and the
    fork server says it once on its stderr (the daemon's log)."""
    if _REFUSED_HERE:
        return _REFUSED_HERE[0] or None
    why, settled = _try_in_child()
    if settled:  # the host's answer, kept; a trial that failed on its own is tried again
        _REFUSED_HERE.append(why)
        if why:
            sys.stderr.write(f"ddpq fork server: jobs get the host's /dev/shm: {why}\n")
    return why or None


def _try_in_child() -> tuple[str, bool]:
    """Why a child could not make a /dev/shm of its own ("" if it could), and whether that
    is the host's answer: a fork that failed, or a child that said nothing (killed before
    it could), tells nothing of the host, and this job alone gets the host's /dev/shm."""
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read)
        os.close(write)
        return f"cannot try a /dev/shm of a job's own: {exc.strerror or exc}", False
    if pid == 0:
        try:
            os.close(read)
            os.write(write, (make_private(1 << 20) or OK).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        answer = said.read().decode(errors="replace")
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped by the fork server's SIGCHLD handler already
    if answer == OK:
        return "", True
    if not answer:
        return "cannot give a job a /dev/shm of its own: the trial child said nothing", False
    return answer, True


def failed(what: str) -> str:
    import ctypes

    code = ctypes.get_errno()
    return f"cannot give the job {what}: {os.strerror(code)}"
