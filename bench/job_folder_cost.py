"""What the filesystem charges for a job's folder, in each place given.

    python bench/job_folder_cost.py [--jobs 400] [--deleted N] [PARENT ...]

For each PARENT (default: the temporary directory, as ``tempfile`` picks it, and this
checkout's folder), a fresh folder is made there and ``--jobs`` times this process does
what a job's start does to the disk: a folder, then three new files in it (the log, the
shim's errors, the exit record). It prints the kernel's and the interpreter's CPU per job
folder (this process's rusage), and the folder is removed after. ``--deleted N``: first
make and delete N files beside it, as a test run or a benchmark's clean-up just did.

Why: on an ext4 mounted without a journal, every new inode is checked against the inodes
of its group freed in the last minutes (``recently_deleted`` in the kernel's inode
allocator), so in a folder whose neighbours were just deleted in bulk (a test suite's,
a previous benchmark's) a new file can cost a hundred times what it costs elsewhere on
the same disk. ``scheduler_bench.py`` and ``burst_cpu.py`` keep their daemon's home in
the temporary directory: run this beside them to know what their figures carry.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
from pathlib import Path

from machine import ROOT, machine_line


def cpu_s() -> tuple[float, float]:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_stime, used.ru_utime


def delete_files(parent: Path, count: int) -> None:
    """Make ``count`` files in a folder under ``parent``, then delete them all."""
    work = Path(tempfile.mkdtemp(prefix="ddpq-folder-cost-deleted-", dir=parent))
    for i in range(count):
        (work / str(i)).touch()
    shutil.rmtree(work)


def job_folders(parent: Path, jobs: int) -> tuple[float, float]:
    """Kernel and interpreter CPU (ms) per job folder made under ``parent``."""
    work = Path(tempfile.mkdtemp(prefix="ddpq-folder-cost-", dir=parent))
    try:
        (sys0, user0) = cpu_s()
        for i in range(jobs):
            folder = work / str(i)
            os.mkdir(folder, 0o700)
            for name in ("output.log", "shim.err", "exit.json.tmp"):
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                os.close(os.open(folder / name, flags, 0o600))
        (sys1, user1) = cpu_s()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (sys1 - sys0) * 1000 / jobs, (user1 - user0) * 1000 / jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--deleted", type=int, default=0)
    ap.add_argument("parents", nargs="*", type=Path)
    args = ap.parse_args()
    parents = args.parents or [Path(tempfile.gettempdir()), ROOT]
    print(machine_line())
    print(f"{args.jobs} job folders (a folder and three files) in each place", end="")
    print(f", right after {args.deleted} files beside them were deleted" if args.deleted else "")
    print("| parent | filesystem | kernel CPU per folder | interpreter CPU per folder |")
    print("|---|---|---|---|")
    for parent in parents:
        kind = filesystem(parent)
        delete_files(parent, args.deleted)
        kernel, user = job_folders(parent, args.jobs)
        print(f"| {parent} | {kind} | {kernel:.3f} ms | {user:.3f} ms |")


def filesystem(path: Path) -> str:
    """The type of the mount ``path`` is on (/proc/self/mounts); for ext4, whether it keeps
    a journal: a journaled ext4 has its block device under /proc/fs/jbd2 (``vda-8``,
    ``dm-0-8``), the device found by the number the path is on, not by the mount's name."""
    best, kind = "", "?"
    real = str(path.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point, fstype = line.split()[1:3]
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fstype
    if kind != "ext4":
        return kind
    dev = os.stat(path).st_dev
    device = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name
    try:
        journals = os.listdir("/proc/fs/jbd2")
    except OSError:
        return kind
    journaled = any(j.rsplit("-", 1)[0] == device for j in journals)
    return f"ext4, {'with' if journaled else 'no'} journal"


if __name__ == "__main__":
    main()
