"""What a job's own /dev/shm costs its start (executors/local/shim_shm.py), measured alone.

    python bench/private_shm_cost.py [--forks 200]     (as root)

Forks ``--forks`` children of this process (run with ``python -S``, as the fork server is)
that exit at once, then as many that first make a mount namespace with a tmpfs on /dev/shm
as the fork server's child does, then plain ones again; prints each batch's CPU per child
(its rusage) and its wall time per fork and wait (p50, p90). The namespace's end, when the
child exits, is in both figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from machine import ROOT, machine_line, python_c_pass_ms

sys.path.insert(0, str(ROOT / "src" / "ddpq" / "executors" / "local"))
import shim_shm  # type: ignore[import-not-found]  # as the fork server loads it


def batch(forks: int, private: bool) -> tuple[float, float, float]:
    """CPU ms per child, wall ms p50 and p90 per fork."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = used.ru_utime + used.ru_stime
    walls = []
    for _ in range(forks):
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 0
            if private and shim_shm.make_private(1 << 20) is not None:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("a child could not make its /dev/shm (run as root)")
        walls.append(time.perf_counter() - began)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    walls.sort()
    cpu = (used.ru_utime + used.ru_stime - before) / forks
    return cpu * 1e3, walls[forks // 2] * 1e3, walls[forks * 9 // 10] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forks", type=int, default=200)
    args = ap.parse_args()
    if sys.flags.no_site == 0:  # as the fork server: no site-packages
        os.execv(sys.executable, [sys.executable, "-S", *sys.argv])
    shim_shm.shim_libc.preload()
    print(machine_line())
    for label, private in (("plain", False), ("own /dev/shm", True), ("plain", False)):
        cpu, p50, p90 = batch(args.forks, private)
        print(f"{label}: {cpu:.3f} ms CPU a child; wall p50 {p50:.2f} ms, p90 {p90:.2f} ms")
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
