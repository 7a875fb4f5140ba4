"""A child born in its v2 cgroup: ``clone3(2)`` with ``CLONE_INTO_CGROUP``, for the fork server.

A process moved into a v2 cgroup by a write into ``cgroup.procs`` makes the kernel take its
global lock on thread groups for writing, and every taking waits for an RCU grace period:
``bench/cgroup_join.py`` measured 7.7 ms at the median and up to 20 ms on this project's
AMD machine (Linux 6.18), one wait on every job's way to its first line. A child the kernel
creates inside the cgroup (Linux 5.7 and later) takes that lock only for reading:
``bench/fork_into.py`` there, from the fork to the child running in its cgroup, 10.1 ms at
the median forked then moved, 2.3 ms born in it.

Python has no wrapper for ``clone3``. This calls it through ctypes the way ``os.fork``
calls ``fork()``: with the interpreter lock held (a ``PyDLL`` function), ``PyOS_BeforeFork``
first, then ``PyOS_AfterFork_Child`` in the child and ``PyOS_AfterFork_Parent`` in the
parent, so the interpreter's locks and every ``os.register_at_fork`` hook are handled as
``os.fork`` handles them. Without ``CLONE_VM`` the child runs on a copy of the parent's
memory and returns from the call as a forked child does. Of what glibc's own ``fork()``
does, the thread's id glibc keeps is done here too: the kernel writes the child's id where
glibc keeps it (``CLONE_CHILD_SETTID``, at the address ``PR_GET_TID_ADDRESS`` gives),
else the child would go on with the fork server's (``pthread_setaffinity_np`` on itself
would pin the fork server, a review found). Not done: glibc's locks taken across the fork
(with one thread there is nobody to hold them), its at-fork handlers (no library the fork
server loads registers one) and its robust-mutex list (the shim uses no robust mutex).
The fork server has one thread, and nothing else may call this.

Where the kernel cannot (no ``clone3`` before Linux 5.3, no ``CLONE_INTO_CGROUP`` before
5.7, no ``PR_GET_TID_ADDRESS`` in a kernel built without checkpoint/restore, a container's
seccomp filter), or the cgroup cannot be opened, the answer is None and
the caller forks and joins by writing, which reports any fault of the cgroup itself. A
kernel without the call is remembered, so the next fork does not try again, and said once
on stderr (the daemon's log).
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys

# Beside it, as for the shim: first on sys.path in the fork server (python -S), ddpq's
# module where tests import it.
if __package__:
    from ddpq.executors.local import shim_libc
else:
    import shim_libc  # type: ignore[import-not-found,no-redef]

TYPE_CHECKING = False  # typing would cost milliseconds in the fork server's start
if TYPE_CHECKING:
    import ctypes
    from typing import Any

SYS_CLONE3 = 435  # the same number on every architecture Linux gives clone3
CLONE_CHILD_CLEARTID = 0x00200000
CLONE_CHILD_SETTID = 0x01000000
CLONE_INTO_CGROUP = 0x200000000
PR_GET_TID_ADDRESS = 40
# The kernel's answers that say the call or the flag is not there (or not allowed):
# whatever the cgroup, the next try would meet the same.
NOT_HERE = frozenset({errno.ENOSYS, errno.E2BIG, errno.EINVAL, errno.EPERM})
_unavailable: list[str] = []  # why the kernel cannot, once it said so


def unavailable() -> str | None:
    """Why children are no longer born in their cgroup here, or None."""
    return _unavailable[0] if _unavailable else None


def _give_up(why: str) -> None:
    """Born in their cgroups no more: remembered, and said once in the daemon's log."""
    _unavailable.append(why)
    sys.stderr.write(f"ddpq fork server: shims move into their cgroups by writing ({why})\n")
    sys.stderr.flush()


def fork_into(cgroup: str) -> int | None:
    """Fork a child that is born in the v2 cgroup ``cgroup`` (a folder's path): its PID
    in the parent, 0 in the child; None (nothing forked) where that cannot be done."""
    if _unavailable:
        return None
    try:
        folder = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # the caller's write meets the same fault, and says it
    try:
        return _clone3(folder)
    finally:
        os.close(folder)  # in the child too: the shim's job must not hold the cgroup open


@functools.cache
def _clone_args() -> type[ctypes.Structure]:
    """``struct clone_args`` as far as ``cgroup`` (``CLONE_ARGS_SIZE_VER2``, 88 bytes)."""
    import ctypes

    names = (
        *("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size"),
        *("tls", "set_tid", "set_tid_size", "cgroup"),
    )
    fields = [(name, ctypes.c_uint64) for name in names]
    return type("CloneArgs", (ctypes.Structure,), {"_fields_": fields})


@functools.cache
def _calls() -> tuple[Any, int] | str:
    """The C library's ``syscall`` with the interpreter lock held (as ``os.fork`` holds
    it across ``fork()``), and where glibc keeps this thread's id; or why not."""
    import ctypes

    try:
        held = ctypes.PyDLL(None, use_errno=True)
        held.syscall.restype = ctypes.c_long
        where = ctypes.c_void_p()
        if shim_libc.libc().prctl(PR_GET_TID_ADDRESS, ctypes.byref(where), 0, 0, 0) != 0:
            fault = ctypes.get_errno()
            return f"the kernel does not say where the thread's id is kept: {os.strerror(fault)}"
    except (OSError, AttributeError) as exc:
        return f"no C library to call clone3 through: {exc}"
    if not where.value:
        return "the kernel does not say where the thread's id is kept"
    return held.syscall, where.value


def _clone3(folder: int) -> int | None:
    import ctypes  # loaded already: the fork server preloads the C library

    calls = _calls()
    if isinstance(calls, str):
        _give_up(calls)
        return None
    syscall, tid_address = calls
    args = _clone_args()(
        flags=CLONE_INTO_CGROUP | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID,
        child_tid=tid_address,
        exit_signal=signal.SIGCHLD,
        cgroup=folder,
    )
    size = ctypes.c_size_t(ctypes.sizeof(args))
    python = ctypes.pythonapi
    python.PyOS_BeforeFork()
    try:
        pid = syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), size)
    except BaseException:
        python.PyOS_AfterFork_Parent()
        raise
    if pid == 0:
        python.PyOS_AfterFork_Child()
        return 0
    fault = ctypes.get_errno()
    python.PyOS_AfterFork_Parent()
    if pid > 0:
        return int(pid)
    if fault in NOT_HERE:
        _give_up(f"clone3 into a cgroup: {os.strerror(fault)}")
    return None
