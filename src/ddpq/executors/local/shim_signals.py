"""The signals a job starts with: every one at its default and none blocked, however the
daemon was started.

An ignored signal stays ignored across fork and exec, and a blocked one blocked, so whatever
the daemon's own start left so would reach every job: ``nohup`` ignores SIGHUP, a script's
``ddpq serve &`` SIGINT and SIGQUIT, and a parent started through glibc's ``posix_spawn``
(as some service managers and CI runners are) can leave glibc's two reserved signals, 32
and 33, ignored. A parent that blocked SIGTERM would leave a shim deaf to the worker's stop
(the daemon unblocks every signal as it starts, ``daemon.run``; a shim started by hand may
not have been). The shim calls ``reset_inherited`` once its own handlers are in place.

Standard library only, and ctypes imported only when 32 or 33 is ignored: this sits on every
job's start path.
"""

from __future__ import annotations

import os
import signal

# Beside this file (the shim's way, ``python -S``), or ddpq's module (imported by tests).
if __package__:
    from ddpq.executors.local import shim_libc
else:
    import shim_libc  # type: ignore[import-not-found,no-redef]

# Ignored by Python itself, so that a write to a closed pipe raises rather than kills; the
# job gets them back at their defaults when it starts (shim_batch, shim_pty).
PYTHON_IGNORES = {signal.SIGPIPE, signal.SIGXFSZ}

# Reserved by glibc for its threads (cancellation, set*id across threads): Python's signal
# module refuses them and glibc's sigaction too, so only the system call itself reaches them.
GLIBC_RESERVED = (32, 33)

# rt_sigaction's number where we know it; elsewhere the reserved two are left as they came.
RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "riscv64": 134}
KERNEL_SIGSET_BYTES = 8  # the kernel's sigset_t on every machine above (64 signals)
SIG_DFL, SIG_IGN = 0, 1


def reset_inherited() -> None:
    """Unblock every signal, and put back at its default every signal this process was
    started ignoring, save Python's own two (each job gets those back as it starts). The
    kernel's mask says which are ignored in one read: asking Python of each of the 64 cost
    more (an enum made for each) on every job's start path."""
    # A stop that came while it was blocked is delivered here, to the shim's handler.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    mask = ignored_mask()
    keep = PYTHON_IGNORES | {signal.SIGKILL, signal.SIGSTOP}
    for number in range(1, KERNEL_SIGSET_BYTES * 8 + 1):
        if not mask >> (number - 1) & 1 or number in keep:
            continue
        if number in GLIBC_RESERVED:  # rare: ctypes is imported only then
            set_reserved(number, SIG_DFL)
            continue
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):  # one this machine does not have
            pass


def ignored_mask() -> int:
    """The kernel's own word on which signals this process ignores (bit n-1 for signal n)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"SigIgn:"):
                return int(line.split()[1], 16)
    return 0


def set_reserved(signum: int, handler: int) -> bool:
    """Set signal ``signum`` to SIG_DFL or SIG_IGN by the system call; False where this
    machine's call is not known or the kernel refused."""
    number = RT_SIGACTION.get(os.uname().machine)  # not `platform`: an import per job
    if number is None:
        return False
    import ctypes

    # struct sigaction as the kernel reads it: handler, flags, restorer, mask. All but the
    # handler are zero, and the buffer is large enough on each machine above.
    action = (ctypes.c_ulong * 4)(handler, 0, 0, 0)
    result: int = shim_libc.libc().syscall(
        ctypes.c_long(number),
        ctypes.c_long(signum),
        ctypes.byref(action),
        None,
        ctypes.c_size_t(KERNEL_SIGSET_BYTES),
    )
    return result == 0
