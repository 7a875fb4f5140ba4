"""This host's CPUs and memory as the daemon sees them: the CPUs it may run on (its
affinity mask, which a container's or a service's cpuset narrows) and ``MemTotal``.

Shared by the worker (what jobs may lease, ``core.hostres``) and the API (a submission
that asks for more than the host gives jobs is refused), which may not import each other.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def host_cpus() -> tuple[int, ...]:
    """The CPU ids the daemon may run on, in order (at least one)."""
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: every CPU
        cpus = tuple(range(os.cpu_count() or 1))
    return cpus or (0,)


def mem_total(meminfo: Path = MEMINFO) -> int | None:
    """The host's memory in bytes (``MemTotal``), None where it cannot be read."""
    try:
        with meminfo.open() as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kib = line.split()[1]
                    return int(kib) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_capacity(setting: int | None) -> int:
    """``cpu_capacity``: the admin's number, or the CPUs the daemon may run on."""
    return setting if setting is not None else len(host_cpus())
