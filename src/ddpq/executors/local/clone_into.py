"""A child born in its v2 cgroup: ``clone3(2)`` with ``CLONE_INTO_CGROUP``, for the fork server.

A process moved into a v2 cgroup by a write into ``cgroup.procs`` makes the kernel take its
global lock on thread groups for writing, and every taking waits for an RCU grace period:
``bench/cgroup_join.py`` measured 7.7 ms at the median and up to 20 ms on this project's
AMD machine (Linux 6.18), one wait on every job's way to its first line. A child the kernel
creates inside the cgroup (Linux 5.7 and later) takes that lock only for reading:
``bench/fork_into.py`` there, from the fork to the child running in its cgroup, 10.1 ms at
the median forked then moved, 2.3 ms born in it.

Python has no wrapper for ``clone3``. This calls it through ctypes the way ``os.fork``
calls ``fork()``: ``PyOS_BeforeFork`` first, then ``PyOS_AfterFork_Child`` in the child and
``PyOS_AfterFork_Parent`` in the parent, so the interpreter's locks and every
``os.register_at_fork`` hook are handled as ``os.fork`` handles them. Without
``CLONE_VM`` the child runs on a copy of the parent's memory and returns from the call as
a forked child does. What glibc's own ``fork()`` adds (its locks taken across the fork, its
record of the thread's id) matters only in a process with other threads: the fork server
has none, and nothing else may call this.

Where the kernel cannot (no ``clone3`` before Linux 5.3, no ``CLONE_INTO_CGROUP`` before
5.7, a container's seccomp filter), or the cgroup cannot be opened, the answer is None and
the caller forks and joins by writing, which reports any fault of the cgroup itself. A
kernel without the call is remembered, so the next fork does not try again.
"""

from __future__ import annotations

import errno
import functools
import os
import signal

# Beside it, as for the shim: first on sys.path in the fork server (python -S), ddpq's
# module where tests import it.
if __package__:
    from ddpq.executors.local import shim_libc
else:
    import shim_libc  # type: ignore[import-not-found,no-redef]

TYPE_CHECKING = False  # typing would cost milliseconds in the fork server's start
if TYPE_CHECKING:
    import ctypes

SYS_CLONE3 = 435  # the same number on every architecture Linux gives clone3
CLONE_INTO_CGROUP = 0x200000000
# The kernel's answers that say the call or the flag is not there (or not allowed):
# whatever the cgroup, the next try would meet the same.
NOT_HERE = frozenset({errno.ENOSYS, errno.E2BIG, errno.EINVAL, errno.EPERM})
_unavailable: list[str] = []  # why the kernel cannot, once it said so


def unavailable() -> str | None:
    """Why children are no longer born in their cgroup here, or None."""
    return _unavailable[0] if _unavailable else None


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

    names = "flags pidfd child_tid parent_tid exit_signal stack stack_size tls set_tid"
    fields = [(name, ctypes.c_uint64) for name in [*names.split(), "set_tid_size", "cgroup"]]
    return type("CloneArgs", (ctypes.Structure,), {"_fields_": fields})


def _clone3(folder: int) -> int | None:
    import ctypes  # loaded already: the fork server preloads the C library

    try:
        call = shim_libc.libc().syscall
    except (OSError, AttributeError) as exc:
        _unavailable.append(f"no C library to call clone3 through: {exc}")
        return None
    call.restype = ctypes.c_long
    args = _clone_args()(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=folder)
    python = ctypes.pythonapi
    python.PyOS_BeforeFork()
    pid = call(SYS_CLONE3, ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        python.PyOS_AfterFork_Child()
        return 0
    fault = ctypes.get_errno()
    python.PyOS_AfterFork_Parent()
    if pid > 0:
        return int(pid)
    if fault in NOT_HERE:
        _unavailable.append(f"clone3 into a cgroup: {os.strerror(fault)}")
    return None
