"""The CPU of one shim with its job, forked as the fork server forks it.

    python bench/shim_cpu.py [--jobs 200] [--src PATH] [--command true]

This process imports the shim as the fork server does (``python -S``, the shim's folder
first on the path, ``json`` and ``ctypes`` loaded before any fork) and then, ``--jobs``
times, forks a child that becomes a session leader and runs ``shim.main`` for a fresh job
folder, one at a time. It prints the children's CPU per shim (the shim and the job it ran,
from their rusage) and the wall time per shim. No daemon, no worker, no cgroup: the shim
finds its job's processes by their session (as a daemon with ``--tracking session`` does),
so the figure is the shim's own part of ``burst_cpu.py``'s "shims" line, without the
cgroup joins. ``--src`` is the ``src`` folder of a tree to measure (this checkout's by
default): run two trees alternately and compare their figures, not figures of other runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from machine import ROOT, machine_line, python_c_pass_ms


def children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--command", default="true")
    args = ap.parse_args()
    if sys.flags.no_site == 0:  # as the fork server: no site-packages, no .pth files
        os.execv(sys.executable, [sys.executable, "-S", *sys.argv])
    floor = python_c_pass_ms()
    sys.path.insert(0, str(Path(args.src) / "ddpq" / "executors" / "local"))
    import ctypes  # noqa: F401  # as the fork server: loaded once, before any fork
    import json  # noqa: F401

    import shim  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="ddpq-shim-cpu-"))
    try:
        before, began = children_cpu_s(), time.perf_counter()
        for i in range(args.jobs):
            folder = work / str(i)
            folder.mkdir()
            argv = ["--job-dir", str(folder), "--log", str(folder / "output.log")]
            argv += ["--record", str(folder / "exit.json"), "--cwd", str(work)]
            argv += ["--grace", "5", "--log-cap", "1000000", "--", args.command]
            pid = os.fork()
            if pid == 0:
                os.setsid()
                os._exit(shim.main(argv))
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"shim {i} exited {os.waitstatus_to_exitcode(status)}")
        cpu_ms = (children_cpu_s() - before) / args.jobs * 1000
        wall_ms = (time.perf_counter() - began) / args.jobs * 1000
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_line())
    print(f"src: {args.src}; {args.jobs} shims running {args.command!r}")
    print(f"CPU per shim with its job: {cpu_ms:.2f} ms; wall {wall_ms:.2f} ms")
    print(f"python -c pass: {floor:.1f} ms; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
